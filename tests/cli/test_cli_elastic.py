"""The elastic driver's pieces in one process, without the engine: the discovery script's
output (a hung script killed with its children), the blacklist and its cooldown, placement, the
commit store and its client over real loopback sockets (a whole commit or none, only from the
open world, forged input refused), the elastic timeline file, the driver's worlds with a
scripted end (a first world that never ran), how a world's end is told from its reports, and
hvlrun's elastic flags (usage errors, the first world's dry run)."""
import json
import os
import random
import socket
import time

import pytest

from hvlite.protocol.commit_client import CommitClient, CommitStoreError
from hvlite.runner.elastic.commit_store import CommitStore
from hvlite.runner.elastic.discovery import DiscoveryError, discover, parse_discovery
from hvlite.runner.elastic.trace import ElasticTrace, world_path
from hvlite.runner.elastic.host_pool import FAILURES_TO_BLACKLIST, HostPool, describe, place
from hvlite.runner.hosts.hostlist import Host
from hvlite.protocol.wire import new_secret
from .live import alive


def test_discovery_output_is_parsed_with_default_slots():
    text = "# hosts\nh1:4\nh2 slots=2\n\nh3  # no count\n"
    assert parse_discovery(text, 3) == [Host("h1", 4), Host("h2", 2), Host("h3", 3)]
    assert parse_discovery("", 1) == []
    # a host named again with the same slots is one host (as Horovod); other slots: an error
    assert parse_discovery("h1:2\nh2\nh1:2\nh2 slots=3\n", 3) == [Host("h1", 2), Host("h2", 3)]
    for bad, message in (("h1:x", "bad slot count"),
                         ("h1\nh1:2", "names host 'h1' a second time with 2 slots \\(first 1\\)"),
                         ("a b c", "cannot parse")):
        with pytest.raises(DiscoveryError, match=message):
            parse_discovery(bad, 1)


def test_discovery_script_failures_are_named(tmp_path):
    assert discover("echo h1:2; echo h2", 1) == [Host("h1", 2), Host("h2", 1)]
    with pytest.raises(DiscoveryError, match="exited with code 3\n    boom"):
        discover("echo boom >&2; exit 3", 1)
    with pytest.raises(DiscoveryError, match="ran longer than 0.5 s"):
        discover("sleep 5", 1, timeout=0.5)


@pytest.mark.parametrize("how", ["timeout", "cancel"])
def test_a_hung_discovery_script_is_killed_with_its_children(tmp_path, how):
    """A script that started a child and hangs: the timeout (or hvlrun ending: cancel) kills
    the script's whole process group, so nothing of it is left behind."""
    pidfile = tmp_path / "child.pid"
    script = "sleep 300 & echo $! > %s; echo h1; sleep 301" % pidfile
    started = time.monotonic()
    # the script has started its child (the pid is written) well before it is ended, however
    # slowly this machine starts a shell
    if how == "timeout":
        with pytest.raises(DiscoveryError, match="ran longer than 3 s"):
            discover(script, 1, timeout=3.0)
    else:
        with pytest.raises(DiscoveryError, match="was stopped: hvlrun is ending"):
            discover(script, 1, cancel=lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    assert time.monotonic() - started < 10
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child), "the script's child %d survived" % child
    assert discover("echo h2:2", 1, cancel=lambda: False) == [Host("h2", 2)]


def test_placement_fills_hosts_in_order():
    hosts = [Host("a", 2), Host("b", 3), Host("c", 1)]
    assert place(hosts, 4) == [Host("a", 2), Host("b", 2)]
    assert place(hosts, 9) == hosts
    assert describe(place(hosts, 1)) == "a:1" and describe([]) == "no host"


def test_a_host_that_keeps_failing_is_blacklisted_for_good():
    pool, hosts = HostPool(), [Host("a", 1), Host("b", 1)]
    assert pool.record_failure("b", 0.0) is None
    pool.record_progress(["a", "b"])          # a commit in between: not "in a row"
    assert pool.record_failure("b", 1.0) is None
    message = pool.record_failure("b", 2.0)
    assert "blacklisted host b for the rest of the job" in message
    assert pool.usable(hosts, 1e9) == [Host("a", 1)] and pool.blacklisted(1e9) == ["b"]
    assert "cannot be reached" in pool.blacklist("a", 3.0, "it cannot be reached")


