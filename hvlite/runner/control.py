"""Control channel between ``hvlrun`` and the per-rank wrappers.

Contract:
  * ``hvlrun`` runs one :class:`ControlServer` (TCP, bound to 0.0.0.0, ephemeral port) and passes
    ``HVLRUN_CONTROL_ADDR=host:port`` to every rank.
  * Each wrapper opens one connection (:class:`ControlClient`) and sends ASCII lines
    ``start <rank> <pid> <host>`` when its child started and ``exit <rank> <code>`` when the
    child ended (code is 128+signum for a signal). Sending is best effort: a wrapper that
    cannot connect carries on silently.
  * ``HVLRUN_OUTPUT_DIR`` (:data:`ENV_OUTPUT_DIR`), the other variable hvlrun sets for the
    wrappers, is named here too so that ``launch`` need not import ``rank_exec``.
  * The server records messages in arrival order on one background thread; malformed lines are
    ignored. All its query methods may be called from any thread.
"""

import selectors
import socket
import threading
import time
from typing import Dict, List, Optional, Tuple

__all__ = ["ENV_CONTROL_ADDR", "ENV_OUTPUT_DIR", "ControlServer", "ControlClient"]

ENV_CONTROL_ADDR = "HVLRUN_CONTROL_ADDR"
ENV_OUTPUT_DIR = "HVLRUN_OUTPUT_DIR"


class ControlServer:
    """Listens for wrapper messages on a background thread.

    Shared fields (``_started``, ``_exits``, ``_open``, ``_rounds``) are guarded by ``_lock``.
    """

    def __init__(self, bind_host: str = "0.0.0.0") -> None:
        """Open the listening socket (does not start the thread).

        Args:
            bind_host: address to bind; the port is chosen by the system.

        Raises:
            OSError: if the socket cannot be bound.
        """
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((bind_host, 0))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._started: Dict[int, Tuple[int, str]] = {}
        self._exits: List[Tuple[int, int]] = []
        self._open = 0
        self._rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hvlrun-control", daemon=True)

    def start(self) -> "ControlServer":
        """Start the background thread. Returns self."""
        self._thread.start()
        return self

    def _serve(self) -> None:
        """Accept connections and read lines until :meth:`close`."""
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, None)
        buffers: Dict[socket.socket, bytes] = {}
        while not self._stop.is_set():
            with self._lock:
                self._rounds += 1
            for key, _ in sel.select(timeout=0.05):
                if key.fileobj is self._listener:
                    try:
                        conn, _ = self._listener.accept()
                    except OSError:
                        continue
                    conn.setblocking(False)
                    sel.register(conn, selectors.EVENT_READ, None)
                    buffers[conn] = b""
                    with self._lock:
                        self._open += 1
                    continue
                conn = key.fileobj
                try:
                    data = conn.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                *lines, buffers[conn] = (buffers[conn] + data).split(b"\n")
                for line in lines:
                    self._handle(line.decode("ascii", "replace"))
                if not data or len(buffers[conn]) > 4096:  # closed, or not our protocol
                    sel.unregister(conn)
                    conn.close()
                    del buffers[conn]
                    with self._lock:
                        self._open -= 1
        for conn in buffers:
            conn.close()
        sel.close()

    def _handle(self, line: str) -> None:
        """Record one message; ignore anything malformed."""
        fields = line.split()
        try:
            if fields[0] == "start" and len(fields) == 4:
                with self._lock:
                    self._started[int(fields[1])] = (int(fields[2]), fields[3])
            elif fields[0] == "exit" and len(fields) == 3:
                with self._lock:
                    self._exits.append((int(fields[1]), int(fields[2])))
        except (IndexError, ValueError):
            pass

    def started_ranks(self) -> Dict[int, Tuple[int, str]]:
        """Return ``{rank: (pid, host)}`` for every rank that reported ``start``."""
        with self._lock:
            return dict(self._started)

    def exits(self) -> List[Tuple[int, int]]:
        """Return the ``(rank, code)`` exit reports in arrival order."""
        with self._lock:
            return list(self._exits)

    def first_failure(self) -> Optional[Tuple[int, int]]:
        """Return the earliest ``(rank, code)`` with a non-zero code, or None."""
        return next(((r, c) for r, c in self.exits() if c != 0), None)

    def wait_quiet(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, until no wrapper connection is open and the
        server has looked for new connections at least once since this call."""
        deadline = time.monotonic() + timeout
        with self._lock:
            first = self._rounds
        while time.monotonic() < deadline and self._thread.is_alive():
            with self._lock:
                if self._open == 0 and self._rounds >= first + 2:
                    return
            time.sleep(0.01)

    def close(self) -> None:
        """Stop the thread and close the listening socket. Safe to call twice."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._listener.close()


class ControlClient:
    """One wrapper's best-effort connection to ``hvlrun``; every method swallows errors."""

    def __init__(self, addr: Optional[str], timeout: float = 5.0) -> None:
        """Connect to ``host:port``; stay disconnected if ``addr`` is empty or unreachable.

        Args:
            addr: the value of ``HVLRUN_CONTROL_ADDR``, or None.
            timeout: seconds for connecting and for each send.
        """
        self._sock: Optional[socket.socket] = None
        if not addr:
            return
        host, _, port = addr.rpartition(":")
        try:
            self._sock = socket.create_connection((host, int(port)), timeout=timeout)
        except (OSError, ValueError):
            self._sock = None

    def send(self, line: str) -> None:
        """Send one message line; on failure, give up on the channel."""
        if self._sock is None:
            return
        try:
            self._sock.sendall(line.encode("ascii", "replace") + b"\n")
        except OSError:
            self.close()

    def close(self) -> None:
        """Close the connection. Safe to call twice."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
