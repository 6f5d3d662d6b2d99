"""Elastic jobs (issue 15), each a real hvlrun job with a hard timeout, on this machine.

The discovery script reads a hosts file that the training scripts rewrite at a chosen step, so
every change of hosts happens at a known point of training. The scenarios
(``tests/scenarios/elastic_train.py`` for torch, ``elastic_keras.py`` for Keras) train on data
that depends only on the step, so the trajectory does not depend on the world's size: every
run is also checked against one process trained without interruption (``refdiff``). Checked
throughout: every step applied exactly once in the state every world restores (``counts``),
identical parameters on every rank, the steps after the last commit done again and no other,
the loss curve going on from the commit, and hvlrun's log naming each re-form."""
import json
import os
import random
import re
import time

import pytest

from jobs import MULTIPLIER, ROOT, run_job

TORCH = os.path.join(ROOT, "tests", "scenarios", "elastic_train.py")
KERAS = os.path.join(ROOT, "tests", "scenarios", "elastic_keras.py")
PROGRAM_ERROR = os.path.join(ROOT, "tests", "scenarios", "elastic_program_error.py")
ELASTIC_FAILED_CODE = 122


def discovery(tmp_path, hosts):
    """A discovery script printing the hosts file, and the file (holding ``hosts``)."""
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text(hosts.replace(",", "\n") + "\n")
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\ncat %s\n" % hosts_file)
    script.chmod(0o755)
    return str(script), str(hosts_file)


def lines(out, tag):
    """Every ``TAG k=v ...`` line of rank 0's output as a dict."""
    return [dict(kv.split("=", 1) for kv in m.split()) for m in
            re.findall(r"\[\d+\]<stdout>: %s (.*)" % tag, out)]


def finals(out):
    found = lines(out, "FINAL")
    assert found, out[-3000:]
    return found


def check_finals(out, size, steps):
    """Every rank of the last world: same parameters, the reference's, each step once."""
    done = finals(out)
    assert sorted(int(f["rank"]) for f in done) == list(range(size)), out[-3000:]
    assert all(int(f["size"]) == size for f in done)
    assert len({f["digest"] for f in done}) == 1, done
    for f in done:
        assert f["counts"] == ",".join(["1"] * steps), f       # none skipped, none twice
        assert float(f["refdiff"]) < 1e-5, f


def check_reform_logged(err, old, new, reason):
    assert re.search(r"hvlrun: elastic: re-forming: world %d \(%s\) -> world %d \(%s\); reason: %s"
                     % (old[0], re.escape(old[1]), new[0], re.escape(new[1]), reason), err), err
    took = re.search(r"hvlrun: elastic: world %d ready: .*the re-form took ([0-9.]+) s"
                     % new[0], err)
    assert took, err
    return float(took.group(1))


def test_killed_worker_job_finishes_with_the_rest_from_the_last_commit(tmp_path):
    kill_step = random.Random(15).randint(6, 22)           # a seeded "random" step
    script, hosts = discovery(tmp_path, "localhost:3")
    timeline = str(tmp_path / "timeline.json")
    job = run_job(3, ["python", TORCH, "--steps", "30", "--commit-every", "5", "--sampler",
                      "--hosts-file", hosts, "--kill", "2:%d:localhost:2" % kill_step],
                  timeout=300, hvlrun_args=["--min-np", "2", "--max-np", "3",
                                            "--host-discovery-script", script,
                                            "--timeline-filename", timeline])
    out, err = job.stdout, job.stderr
    assert job.returncode == 0, err[-4000:]
    check_finals(out, size=2, steps=30)
    took = check_reform_logged(err, (1, "3 ranks on localhost:3"), (2, "2 ranks on localhost:2"),
                               r"rank 2 on localhost was killed by signal 9")
    begins = {int(b["w"]): b for b in lines(out, "BEGIN")}
    assert int(begins[1]["size"]) == 3 and int(begins[2]["size"]) == 2, begins
    # world 2 starts at the last commit world 1 made, which is before the kill
    commits1 = [int(c["s"]) for c in lines(out, "COMMIT") if c["w"] == "1"]
    last = int(begins[2]["s"])
    assert last == max(s for s in commits1 if s <= kill_step), (commits1, begins)
    # replay: the steps after the last commit are done again, no other step is
    steps = lines(out, "STEP")
    runs = {}
    for s in steps:
        runs.setdefault(int(s["s"]), []).append((int(s["w"]), s["loss"]))
    for step in range(30):
        expected = 2 if last <= step <= kill_step else 1
        assert len(runs[step]) == expected, (step, runs[step], last, kill_step)
        losses = [float(loss) for _, loss in runs[step]]
        # the loss curve goes on from the commit: the first redone step sees the very same
        # model; later ones differ by the rounding of averaging over 2 ranks instead of 3
        assert max(losses) - min(losses) <= (0 if step == last else 1e-5 * max(losses)), runs[step]
    # the sampler: every sample of the epoch processed, only padding twice
    seen = [int(v) for v in lines(out, "SAMPLES")[0]["seen"].split(",")]
    assert min(seen) == 1 and max(seen) <= 2 and seen.count(2) <= 1, seen
    check_timelines(timeline, took)
    print("\n[elastic] killed at step %d, resumed at %d; re-form %.1f s" % (kill_step, last, took))


