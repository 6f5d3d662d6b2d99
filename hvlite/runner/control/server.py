"""hvlrun's end of the control channel: what the rank wrappers and host guards report.

Contract:
  * ``hvlrun`` runs one :class:`ControlServer` (TCP, ephemeral port, bound to the address it
    gives: 127.0.0.1 when every rank is local) and passes ``HVLRUN_CONTROL_ADDR=host:port`` and
    the job secret to the processes it starts (``names.py``); they connect with
    ``client.ControlClient``.
  * Every line is authenticated (``hvlite/protocol/wire.py``). Rejected input (no or bad hello,
    bad MAC, replay, malformed or over-long line, no authentic message within
    :data:`HELLO_SECONDS` of connecting) is dropped and counted by :meth:`rejected`, never acted
    on; a connection that has not yet sent one authentic message
    is closed on its first rejected line.
  * Client messages: ``start <rank> <pid> <host>`` and ``exit <rank> <code>`` (rank wrappers;
    code is 128+signum for a signal), ``guard <host> <pid>`` and ``done <code>`` (host guards:
    the MPI proxy on that host started / ended), ``check <host>`` (hvlrun's host check, answered
    with ``checked``), ``ping``. Server messages: ``ping`` every heartbeat interval, ``checked``,
    ``stop <reason>`` once :meth:`stop_all` was called (also to clients that connect later).
  * Liveness (heartbeat timeout T > 0): a wrapper or guard that has not sent its final message
    (``exit``/``done``) is lost when its connection closes or nothing authentic came from it for T
    seconds; :meth:`lost` names the first such host (with its ranks that reported no exit) or
    rank: a guard before any rank wrapper (a guard is lost only with its host), then in the order
    their connections closed (silent clients last). The wording does not depend on which of a
    host's connections closes first: a closed connection whose host still has open ones is
    reported only once those close too (the host is gone) or :data:`HOST_SETTLE_SECONDS` have
    passed (the one client is gone); meanwhile the next lost client, if reportable, is named.
    Given the round in which the world's ranks agreed to end, rank wrappers whose connection
    closed in that round or later are not lost: the launcher killed them (guards and silent
    clients always count).
  * One background thread does all socket work; every query method may be called from any
    thread.
"""

import selectors
import socket
import threading
import time
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

from ...protocol.wire import MAX_LINE, Rejected, Session, heartbeat_interval

__all__ = ["HELLO_SECONDS", "HOST_SETTLE_SECONDS", "Lost", "ControlServer"]

HELLO_SECONDS = 10.0
HOST_SETTLE_SECONDS = 2.0       # a killed host's connections close within this of each other
_MAX_BACKLOG = 65536            # bytes queued for a peer that does not read: it is stuck


class Lost(NamedTuple):
    """A lost client: ``who`` ("host h2 (rank 1)" or "rank 1 on h2"), the full ``message``,
    its ``host``, and ``since``, the server round in which it was lost (its connection closed;
    for a silent client, the round of the query). Rounds order events; events of one round (one
    pass over the sockets) may have happened in any order."""
    who: str
    message: str
    since: int
    host: str = ""        # the host of the lost client, as it reported itself


class _Peer:
    """One connection's state; owned by the server thread, read under the server's lock."""

    def __init__(self, sock: socket.socket, addr: str, secret: str) -> None:
        self.sock, self.addr = sock, addr
        self.session = Session(secret, server=True)
        self.inbuf = b""
        self.outbuf = self.session.hello()
        self.kind: Optional[str] = None      # "rank", "guard" or "check" once identified
        self.rank: Optional[int] = None
        self.host = ""
        self.finished = False                # sent exit/done
        self.closed = False
        self.stopped = False                 # was sent "stop"
        self.opened = self.heard = self.pinged = time.monotonic()
        self.closed_at = 0              # the server round in which the connection closed
        self.closed_time = 0.0          # time.monotonic() when it closed

    def describe(self) -> str:
        if self.kind == "guard":
            return "host %s" % self.host
        return "rank %d on %s" % (self.rank, self.host)


