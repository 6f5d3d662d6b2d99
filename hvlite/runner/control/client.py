"""The clients' end of the control channel (rank wrappers and host guards).

Contract:
  * :meth:`ControlClient.connect` opens the TCP connection to ``host:port``, exchanges hellos
    (``hvlite/protocol/wire.py``) and starts one background thread; it raises
    :class:`ControlError`, with the address and the cause, when hvlrun cannot be reached or the
    handshake fails.
  * :meth:`ControlClient.send` seals and sends one message (any thread); it returns False once
    the channel is broken, and never raises.
  * The thread sends ``ping`` every heartbeat interval and reads hvlrun's lines. ``stop <reason>``
    calls ``on_stop(reason)``. ``on_lost(reason)`` is called, once, when hvlrun is gone: its
    connection closed or broke, or (heartbeat timeout T > 0) nothing authentic came for T
    seconds. Neither is called after :meth:`close`. Lines that fail authentication are dropped
    and counted (:attr:`rejected`), never acted on. Callbacks run on the thread; they must not
    call :meth:`close`.
"""

import socket
import threading
import time
from typing import Callable, Optional

from ...protocol.wire import MAX_LINE, Rejected, Session, heartbeat_interval

__all__ = ["ControlError", "ControlClient"]


class ControlError(OSError):
    """hvlrun's control channel cannot be reached or refused the handshake."""


def _nothing(_reason: str) -> None:
    """Default callback. Cannot fail."""


class ControlClient:
    """One authenticated connection to hvlrun, with heartbeats both ways."""

    def __init__(self, addr: str, secret: str, heartbeat_timeout: float = 0.0,
                 on_lost: Callable[[str], None] = _nothing,
                 on_stop: Callable[[str], None] = _nothing,
                 on_message: Callable[[str], None] = _nothing) -> None:
        """Prepare a client (connects nothing yet).

        Args:
            addr: ``host:port`` of hvlrun's control server.
            secret: the job secret.
            heartbeat_timeout: seconds of silence after which hvlrun counts as lost; 0: never.
            on_lost: called with a reason when hvlrun is gone.
            on_stop: called with hvlrun's reason when it asks this client to stop.
            on_message: called with every other message body (e.g. ``checked``).
        """
        self.addr = addr
        self._session = Session(secret, server=False)
        self._timeout = heartbeat_timeout
        self._interval = heartbeat_interval(heartbeat_timeout)
        self._on_lost, self._on_stop, self._on_message = on_lost, on_stop, on_message
        self._sock: Optional[socket.socket] = None
        self._send_lock = threading.Lock()
        self._closing = threading.Event()
        self._broken = False
        self.rejected = 0
        self._thread = threading.Thread(target=self._run, name="hvlrun-channel", daemon=True)

    def connect(self, timeout: float = 10.0) -> "ControlClient":
        """Connect, shake hands and start the thread. Returns self.

        Raises:
            ControlError: naming the address and the cause.
        """
        host, _, port = self.addr.rpartition(":")
        try:
            self._sock = socket.create_connection((host, int(port)), timeout=timeout)
            self._sock.sendall(self._session.hello())
            self._session.accept_hello(self._read_line(timeout))
        except (OSError, ValueError) as e:  # Rejected is a ValueError
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            raise ControlError("cannot reach hvlrun's control channel at %s: %s"
                               % (self.addr, e)) from None
        self._sock.settimeout(min(self._interval, 0.25))
        self._thread.start()
        return self

    def _read_line(self, timeout: float) -> bytes:
        """Read the server's hello one byte at a time (nothing after it is consumed)."""
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            if len(line) > MAX_LINE or time.monotonic() > deadline:
                raise ControlError("no hello from hvlrun")
            byte = self._sock.recv(1)
            if not byte:
                raise ControlError("connection closed during the hello")
            line += byte
        return line

    def send(self, body: str) -> bool:
        """Send one message. Returns False (and sends nothing) once the channel is broken."""
        with self._send_lock:
            if self._sock is None or self._broken:
                return False
            try:
                self._sock.sendall(self._session.seal(body))
                return True
            except OSError:
                self._broken = True  # a partial line may be out: nothing after it can count
                return False

    def _run(self) -> None:
        """Read hvlrun's lines, send heartbeats, notice when hvlrun is gone."""
        buffer, heard, pinged = b"", time.monotonic(), 0.0
        while not self._closing.is_set():
            now = time.monotonic()
            if self._timeout > 0 and now - pinged >= self._interval:
                pinged = now
                self.send("ping")
            if self._timeout > 0 and now - heard > self._timeout:
                return self._lost("nothing heard from hvlrun for %.1f s (limit %g s)"
                                  % (now - heard, self._timeout))
            try:
                data = self._sock.recv(4096)
            except socket.timeout:
                continue
            except OSError as e:
                return self._lost("the connection to hvlrun broke: %s" % e)
            if not data:
                return self._lost("hvlrun closed the control connection")
            *lines, buffer = (buffer + data).split(b"\n")
            for line in lines:
                try:
                    body = self._session.open(line)
                except Rejected:
                    self.rejected += 1
                    continue
                heard = time.monotonic()
                if body.startswith("stop") and not self._closing.is_set():
                    self._on_stop(body[5:] or "stop")
                elif body != "ping" and not self._closing.is_set():
                    self._on_message(body)
            if len(buffer) > MAX_LINE:
                buffer = b""
                self.rejected += 1
        return None

    def _lost(self, reason: str) -> None:
        with self._send_lock:
            self._broken = True
        if not self._closing.is_set():
            self._on_lost(reason)

    def close(self) -> None:
        """Stop the thread and close the connection; no callback runs after this returns
        (unless called from a callback). Safe to call twice."""
        self._closing.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2)
        with self._send_lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
