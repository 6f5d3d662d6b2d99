"""The node agent: what a Ray actor or a Spark task runs for hvlrun on its node.

An agent lives inside the engine's worker process (the actor, the task) as a TCP server on the
node's address, with its own threads. It plays two parts:

  * **The far end of hvlrun's remote shell.** hvlrun reaches other hosts through a remote shell
    (``--ssh-command``); on a cluster engine that shell is ``python -m hvlite.cluster.rsh``,
    which asks the agent of the host's first slot to run the command (``run``). The agent runs
    it as sshd would: ``/bin/sh -c COMMAND`` in a new session, with the request's variables
    added, the request's bytes on its standard input, its output and exit code sent back
    (``out``/``err`` frames, then ``exit``). When the requester goes away first, the command's
    process group gets SIGTERM (the host guard then ends everything below it), and SIGKILL
    :data:`KILL_GRACE_SECONDS` later. So the host guard, MPI's proxy and the ranks of this host
    are the agent's children, placed, counted and killed with the actor or task.
  * **The door of one rank's process.** The rank process of this slot (``worker.py``) connects
    and says ``hello`` (its rank, world and pid). The agent answers with the slot's setup
    (variables such as ``CUDA_VISIBLE_DEVICES``, the working directory and ``sys.path`` of the
    engine's worker), then either relays calls one at a time (:meth:`Agent.call`: the Ray
    executor's stateful workers) or, when a job was set (:meth:`Agent.set_job`: Spark, elastic
    runs), hands every rank process that connects the job's call and keeps its result by world
    and rank (:meth:`Agent.results`). A rank stand-in (``standin.py``: Ray Train, where the
    engine's worker itself is the rank) gets frames from the owner (:meth:`Agent.tell_worker`)
    and sends ``notice`` frames, handed to the owner's ``on_notice``.

Driver-side requests: ``ping`` (``pong``), ``results`` (a pickle of the kept results, for the
driver to read) and ``finish`` (:meth:`Agent.wait_finished` returns: the Spark task may end).

Contract: every frame is authenticated with the job's key (``frames.py``); a connection whose
first frame is not one of the above is closed. The agent unpickles nothing: calls and results
pass through it as bytes. :meth:`Agent.close` ends the rank process's connection, the commands
still running (as above) and the server, within a bound. No method raises for what a peer
does, except :meth:`Agent.call` and :meth:`Agent.wait_worker`, which raise :class:`WorkerGone`.
"""
import base64
import json
import os
import pickle
import signal
import socket
import subprocess
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from .frames import Channel, ChannelError

__all__ = ["KILL_GRACE_SECONDS", "STATUS", "WorkerGone", "Agent", "local_address"]

KILL_GRACE_SECONDS = 10.0    # the host guard needs a few seconds to end what is below it
# A result's first byte (``worker.py``): the value, the function's own failure, or a failure
# that another rank's caused (hvlite's error saying a peer is gone or stopped).
# ``b"3"``: the function returned, but its value cannot be pickled (the rank goes on).
STATUS = {b"1": "ok", b"0": "raised", b"2": "consequence", b"3": "unpicklable"}
_MAX_STDIN = 1 << 16


class WorkerGone(RuntimeError):
    """The rank process of this slot is not (or no longer) connected."""


def local_address(toward: str) -> str:
    """Return this machine's IPv4 address on the route to ``toward`` (an address or name):
    the address a peer there reaches us at. Sends nothing (a UDP socket's connect only picks
    the route). Raises OSError when there is no route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((toward, 9))
        return s.getsockname()[0]


class _Command:
    """One command run for a remote shell request."""

    def __init__(self, channel: Channel, request: dict) -> None:
        self.channel = channel
        env = dict(os.environ, **{k: str(v) for k, v in request.get("env", {}).items()})
        self.proc = subprocess.Popen(["/bin/sh", "-c", request["command"]], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        stdin = base64.b64decode(request.get("stdin", ""))[:_MAX_STDIN]
        try:
            self.proc.stdin.write(stdin)
            self.proc.stdin.close()
        except OSError:
            pass                      # the command did not read it: its own business

    def pump(self, source, kind: str) -> None:
        for chunk in iter(lambda: source.read1(65536), b""):
            try:
                self.channel.send(kind, chunk)
            except ChannelError:
                pass                  # keep draining: the command must not block on a pipe
        source.close()

    def end(self) -> None:
        """SIGTERM the command's process group, SIGKILL it after the grace. Cannot fail."""
        for signum, wait in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, 1.0)):
            try:
                os.killpg(self.proc.pid, signum)
            except OSError:
                return
            try:
                self.proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