def test_cooldown_doubles_within_the_range_and_the_host_returns():
    pool, hosts = HostPool((10.0, 25.0), random.Random(0)), [Host("a", 1)]
    for _ in range(FAILURES_TO_BLACKLIST - 1):
        pool.record_failure("a", 0.0)
    first = pool.record_failure("a", 0.0)
    assert pool.usable(hosts, 9.9) == [] and pool.usable(hosts, 11.1) == hosts, first
    second = pool.record_failure("a", 20.0)        # one failure after its return is enough
    assert second and pool.usable(hosts, 20.0 + 19.9) == []
    assert pool.usable(hosts, 20.0 + 22.1) == hosts
    third = pool.record_failure("a", 50.0)
    seconds = float(third.split(" for ")[1].split(" s")[0])
    assert seconds == 25.0, third                   # capped at the range's top


@pytest.fixture
def store(tmp_path):
    key = new_secret()
    server = CommitStore(key, str(tmp_path)).start()
    yield server, key
    server.close()


def client(server, key):
    return CommitClient("127.0.0.1:%d" % server.port, key, timeout=10).connect()


def test_commits_round_trip_only_from_the_open_world(store):
    server, key = store
    c = client(server, key)
    assert c.fetch() is None
    with pytest.raises(CommitStoreError, match="world 1 is over"):
        c.put(1, b"early")                       # refused (and the client hangs up)
    server.open_world(1)
    c = client(server, key)
    assert c.put(1, b"first") == (1, 0)
    server.request_reform()
    assert c.put(1, b"second" * 100000) == (2, 1)       # the driver asks the world to stop
    assert c.updates(1) == 1
    c.ready(1, 2)
    assert server.ready(1)[0] == 2
    with open(server.path, "rb") as f:
        assert f.read() == b"second" * 100000
    server.close_world()
    with pytest.raises(CommitStoreError):
        c.put(1, b"late")                               # its connection was dropped
    server.open_world(2)
    again = client(server, key)
    assert again.fetch() == (2, 1, b"second" * 100000)
    with pytest.raises(CommitStoreError, match="world 1 is over"):
        again.put(1, b"stale world")
    assert server.latest().seq == 2 and server.latest().world == 1


def test_a_partial_commit_never_replaces_the_last(store):
    server, key = store
    server.open_world(1)
    c = client(server, key)
    c.put(1, b"whole")
    sock = c._sock
    sock.sendall(c._session.seal("put 1 1000 %s" % ("0" * 64)))
    sock.sendall(b"x" * 10)
    server.close_world()                       # the world ends mid-transfer
    server.open_world(2)
    assert client(server, key).fetch() == (1, 1, b"whole")
    assert not os.path.exists(server.path + ".tmp")


def test_wrong_key_and_forged_bytes_are_refused(store):
    server, key = store
    server.open_world(1)
    with pytest.raises(CommitStoreError):
        client(server, new_secret()).put(1, b"forged")
    c = client(server, key)
    c._sock.sendall(c._session.seal("put 1 5 %s" % ("0" * 64)) + b"bytes")   # wrong digest
    assert c._reader.readline() == b""                                        # dropped
    raw = socket.create_connection(("127.0.0.1", server.port))
    raw.sendall(b"hvlrun-hello 1 " + b"0" * 32 + b"\nput 1 1 x\n")
    raw.close()
    assert server.latest() is None
    assert any("digest" in r for r in server.rejected()), server.rejected()


