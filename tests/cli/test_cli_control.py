"""The authenticated control channel in one process: the wire format (HMAC lines, handshake,
replays), the server and client over real loopback sockets (start/exit records, forged and
replayed lines dropped and counted, heartbeats, lost clients, stop), how an elastic world's
supervisor judges them (wrappers mpiexec killed after an agreed exit are no loss; a guard
always is), and that nothing in the launcher deserialises network data beyond splitting ASCII
words."""

import re
import socket
import threading
import time
from pathlib import Path

import pytest

from hvlite.runner.control.server import ControlServer
from hvlite.runner.control.client import ControlClient, ControlError
from hvlite.runner.world.supervise import lost_first
from hvlite.protocol.wire import MAX_LINE, Rejected, Session, new_secret

SECRET = new_secret()


def pair(secret_server=SECRET, secret_client=SECRET):
    server, client = Session(secret_server, server=True), Session(secret_client, server=False)
    server.accept_hello(client.hello())
    client.accept_hello(server.hello())
    return server, client


def test_secret_is_random_hex():
    a, b = new_secret(), new_secret()
    assert a != b and len(a) == 64 and int(a, 16) >= 0


def test_lines_round_trip_in_order():
    server, client = pair()
    assert server.open(client.seal("start 0 12 h1")) == "start 0 12 h1"
    assert server.open(client.seal("ping")) == "ping"
    assert client.open(server.seal("stop lost host h2")) == "stop lost host h2"


def test_tampered_replayed_reordered_and_foreign_lines_are_rejected():
    server, client = pair()
    line = client.seal("exit 1 0")
    with pytest.raises(Rejected, match="bad MAC"):
        server.open(line.replace(b"exit 1 0", b"exit 1 3"))
    assert server.open(line) == "exit 1 0"
    with pytest.raises(Rejected, match="replayed"):
        server.open(line)
    later, skipped = client.seal("ping"), client.seal("ping")
    with pytest.raises(Rejected, match="sequence"):
        server.open(skipped)
    assert server.open(later) == "ping"
    other_server, _ = pair()            # same secret, another connection: other nonces
    with pytest.raises(Rejected):
        other_server.open(client.seal("exit 1 3"))
    wrong_server, wrong_client = pair(secret_client=new_secret())
    with pytest.raises(Rejected, match="bad MAC"):
        wrong_server.open(wrong_client.seal("exit 1 3"))
    with pytest.raises(Rejected):       # the server's direction cannot be sent back to it
        server.open(server.seal("ping"))


@pytest.mark.parametrize("line", [b"exit 1 3", b"", b"1 exit 1 3", b"x" * (MAX_LINE + 1),
                                  "1 ex\u00eft 1 3 ".encode() + b"0" * 64, b"1  ping " + b"0" * 64])
def test_malformed_lines_are_rejected(line):
    server, _ = pair()
    with pytest.raises(Rejected):
        server.open(line)


def test_hello_is_checked():
    server = Session(SECRET, server=True)
    with pytest.raises(Rejected, match="before the hello"):
        server.open(b"1 ping " + b"0" * 64)
    for bad in (b"exit 1 3\n", b"hvlrun-hello 1 xyz\n", b"hvlrun-hello 2 " + b"a" * 32 + b"\n"):
        with pytest.raises(Rejected, match="bad hello"):
            server.accept_hello(bad)
    with pytest.raises(ValueError):
        Session("", server=True)


class RawClient:
    """A client built from a socket and a Session: it can record and replay lines."""

    def __init__(self, port, secret=SECRET):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.session = Session(secret, server=False)
        self.sock.sendall(self.session.hello())
        hello = b""
        while not hello.endswith(b"\n"):
            hello += self.sock.recv(1)
        self.session.accept_hello(hello)

    def send(self, body):
        line = self.session.seal(body)
        self.sock.sendall(line)
        return line