class Agent:
    """A node agent (see the module contract)."""

    def __init__(self, key: str, bind: str,
                 on_notice: Optional[Callable[[bytes], None]] = None) -> None:
        """Bind the server on ``bind`` (the node's address), port chosen by the system.

        Args:
            key: the job's key.
            bind: the address to listen on.
            on_notice: called (on the agent's thread) with the bytes of each ``notice`` frame
                the connected rank process sends; it must not block.

        Raises:
            OSError: the address cannot be bound.
        """
        self._key = key
        self._on_notice = on_notice
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((bind, 0))
        self._listener.listen(64)
        self.address = "%s:%d" % (bind, self._listener.getsockname()[1])
        self._lock = threading.Condition()
        self._closing = False
        self._setup: dict = {}
        self._job: Optional[bytes] = None
        self._worker: Optional[Channel] = None
        self.worker_info: Optional[dict] = None
        self._answers: List[Tuple[str, bytes]] = []
        self._calling = threading.Lock()      # one call at a time: they share ``_answers``
        self._turn = 0                        # the ``seq`` of the call whose turn it is
        self._gone = ""                       # why the connected rank process went away
        self._results: List[Tuple[int, int, str, bytes]] = []
        self._commands: List[_Command] = []
        self._channels: List[Channel] = []
        self._finished = threading.Event()
        threading.Thread(target=self._accept, name="hvlite-agent", daemon=True).start()

    # --- the owner's side ------------------------------------------------------------------
    def set_setup(self, env: Dict[str, str], cwd: str, path: List[str]) -> None:
        """What every rank process of this slot applies before anything else."""
        with self._lock:
            self._setup = {"env": dict(env), "cwd": cwd, "path": list(path)}

    def set_job(self, payload: bytes) -> None:
        """Hand ``payload`` (a pickled call) to every rank process that connects from now on;
        the results of an earlier job are forgotten (each job's hvlrun numbers its worlds
        from 1 again)."""
        with self._lock:
            self._job = payload
            self._results = []

    def wait_worker(self, timeout: float) -> dict:
        """Wait until this slot's rank process connected; return its hello (rank, world, pid).

        Raises:
            WorkerGone: none connected within ``timeout`` seconds, or the agent is closing.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._worker is None and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WorkerGone("no rank process connected within %g s" % timeout)
                self._lock.wait(left)
            if self._worker is None:
                raise WorkerGone("the agent is closing")
            return dict(self.worker_info)

    def call(self, payload: bytes, seq: Optional[int] = None) -> Tuple[str, bytes]:
        """Send a call to the connected rank process and wait for its answer: ``("ok", the
        pickled value)``, ``("raised" | "consequence", traceback text)`` or ``("unpicklable",
        why)`` (:data:`STATUS`).

        Calls are served one at a time. ``seq`` (0, 1, 2, ... as the driver issued them) makes
        them run in that order whatever order they arrive in: call ``seq`` waits until call
        ``seq - 1`` was answered (or failed). Without it, in arrival order.

        Raises:
            WorkerGone: no rank process is connected, or it went away before answering.
        """
        if seq is None:
            with self._calling:
                return self._call(payload)
        with self._lock:
            while self._turn != seq and not self._closing:
                self._lock.wait(1.0)
        try:
            if self._closing:
                raise WorkerGone("the agent is closing")
            with self._calling:
                return self._call(payload)
        finally:
            with self._lock:
                self._turn = max(self._turn, seq + 1)
                self._lock.notify_all()

    def _call(self, payload: bytes) -> Tuple[str, bytes]:
        with self._lock:
            worker = self._worker
            if worker is None:
                raise WorkerGone(self._gone or "no rank process is connected")
            self._answers = []
        try:
            worker.send("call", payload)
        except ChannelError as e:
            raise WorkerGone("the rank process went away: %s" % e) from None
        with self._lock:
            while not self._answers and self._worker is worker:
                self._lock.wait(1.0)
            if not self._answers:
                raise WorkerGone(self._gone or "the rank process went away")
            kind, data = self._answers.pop(0)
        return STATUS.get(data[:1], "raised"), data[1:]

    def stop_worker(self) -> None:
        """Ask the connected rank process to exit with code 0 (the end of a job). Cannot fail."""
        self.tell_worker("stop")

    def tell_worker(self, kind: str, data: bytes = b"") -> bool:
        """Send one frame to the connected rank process; False when none is connected (or it
        is gone). Cannot fail."""
        with self._lock:
            worker = self._worker
        if worker is None:
            return False
        try:
            worker.send(kind, data)
            return True
        except ChannelError:
            return False

    def results(self) -> List[Tuple[int, int, str, bytes]]:
        """The results of the job's calls: ``(world, rank, status, bytes)`` in arrival order."""
        with self._lock:
            return list(self._results)

    def wait_finished(self, timeout: Optional[float] = None) -> bool:
        """Wait until the driver sent ``finish`` (or the agent closed); True if it did."""
        return self._finished.wait(timeout)

    def close(self) -> None:
        """End the rank process's connection, the commands still running and the server.
        Returns within about :data:`KILL_GRACE_SECONDS`. Safe to call twice."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._lock.notify_all()
            channels, commands = list(self._channels), list(self._commands)
        self._finished.set()
        try:
            self._listener.close()
        except OSError:
            pass
        for channel in channels:
            channel.close()
        enders = [threading.Thread(target=c.end, daemon=True) for c in commands]
        for t in enders:
            t.start()
        for t in enders:
            t.join(KILL_GRACE_SECONDS + 2)

    # --- the server's threads ------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return                        # closed
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            channel = Channel(sock, self._key, server=True).handshake()
        except (ChannelError, OSError):
            return
        with self._lock:
            if self._closing:
                channel.close()
                return
            self._channels.append(channel)
        try:
            kind, data = channel.recv()
            if kind == "run":
                self._run(channel, json.loads(data.decode("utf-8")))
            elif kind == "hello":
                self._worker_session(channel, json.loads(data.decode("utf-8")))
            elif kind == "ping":
                channel.send("pong")
            elif kind == "results":
                channel.send("results", pickle.dumps(self.results()))
            elif kind == "finish":
                self._finished.set()
                channel.send("finished")
        except (ChannelError, ValueError, KeyError, OSError):
            pass
        finally:
            channel.close()
            with self._lock:
                if channel in self._channels:
                    self._channels.remove(channel)

    def _run(self, channel: Channel, request: dict) -> None:
        """A remote shell request: run, stream, report the exit code (see the module)."""
        try:
            command = _Command(channel, request)
        except OSError as e:
            channel.send("err", ("hvlite agent: cannot run the command: %s\n" % e).encode())
            channel.send("exit", b"127")
            return
        with self._lock:
            self._commands.append(command)
            closing = self._closing
        if closing:
            command.end()
        pumps = [threading.Thread(target=command.pump, args=(src, kind), daemon=True)
                 for src, kind in ((command.proc.stdout, "out"), (command.proc.stderr, "err"))]
        for pump in pumps:
            pump.start()
        # the requester going away (hvlrun ended the launcher) ends the command, as sshd would
        watcher = threading.Thread(target=self._watch_requester, args=(channel, command),
                                   daemon=True)
        watcher.start()
        code = command.proc.wait()
        for pump in pumps:
            pump.join(5.0)
        code = 128 - code if code < 0 else code
        try:
            channel.send("exit", str(code).encode())
        except ChannelError:
            pass
        with self._lock:
            self._commands.remove(command)

    @staticmethod
    def _watch_requester(channel: Channel, command: _Command) -> None:
        try:
            while True:
                channel.recv()                # nothing more is expected: only the end
        except ChannelError:
            pass
        if command.proc.poll() is None:
            command.end()

    def _worker_session(self, channel: Channel, hello: dict) -> None:
        """A rank process of this slot: set it up, then relay calls or run the job."""
        with self._lock:
            job, setup = self._job, self._setup
            if self._worker is not None:
                channel.send("refused", b"this slot already has a rank process")
                return
            self._worker, self.worker_info, self._gone = channel, hello, ""
            self._lock.notify_all()
        why = "the rank process closed its connection"
        try:
            channel.send("setup", json.dumps(setup).encode("utf-8"))
            if job is not None:
                channel.send("job", job)
            while True:
                kind, data = channel.recv()
                if kind == "notice" and self._on_notice is not None:
                    self._on_notice(data)
                if kind != "result":
                    continue
                with self._lock:
                    if job is not None:
                        self._results.append((int(hello.get("world", 0)), int(hello["rank"]),
                                              STATUS.get(data[:1], "raised"), data[1:]))
                    else:
                        self._answers.append((kind, data))
                    self._lock.notify_all()
        except ChannelError as e:
            why = "rank %s's process ended (%s)" % (hello.get("rank"), e)
        finally:
            with self._lock:
                if self._worker is channel:
                    self._worker, self._gone = None, why
                self._lock.notify_all()
