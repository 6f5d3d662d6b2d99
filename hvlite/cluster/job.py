"""The driver's side of a job on a cluster engine: its hosts, and the hvlrun that runs it.

Contract:
  * :func:`host_names` names the engine's nodes for hvlrun's host list: ``<prefix>-<address with
    dashes>-<short id>`` (``ray-10-0-0-2-a1b2c3``); a restarted node gets a fresh name. The
    names are never this machine's, so hvlrun reaches every node, the driver's own included,
    through the remote shell and the node's agent, never by starting ranks itself.
  * :class:`HostTable` keeps, in a private directory, the table ``rsh.py`` reads (each host's
    agent addresses in slot order) and, for elastic jobs, the host list hvlrun's discovery
    script prints; both are rewritten whole and atomically.
  * :class:`Hvlrun` runs ``python -m hvlite.runner`` for the job (its own session; ended when
    this process dies), with the remote shell ``python -m hvlite.cluster.rsh``, the network
    interface that holds the driver's address, and ``python -m hvlite.cluster.worker`` as every
    rank's command (``python -m hvlite.cluster.standin`` where the engine's workers are the
    ranks themselves). The ranks' output goes to the given streams; hvlrun's own lines
    (``hvlrun: ...``) are kept to say why a job ended. :meth:`Hvlrun.end` stops it within a
    bound: SIGTERM (hvlrun ends the job on every host), SIGKILL after :data:`END_GRACE_SECONDS`.
  * :class:`JobError` (a ``RuntimeError``) is what the engines' ``run``/``execute`` raise when a
    job fails: the failing rank (or None), its host, its traceback, and hvlrun's words.
"""
import io
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from typing import Dict, IO, List, Optional, Sequence, Tuple

from .names import ENV_HOSTS, ENV_KEY

__all__ = ["END_GRACE_SECONDS", "JobError", "host_names", "interface_of", "HostTable", "Hvlrun"]

END_GRACE_SECONDS = 15.0      # hvlrun's own end: stop, guards, a lost host's grace
_KEEP_LINES = 12