def test_a_first_world_whose_host_cannot_be_reached_is_followed_by_the_next(store, capsys):
    """World 1 never ran (host h9 failed the check): world 2 starts without it, and there is
    no re-form to time (this raised a TypeError: no world had run)."""
    import threading
    from types import SimpleNamespace
    from hvlite.runner.elastic.driver import _Driver
    from hvlite.runner.world.spec import Launch, WorldEnd
    server, _ = store
    args = SimpleNamespace(min_np=2, max_np=None, blacklist_cooldown_range=None,
                           elastic_timeout=5.0, np=3, reset_limit=None)
    ends = iter([WorldEnd("unreachable", "host h9 is not reachable", ("h9",)),
                 WorldEnd("done", "every rank finished")])
    worlds = []

    class Scripted(_Driver):
        def run_one(self, spec):
            worlds.append(describe(spec.hosts))
            self.world_start = time.monotonic()
            return next(ends)._replace(at=time.monotonic())
    hosts = [Host("h1", 1), Host("h2", 1), Host("h9", 1)]
    driver = Scripted(Launch(args, "mpich", "mpiexec", ["true"], {}, {}), lambda: list(hosts),
                      server, "127.0.0.1", [], threading.Event())
    assert driver.run() == 0
    assert worlds == ["h1:1,h2:1,h9:1", "h1:1,h2:1"]
    assert driver.pending_reform is None
    err = capsys.readouterr().err
    assert "blacklisted host h9 for the rest of the job: it cannot be reached" in err, err
    assert "re-forming: world 1 (3 ranks on h1:1,h2:1,h9:1) -> world 2 (2 ranks on h1:1,h2:1)" \
        in err, err


def test_elastic_timeline_is_valid_json_after_every_event(tmp_path):
    path = str(tmp_path / "t.json")
    assert world_path(path, 2) == str(tmp_path / "t.world2.json")
    trace = ElasticTrace(path, 100.0)
    trace.span("worlds", "world 1 (3 ranks)", 100.0, 112.5, {"end": "failed"})
    trace.span("re-forms", "REFORM world 1 -> 2", 112.5, 116.0, {"seconds": 3.5})
    trace.mark("hosts", "BLACKLIST", 113.0, {"detail": "h3"})
    events = json.loads(open(path).read())
    spans = [e for e in events if e["ph"] == "X"]
    assert [e["dur"] for e in spans] == [12.5e6, 3.5e6] and spans[1]["ts"] == 12.5e6


def test_elastic_flags_are_checked(hvlrun):
    for args, message in ((["--min-np", "3", "--max-np", "2"], "--max-np 2 is below --min-np 3"),
                          (["-np", "5", "--min-np", "2", "--max-np", "4"], "-np 5 is not between"),
                          (["--min-np", "0"], "--min-np must be at least 1"),
                          (["--min-np", "1", "--blacklist-cooldown-range", "5", "1"],
                           "0 <= MIN <= MAX"),
                          (["-np", "2", "--reset-limit", "3"],
                           "--reset-limit only applies to elastic jobs"),
                          (["--min-np", "4", "-H", "localhost:2"],
                           "--min-np 4 is above the 2 slots of the fixed hosts (localhost:2): "
                           "the job could never start"),
                          (["-H", "localhost", "--min-np", "1", "--slots-per-host", "4"],
                           "--slots-per-host applies to the lines of --host-discovery-script")):
        job = hvlrun(args + ["true"], env={"HOROVOD_ELASTIC_TIMEOUT": "1"})
        assert job.returncode == 2 and message in job.stderr, (args, job.stderr)
    for name, args in (("HOROVOD_ELASTIC_TIMEOUT", ["--min-np", "1", "-np", "1"]),
                       ("HOROVOD_START_TIMEOUT", ["-np", "1"]),
                       ("HVLRUN_HEARTBEAT_TIMEOUT", ["-np", "1"])):
        job = hvlrun(args + ["true"], env={name: "30s"})
        assert job.returncode == 2 and "$%s='30s' is not a number of seconds" % name \
            in job.stderr, (name, job.stderr)


def test_dry_run_shows_the_first_world_of_the_discovered_hosts(hvlrun, tmp_path):
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho localhost:2\necho otherhost:4\n")
    script.chmod(0o755)
    job = hvlrun(["--dry-run", "--max-np", "3", "--host-discovery-script", str(script),
                  "--mpi-flavour", "mpich", "python", "train.py"])
    assert job.returncode == 0, job.stderr
    assert " -n 3 -hosts localhost:2,otherhost:1 " in job.stdout, job.stdout
    job = hvlrun(["--dry-run", "--min-np", "9", "--host-discovery-script", str(script),
                  "--mpi-flavour", "mpich", "true"])
    assert job.returncode == 2 and "names 6 slots, below --min-np 9" in job.stderr