class ControlServer:
    """Listens for wrapper and guard messages on a background thread."""

    def __init__(self, secret: str, bind_host: str = "127.0.0.1",
                 heartbeat_timeout: float = 0.0) -> None:
        """Open the listening socket (does not start the thread).

        Args:
            secret: the job secret every client must prove it knows.
            bind_host: address to bind; the port is chosen by the system.
            heartbeat_timeout: seconds of silence after which a client is lost; 0 turns the
                heartbeat and the silence check off (closed connections are still lost).

        Raises:
            OSError: if the socket cannot be bound.
        """
        self._secret = secret
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((bind_host, 0))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._timeout = heartbeat_timeout
        self._interval = heartbeat_interval(heartbeat_timeout)
        self._lock = threading.Lock()
        self._peers: List[_Peer] = []
        self._started: Dict[int, Tuple[int, str]] = {}
        self._exits: List[Tuple[int, int, int]] = []      # (rank, code, round)
        self._checked: Set[str] = set()
        self._rejected = 0
        self._rejected_from: Set[str] = set()
        self._stop_reason: Optional[str] = None
        self._rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hvlrun-control", daemon=True)

    def start(self) -> "ControlServer":
        """Start the background thread. Returns self."""
        self._thread.start()
        return self

    # --- the server thread -------------------------------------------------------------------
    def _serve(self) -> None:
        """Accept, read and send until :meth:`close`."""
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, None)
        while not self._stop.is_set():
            for key, _ in sel.select(timeout=0.05):
                with self._lock:
                    if key.data is None:
                        self._accept(sel)
                    else:
                        self._read(sel, key.data)
            with self._lock:
                self._rounds += 1
                self._tick(sel)
        with self._lock:
            for peer in self._peers:
                self._drop(sel, peer)
        sel.close()

    def _accept(self, sel: selectors.BaseSelector) -> None:
        try:
            conn, addr = self._listener.accept()
        except OSError:
            return
        conn.setblocking(False)
        peer = _Peer(conn, "%s:%d" % addr[:2], self._secret)
        self._peers.append(peer)
        sel.register(conn, selectors.EVENT_READ, peer)

    def _drop(self, sel: selectors.BaseSelector, peer: _Peer) -> None:
        """Close ``peer``'s socket; its record stays (a closed unfinished client is lost)."""
        if not peer.closed:
            peer.closed, peer.closed_at, peer.closed_time = True, self._rounds, time.monotonic()
            try:
                sel.unregister(peer.sock)
            except (KeyError, ValueError):
                pass
            peer.sock.close()

    def _reject(self, sel: selectors.BaseSelector, peer: _Peer, why: str) -> None:
        """Count a rejected line; close the connection unless it already proved itself."""
        self._rejected += 1
        self._rejected_from.add("%s (%s)" % (peer.addr.rsplit(":", 1)[0], why))
        if peer.kind is None:
            self._drop(sel, peer)
            self._peers.remove(peer)

    def _read(self, sel: selectors.BaseSelector, peer: _Peer) -> None:
        try:
            data = peer.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sel, peer)
            if peer.kind is None:
                self._peers.remove(peer)
            return
        *lines, peer.inbuf = (peer.inbuf + data).split(b"\n")
        for line in lines:
            if peer.closed:
                return
            try:
                if peer.session.ready:
                    self._handle(peer, peer.session.open(line))
                else:
                    peer.session.accept_hello(line)
            except Rejected as e:
                self._reject(sel, peer, str(e))
        if len(peer.inbuf) > MAX_LINE and not peer.closed:
            peer.inbuf = b""
            self._reject(sel, peer, "over-long line")

    def _handle(self, peer: _Peer, body: str) -> None:
        """Act on one authentic message (malformed ones count as rejected)."""
        peer.heard = time.monotonic()
        fields = body.split(" ")
        try:
            if fields[0] == "start" and len(fields) == 4:
                peer.kind, peer.rank, peer.host = "rank", int(fields[1]), fields[3]
                self._started[peer.rank] = (int(fields[2]), peer.host)
            elif fields[0] == "exit" and len(fields) == 3:
                peer.finished = True
                self._exits.append((int(fields[1]), int(fields[2]), self._rounds))
            elif fields[0] == "guard" and len(fields) == 3:
                peer.kind, peer.host = "guard", fields[1]
            elif fields[0] == "done" and len(fields) == 2:
                peer.finished = True
            elif fields[0] == "check" and len(fields) == 2:
                peer.kind, peer.host, peer.finished = "check", fields[1], True
                self._checked.add(fields[1])
                self._queue(peer, "checked")
            elif fields != ["ping"]:
                raise ValueError(body)
        except ValueError:
            self._rejected += 1
            self._rejected_from.add("%s (unknown message %r)" % (peer.addr.rsplit(":", 1)[0], body[:60]))

    def _queue(self, peer: _Peer, body: str) -> None:
        if peer.session.ready and not peer.closed:
            peer.outbuf += peer.session.seal(body)

    def _tick(self, sel: selectors.BaseSelector) -> None:
        """Heartbeats, stop requests, hello timeouts and pending sends, once per loop."""
        now = time.monotonic()
        for peer in list(self._peers):
            if peer.closed:
                continue
            if peer.kind is None and not peer.finished and now - peer.opened > HELLO_SECONDS:
                self._reject(sel, peer, "nothing authentic within %g s" % HELLO_SECONDS)
                continue
            if self._stop_reason and not peer.stopped and peer.session.ready:
                peer.stopped = True
                self._queue(peer, "stop " + self._stop_reason)
            if self._timeout > 0 and now - peer.pinged >= self._interval:
                peer.pinged = now
                self._queue(peer, "ping")
            if peer.outbuf:
                try:
                    sent = peer.sock.send(peer.outbuf)
                    peer.outbuf = peer.outbuf[sent:]
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    self._drop(sel, peer)
                    continue
                if len(peer.outbuf) > _MAX_BACKLOG:
                    self._drop(sel, peer)

    # --- queries (any thread) ---------------------------------------------------------------
    def started_ranks(self) -> Dict[int, Tuple[int, str]]:
        """Return ``{rank: (pid, host)}`` for every rank that reported ``start``."""
        with self._lock:
            return dict(self._started)

    def exits(self) -> List[Tuple[int, int]]:
        """Return the ``(rank, code)`` exit reports in arrival order."""
        with self._lock:
            return [(r, c) for r, c, _ in self._exits]

    def first_failure(self) -> Optional[Tuple[int, int]]:
        """Return the earliest ``(rank, code)`` with a non-zero code, or None."""
        return next(((r, c) for r, c in self.exits() if c != 0), None)

    def exit_rounds(self) -> List[Tuple[int, int, int]]:
        """Return the ``(rank, code, round)`` exit reports in arrival order (``round``: the
        server round it arrived in, comparable with :attr:`Lost.since`)."""
        with self._lock:
            return list(self._exits)

    def checked_hosts(self) -> Set[str]:
        """Return the hosts whose check message arrived."""
        with self._lock:
            return set(self._checked)

    def rejected(self) -> Tuple[int, List[str]]:
        """Return how many lines were rejected, and from where (address and reason)."""
        with self._lock:
            return self._rejected, sorted(self._rejected_from)

    def lost(self, settle: float = HOST_SETTLE_SECONDS,
             ended_round: Optional[int] = None) -> Optional[Lost]:
        """Return the first lost client as a :class:`Lost`, or None (see the module contract).

        Args:
            settle: a client whose connection closed less than ``settle`` seconds ago while
                others on its host are still open is not reported yet: a killed host's
                connections close one by one, and the wording must not depend on their order
                (0 reports at once, for a job already over). The next lost client is looked at
                instead.
            ended_round: the server round of an elastic world's first agreed end (an exit
                75/76), or None: rank wrappers whose connection closed in that round or later
                are left out (the launcher killed them once that rank exited; within one round
                the order is unknown, and a killed wrapper is taken as a consequence).
        """
        now = time.monotonic()
        with self._lock:
            def silent(p: _Peer, limit: float) -> bool:
                return p.closed or (self._timeout > 0 and now - p.heard > limit)
            live = [p for p in self._peers if p.kind in ("rank", "guard") and not p.finished]
            gone = [p for p in live if silent(p, self._timeout) and not (
                ended_round is not None and p.kind == "rank" and p.closed
                and p.closed_at >= ended_round)]
            gone.sort(key=lambda p: (p.kind != "guard", p.closed_at if p.closed else self._rounds))
            for peer in gone:
                whole = all(silent(p, self._timeout / 2) for p in live if p.host == peer.host)
                if peer.closed and not whole and now - peer.closed_time < settle:
                    continue
                return self._describe_lost(peer, whole, now)
            return None

    def _describe_lost(self, peer: _Peer, whole: bool, now: float) -> Lost:
        """``peer`` as lost (the lock held): its host, with the ranks there that reported no
        exit, when ``peer`` is a guard or ``whole`` (every unfinished client on the host is
        closed or was silent for half the limit: the host is gone, not one rank); else the one
        rank and its host."""
        done = {r for r, _, _ in self._exits}
        ranks = sorted(r for r, (_, host) in self._started.items()
                       if host == peer.host and r not in done)
        if (whole or peer.kind == "guard") and ranks:
            who = "host %s (rank%s %s)" % (peer.host, "s" if len(ranks) > 1 else "",
                                          ",".join(map(str, ranks)))
        else:
            who = peer.describe()
        if peer.closed:
            return Lost(who, "%s: its connection to hvlrun closed before it reported an exit "
                        "(processes killed or host down)" % who, peer.closed_at, peer.host)
        return Lost(who, "%s stopped answering: nothing heard for %.1f s (link cut, host "
                    "down or frozen; limit %g s)" % (who, now - peer.heard, self._timeout),
                    self._rounds, peer.host)

    def stop_all(self, reason: str) -> None:
        """Ask every client, now and later, to end its part of the job (``stop <reason>``)."""
        with self._lock:
            if self._stop_reason is None:  # printable ASCII words, as the wire requires
                words = "".join(c if " " <= c <= "~" else "?" for c in reason).split()
                self._stop_reason = " ".join(words)[:400] or "stop"

    def wait_quiet(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, until no client connection is open and the
        server has looked for new connections at least once since this call."""
        deadline = time.monotonic() + timeout
        with self._lock:
            first = self._rounds
        while time.monotonic() < deadline and self._thread.is_alive():
            with self._lock:
                if self._rounds >= first + 2 and all(p.closed for p in self._peers):
                    return
            time.sleep(0.01)

    def close(self) -> None:
        """Stop the thread and close every socket. Safe to call twice."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._listener.close()
