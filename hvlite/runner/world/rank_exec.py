"""Per-rank wrapper: ``python -m hvlite.runner.world.rank_exec -- command...``.

Contract:
  * The rank comes from the launcher's environment: the first of ``PMI_RANK``, ``PMI_ID``
    (hydra's ``-pmi-port`` mode sets only this), ``OMPI_COMM_WORLD_RANK``, ``PMIX_RANK``,
    ``SLURM_PROCID``; 0 if none is set.
  * The command runs as a child; each line it writes is forwarded as ``[rank]<stdout>: line``
    to this process's stdout (``<stderr>`` likewise), flushed per line. Bytes that are not UTF-8
    are replaced; a last line without newline gets one; lines over 64 KiB are split.
  * With ``HVLRUN_PREFIX_TIMESTAMP=1`` each forwarded line starts with the local time, as
    horovodrun's ``--prefix-output-with-timestamp`` writes it (``time.asctime()``:
    ``Fri Nov  6 21:15:03 2026[1]<stdout>: line``).
  * With ``HVLRUN_OUTPUT_DIR=DIR`` the raw output is also written to ``DIR/rank.<N>/stdout`` and
    ``DIR/rank.<N>/stderr``.
  * The child inherits the environment and the descriptors the launcher passed (e.g. hydra's
    ``PMI_FD``), so it can initialise MPI as if started directly. Where hvlrun chose
    ``OMP_NUM_THREADS`` (``HVLRUN_OMP_AUTO=1``), the child gets this host's cores divided by
    the ranks the launcher says run on this host (hvlrun's value is its own host's).
  * The child gets SIGKILL when this wrapper dies (``PR_SET_PDEATHSIG``, Linux); this wrapper gets
    SIGTERM when the launcher process that started it dies. SIGTERM/SIGINT received here are
    forwarded to the child.
  * A child that fails is named in one stderr line (``hvlrun: rank 1 (pid 12 on host) exited
    with code 3`` or ``... was killed by signal 9 (SIGKILL)``); the wrapper exits with the
    child's code, 128+signum for a signal, 127 if the command cannot be started.
  * With ``HVLRUN_CONTROL_ADDR`` set, ``start``/``exit`` are reported over the authenticated
    control channel (``control/``), whose secret (``HVLRUN_SECRET``) the child does not
    inherit. A wrapper that cannot reach hvlrun says so and exits 1 before starting the child.
    When hvlrun asks it to stop, or is gone (connection closed, or silent for
    ``HVLRUN_HEARTBEAT_TIMEOUT`` seconds: a cut link), the wrapper ends the child (SIGTERM,
    then SIGKILL after :data:`STOP_GRACE_SECONDS`) and says why on stderr. The job's ``/dev/shm``
    files the child maps at that moment (``procs/job_files.py``) are removed once no process maps them,
    so a job whose hvlrun was killed outright (SIGKILL: it cannot clean up) leaves none behind.
  * The host the wrapper reports is ``HVLRUN_HOST`` (the name in hvlrun's host list, set by the
    host guard) or else ``socket.gethostname()``.
  * What the wrapper itself writes on stderr cannot fail it (write errors are ignored): its
    stderr may be gone with hvlrun, exactly when it must still end the child.
  * Test-only hook: ``HVLRUN_TEST_DELAY_START_RANK=R:S`` makes rank R sleep S seconds before
    starting its child (used to test ``--start-timeout``).
"""

import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Callable, Dict, List, Mapping, Optional, Sequence, Set

from ...protocol.wire import ENV_SECRET
from ..control.client import ControlClient, ControlError
from ..control.names import (ENV_CONTROL_ADDR, ENV_HEARTBEAT, ENV_HOST, ENV_OMP_AUTO,
                             ENV_OUTPUT_DIR, ENV_PREFIX_TIME)
from ..procs.proctree import descendants
from ..procs.job_files import mapped_shm, remove_unused
from .say import tell as _tell

__all__ = ["RANK_VARIABLES", "ENV_OUTPUT_DIR", "ENV_TEST_DELAY", "STOP_GRACE_SECONDS",
           "rank_from_env", "run_rank", "describe_exit", "main"]