class JobError(RuntimeError):
    """A job on a cluster engine failed.

    Attributes:
        rank: the rank whose function raised (None when no rank's function did: a lost node,
            a start that timed out).
        host: that rank's host in hvlrun's host list ("" when unknown).
        traceback: the rank's traceback as text ("" when none).
        hvlrun: what hvlrun said about the job's end, one line each.
    """

    def __init__(self, message: str, rank: Optional[int] = None, host: str = "",
                 traceback: str = "", hvlrun: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.rank, self.host, self.traceback = rank, host, traceback
        self.hvlrun = list(hvlrun)


def host_names(prefix: str, nodes: Sequence[Tuple[str, str, str]]) -> Dict[str, str]:
    """Name each node (``(key, address, short id)``: the engine's id of the node, its address,
    a few characters that tell this incarnation of it from another) for hvlrun: ``<prefix>-<the
    address with dashes>-<short id>``; returns ``{key: name}``. A node that restarts gets a new
    id, hence a new name: hvlrun's verdicts on the old one (a blacklist) do not stick to it.
    Cannot fail."""
    return {key: "%s-%s-%s" % (prefix, address.replace(".", "-").replace(":", "-"), short)
            for key, address, short in nodes}


def interface_of(address: str) -> Optional[str]:
    """Return the name of this machine's interface that holds IPv4 ``address``, or None."""
    from ..runner.hosts.hostlist import interface_ipv4
    for _, name in socket.if_nameindex():
        try:
            if interface_ipv4(name) == address:
                return name
        except ValueError:
            continue
    return None


class HostTable:
    """The host table and discovery list of one job, in a private directory."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="hvlite-cluster-")
        self.table_path = os.path.join(self.directory, "hosts.json")
        self.discovery_path = os.path.join(self.directory, "discovered")
        # A task or node leaving while the job ends rewrites the table from another thread:
        # once removed, the table stays removed (a write racing rmtree left the folder behind)
        self.lock = threading.Lock()
        self.removed = False
        self.write({})

    def _replace(self, path: str, text: str) -> None:
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)

    def write(self, hosts: Dict[str, List[str]]) -> None:
        """Set the table (``{host: [agent address per slot]}``) and the discovery list (every
        host with its slot count, in the table's order)."""
        with self.lock:
            if self.removed:
                return
            self._replace(self.table_path, json.dumps({"hosts": hosts}))
            self._replace(self.discovery_path,
                          "".join("%s:%d\n" % (h, len(a)) for h, a in hosts.items() if a))

    def discovery_script(self) -> str:
        """The ``--host-discovery-script`` that prints the discovery list."""
        return "cat %s" % shlex.quote(self.discovery_path)

    def remove(self) -> None:
        with self.lock:
            self.removed = True
            shutil.rmtree(self.directory, ignore_errors=True)


class Hvlrun:
    """One hvlrun for a job (see the module contract)."""

    def __init__(self, table: HostTable, key: str, np: int, address: str,
                 hosts: Optional[Dict[str, int]] = None, elastic: Optional[dict] = None,
                 start_timeout: float = 0.0, heartbeat_timeout: Optional[float] = None,
                 nics: Optional[Sequence[str]] = None, env: Optional[Dict[str, str]] = None,
                 stdout: Optional[IO] = None, stderr: Optional[IO] = None, verbose: int = 1,
                 prefix_timestamp: bool = False, mpi_args: str = "",
                 executable: Optional[str] = None,
                 rank_module: str = "hvlite.cluster.worker") -> None:
        """Start hvlrun.

        Args:
            table: the job's host table.
            key: the agents' key.
            np: the number of ranks (an elastic job's first world).
            address: the driver's address as the nodes reach it (its interface is passed to
                hvlrun unless ``nics`` names interfaces).
            hosts: ``{host: slots}`` of a plain job, in rank order; None for an elastic job.
            elastic: an elastic job's ``min_np``, ``max_np``, ``elastic_timeout``,
                ``reset_limit``, ``cooldown_range`` (values None are left out).
            start_timeout: seconds for every rank to start (hvlrun's ``--start-timeout``).
            heartbeat_timeout: hvlrun's ``--heartbeat-timeout`` (None: its default).
            nics: network interfaces for hvlrun's ``--network-interface``.
            env: more variables for every rank.
            stdout, stderr: where the ranks' output goes (this process's, when None); a
                real file gets it directly, another stream object (a notebook's) through
                a thread.
            verbose: 2 shows hvlrun's command.
            prefix_timestamp: hvlrun's ``--prefix-output-with-timestamp``.
            mpi_args: more mpiexec arguments.
            executable: the Python the ranks run (``sys.executable`` when None).
            rank_module: the module every rank runs (``python -m``).

        Raises:
            OSError: hvlrun cannot be started.
        """
        python = executable or sys.executable
        argv = [sys.executable, "-m", "hvlite.runner", "-np", str(np),
                "--ssh-command", "%s -m hvlite.cluster.rsh" % shlex.quote(python)]
        interfaces = list(nics or [])
        if not interfaces:
            found = interface_of(address)
            interfaces = [found] if found else []
        if interfaces:
            argv += ["--network-interface", ",".join(interfaces)]
        if hosts is not None:
            argv += ["-H", ",".join("%s:%d" % hs for hs in hosts.items())]
        else:
            argv += ["--host-discovery-script", table.discovery_script()]
            for flag, name in (("--min-np", "min_np"), ("--max-np", "max_np"),
                               ("--elastic-timeout", "elastic_timeout"),
                               ("--reset-limit", "reset_limit")):
                if (elastic or {}).get(name) is not None:
                    argv += [flag, str(elastic[name])]
            if (elastic or {}).get("cooldown_range"):
                argv += ["--blacklist-cooldown-range"] + [str(v) for v in elastic["cooldown_range"]]
        if start_timeout:
            argv += ["--start-timeout", "%g" % start_timeout]
        if heartbeat_timeout:
            argv += ["--heartbeat-timeout", "%g" % heartbeat_timeout]
        if prefix_timestamp:
            argv.append("--prefix-output-with-timestamp")
        if verbose >= 2:
            argv.append("--verbose")
        if mpi_args:
            argv.append("--mpi-args=" + mpi_args)     # one word: it may start with "-"
        argv += ["--", python, "-m", rank_module]
        variables = dict(os.environ, **(env or {}))
        variables.update({ENV_KEY: key, ENV_HOSTS: table.table_path})
        self._lines: List[str] = []
        self._lock = threading.Lock()
        self._stderr = stderr if stderr is not None else sys.stderr
        out = stdout if stdout is not None else sys.stdout
        out_fd = _fileno(out)
        # SIGTERM when the driver dies (Linux), so that no hvlrun outlives its job; resolved
        # here: the child of a threaded process must not import
        from ..runner.world.rank_exec import _death_signal_setter
        on_death = _death_signal_setter(signal.SIGTERM, os.getpid())
        # "/": a directory every node has (mpiexec's is the proxies' working directory); each
        # rank moves to its actor's or task's own directory (worker.py)
        self.proc = subprocess.Popen(argv, env=variables, cwd="/", stdin=subprocess.DEVNULL,
                                     stdout=out_fd if out_fd is not None else subprocess.PIPE,
                                     stderr=subprocess.PIPE, preexec_fn=on_death,
                                     start_new_session=True)
        self._pumps = [threading.Thread(target=self._pump_err, daemon=True)]
        if out_fd is None:
            self._pumps.append(threading.Thread(target=_pump, args=(self.proc.stdout, out),
                                                daemon=True))
        for pump in self._pumps:
            pump.start()

    def _pump_err(self) -> None:
        for raw in iter(self.proc.stderr.readline, b""):
            text = raw.decode("utf-8", "replace")
            if text.startswith("hvlrun: "):
                with self._lock:
                    self._lines = (self._lines + [text.rstrip("\n")])[-_KEEP_LINES:]
            _write(self._stderr, text)
        self.proc.stderr.close()

    def said(self) -> List[str]:
        """hvlrun's last lines (``hvlrun: ...``)."""
        with self._lock:
            return list(self._lines)

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """hvlrun's exit code, or None while it runs after ``timeout`` seconds."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        for pump in self._pumps:
            pump.join(2.0)
        return code

    def end(self) -> int:
        """Stop hvlrun (see the module contract); return its exit code."""
        for signum, grace in ((signal.SIGTERM, END_GRACE_SECONDS), (signal.SIGKILL, 5.0)):
            if self.proc.poll() is not None:
                break
            try:
                self.proc.send_signal(signum)
            except OSError:
                break
            if self.wait(grace) is not None:
                break
        return self.wait(5.0) if self.proc.poll() is None else self.proc.returncode

    def describe_end(self, code: Optional[int]) -> str:
        """``hvlrun exited with code C: <its last words>``."""
        # the consequences (every wrapper and guard saying it was stopped) are left out
        lines = [l[len("hvlrun: "):] for l in self.said()
                 if "hvlrun ended the job" not in l and " (pid " not in l]
        words = (": " + "; ".join(lines[-3:])) if lines else ""
        return "hvlrun exited with code %s%s" % (code, words)


def _fileno(stream: IO) -> Optional[int]:
    """The descriptor hvlrun may write to directly: only a real file's (the process's own
    streams, an opened file). A stream object of another kind (a notebook kernel's, whose
    ``fileno()`` is the terminal's while its text goes to the cell) is written through."""
    if stream not in (sys.__stdout__, sys.__stderr__) and \
            not isinstance(stream, (io.TextIOWrapper, io.BufferedWriter, io.FileIO)):
        return None
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _write(stream: IO, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError):
        pass
    except TypeError:             # a binary stream
        stream.write(text.encode("utf-8"))


def _pump(source, sink: IO) -> None:
    for raw in iter(source.readline, b""):
        _write(sink, raw.decode("utf-8", "replace"))
    source.close()