def test_stopped_worker_peers_leave_saying_why_and_the_job_goes_on(tmp_path):
    """A rank stops (SIGSTOP) mid-step: its peer times out, says why and leaves with the
    peer-lost code (not a traceback of its own, which would charge its host), and the job
    re-forms from the last commit and finishes. The world ended on a lost peer, charged to no
    host: mpiexec killing the stopped rank's wrapper after the peer left is no lost host."""
    script, _ = discovery(tmp_path, "localhost:2")
    job = run_job(2, ["python", TORCH, "--steps", "12", "--commit-every", "4", "--stop", "1:6"],
                  timeout=240, env={"HVLITE_PEER_TIMEOUT_SECONDS": "3"},
                  hvlrun_args=["--min-np", "2", "--max-np", "2", "--host-discovery-script", script])
    out, err = job.stdout, job.stderr
    assert job.returncode == 0, err[-4000:]
    check_finals(out, size=2, steps=12)
    assert "hvlrun: rank 0 (pid" in err and "exited with code 76" in err, err   # PEER_LOST_CODE
    assert re.search(r"hvlite\.elastic: rank 0: HvliteTimeoutError: .*rank 1 \(pid \d+\) on this host is "
                     r"stopped.*; this world ends, hvlrun re-forms the job from commit #1", err), err
    assert "Traceback" not in err, err
    assert re.search(r"hvlrun: elastic: world 1 ended after [0-9.]+ s: rank 0 on \S+ lost a peer "
                     r"\(HorovodInternalError\)", err), err
    assert "its connection to hvlrun closed" not in err, err
    assert int({int(b["w"]): b for b in lines(out, "BEGIN")}[2]["s"]) == 4, out   # the last commit


def check_timelines(path, took):
    """hvlrun's own trace has both worlds and the re-form; each world's rank 0 wrote the engine's
    timeline to a file of its own."""
    events = json.load(open(path))
    worlds = [e for e in events if e["ph"] == "X" and e["name"].startswith("world ")]
    reforms = [e for e in events if e["ph"] == "X" and e["name"] == "REFORM world 1 -> 2"]
    assert [w["name"] for w in worlds] == ["world 1 (3 ranks)", "world 2 (2 ranks)"], events
    assert worlds[0]["args"]["end"] == "failed" and worlds[1]["args"]["end"] == "done"
    args = reforms[0]["args"]
    assert (args["old_ranks"], args["new_ranks"]) == (3, 2) and "signal 9" in args["reason"]
    assert abs(args["seconds"] - took) < 0.01
    assert reforms[0]["dur"] == pytest.approx(took * 1e6, rel=0.01)
    for world in (1, 2):
        engine = json.load(open(path.replace(".json", ".world%d.json" % world)))
        assert any("ALLREDUCE" in e.get("name", "") for e in engine), world


