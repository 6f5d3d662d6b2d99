"""The pieces Ray and Spark jobs share (``hvlite/cluster``), without an engine: authenticated
frames, the node agent as the far end of the remote shell (output, stdin, exit code, the
command ended when the requester goes away), the rank worker's calls and failures, the rank
stand-in of Ray Train's workers (what it hands over, how each of its ends goes), and the
driver's host names and table. The whole path on real clusters is ``tests/hosts/test_ray.py``
and ``test_spark.py``."""
import io
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time

import cloudpickle
import pytest

from hvlite.cluster.agent import Agent, WorkerGone
from hvlite.cluster.frames import Channel, ChannelClosed, ChannelError, connect
from hvlite.cluster.job import HostTable, host_names, interface_of
from hvlite.cluster.names import ENV_HOSTS, ENV_KEY, ENV_SLOTS
from hvlite.protocol.wire import new_secret

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEY = new_secret()


def env(**more):
    variables = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    variables.update(more)
    return variables


@pytest.fixture
def agent():
    a = Agent(KEY, "127.0.0.1")
    yield a
    a.close()


@pytest.fixture
def table(agent):
    t = HostTable()
    t.write({"node-a": [agent.address]})
    yield t
    t.remove()


def pair(key_server=KEY, key_client=KEY):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    result = {}

    def serve():
        sock, _ = listener.accept()
        try:
            result["server"] = Channel(sock, key_server, server=True).handshake()
        except ChannelError as e:
            result["error"] = e
    thread = threading.Thread(target=serve)
    thread.start()
    client = connect("127.0.0.1:%d" % listener.getsockname()[1], key_client)
    thread.join(10)
    listener.close()
    return client, result.get("server")


def test_frames_carry_bytes_both_ways_and_end_cleanly():
    client, server = pair()
    data = bytes(range(256)) * 5000
    client.send("call", data)
    assert server.recv() == ("call", data)
    server.send("result")
    assert client.recv() == ("result", b"")
    client.close()
    with pytest.raises(ChannelClosed):
        server.recv()
    server.close()


def test_a_frame_under_another_key_is_rejected():
    client, server = pair(key_client=new_secret())
    client.send("call", b"x")
    with pytest.raises(ChannelError, match="rejected"):
        server.recv()
    client.close()
    server.close()


def rsh(table, host, command, stdin=b"", key=KEY):
    return subprocess.run([sys.executable, "-m", "hvlite.cluster.rsh", "-x", host, command],
                          input=stdin, capture_output=True, timeout=60,
                          env=env(**{ENV_KEY: key, ENV_HOSTS: table.table_path}))


def test_the_agent_runs_a_command_as_sshd_would(table):
    done = rsh(table, "node-a", 'echo out; echo err >&2; cat; echo "slots=$%s"; exit 3'
               % ENV_SLOTS, stdin=b"the secret\n")
    assert done.returncode == 3, done
    agent_address = json.load(open(table.table_path))["hosts"]["node-a"][0]
    assert done.stdout.decode().splitlines() == ["out", "the secret", "slots=" + agent_address]
    assert done.stderr.decode() == "err\n"


def test_the_remote_shell_fails_as_ssh_does(table):
    unknown = rsh(table, "node-b", "true")
    assert unknown.returncode == 255
    assert b"host node-b: not in the cluster's host table" in unknown.stderr
    wrong = rsh(table, "node-a", "true", key=new_secret())
    assert wrong.returncode == 255 and b"agent at" in wrong.stderr, wrong


def test_a_command_ends_when_its_requester_goes_away(table, tmp_path):
    marker = tmp_path / "pid"
    proc = subprocess.Popen([sys.executable, "-m", "hvlite.cluster.rsh", "node-a",
                             "echo $$ > %s; exec sleep 120" % marker], stdin=subprocess.DEVNULL,
                            env=env(**{ENV_KEY: KEY, ENV_HOSTS: table.table_path}))
    deadline = time.monotonic() + 30
    while not (marker.exists() and marker.read_text().strip()):
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    pid = int(marker.read_text())
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 15
    while running(pid):
        assert time.monotonic() < deadline, "the command outlived its requester"
        time.sleep(0.05)