class FakeServer:
    """What a world's watcher reads from its control server, scripted: exits as ``(rank, code)``
    (all in server round 5) or ``(rank, code, round)``. Which clients ``lost`` leaves out is the
    real server's business (test_cli_control.py); this one notes what it was asked."""

    def __init__(self, exits, lost=None):
        self._exits = [tuple(e) + (5,) * (3 - len(e)) for e in exits]
        self._lost, self.ended_rounds = lost, []

    def exits(self):
        return [(r, c) for r, c, _ in self._exits]

    def exit_rounds(self):
        return list(self._exits)

    def lost(self, settle=0.0, ended_round=None):
        self.ended_rounds.append(ended_round)
        return self._lost

    def started_ranks(self):
        return {r: (1, "x") for r in range(3)}


class FinishedProc:
    def poll(self):
        return 0        # nothing left to end


def classify(exits, lost=None, wait=0.0, plain=False):
    from hvlite.runner.world.rules import ELASTIC, PLAIN
    from hvlite.runner.world.spec import WorldSpec
    from hvlite.runner.world.supervise import Supervisor
    spec = WorldSpec(0 if plain else 1, [Host("a", 2), Host("b", 1)], {})
    watch = Supervisor(FinishedProc(), FakeServer(exits, lost), spec, PLAIN if plain else ELASTIC,
                       0, [])
    end = watch.judge()
    if end is None and wait:
        time.sleep(wait)
        end = watch.judge()
    return end


def test_how_a_world_ended_is_told_from_its_reports():
    from hvlite.runner.control.server import Lost
    from hvlite.runner.world.supervise import PEER_LOST_WAIT_SECONDS
    failed = classify([(2, 137)])
    assert (failed.kind, failed.hosts) == ("failed", ("b",))
    assert failed.reason == "rank 2 on b was killed by signal 9"
    assert classify([(0, 75)]) is None                      # the others get time to leave
    assert classify([(0, 75), (1, 75), (2, 75)]).kind == "reform"
    assert classify([(1, 76)]) is None                      # a consequence: wait for the cause
    assert classify([(1, 76)], wait=PEER_LOST_WAIT_SECONDS + 0.1).kind == "peer-lost"
    assert classify([(1, 76), (0, 1)]).hosts == ("a",)      # the cause, once it is there
    done_then_failed = classify([(0, 0), (2, 3)])
    assert (done_then_failed.kind, done_then_failed.code) == ("finished-failed", 3)
    lost = classify([(0, 143)], Lost("host b (rank 2)", "host b (rank 2): gone", 4, "b"))
    assert (lost.kind, lost.hosts) == ("lost", ("b",))      # lost first: the SIGTERM follows


def test_a_loss_is_ordered_against_the_first_exit_that_is_no_agreed_end():
    """Rank 0 left with 76 (round 3), host b was lost (round 5), then rank 1 failed (round 9):
    the loss came first. (It was compared with the 76, so rank 1's host a was charged.) The
    supervisor passes the round of the 76 on: wrappers killed from then on are no loss."""
    from hvlite.runner.control.server import Lost
    from hvlite.runner.world.rules import ELASTIC, PLAIN
    from hvlite.runner.world.spec import WorldSpec
    from hvlite.runner.world.supervise import Supervisor
    gone = Lost("host b (rank 2)", "host b (rank 2): gone", 5, "b")
    lost = classify([(0, 76, 3), (1, 1, 9)], gone)
    assert (lost.kind, lost.hosts) == ("lost", ("b",)), lost
    failed = classify([(0, 76, 3), (1, 1, 4)], gone)
    assert (failed.kind, failed.hosts) == ("failed", ("a",)), failed
    spec = WorldSpec(1, [Host("a", 2), Host("b", 1)], {})
    for rules, ended in ((ELASTIC, 3), (PLAIN, None)):
        server = FakeServer([(0, 76, 3), (1, 75, 4)])
        Supervisor(FinishedProc(), server, spec, rules, 0, []).judge()
        assert server.ended_rounds == [ended], rules