def test_added_slot_joins_at_the_next_commit(tmp_path):
    script, hosts = discovery(tmp_path, "localhost:2")
    job = run_job(2, ["python", TORCH, "--steps", "40", "--commit-every", "4", "--sleep", "0.15",
                      "--hosts-file", hosts, "--change", "6:localhost:3"],
                  timeout=300, hvlrun_args=["--min-np", "2", "--max-np", "3",
                                            "--host-discovery-script", script])
    out, err = job.stdout, job.stderr
    assert job.returncode == 0, err[-4000:]
    check_finals(out, size=3, steps=40)
    check_reform_logged(err, (1, "2 ranks on localhost:2"), (2, "3 ranks on localhost:3"),
                        "the hosts changed")
    assert ("hosts changed (usable now: localhost:3); world 1 (localhost:2) stops at its next "
            "commit") in err
    begins = {int(b["w"]): b for b in lines(out, "BEGIN")}
    commits1 = [int(c["s"]) for c in lines(out, "COMMIT") if c["w"] == "1"]
    # the new world starts at the commit where the old one stopped: nothing is done twice
    assert int(begins[2]["s"]) == commits1[-1] > 6, (begins, commits1)
    assert sorted(int(s["s"]) for s in lines(out, "STEP")) == list(range(40))
    assert err.count("exited with code 75") == 2, err      # both ranks left on agreement


def test_below_min_np_ends_with_a_clear_error_in_bounded_time(tmp_path):
    script, hosts = discovery(tmp_path, "localhost:2")
    start = time.monotonic()
    job = run_job(2, ["python", TORCH, "--steps", "30", "--hosts-file", hosts,
                      "--kill", "1:7:localhost:1"],
                  timeout=150, hvlrun_args=["--min-np", "2", "--elastic-timeout", "4",
                                            "--host-discovery-script", script])
    seconds = time.monotonic() - start
    err = job.stderr
    assert job.returncode == ELASTIC_FAILED_CODE, err[-4000:]
    assert re.search(r"hvlrun: elastic: error: only 1 slot usable \(localhost:1; blacklisted: "
                     r"none\) for 4 s, below --min-np 2 \(--elastic-timeout\): ending the job; "
                     r"last commit #1 \(world 1\)", err), err
    assert "waiting for hosts: 1 slot usable" in err
    assert seconds < 120 * MULTIPLIER, seconds


def test_keras_grows_then_loses_a_worker(tmp_path):
    """KerasState and the elastic callbacks: 2 ranks, a third joins at a commit, then dies;
    the job ends with 2, every batch applied once, the model equal to one process's."""
    script, hosts = discovery(tmp_path, "localhost:2")
    job = run_job(2, ["python", KERAS, "--epochs", "3", "--batches", "8", "--commit-every", "3",
                      "--hosts-file", hosts, "--event", "1:0:5:localhost:3",
                      "--event", "2:2:14:localhost:2:kill"],
                  timeout=600, hvlrun_args=["--min-np", "2", "--max-np", "3",
                                            "--host-discovery-script", script])
    out, err = job.stdout, job.stderr
    assert job.returncode == 0, err[-4000:]
    check_finals(out, size=2, steps=24)
    check_reform_logged(err, (1, "2 ranks on localhost:2"), (2, "3 ranks on localhost:3"),
                        "the hosts changed")
    check_reform_logged(err, (2, "3 ranks on localhost:3"), (3, "2 ranks on localhost:2"),
                        r"rank 2 on localhost was killed by signal 9")
    begins = {int(b["w"]): (int(b["e"]), int(b["b"]), int(b["size"])) for b in lines(out, "BEGIN")}
    commits = [(int(c["w"]), int(c["e"]), int(c["b"]), int(c["seq"]))
               for c in lines(out, "COMMIT")]
    last1 = [c[1:3] for c in commits if c[0] == 1][-1]
    assert begins[2] == last1 + (3,), (begins, commits)     # joins where world 1 stopped
    assert begins[3][2] == 2, begins
    # world 3 restores a commit world 2 made (a commit rank 0 stored while rank 2 was dying
    # counts too: every rank had applied every step in it), not older than the last one every
    # rank saw stored, and nothing after the kill (at global batch 14)
    def flat(epoch, batch):
        return epoch * 8 + batch
    resumed, started2 = flat(*begins[3][:2]), flat(*last1)
    seq, stored = [c[3] for c in commits if c[0] == 1][-1], [started2]
    for w, e, b, now in commits:
        if w == 2 and now > seq:           # printed after the commit, also when it failed
            seq = now
            stored.append(flat(e, b))
    points = [started2] + [flat(e, b) for w, e, b, _ in commits if w == 2]
    assert resumed in points and resumed >= max(stored), (begins, commits)
    # replay: the steps from world 3's commit to the last one world 2 began are done twice,
    # every other step once; the first one redone sees the very same model
    runs = {}
    for step in lines(out, "STEP"):
        runs.setdefault(int(step["s"]), []).append((int(step["w"]), float(step["loss"])))
    last2 = max(s for s, r in runs.items() if any(w == 2 for w, _ in r))
    assert 14 <= last2 <= 15 and resumed <= last2, (last2, resumed)
    for step in range(24):
        expected = 2 if resumed <= step <= last2 else 1
        assert len(runs.get(step, [])) == expected, (step, runs.get(step), resumed, last2)
        losses = [loss for _, loss in runs[step]]
        assert max(losses) - min(losses) <= (0 if step == resumed else 1e-5 * max(losses)), \
            runs[step]
    print("\n[elastic] keras: rank 2 killed after global batch 14; world 3 resumed at %d, "
          "redid %d steps" % (resumed, last2 - resumed + 1))


