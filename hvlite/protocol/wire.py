"""The control channel's wire format: ASCII lines, each authenticated with HMAC-SHA256.

Contract:
  * A job has one secret (:func:`new_secret`, 32 random bytes as 64 hex digits). It reaches the
    ranks in the environment (:data:`ENV_SECRET`) and the host guards on their standard input;
    it never appears on a command line.
  * A connection opens with each side sending ``hvlrun-hello 1 <nonce>`` (16 random bytes in hex)
    without waiting for the other. The session key is HMAC(secret, server nonce, client nonce),
    so a line recorded on one connection means nothing on another.
  * Every later line is ``<seq> <body> <mac>``: ``seq`` counts 1, 2, ... in each direction,
    ``body`` is printable ASCII words separated by single spaces, ``mac`` is the hex
    HMAC-SHA256 under the session key of the direction (``c`` client to server, ``s`` back), the
    sequence number and the body. A repeated, reordered or altered line fails.
  * :meth:`Session.open` returns the body of a good line and raises :class:`Rejected` (with the
    reason) for anything else: an over-long, non-ASCII or malformed line, a wrong sequence number
    or MAC, a line before the hello. Callers drop the connection on the first rejection.
  * Both ends send ``ping`` every :func:`heartbeat_interval`; the silence limit is hvlrun's
    ``--heartbeat-timeout``.
  * Pure: no sockets, no threads, nothing is deserialised beyond splitting ASCII words.
"""

import hashlib
import hmac
import secrets
from typing import Optional

__all__ = ["ENV_SECRET", "MAX_LINE", "Rejected", "Session", "new_secret", "heartbeat_interval"]

ENV_SECRET = "HVLRUN_SECRET"
MAX_LINE = 1024           # bytes, newline included; longer input is not ours
_HELLO = b"hvlrun-hello 1 "
_NONCE_HEX = 32


class Rejected(ValueError):
    """A line that is not an authentic message of this session."""


def new_secret() -> str:
    """Return a fresh job secret: 64 hex digits from the OS's random source. Cannot fail."""
    return secrets.token_hex(32)


def heartbeat_interval(timeout: float) -> float:
    """Seconds between heartbeats for a silence limit of ``timeout`` seconds (0: no limit):
    a fifth of it, so a few lost beats are no failure, between 0.1 and 2 s. Cannot fail."""
    return max(0.1, min(2.0, timeout / 5.0)) if timeout > 0 else 2.0


def _body_ok(body: str) -> bool:
    """True if ``body`` is non-empty printable ASCII words separated by single spaces."""
    words = body.split(" ")
    return bool(body) and all(w and all("!" <= c <= "~" for c in w) for w in words)


class Session:
    """One end of one connection: the handshake, then sealing and opening lines.

    Not thread-safe: callers that seal from several threads hold their own lock.
    """

    def __init__(self, secret: str, server: bool) -> None:
        """Start a session.

        Args:
            secret: the job secret (hex string).
            server: True for hvlrun's end, False for a rank wrapper's or a guard's.

        Raises:
            ValueError: if ``secret`` is empty.
        """
        if not secret:
            raise ValueError("no control channel secret")
        self._secret = secret.encode("ascii")
        self._server = server
        self.nonce = secrets.token_hex(_NONCE_HEX // 2)
        self._key: Optional[bytes] = None
        self._sent = 0
        self._received = 0

    def hello(self) -> bytes:
        """Return this side's opening line. Cannot fail."""
        return _HELLO + self.nonce.encode("ascii") + b"\n"

    @property
    def ready(self) -> bool:
        """True once the peer's hello was accepted."""
        return self._key is not None

    def accept_hello(self, line: bytes) -> None:
        """Take the peer's opening line and derive the session key.

        Raises:
            Rejected: if the line is not a hello with a well-formed nonce, or came twice.
        """
        line = line.rstrip(b"\n")
        nonce = line[len(_HELLO):]
        if (self._key is not None or not line.startswith(_HELLO) or len(nonce) != _NONCE_HEX
                or any(c not in b"0123456789abcdef" for c in nonce)):
            raise Rejected("bad hello %r" % line[:80])
        ours = self.nonce.encode("ascii")
        server_nonce, client_nonce = (ours, nonce) if self._server else (nonce, ours)
        self._key = hmac.new(self._secret, b"hvlrun session " + server_nonce + b" " + client_nonce,
                             hashlib.sha256).digest()

    def _mac(self, direction: str, seq: int, body: str) -> str:
        message = ("%s %d %s" % (direction, seq, body)).encode("ascii")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def seal(self, body: str) -> bytes:
        """Return the line carrying ``body``.

        Raises:
            ValueError: before the handshake, or if ``body`` is not printable ASCII words.
        """
        if self._key is None:
            raise ValueError("seal before the handshake")
        if not _body_ok(body):
            raise ValueError("bad message body %r" % body)
        self._sent += 1
        direction = "s" if self._server else "c"
        line = ("%d %s %s\n" % (self._sent, body, self._mac(direction, self._sent, body)))
        return line.encode("ascii")

    def open(self, line: bytes) -> str:
        """Check one line from the peer and return its body.

        Raises:
            Rejected: on anything but the next authentic line of this session.
        """
        if self._key is None:
            raise Rejected("message before the hello")
        if len(line) > MAX_LINE:
            raise Rejected("line of %d bytes" % len(line))
        try:
            text = line.rstrip(b"\n").decode("ascii")
        except UnicodeDecodeError:
            raise Rejected("non-ASCII line") from None
        seq_text, _, rest = text.partition(" ")
        body, _, mac = rest.rpartition(" ")
        if not (seq_text.isdigit() and _body_ok(body) and len(mac) == 64):
            raise Rejected("malformed line %r" % text[:80])
        direction = "c" if self._server else "s"
        if not hmac.compare_digest(mac, self._mac(direction, int(seq_text), body)):
            raise Rejected("bad MAC on %r" % body[:80])
        if int(seq_text) != self._received + 1:
            raise Rejected("sequence %s after %d (replayed or reordered)" % (seq_text, self._received))
        self._received += 1
        return body
