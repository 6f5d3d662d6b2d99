"""Authenticated frames between the driver's side, the node agents and the rank workers.

Contract:
  * One connection carries frames in both directions, each an authenticated line of
    ``hvlite/protocol/wire.py`` (``<kind> <nbytes> <sha256>``: the session's MAC covers the
    kind, the length and the digest) followed by ``nbytes`` raw bytes that must match the
    digest. So every byte is authenticated with the job's key, and bulk data (a pickled
    function, a result, a command's output) needs no escaping.
  * :class:`Channel` wraps a connected socket: :meth:`Channel.handshake` exchanges hellos (both
    sides send at once), :meth:`Channel.send` (any thread: one lock) and :meth:`Channel.recv`
    (one reader). ``recv`` raises :class:`ChannelClosed` at a clean end of the stream and
    :class:`ChannelError` (an ``OSError``) for anything else: a broken connection, a rejected
    line, bytes that do not match their digest, a frame over :data:`MAX_FRAME`.
  * Nothing here unpickles: a frame's bytes are handed to the caller as they came.
"""
import hashlib
import socket
import threading
from typing import Optional, Tuple

from ..protocol.wire import MAX_LINE, Rejected, Session

__all__ = ["MAX_FRAME", "ChannelError", "ChannelClosed", "Channel", "connect"]

MAX_FRAME = 1 << 31          # 2 GiB: a function's arguments or a result, pickled
_CHUNK = 1 << 20


class ChannelError(OSError):
    """The peer is gone, or sent something that is not an authentic frame."""


class ChannelClosed(ChannelError):
    """The peer closed the connection between two frames."""


def _kind_ok(kind: str) -> bool:
    return bool(kind) and kind.isascii() and kind.isalnum()


class Channel:
    """Frames over one socket (see the module contract)."""

    def __init__(self, sock: socket.socket, key: str, server: bool) -> None:
        """Args: a connected socket (owned from now on), the job's key, and which end this is
        (the listening side is the server)."""
        self.sock = sock
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader = sock.makefile("rb")
        self._session = Session(key, server=server)
        self._send_lock = threading.Lock()
        self.peer = "%s:%d" % sock.getpeername()[:2]

    def handshake(self, timeout: Optional[float] = 10.0) -> "Channel":
        """Exchange hellos; return self. Raises :class:`ChannelError`."""
        try:
            self.sock.settimeout(timeout)
            self.sock.sendall(self._session.hello())
            self._session.accept_hello(self._reader.readline(MAX_LINE + 1))
            self.sock.settimeout(None)
        except (OSError, ValueError) as e:
            self.close()
            raise ChannelError("no handshake with %s: %s" % (self.peer, e)) from None
        return self

    def send(self, kind: str, data: bytes = b"") -> None:
        """Send one frame. Raises :class:`ChannelError` when the connection is broken."""
        if not _kind_ok(kind):
            raise ValueError("bad frame kind %r" % kind)
        digest = hashlib.sha256(data).hexdigest()
        with self._send_lock:
            try:
                self.sock.sendall(self._session.seal("%s %d %s" % (kind, len(data), digest)))
                view = memoryview(data)
                for start in range(0, len(view), _CHUNK):
                    self.sock.sendall(view[start:start + _CHUNK])
            except OSError as e:
                raise ChannelError("cannot send to %s: %s" % (self.peer, e)) from None

    def recv(self) -> Tuple[str, bytes]:
        """Return the next frame as ``(kind, data)``. Raises :class:`ChannelClosed` or
        :class:`ChannelError` (see the module contract)."""
        try:
            line = self._reader.readline(MAX_LINE + 1)
        except OSError as e:
            raise ChannelError("connection to %s broke: %s" % (self.peer, e)) from None
        if not line:
            raise ChannelClosed("%s closed the connection" % self.peer)
        try:
            words = self._session.open(line).split(" ")
        except Rejected as e:
            raise ChannelError("rejected a line from %s: %s" % (self.peer, e)) from None
        if len(words) != 3 or not _kind_ok(words[0]) or not words[1].isdigit():
            raise ChannelError("malformed frame from %s: %r" % (self.peer, " ".join(words)[:80]))
        kind, size, digest = words[0], int(words[1]), words[2]
        if size > MAX_FRAME:
            raise ChannelError("frame of %d bytes from %s" % (size, self.peer))
        try:
            data = self._reader.read(size) if size else b""
        except OSError as e:
            raise ChannelError("connection to %s broke: %s" % (self.peer, e)) from None
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            raise ChannelError("a %s frame from %s arrived incomplete or altered"
                               % (kind, self.peer))
        return kind, data

    def close(self) -> None:
        """Close the connection (a reader blocked in :meth:`recv` gets an error). Safe twice."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        for closable in (self._reader, self.sock):
            try:
                closable.close()
            except OSError:
                pass


def connect(addr: str, key: str, timeout: float = 10.0) -> Channel:
    """Connect to ``host:port`` and shake hands. Raises :class:`ChannelError` naming it."""
    host, _, port = addr.rpartition(":")
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except (OSError, ValueError) as e:
        raise ChannelError("cannot connect to %s: %s" % (addr, e)) from None
    return Channel(sock, key, server=False).handshake(timeout)