def wait_until(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.fixture
def server():
    srv = ControlServer(SECRET, "127.0.0.1", heartbeat_timeout=0.6).start()
    yield srv
    srv.close()


def test_authentic_messages_are_recorded_forged_and_replayed_ones_are_not(server):
    good = RawClient(server.port)
    good.send("start 1 4242 hostA")
    recorded = good.send("exit 1 0")
    wait_until(lambda: server.exits() == [(1, 0)])
    assert server.started_ranks() == {1: (4242, "hostA")}
    replay = RawClient(server.port)                     # the recorded line on a new connection
    replay.sock.sendall(recorded.replace(b"exit 1 0", b"exit 1 3"))
    replay2 = RawClient(server.port)
    replay2.sock.sendall(recorded)
    forger = RawClient(server.port, secret=new_secret())
    forger.send("exit 1 3")
    plain = socket.create_connection(("127.0.0.1", server.port))
    plain.sendall(b"exit 1 3\n")
    wait_until(lambda: server.rejected()[0] >= 4)
    assert server.exits() == [(1, 0)] and server.first_failure() is None
    assert server.lost() is None
    count, sources = server.rejected()
    assert count == 4 and all(s.startswith("127.0.0.1 (") for s in sources), sources
    for s in (good.sock, replay.sock, replay2.sock, forger.sock, plain):
        s.close()


def test_over_long_line_and_silent_connection_are_dropped(server, monkeypatch):
    flood = socket.create_connection(("127.0.0.1", server.port))
    flood.sendall(b"A" * (3 * MAX_LINE))
    wait_until(lambda: server.rejected()[0] == 1)
    assert "over-long" in server.rejected()[1][0] or "bad hello" in server.rejected()[1][0]
    flood.close()


def test_silent_and_closed_clients_are_lost_with_their_host(server):
    # both connected first, then announced back to back: the host counts as lost whole only
    # when its guard is silent too, so the two silences must start together
    rank, guard = RawClient(server.port), RawClient(server.port)
    rank.send("start 3 99 hostB")
    guard.send("guard hostB 98")
    wait_until(lambda: server.started_ranks())
    assert server.lost() is None
    wait_until(lambda: server.lost() is not None, 3)  # neither sends pings: silent
    who, message, since, host = server.lost()
    assert who == "host hostB (rank 3)" and "stopped answering" in message, message
    assert host == "hostB"
    assert isinstance(since, int)
    rank.sock.close()
    guard.sock.close()


def test_closed_rank_is_lost_at_once(server):
    rank = RawClient(server.port)
    rank.send("start 2 77 hostC")
    wait_until(lambda: server.started_ranks())
    rank.sock.close()
    wait_until(lambda: server.lost() is not None, 0.5)
    who, message, _, host = server.lost()
    assert who == "host hostC (rank 2)" and "connection to hvlrun closed" in message
    assert host == "hostC"


@pytest.mark.parametrize("first", ["rank", "guard"])
def test_a_killed_host_is_named_whichever_connection_closes_first(first):
    """One wording for a killed host, whatever the order its connections close in (no
    heartbeat here: only closed connections are lost)."""
    server = ControlServer(SECRET, "127.0.0.1").start()
    rank = RawClient(server.port)
    rank.send("start 1 77 hostG")
    guard = RawClient(server.port)
    guard.send("guard hostG 76")
    wait_until(lambda: server.started_ranks())
    wait_until(lambda: sum(p.kind is not None for p in server._peers) == 2)
    one, other = (rank, guard) if first == "rank" else (guard, rank)
    one.sock.close()
    if first == "rank":      # the guard is still open: not reported yet, even after a while
        time.sleep(0.5)
        assert server.lost() is None
    other.sock.close()
    wait_until(lambda: server.lost() is not None and server.lost().host == "hostG", 3)
    who, message, _, _ = server.lost()
    assert who == "host hostG (rank 1)" and "connection to hvlrun closed" in message, message
    server.close()


def test_a_closed_rank_whose_host_lives_on_is_named_alone_after_the_settle_time():
    server = ControlServer(SECRET, "127.0.0.1").start()
    rank = RawClient(server.port)
    rank.send("start 4 77 hostH")
    guard = RawClient(server.port)
    guard.send("guard hostH 76")
    wait_until(lambda: server.started_ranks())
    wait_until(lambda: sum(p.kind is not None for p in server._peers) == 2)
    rank.sock.close()
    wait_until(lambda: any(p.closed for p in server._peers), 3)
    assert server.lost(settle=30) is None
    wait_until(lambda: server.lost(settle=0.2) is not None, 3)
    who, message, _, host = server.lost(settle=0.2)
    assert who == "rank 4 on hostH" and "connection to hvlrun closed" in message, message
    guard.sock.close()
    server.close()


def test_a_vanished_client_is_the_cause_unless_a_rank_failed_first():
    """hvlrun's choice when mpiexec ended the job itself (events ordered by server round)."""
    assert lost_first(5, None, None)
    assert lost_first(4, 5, (0, 3)) and not lost_first(6, 5, (0, 3))
    assert lost_first(5, 5, (0, 143))           # same round: killed by a signal = consequence
    assert not lost_first(5, 5, (1, 3))         # same round: its own exit code = the cause


def test_client_heartbeats_stop_and_check(server):
    stops, lost, other = [], [], []
    client = ControlClient("127.0.0.1:%d" % server.port, SECRET, 0.6, on_lost=lost.append,
                           on_stop=stops.append, on_message=other.append).connect()
    assert client.send("start 0 1 hostD")
    time.sleep(1.5)                                  # > the timeout: pings keep both alive
    assert server.lost() is None and not lost
    assert client.send("check hostD")
    wait_until(lambda: other == ["checked"])
    server.stop_all("lost host hostE (rank 4)")
    wait_until(lambda: stops == ["lost host hostE (rank 4)"])
    assert client.send("exit 0 0")
    client.close()
    wait_until(lambda: server.exits() == [(0, 0)])
    assert server.lost() is None and not lost and client.rejected == 0


def test_client_notices_hvlrun_gone():
    srv = ControlServer(SECRET, "127.0.0.1", heartbeat_timeout=0.5).start()
    lost = []
    client = ControlClient("127.0.0.1:%d" % srv.port, SECRET, 0.5, on_lost=lost.append).connect()
    srv.close()
    wait_until(lambda: lost, 3)
    assert "closed" in lost[0] or "broke" in lost[0] or "nothing heard" in lost[0], lost
    assert not client.send("ping")
    client.close()


def test_client_with_wrong_secret_or_no_server_fails_clearly(server):
    with pytest.raises(ControlError, match="127.0.0.1:1: "):
        ControlClient("127.0.0.1:1", SECRET).connect(timeout=2)
    lost = []
    client = ControlClient("127.0.0.1:%d" % server.port, new_secret(), 0.6,
                           on_lost=lost.append).connect()   # the hello carries no proof yet
    client.send("start 5 1 hostF")
    wait_until(lambda: server.rejected()[0] == 1)
    assert server.started_ranks() == {}
    wait_until(lambda: lost, 3)                          # the server dropped it
    client.close()


def test_nothing_in_the_launcher_deserialises_network_data():
    package = Path(__file__).resolve().parents[2] / "hvlite"
    pattern = re.compile(r"\b(pickle|cPickle|marshal|shelve|dill|cloudpickle|yaml)\b|\beval\(|\bexec\(")
    files = [p for part in ("runner", "protocol") for p in (package / part).rglob("*.py")]
    assert len(files) > 20, files
    # --config-file: a local file named on the command line, read with yaml.safe_load (plain
    # data only); never anything that came over the network.
    allowed = re.compile(r"^\s*import yaml$|yaml\.(safe_load|YAMLError)\b", re.M)
    # func_run.py is Horovod's run(func, ...), a function of the caller's own process (not
    # hvlrun's): it pickles the function for its own ranks and reads their results back, through
    # a folder only this user can open (mkdtemp: mode 0700), never through a connection.
    offenders = [str(p) for p in files if p.name != "func_run.py"
                 and pattern.search(allowed.sub("", p.read_text()))]
    assert offenders == [], offenders
    assert "mkdtemp(" in (package / "runner" / "func_run.py").read_text()


# --- an elastic world's agreed end: who the launcher killed is no loss ----------------------
class FakeLauncher:
    """Stands for mpiexec, already over (``end_group`` is replaced where it would be signalled)."""
    args = ["mpiexec"]
    pid = None

    def poll(self):
        return 1


def elastic_world(server, monkeypatch):
    """A Supervisor of elastic world 1 over ``server``: rank 0 on host a, rank 1 on host b."""
    from hvlite.runner.hosts.hostlist import Host
    from hvlite.runner.world import supervise
    from hvlite.runner.world.rules import ELASTIC
    from hvlite.runner.world.spec import WorldSpec
    monkeypatch.setattr(supervise, "end_group", lambda proc, grace: None)
    monkeypatch.setattr(supervise, "QUIET_SECONDS", 0.5)
    spec = WorldSpec(1, [Host("a", 1), Host("b", 1)], {})
    return supervise.Supervisor(FakeLauncher(), server, spec, ELASTIC, 0, [])


def two_ranks(server):
    """Rank 0 on host a and rank 1 on host b, connected and started."""
    ranks = [RawClient(server.port), RawClient(server.port)]
    ranks[0].send("start 0 10 a")
    ranks[1].send("start 1 11 b")
    wait_until(lambda: len(server.started_ranks()) == 2)
    return ranks


def close_and_wait(server, client):
    """Close ``client`` and wait until the server saw this connection close (a later server
    round). Its own: counting closed connections, another client's close still on its way
    could be taken for this one's."""
    addr = "%s:%d" % client.sock.getsockname()[:2]
    client.sock.close()
    wait_until(lambda: any(p.addr == addr and p.closed for p in server._peers))


def test_a_rank_killed_after_its_peer_agreed_to_leave_is_no_loss(monkeypatch):
    """Rank 0 leaves with the peer-lost code (76); mpiexec then kills rank 1's wrapper, whose
    connection closes without an exit: the world ended on a lost peer, charged to no host
    (it was charged to b, and two such worlds blacklisted a healthy host)."""
    from hvlite.runner.world import supervise
    server = ControlServer(SECRET, "127.0.0.1").start()
    try:
        world = elastic_world(server, monkeypatch)
        ranks = two_ranks(server)
        ranks[0].send("exit 0 76")
        wait_until(lambda: server.exits() == [(0, 76)])
        ranks[0].sock.close()
        close_and_wait(server, ranks[1])
        assert server.lost(settle=0) is not None                # a loss, for a plain job
        ((_, _, agreed_round),) = server.exit_rounds()
        assert server.lost(settle=0, ended_round=agreed_round) is None
        assert world.judge(settle=0) is None                    # the cause gets time to show
        monkeypatch.setattr(supervise, "PEER_LOST_WAIT_SECONDS", 0.0)
        time.sleep(0.01)
        end = world.judge(settle=0)
        assert (end.kind, end.hosts) == ("peer-lost", ()), end
        assert end.reason == "rank 0 on a lost a peer (HorovodInternalError)"
        # mpiexec exiting first: judged at once, as a lost peer, not as the launcher's failure
        over = elastic_world(server, monkeypatch).launcher_ended(9)
        assert (over.kind, over.hosts) == ("peer-lost", ()), over
    finally:
        server.close()


def test_a_rank_gone_before_its_peer_agreed_to_leave_is_the_loss(monkeypatch):
    server = ControlServer(SECRET, "127.0.0.1").start()
    try:
        world = elastic_world(server, monkeypatch)
        ranks = two_ranks(server)
        close_and_wait(server, ranks[1])
        ranks[0].send("exit 0 76")
        wait_until(lambda: server.exits() == [(0, 76)])
        end = world.judge(settle=0)
        assert (end.kind, end.hosts, end.who) == ("lost", ("b",), "host b (rank 1)"), end
        assert "its connection to hvlrun closed" in end.reason
        ranks[0].sock.close()
    finally:
        server.close()


def test_a_host_whose_guard_goes_after_the_agreed_exit_is_still_lost(monkeypatch):
    """A guard is lost only with its host, whenever that happens: host b dies after rank 0
    left with 76 (or its loss is what rank 0 saw, noticed late). Ranks that reported an exit
    are not named with the host."""
    server = ControlServer(SECRET, "127.0.0.1").start()
    try:
        world = elastic_world(server, monkeypatch)
        ranks = two_ranks(server)
        guard = RawClient(server.port)
        guard.send("guard b 12")
        wait_until(lambda: sum(p.kind == "guard" for p in server._peers) == 1)
        ranks[0].send("exit 0 76")
        wait_until(lambda: server.exits() == [(0, 76)])
        close_and_wait(server, ranks[1])
        close_and_wait(server, guard)
        end = world.judge(settle=0)
        assert (end.kind, end.hosts, end.who) == ("lost", ("b",), "host b (rank 1)"), end
        ranks[0].sock.close()
    finally:
        server.close()


def test_a_closed_rank_still_settling_does_not_hide_a_host_that_is_gone():
    """The first closed client waits out the settle time (its host still has a connection
    open); a later one whose whole host is gone is reported meanwhile."""
    server = ControlServer(SECRET, "127.0.0.1").start()
    try:
        first, guard, second = (RawClient(server.port) for _ in range(3))
        first.send("start 4 77 hostH")
        guard.send("guard hostH 76")
        second.send("start 5 78 hostJ")
        wait_until(lambda: sum(p.kind is not None for p in server._peers) == 3)
        close_and_wait(server, first)
        assert server.lost(settle=30) is None
        close_and_wait(server, second)
        who, message, _, host = server.lost(settle=30)
        assert (who, host) == ("host hostJ (rank 5)", "hostJ"), message
        guard.sock.close()
    finally:
        server.close()