def test_a_plain_job_is_judged_by_the_same_loop_with_its_own_rules():
    """A plain job is an elastic job of one world: the same Supervisor, judged by PLAIN, where
    the elastic codes are failures like any other and hvlrun's own words go to the wrappers."""
    from hvlite.runner.control.server import Lost
    from hvlite.runner.world.rules import ELASTIC, PLAIN
    reform = classify([(0, 75)], plain=True)
    assert (reform.kind, reform.rank, reform.code) == ("failed", 0, 75)
    assert PLAIN.stop_reason(reform) == "rank 0 failed"
    assert ELASTIC.stop_reason(reform) == reform.reason == "rank 0 on a exited with code 75"
    lost = classify([(0, 143)], Lost("host b (rank 2)", "host b (rank 2): gone", 4, "b"), plain=True)
    assert PLAIN.stop_reason(lost) == "lost host b (rank 2)"
    assert PLAIN.start_timeout_reason([1, 2], 2) == "ranks 1,2 did not start within 2 s"
    assert ELASTIC.start_timeout_reason([1], 2) == "rank 1 did not start in time"
    assert (PLAIN.check_timeout(0), ELASTIC.check_timeout(0)) == (None, 30.0)


@pytest.mark.parametrize("bind", ["127.0.0.2", "0.0.0.0", "127.0.0.1"])
def test_an_all_local_world_is_told_an_address_the_store_listens_on(tmp_path, bind):
    """With --network-interface the store listens only on that interface's address (127.0.0.2
    stands in for it here): an all-local world must be told that address, not 127.0.0.1
    (which was refused); a store on every address or on loopback is reached over loopback."""
    import threading
    from types import SimpleNamespace
    from hvlite.runner.elastic.driver import _Driver
    from hvlite.runner.world.spec import Launch
    key = new_secret()
    server = CommitStore(key, str(tmp_path), bind).start()
    try:
        args = SimpleNamespace(min_np=1, max_np=None, blacklist_cooldown_range=None,
                               elastic_timeout=5.0, np=None, reset_limit=None)
        advertise = bind if bind != "0.0.0.0" else socket.gethostname()
        driver = _Driver(Launch(args, "mpich", "mpiexec", ["true"], {}, {}), lambda: [],
                         server, advertise, [], threading.Event())
        address = driver.spec(1, [Host("localhost", 2)], "start").rank_env["HVLRUN_ELASTIC_STORE"]
        assert address == "%s:%d" % ("127.0.0.2" if bind == "127.0.0.2" else "127.0.0.1",
                                     server.port)
        assert CommitClient(address, key, timeout=10).connect().fetch() is None
    finally:
        server.close()


def test_a_discovery_script_that_fails_at_first_ends_the_job_at_once(hvlrun, tmp_path):
    """Horovod's rule: a script that fails on its first run ends the job with its error (it
    waited --elastic-timeout, then said only "0 slots usable")."""
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho no inventory here >&2\nexit 4\n")
    script.chmod(0o755)
    started = time.monotonic()
    job = hvlrun(["--min-np", "1", "--elastic-timeout", "60", "--host-discovery-script",
                  str(script), "true"], timeout=30)
    assert job.returncode == 1, job.stderr
    assert "exited with code 4" in job.stderr and "no inventory here" in job.stderr, job.stderr
    assert "host discovery never succeeded" in job.stderr, job.stderr
    assert "slots usable" not in job.stderr and time.monotonic() - started < 20


def test_the_timeout_message_names_discoverys_last_error(store, capsys):
    """Discovery worked once, then fails: the --elastic-timeout error says why."""
    import threading
    from types import SimpleNamespace
    from hvlite.runner.elastic.driver import ELASTIC_FAILED_CODE, _Driver
    from hvlite.runner.world.spec import Launch
    server, _ = store
    args = SimpleNamespace(min_np=2, max_np=None, blacklist_cooldown_range=None,
                           elastic_timeout=0.5, np=None, reset_limit=None)
    calls = []

    def source():
        calls.append(1)
        if len(calls) == 1:
            return [Host("h1", 1)]
        raise DiscoveryError("host discovery script ./d.sh exited with code 3")
    driver = _Driver(Launch(args, "mpich", "mpiexec", ["true"], {}, {}), source, server,
                     "127.0.0.1", [], threading.Event())
    assert driver.run() == ELASTIC_FAILED_CODE
    err = capsys.readouterr().err
    assert "only 1 slot usable (h1:1; blacklisted: none) for 0.5 s, below --min-np 2" in err, err
    assert "host discovery's last run failed: host discovery script ./d.sh exited with code 3" \
        in err, err
