"""The elastic driver's commit store: where the last commit lives while workers come and go.

Contract:
  * One :class:`CommitStore` per elastic job, inside hvlrun (which outlives every worker). It
    listens on TCP; a world's rank 0 connects with ``hvlite.protocol.commit_client.CommitClient``,
    using the job's commit key (``HVLRUN_ELASTIC_KEY``). Request and answer lines are
    authenticated as on the control channel (``hvlite/protocol/wire.py``: HMAC per line, bound to
    the connection); bulk bytes follow a line that carries their length and SHA-256, so they are
    authenticated too.
  * Requests: ``put <world> <nbytes> <sha256>`` + bytes -> ``stored <seq> <updates>`` or
    ``refused <why>``; ``fetch`` -> ``commit <seq> <world> <nbytes> <sha256>`` + bytes, or
    ``none``; ``updates <world>`` -> ``updates <n>`` (or ``refused``); ``ready <world> <seq>``
    -> ``ok``. ``<updates>``/``<n>`` count the driver's :meth:`request_reform` calls in that
    world: non-zero tells the workers to stop at this commit.
  * A commit is accepted only from the world that is open (:meth:`open_world`) and only whole:
    its bytes are written to ``<directory>/commit.tmp``, checked against the digest, flushed
    to disk and renamed over ``<directory>/commit``; only then does the answer say
    ``stored``. :meth:`close_world` (called before a world is ended) closes every connection,
    so a commit still in transfer is dropped and the previous one stays. Nothing received is
    deserialised here: the bytes are stored and served as they are.
  * Rejected input (no or bad hello, bad MAC, malformed line, digest mismatch) is counted
    (:meth:`rejected`) and closes the connection; it is never acted on.
  * Threads: one accepting, one per connection; every public method may be called from any
    thread.
"""

import hashlib
import os
import socket
import threading
import time
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

from ...protocol.wire import MAX_LINE, Rejected, Session

__all__ = ["CommitInfo", "CommitStore"]

_HELLO_SECONDS = 10.0
_TRANSFER_SECONDS = 60.0      # longest wait for the next bytes of a transfer
_CHUNK = 1 << 20


class CommitInfo(NamedTuple):
    """A stored commit: its number (1, 2, ... over the job), the world that made it, its size
    in bytes, its SHA-256 (hex) and when it was stored (``time.monotonic()``)."""
    seq: int
    world: int
    size: int
    sha256: str
    at: float


class _Closed(Exception):
    """The connection ended or broke."""


class _Conn:
    """One client connection: authenticated lines and raw bytes over a buffered socket."""

    def __init__(self, sock: socket.socket, key: str) -> None:
        self.sock = sock
        self.reader = sock.makefile("rb")
        self.session = Session(key, server=True)

    def line(self) -> bytes:
        try:
            data = self.reader.readline(MAX_LINE + 1)
        except (OSError, ValueError):
            raise _Closed() from None
        if not data:
            raise _Closed()
        return data

    def send(self, body: str) -> None:
        try:
            self.sock.sendall(self.session.seal(body))
        except OSError:
            raise _Closed() from None

    def read_into(self, nbytes: int, sink, hasher) -> None:
        left = nbytes
        while left:
            try:
                data = self.reader.read(min(left, _CHUNK))
            except (OSError, ValueError):
                raise _Closed() from None
            if not data:
                raise _Closed()
            hasher.update(data)
            sink.write(data)
            left -= len(data)


