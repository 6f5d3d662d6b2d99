"""The workers' end of the elastic driver's commit store (``runner/elastic/commit_store.py``).

Contract:
  * A world's rank 0 opens one :class:`CommitClient` to ``HVLRUN_ELASTIC_STORE`` with the key in
    ``HVLRUN_ELASTIC_KEY`` (``elastic_env.py``) and keeps it for the world's life. Requests are
    synchronous and not thread-safe (one caller at a time).
  * :meth:`put` sends a commit and returns once hvlrun has it on disk; :meth:`fetch` returns the
    last commit (its bytes are checked against the authenticated digest); :meth:`updates`
    asks whether the driver wants the world to stop at this commit; :meth:`ready` reports that
    the world's state is restored and checked on every rank.
  * Every failure raises :class:`CommitStoreError` naming the store's address and the cause:
    hvlrun cannot be reached, the handshake or a line fails authentication, the connection
    breaks, the store refuses (e.g. the world is over), or no progress for ``timeout`` seconds.
  * Imports nothing of the engine: it runs in training processes (``hvlite.elastic``) and in
    tests alike.
"""

import hashlib
import socket
from typing import Optional, Tuple

from .wire import MAX_LINE, Rejected, Session

__all__ = ["CommitStoreError", "CommitClient"]

_CHUNK = 4 << 20


class CommitStoreError(OSError):
    """The commit store cannot be reached, refused a request, or the connection broke."""


class CommitClient:
    """One authenticated connection to hvlrun's commit store."""

    def __init__(self, addr: str, key: str, timeout: float = 60.0) -> None:
        """Prepare a client (connects nothing yet).

        Args:
            addr: ``host:port`` of the store.
            key: the job's commit key.
            timeout: seconds without progress after which a request fails.

        Raises:
            CommitStoreError: the key is empty.
        """
        if not key:
            raise CommitStoreError("no commit store key (HVLRUN_ELASTIC_KEY) for %s" % addr)
        self.addr = addr
        self._session = Session(key, server=False)
        self._timeout = timeout
        self._sock: Optional[socket.socket] = None
        self._reader = None

    def connect(self) -> "CommitClient":
        """Connect and shake hands. Returns self.

        Raises:
            CommitStoreError: naming the address and the cause.
        """
        host, _, port = self.addr.rpartition(":")
        try:
            self._sock = socket.create_connection((host, int(port)), timeout=self._timeout)
            # a request is two writes (line, bytes) then a read: with Nagle's delay that met
            # the store's delayed ACK, every commit took 40 ms more
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._reader = self._sock.makefile("rb")
            self._sock.sendall(self._session.hello())
            self._session.accept_hello(self._reader.readline(MAX_LINE + 1))
        except (OSError, ValueError) as e:   # Rejected is a ValueError
            self.close()
            raise CommitStoreError("cannot reach hvlrun's commit store at %s: %s"
                                   % (self.addr, e)) from None
        return self

    def _fail(self, what: str) -> CommitStoreError:
        self.close()
        return CommitStoreError("hvlrun's commit store at %s: %s" % (self.addr, what))

    def _request(self, body: str, payload: bytes = b"") -> str:
        """Send one request (and its bytes); return the answer's body."""
        if self._sock is None:
            raise self._fail("not connected")
        try:
            self._sock.sendall(self._session.seal(body))
            view = memoryview(payload)
            for start in range(0, len(view), _CHUNK):
                self._sock.sendall(view[start:start + _CHUNK])
            line = self._reader.readline(MAX_LINE + 1)
            if not line:
                raise self._fail("connection closed (the world is being re-formed?)")
            return self._session.open(line)
        except Rejected as e:
            raise self._fail("bad answer: %s" % e) from None
        except OSError as e:
            if isinstance(e, CommitStoreError):
                raise
            raise self._fail(str(e)) from None

    def put(self, world: int, data: bytes) -> Tuple[int, int]:
        """Store ``data`` as the job's commit, made by ``world``.

        Returns:
            ``(seq, updates)``: the commit's number and the driver's re-form requests in this
            world (non-zero: stop here).
        Raises:
            CommitStoreError: not stored (refused, or the connection broke).
        """
        digest = hashlib.sha256(data).hexdigest()
        answer = self._request("put %d %d %s" % (world, len(data), digest), data).split(" ")
        if answer[0] == "stored" and len(answer) == 3:
            return int(answer[1]), int(answer[2])
        raise self._fail("commit not stored: %s" % " ".join(answer))

    def fetch(self) -> Optional[Tuple[int, int, bytes]]:
        """Return ``(seq, world, data)`` of the last commit, or None if there is none.

        Raises:
            CommitStoreError: as the module says, or the bytes do not match their digest.
        """
        answer = self._request("fetch").split(" ")
        if answer == ["none"]:
            return None
        if answer[0] != "commit" or len(answer) != 5:
            raise self._fail("unexpected answer %r" % " ".join(answer)[:80])
        seq, world, size, sha256 = int(answer[1]), int(answer[2]), int(answer[3]), answer[4]
        try:
            data = self._reader.read(size)
        except OSError as e:
            raise self._fail(str(e)) from None
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
            raise self._fail("commit %d arrived incomplete or altered" % seq)
        return seq, world, data

    def updates(self, world: int) -> int:
        """Return the driver's re-form requests in ``world`` (non-zero: stop at this commit)."""
        answer = self._request("updates %d" % world).split(" ")
        if answer[0] == "updates" and len(answer) == 2:
            return int(answer[1])
        raise self._fail(" ".join(answer))

    def ready(self, world: int, seq: int) -> None:
        """Report that ``world`` restored commit ``seq`` (0: none) and checked it on every rank."""
        answer = self._request("ready %d %d" % (world, seq))
        if answer != "ok":
            raise self._fail(answer)

    def close(self) -> None:
        """Close the connection. Safe to call twice."""
        for closable in (self._reader, self._sock):
            if closable is not None:
                try:
                    closable.close()
                except OSError:
                    pass
        self._reader = self._sock = None