RANK_VARIABLES = ("PMI_RANK", "PMI_ID", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
ENV_TEST_DELAY = "HVLRUN_TEST_DELAY_START_RANK"
_PR_SET_PDEATHSIG = 1
_MAX_LINE = 65536
_JOIN_SECONDS = 5.0
STOP_GRACE_SECONDS = 3.0


def rank_from_env(environ: Mapping[str, str]) -> int:
    """Return this process's rank from the launcher's variables (first found), else 0.

    Raises:
        ValueError: if the first variable found is not an integer.
    """
    for name in RANK_VARIABLES:
        if environ.get(name, "").strip():
            return int(environ[name])
    return 0


def describe_exit(rank: int, pid: int, host: str, returncode: int) -> Optional[str]:
    """Describe a failed child in one line.

    Args:
        rank: the rank.
        pid: the child's pid.
        host: this host's name.
        returncode: ``Popen.returncode`` (negative for a signal).

    Returns:
        The line (no newline), or None if the child exited with code 0.
    """
    if returncode == 0:
        return None
    who = "hvlrun: rank %d (pid %d on %s)" % (rank, pid, host)
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return "%s was killed by signal %d (%s)" % (who, -returncode, name)
    return "%s exited with code %d" % (who, returncode)


def _death_signal_setter(signum: int, parent: int) -> Callable[[], None]:
    """Return a function that asks Linux to send ``signum`` to the caller when its parent dies.

    Everything is resolved now, so the returned function is safe in ``preexec_fn``. It does
    nothing off Linux or if libc cannot be loaded.

    Args:
        signum: the signal to receive.
        parent: the pid the caller's parent should have; if it differs once the request is
            made, the parent already died and the signal is sent at once.

    Returns:
        The function, taking no arguments.
    """
    if not sys.platform.startswith("linux"):
        return lambda: None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None

    def set_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signum)
    return set_death_signal


def _pump(source: BinaryIO, prefix: bytes, sink: BinaryIO, copy: Optional[BinaryIO],
          timed: bool = False) -> None:
    """Forward lines from ``source`` to ``sink`` with ``prefix`` (after the local time if
    ``timed``); raw copy to ``copy``."""
    for line in iter(lambda: source.readline(_MAX_LINE), b""):
        if copy is not None:
            try:
                copy.write(line)
                copy.flush()
            except OSError as e:  # e.g. disk full: say so once, keep forwarding
                _tell("hvlrun: stopped writing %s: %s" % (copy.name, e))
                copy.close()
                copy = None
        text = line.decode("utf-8", "replace").encode("utf-8")
        if not text.endswith(b"\n"):
            text += b"\n"
        when = time.asctime().encode() if timed else b""
        try:
            sink.write(when + prefix + text)
            sink.flush()
        except (OSError, ValueError):
            pass  # our own output is gone; keep draining so the child does not block
    source.close()
    if copy is not None:
        copy.close()


def _open_copies(rank: int) -> List[Optional[BinaryIO]]:
    """Open ``DIR/rank.<N>/stdout`` and ``stderr`` when ``HVLRUN_OUTPUT_DIR`` is set."""
    out_dir = os.environ.get(ENV_OUTPUT_DIR)
    if not out_dir:
        return [None, None]
    rank_dir = os.path.join(out_dir, "rank.%d" % rank)
    os.makedirs(rank_dir, exist_ok=True)
    return [open(os.path.join(rank_dir, name), "wb") for name in ("stdout", "stderr")]


def _test_delay(rank: int) -> None:
    """Honour ``HVLRUN_TEST_DELAY_START_RANK=R:S`` (test-only): rank R sleeps S seconds."""
    spec = os.environ.get(ENV_TEST_DELAY, "")
    target, _, seconds = spec.partition(":")
    if target.strip() == str(rank) and seconds:
        time.sleep(float(seconds))


def _forward_signals(proc: subprocess.Popen, received: List[int]) -> None:
    """Pass SIGTERM and SIGINT received by this wrapper on to the child, noting them in
    ``received``."""
    def forward(signum, _frame):
        received.append(signum)
        try:
            proc.send_signal(signum)
        except OSError:
            pass
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)