def running(pid):
    """True while process ``pid`` runs (a zombie has ended; so has a process that is gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except FileNotFoundError:
        return False


def start_worker(agent, rank=0):
    return subprocess.Popen([sys.executable, "-m", "hvlite.cluster.worker"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd="/",
                            env=env(**{ENV_KEY: KEY, ENV_SLOTS: agent.address,
                                       "PMI_RANK": str(rank), "MPI_LOCALRANKID": "0"}))


def call(mode, fn, *args):
    return cloudpickle.dumps((mode, fn, args, {}))


def test_a_worker_keeps_its_object_between_calls_and_takes_its_slots_setup(agent, tmp_path):
    class Counter:            # defined here: it travels by value, as a driver script's would
        def __init__(self, start):
            self.value = start

        def add(self, n):
            self.value += n
            return self.value, os.getpid()
    agent.set_setup({"SLOT_TEST_VALUE": "seven"}, str(tmp_path), [str(tmp_path)])
    proc = start_worker(agent, rank=2)
    try:
        assert agent.wait_worker(60)["rank"] == 2
        assert agent.call(call("build", Counter, 40)) == ("ok", cloudpickle.dumps(None))
        first = pickle.loads(agent.call(call("execute", lambda c: c.add(1)))[1])
        second = pickle.loads(agent.call(call("execute", lambda c: c.add(1)))[1])
        assert first[0] == 41 and second == (42, first[1])
        seen = pickle.loads(agent.call(call("run", lambda: (os.environ["SLOT_TEST_VALUE"],
                                                            os.getcwd(), sys.path[-1])))[1])
        assert seen == ("seven", str(tmp_path), str(tmp_path))
        agent.stop_worker()
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_raising_call_returns_its_traceback_and_ends_the_worker(agent):
    proc = start_worker(agent)
    try:
        agent.wait_worker(60)

        def boom():
            raise ValueError("boom")
        status, text = agent.call(call("run", boom))
        assert status == "raised" and b"ValueError: boom" in text
        assert proc.wait(30) == 1
        with pytest.raises(WorkerGone):
            agent.call(call("run", lambda: 1))
    finally:
        proc.kill()
        proc.wait()


def test_hvlites_word_that_a_peer_left_is_a_consequence(agent):
    proc = start_worker(agent)
    try:
        agent.wait_worker(60)

        def peer_left():
            from hvlite.errors import HvliteShutdownError
            raise HvliteShutdownError("hvlite has been shut down: a rank exited")
        status, text = agent.call(call("run", peer_left))
        assert status == "consequence" and b"HvliteShutdownError" in text
        assert proc.wait(30) == 1
    finally:
        proc.kill()
        proc.wait()


def test_a_job_runs_once_per_rank_process_and_its_result_is_kept(agent):
    agent.set_job(call("run", lambda: os.environ["PMI_RANK"]))
    proc = start_worker(agent, rank=5)
    try:
        assert proc.wait(60) == 0
        ((world, rank, status, data),) = agent.results()
        assert (world, rank, status, pickle.loads(data)) == (0, 5, "ok", "5")
    finally:
        proc.kill()
        proc.wait()


def test_a_worker_without_its_agent_says_so():
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    address = "127.0.0.1:%d" % dead.getsockname()[1]
    dead.close()
    done = subprocess.run([sys.executable, "-m", "hvlite.cluster.worker"], capture_output=True,
                          timeout=60, env=env(**{ENV_KEY: KEY, ENV_SLOTS: address}))
    assert done.returncode == 1
    assert b"lost the agent of its slot" in done.stderr, done.stderr


def test_host_names_are_never_this_machine_and_tell_incarnations_apart(table):
    from hvlite.runner.hosts.hostlist import is_local
    names = host_names("ray", [("n1", "127.0.0.1", "aa11"), ("n2", "127.0.0.1", "bb22")])
    assert names == {"n1": "ray-127-0-0-1-aa11", "n2": "ray-127-0-0-1-bb22"}
    assert not any(is_local(n) for n in names.values())
    table.write({"a": ["x:1", "x:2"], "b": ["y:1"], "c": []})
    assert open(table.discovery_path).read() == "a:2\nb:1\n"
    assert subprocess.run(table.discovery_script(), shell=True, capture_output=True,
                          text=True).stdout == "a:2\nb:1\n"
    assert interface_of("127.0.0.1") == "lo"


# --- the rank stand-in (Ray Train: the engine's worker is the rank) -------------------------
def start_standin(agent, rank=0, **more):
    variables = {ENV_KEY: KEY, ENV_SLOTS: agent.address, "PMI_ID": str(rank),
                 "PMI_PORT": "node:4242", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
    variables.update(more)
    return subprocess.Popen([sys.executable, "-m", "hvlite.cluster.standin"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd="/", env=env(**variables))


def ended(proc, timeout=30):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, err.decode("utf-8", "replace")


def test_a_standin_hands_over_its_mpi_connection_and_hvlruns_settings_then_stops(agent):
    proc = start_standin(agent, rank=2, HVLITE_CYCLE_TIME="3", NCCL_SOCKET_IFNAME="eth9",
                         HVLRUN_HOST="h1", OMP_NUM_THREADS="1", HVLRUN_CLUSTER_HOSTS="/x")
    try:
        hello = agent.wait_worker(60)
        assert hello["rank"] == 2 and hello["host"] == "h1"
        assert hello["handover"]["mpi"] == {"PMI_ID": "2", "PMI_PORT": "node:4242",
                                            "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
        settings = hello["handover"]["settings"]
        assert settings["HVLITE_CYCLE_TIME"] == "3" and settings["NCCL_SOCKET_IFNAME"] == "eth9"
        assert settings["HVLRUN_HOST"] == "h1"
        assert not {"OMP_NUM_THREADS", "HVLRUN_CLUSTER_HOSTS", ENV_KEY} & set(settings)
        agent.stop_worker()
        assert ended(proc)[0] == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_standin_told_its_worker_failed_prints_why_and_exits_1(agent):
    proc = start_standin(agent)
    try:
        agent.wait_worker(60)
        assert agent.tell_worker("fail", b"Traceback ...\nValueError: the loop failed\n")
        code, err = ended(proc)
        assert code == 1 and "ValueError: the loop failed" in err, err
    finally:
        proc.kill()
        proc.wait()


def test_a_standin_ended_by_hvlrun_tells_its_worker_the_world_ends():
    notices = []
    agent = Agent(KEY, "127.0.0.1", on_notice=notices.append)
    proc = start_standin(agent)
    try:
        agent.wait_worker(60)
        time.sleep(0.5)                   # past the setup frame: serving
        proc.send_signal(signal.SIGTERM)
        assert ended(proc)[0] == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while not notices and time.monotonic() < deadline:
            time.sleep(0.05)
        assert notices == [b"end"]
    finally:
        proc.kill()
        proc.wait()
        agent.close()


def test_a_standin_whose_worker_is_gone_says_so_and_exits_1(agent):
    proc = start_standin(agent)
    try:
        agent.wait_worker(60)
        agent.close()                        # the worker's process (the agent's) is gone
        code, err = ended(proc)
        assert code == 1 and "rank 0: its worker is gone" in err, err
    finally:
        proc.kill()
        proc.wait()


def test_a_standin_without_a_pmi_port_says_hvlrun_needs_it(agent):
    proc = start_standin(agent, PMI_PORT="")
    code, err = ended(proc)
    assert code == 1 and "-pmi-port" in err, err


# --- calls in order, one at a time; results per job; values that cannot travel ---------------
def echo_worker(agent, delay, order):
    """A rank process's side of the frames, in a thread: answers each call with its payload,
    after ``delay`` seconds, noting the order it got them in."""
    channel = connect(agent.address, KEY)
    channel.send("hello", json.dumps({"rank": 0, "world": 0, "pid": 1}).encode())

    def serve():
        try:
            while True:
                kind, data = channel.recv()
                if kind == "call":
                    order.append(data)
                    time.sleep(delay)
                    channel.send("result", b"1" + pickle.dumps(data))
        except ChannelError:
            pass
    threading.Thread(target=serve, daemon=True).start()
    return channel


def test_calls_at_once_each_get_their_own_answer(agent):
    channel = echo_worker(agent, 0.1, [])
    agent.wait_worker(10)
    payloads = [b"%d" % i for i in range(6)]
    got = {}
    threads = [threading.Thread(target=lambda p=p: got.update({p: agent.call(p)}), daemon=True)
               for p in payloads]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join(10)
    channel.close()
    assert not any(t.is_alive() for t in threads), "a call hung"
    assert {p: pickle.loads(v[1]) for p, v in got.items()} == {p: p for p in payloads}


def test_numbered_calls_run_in_the_drivers_order_whatever_order_they_arrive_in(agent):
    order = []
    channel = echo_worker(agent, 0.05, order)
    agent.wait_worker(10)
    got = {}
    threads = [threading.Thread(target=lambda s=s: got.update({s: agent.call(b"%d" % s, s)}))
               for s in (2, 0, 1)]                   # as Ray may deliver them
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(10)
    channel.close()
    assert order == [b"0", b"1", b"2"]
    assert {s: pickle.loads(v[1]) for s, v in got.items()} == {0: b"0", 1: b"1", 2: b"2"}


def test_a_new_job_forgets_the_results_of_the_last(agent):
    for value in ("first", "second"):
        agent.set_job(call("run", lambda v=value: v))
        proc = start_worker(agent, rank=0)
        try:
            assert proc.wait(60) == 0
        finally:
            proc.kill()
            proc.wait()
        assert [pickle.loads(r[3]) for r in agent.results()] == [value]


def test_a_value_that_cannot_be_pickled_is_named_and_the_rank_goes_on(agent):
    proc = start_worker(agent, rank=3)
    try:
        agent.wait_worker(60)
        status, why = agent.call(call("run", lambda: threading.Lock()))
        assert status == "unpicklable" and b"_thread.lock" in why, (status, why)
        assert agent.call(call("run", lambda: 7)) == ("ok", cloudpickle.dumps(7))
        agent.stop_worker()
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()


def test_collecting_results_gives_up_on_a_stalled_agent_in_time(agent):
    pytest.importorskip("pyspark")
    from hvlite.spark.runner import collect_results
    agent.set_job(call("run", lambda: "kept"))
    proc = start_worker(agent, rank=0)
    try:
        assert proc.wait(60) == 0
    finally:
        proc.kill()
        proc.wait()
    stalled = socket.socket()                  # shakes hands, then never answers
    stalled.bind(("127.0.0.1", 0))
    stalled.listen(1)
    held = []

    def serve():
        sock, _ = stalled.accept()
        held.append(Channel(sock, KEY, server=True).handshake())
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    started = time.monotonic()
    found = collect_results(["127.0.0.1:%d" % stalled.getsockname()[1], agent.address], KEY,
                            timeout=2.0)
    seconds = time.monotonic() - started
    stalled.close()
    for channel in held:
        channel.close()
    assert [pickle.loads(r[3]) for r in found] == ["kept"]
    assert seconds < 5, seconds


def test_the_horovod_spark_variables_point_to_nothing_hvlite_lacks():
    from hvlite.horovod_env import VARIABLES
    for name in ("HOROVOD_SPARK_PYTHONPATH", "HOROVOD_SPARK_WORK_DIR",
                 "HOROVOD_SPARK_USE_LOCAL_RANK_GPU_INDEX"):
        text = VARIABLES[name].text
        assert "argument" not in text and "hvlite.spark.run" in text, (name, text)


def test_rank_output_goes_through_a_stream_object_that_is_no_real_file():
    from hvlite.cluster.job import _fileno

    class NotebookStream(io.StringIO):       # ipykernel's: fileno() is the terminal's
        def fileno(self):
            return 1
    assert _fileno(NotebookStream()) is None
    assert _fileno(sys.__stdout__) == sys.__stdout__.fileno()
    with open(os.devnull, "w") as f:
        assert _fileno(f) == f.fileno()


# --- the elastic Ray executor's own rules (no cluster needed) ---------------------------------
def test_elastic_ray_refuses_what_it_cannot_take():
    pytest.importorskip("ray")
    from hvlite.ray import ElasticRayExecutor, RayExecutor
    settings = RayExecutor.create_settings()
    with pytest.raises(ValueError, match="override_discovery=False"):
        RayExecutor(settings, min_workers=2, override_discovery=False)
    with pytest.raises(ValueError, match="override_discovery=False"):
        ElasticRayExecutor(ElasticRayExecutor.create_settings(), override_discovery=False)
    executor = RayExecutor(settings, min_workers=2)
    with pytest.raises(ValueError, match="builds no executable_cls"):
        executor.start(executable_cls=dict)
    with pytest.raises(NotImplementedError):
        executor.execute(lambda w: 1)


def test_the_elastic_watchers_last_error_is_in_starts_error():
    pytest.importorskip("ray")
    from hvlite.cluster.job import JobError
    from hvlite.ray.elastic import ElasticJob
    from hvlite.ray.executor import Settings
    job = ElasticJob(Settings(timeout_s=2.5), 2, 3, 1, 0)

    def look():
        raise ConnectionError("the GCS is away")
    job._look = look
    try:
        with pytest.raises(JobError, match="last error: ConnectionError: the GCS is away"):
            job.start()
    finally:
        job.shutdown()


def test_an_elastic_node_is_dropped_only_after_pings_missed_for_a_while():
    pytest.importorskip("ray")
    from hvlite.ray.elastic import DROP_MISSED_PINGS, DROP_SECONDS, _Node
    node = _Node("n1", [])
    assert not node.answered(False, 100.0)                 # one missed ping: kept
    assert not node.answered(True, 101.0)                  # it answered: the count starts over
    t = 200.0
    for _ in range(DROP_MISSED_PINGS - 1):
        assert not node.answered(False, t)
        t += 1.0
    assert not node.answered(False, 200.0 + DROP_SECONDS - 0.5)   # enough pings, too soon
    assert node.answered(False, 200.0 + DROP_SECONDS)