class CommitStore:
    """Keeps the job's last commit (see the module contract)."""

    def __init__(self, key: str, directory: str, bind_host: str = "127.0.0.1") -> None:
        """Open the listening socket (does not start the thread).

        Args:
            key: the commit key every client must prove it knows.
            directory: an existing private directory for the commit file.
            bind_host: address to bind; the port is chosen by the system.

        Raises:
            OSError: if the socket cannot be bound.
        """
        self._key = key
        self.path = os.path.join(directory, "commit")
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((bind_host, 0))
        self._listener.listen(16)
        self._listener.settimeout(0.2)
        self.bind_host, self.port = self._listener.getsockname()[:2]
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._latest: Optional[CommitInfo] = None
        self._world: Optional[int] = None
        self._updates = 0
        self._conns: Set[socket.socket] = set()
        self._ready: Dict[int, Tuple[int, float]] = {}
        self._rejected: List[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="hvlrun-commits", daemon=True)

    def start(self) -> "CommitStore":
        """Start accepting. Returns self."""
        self._thread.start()
        return self

    # --- the driver's side -------------------------------------------------------------------
    def open_world(self, world: int) -> None:
        """Accept commits from ``world`` from now on (and from no other)."""
        with self._lock:
            self._world, self._updates = world, 0

    def close_world(self) -> None:
        """Accept no commit until the next :meth:`open_world`; drop every connection (a commit
        in transfer is lost, the previous one stays)."""
        with self._lock:
            self._world = None
            conns, self._conns = list(self._conns), set()
        for sock in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def request_reform(self) -> None:
        """Tell the open world's workers, at their next commit or host check, to stop there."""
        with self._lock:
            if self._world is not None:
                self._updates += 1

    def latest(self) -> Optional[CommitInfo]:
        """Return the last stored commit, or None before the first."""
        with self._lock:
            return self._latest

    def ready(self, world: int) -> Optional[Tuple[int, float]]:
        """Return ``(commit seq, time)`` of world's ready report (its state restored and
        checked on every rank), or None if it has not come."""
        with self._lock:
            return self._ready.get(world)

    def rejected(self) -> List[str]:
        """Return a description of every rejected input."""
        with self._lock:
            return list(self._rejected)

    def close(self) -> None:
        """Stop accepting and drop every connection. Safe to call twice."""
        self._stop.set()
        self.close_world()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._listener.close()

    # --- the threads ------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                sock, addr = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                self._conns.add(sock)
            threading.Thread(target=self._serve, args=(sock, "%s:%d" % addr[:2]),
                             name="hvlrun-commit-conn", daemon=True).start()

    def _serve(self, sock: socket.socket, addr: str) -> None:
        conn = _Conn(sock, self._key)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # answers go out at once
            sock.settimeout(_HELLO_SECONDS)
            sock.sendall(conn.session.hello())
            conn.session.accept_hello(conn.line())
            sock.settimeout(None)    # rank 0 keeps its connection for its world's life
            while True:
                self._handle(conn, conn.session.open(conn.line()).split(" "))
        except Rejected as e:
            self._reject(addr, str(e))
        except socket.timeout:
            self._reject(addr, "nothing authentic within %g s" % _HELLO_SECONDS)
        except (_Closed, OSError):
            pass
        finally:
            with self._lock:
                self._conns.discard(sock)
            sock.close()

    def _reject(self, addr: str, why: str) -> None:
        with self._lock:
            self._rejected.append("%s (%s)" % (addr.rsplit(":", 1)[0], why))

    def _handle(self, conn: _Conn, fields: List[str]) -> None:
        """Answer one request (see the module contract)."""
        if fields[0] == "put" and len(fields) == 4 and fields[1].isdigit() and fields[2].isdigit():
            conn.send(self._put(conn, int(fields[1]), int(fields[2]), fields[3]))
        elif fields == ["fetch"]:
            self._fetch(conn)
        elif fields[0] == "updates" and len(fields) == 2 and fields[1].isdigit():
            with self._lock:
                open_now = self._world == int(fields[1])
                answer = "updates %d" % self._updates if open_now else "refused world is over"
            conn.send(answer)
        elif fields[0] == "ready" and len(fields) == 3 and all(f.isdigit() for f in fields[1:]):
            with self._lock:
                self._ready.setdefault(int(fields[1]), (int(fields[2]), time.monotonic()))
            conn.send("ok")
        else:
            raise Rejected("unknown request %r" % " ".join(fields)[:60])

    def _put(self, conn: _Conn, world: int, nbytes: int, sha256: str) -> str:
        """Receive a commit's bytes; store them if whole and from the open world."""
        tmp = self.path + ".tmp"
        with self._write_lock:
            hasher = hashlib.sha256()
            conn.sock.settimeout(_TRANSFER_SECONDS)
            try:
                with open(tmp, "wb") as sink:
                    conn.read_into(nbytes, sink, hasher)
                    sink.flush()
                    os.fsync(sink.fileno())
            except BaseException:
                os.unlink(tmp)      # a partial transfer never becomes the commit
                raise
            finally:
                conn.sock.settimeout(None)
            if hasher.hexdigest() != sha256:
                os.unlink(tmp)
                raise Rejected("commit bytes do not match their digest")
            with self._lock:
                if self._world != world:
                    os.unlink(tmp)
                    return "refused world %d is over" % world
                os.replace(tmp, self.path)
                _sync_dir(os.path.dirname(self.path))
                seq = self._latest.seq + 1 if self._latest else 1
                self._latest = CommitInfo(seq, world, nbytes, sha256, time.monotonic())
                return "stored %d %d" % (seq, self._updates)

    def _fetch(self, conn: _Conn) -> None:
        """Send the last commit (the file stays readable while a newer one replaces it)."""
        with self._write_lock, self._lock:
            info = self._latest
            source = open(self.path, "rb") if info else None
        if source is None:
            conn.send("none")
            return
        with source:
            conn.send("commit %d %d %d %s" % (info.seq, info.world, info.size, info.sha256))
            conn.sock.settimeout(_TRANSFER_SECONDS)
            try:
                while True:
                    data = source.read(_CHUNK)
                    if not data:
                        break
                    conn.sock.sendall(data)
            except OSError:
                raise _Closed() from None
            finally:
                conn.sock.settimeout(None)


def _sync_dir(path: str) -> None:
    """Flush a directory entry (the rename) to disk; best effort."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