class _Stopper:
    """Ends the child when hvlrun asks or is gone; may fire before the child exists."""

    def __init__(self, rank: int, host: str) -> None:
        self._lock = threading.Lock()
        self._proc: Optional[subprocess.Popen] = None
        self._who = "rank %d on %s" % (rank, host)
        self.reason: Optional[str] = None
        self.shm_files: Set[str] = set()   # what the child mapped when the stop came

    def attach(self, proc: subprocess.Popen) -> None:
        """Watch ``proc``; end it at once if a stop came before it started."""
        with self._lock:
            self._proc = proc
            stopping = self.reason is not None
        if stopping:
            self._end()

    def stop(self, reason: str) -> None:
        """End the child (now or when it starts), then say why on stderr; once. Cannot fail."""
        with self._lock:
            if self.reason is not None:
                return
            self.reason = reason
        self._end()
        _tell("hvlrun: %s: %s; stopping the rank" % (self._who, reason))

    def _end(self) -> None:
        with self._lock:
            proc = self._proc
        if proc is not None:
            # hvlrun may be gone, so nobody else may remove the job's files: note them first
            for pid in [proc.pid, *descendants(proc.pid)]:
                self.shm_files |= mapped_shm(pid)
            threading.Thread(target=_terminate, args=(proc,), daemon=True).start()


def _terminate(proc: subprocess.Popen) -> None:
    """SIGTERM ``proc``, SIGKILL it after the grace period. Cannot fail."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            proc.send_signal(signum)
            proc.wait(timeout=STOP_GRACE_SECONDS)
            return
        except subprocess.TimeoutExpired:
            continue
        except OSError:
            return


def _open_channel(rank: int, host: str, stopper: _Stopper) -> Optional[ControlClient]:
    """Connect to hvlrun when ``HVLRUN_CONTROL_ADDR`` is set; None when it is not.

    Raises:
        ControlError: hvlrun cannot be reached, or the secret is missing or wrong.
    """
    addr = os.environ.get(ENV_CONTROL_ADDR)
    if not addr:
        return None
    try:
        timeout = float(os.environ.get(ENV_HEARTBEAT, "0") or 0)
        client = ControlClient(addr, os.environ.get(ENV_SECRET, ""), timeout,
                               on_lost=lambda why: stopper.stop("lost contact with hvlrun at "
                                                                "%s: %s" % (addr, why)),
                               on_stop=lambda why: stopper.stop("hvlrun ended the job (%s)"
                                                                % why))
    except ValueError as e:
        raise ControlError("cannot use hvlrun's control channel at %s: %s" % (addr, e)) from None
    return client.connect()


def _fail_before_start(channel: Optional[ControlClient], rank: int, code: int,
                       message: str) -> int:
    """Report a rank that could not start its command; return ``code``."""
    _tell(message)
    if channel is not None:
        channel.send("exit %d %d" % (rank, code))
        channel.close()
    return code


def _start_pumps(proc: subprocess.Popen, rank: int,
                 copies: Sequence[Optional[BinaryIO]]) -> List[threading.Thread]:
    """Start the threads that forward the child's stdout and stderr."""
    timed = os.environ.get(ENV_PREFIX_TIME) == "1"
    pumps = [threading.Thread(target=_pump, daemon=True,
                              args=(src, b"[%d]<%s>: " % (rank, name), sink, copy, timed))
             for src, name, sink, copy in ((proc.stdout, b"stdout", sys.stdout.buffer, copies[0]),
                                           (proc.stderr, b"stderr", sys.stderr.buffer, copies[1]))]
    for pump in pumps:
        pump.start()
    return pumps


# the ranks of this host, as the launcher tells each rank (MPICH's hydra, Open MPI)
_LOCAL_SIZE_VARIABLES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")