def test_program_that_fails_by_itself_is_not_reformed_forever(tmp_path):
    script, _ = discovery(tmp_path, "localhost:2")
    job = run_job(2, ["python", "-c", "import sys; sys.exit(3)"], timeout=90,
                  hvlrun_args=["--min-np", "1", "--host-discovery-script", script])
    assert job.returncode == ELASTIC_FAILED_CODE, job.stderr
    assert "worlds in a row failed before storing a commit" in job.stderr, job.stderr
    assert "re-forming: world 1" in job.stderr and "-> world 3" not in job.stderr


def test_reset_limit_ends_the_job(tmp_path):
    job = run_job(1, ["python", "-c", "import sys, os; sys.exit(0 if os.environ["
                      "'HVLRUN_ELASTIC_WORLD'] == '9' else 3)"], timeout=90,
                  hvlrun_args=["--min-np", "1", "--reset-limit", "1",
                               "--blacklist-cooldown-range", "0", "0"])
    assert job.returncode == ELASTIC_FAILED_CODE, job.stderr
    assert "the job re-formed 1 times (--reset-limit 1); not again after: rank 0 on " \
           "localhost exited with code 3" in job.stderr, job.stderr


@pytest.mark.parametrize("mode,error", [
    ("key", r"StateEncodingError: hvlite\.elastic: the state cannot be committed: cannot commit "
            r"counts: dict key np\.int64\(1\) of type int64"),
    ("horovod", r"StateNotCommittableError: hvlite\.elastic: HorovodStyle subclasses State"),
    ("mismatch", r"StateMismatchError: hvlite\.elastic: after loading rank 0's state, rank 1 "
                 r"holds a different state")])
def test_a_state_error_ends_the_job_with_it_on_every_rank(tmp_path, mode, error):
    """The program's own state errors are raised on every rank and end the job (exit 1) in
    world 1: no rank leaves as if a peer were lost, no world is re-formed."""
    script, _ = discovery(tmp_path, "localhost:2")
    job = run_job(2, ["python", PROGRAM_ERROR, mode], timeout=120,
                  hvlrun_args=["--min-np", "2", "--host-discovery-script", script])
    out, err = job.stdout, job.stderr
    assert job.returncode == 1, err[-4000:]
    assert len(re.findall(error, err)) == 2, err[-4000:]            # on both ranks
    assert err.count("the job ends: a re-formed world would fail the same way") == 2, err
    assert "hvlrun: elastic: error: the program's state cannot go on" in err, err
    assert "re-forming: world" not in err and "exited with code 76" not in err, err
    assert "WORLD w=2" not in out, out