def child_environment(environ: Mapping[str, str], cores: int) -> Dict[str, str]:
    """The rank's environment: ``environ`` without the job secret; where hvlrun chose
    ``OMP_NUM_THREADS`` (``HVLRUN_OMP_AUTO=1``), this host's ``cores`` divided by the ranks on
    this host, at least 1 (hvlrun's value is its own host's)."""
    env = {k: v for k, v in environ.items() if k not in (ENV_SECRET, ENV_OMP_AUTO)}
    if environ.get(ENV_OMP_AUTO) == "1":
        for name in _LOCAL_SIZE_VARIABLES:
            text = environ.get(name, "").strip()
            if text.isdigit() and int(text) > 0:
                env["OMP_NUM_THREADS"] = str(max(1, cores // int(text)))
                break
    return env


def _spawn(command: Sequence[str], copies: Sequence[Optional[BinaryIO]]) -> subprocess.Popen:
    """Start the child without the job secret, its output piped to this wrapper.

    Raises:
        OSError: the command cannot be run (the output copies are closed then).
    """
    child_env = child_environment(os.environ, os.cpu_count() or 1)
    try:
        # close_fds=False: the child needs descriptors the launcher passed on (hydra's PMI_FD);
        # the wrapper's own files and sockets are not inheritable (PEP 446).
        return subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                close_fds=False, env=child_env,
                                preexec_fn=_death_signal_setter(signal.SIGKILL, os.getpid()))
    except OSError:
        for copy in copies:
            if copy is not None:
                copy.close()
        raise


def _tell_exit(rank: int, proc: subprocess.Popen, host: str, received: Sequence[int],
               stopper: _Stopper) -> None:
    """Name a child that failed in one stderr line, with who stopped it and why."""
    message = describe_exit(rank, proc.pid, host, proc.returncode)
    if message and received:
        message += "; the launcher stopped it with %s" % signal.Signals(received[0]).name
    if message and stopper.reason:
        message += "; %s" % stopper.reason
    if message:
        _tell(message)


def run_rank(command: Sequence[str]) -> int:
    """Run ``command`` as this rank's child, forwarding and reporting as the module describes.

    Args:
        command: the user's command.

    Returns:
        The exit code for this wrapper: the child's, 128+signum if a signal ended it, 127 if it
        could not be started, 1 if the output files could not be opened.
    """
    rank = rank_from_env(os.environ)
    host = os.environ.get(ENV_HOST) or socket.gethostname()
    _death_signal_setter(signal.SIGTERM, os.getppid())()  # launcher gone: stop the child
    _test_delay(rank)
    stopper = _Stopper(rank, host)
    try:
        channel = _open_channel(rank, host, stopper)
    except ControlError as e:
        return _fail_before_start(None, rank, 1, "hvlrun: rank %d on %s: %s" % (rank, host, e))
    try:
        copies = _open_copies(rank)
    except OSError as e:
        return _fail_before_start(channel, rank, 1, "hvlrun: rank %d on %s cannot write its "
                                  "output files: %s" % (rank, host, e))
    try:
        proc = _spawn(command, copies)
    except OSError as e:
        return _fail_before_start(channel, rank, 127, "hvlrun: rank %d on %s cannot run %r: %s"
                                  % (rank, host, command[0], e))
    if channel is not None:
        channel.send("start %d %d %s" % (rank, proc.pid, host))
    received: List[int] = []
    _forward_signals(proc, received)
    stopper.attach(proc)
    pumps = _start_pumps(proc, rank, copies)
    returncode = proc.wait()
    code = 128 - returncode if returncode < 0 else returncode
    if channel is not None:
        channel.send("exit %d %d" % (rank, code))
        channel.close()
    for pump in pumps:  # a grandchild holding the pipes open must not keep us here
        pump.join(timeout=_JOIN_SECONDS)
    _tell_exit(rank, proc, host, received, stopper)
    if stopper.shm_files:   # the other ranks are stopping too: give them time to let go
        remove_unused(stopper.shm_files, wait=STOP_GRACE_SECONDS + 2.0)
    return code


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m hvlite.runner.world.rank_exec [--] command...``.

    Args:
        argv: the arguments after the module name; ``sys.argv[1:]`` when omitted.

    Returns:
        The exit code (2 when no command is given).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        sys.stderr.write("usage: python -m hvlite.runner.world.rank_exec -- command...\n")
        return 2
    return run_rank(args)


if __name__ == "__main__":
    sys.exit(main())
