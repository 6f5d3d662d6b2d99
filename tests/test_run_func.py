"""hvlite.run and hvlite.runner.run (Horovod's horovod.run and horovod.runner.run): a function of the caller's own script runs on every rank
of a new job, and the results come back by rank; the script's `if __name__ == "__main__"` block
does not run again on the ranks; the function's own init() settings hold; sys.exit(0) returns
None; a rank's exception reaches the caller as a RuntimeError naming the rank; an unpicklable
argument is a ValueError before anything starts; a script without a main guard fails saying so
(no job per rank); in an elastic job, the results are the last world's; the working folder is
removed. Each driver is a real script run by a real Python, with a hard timeout."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from jobs import MULTIPLIER, STOP_GRACE, job_env

SCRIPT = textwrap.dedent('''
    import os, sys
    import numpy as np
    import hvlite

    ARGV = list(sys.argv)           # the caller's argv, on the ranks too

    def work(x, scale=1):
        import hvlite as hvd
        hvd.init(process_sets=[hvd.ProcessSet([0, 1])])   # its own settings: nothing before it
        total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum, name="total")
        import inspect
        return {"rank": hvd.rank(), "size": hvd.size(), "value": x * scale,
                "total": float(total[0]), "argv": ARGV, "cwd": os.getcwd(),
                "source": inspect.getsource(work).startswith("def work")}   # autograph reads it

    def fail_on_1():
        import hvlite as hvd
        hvd.init()
        if hvd.rank() == 1:
            raise KeyError("no such thing on rank 1")
        if hvd.rank() == 2:
            sys.exit(0)
        return "fine"

    def wait_forever(flag):
        import time
        import hvlite as hvd
        hvd.init()
        open(flag, "w").close()
        time.sleep(300)

    def elastic_train(hosts_file):
        import time
        import hvlite as hvd, hvlite.elastic as el
        hvd.init()
        state = el.ObjectState(step=0)

        @el.run
        def loop(state):
            while state.step < 6:
                if state.step == 3 and hvd.size() == 2 and hvd.rank() == 0:
                    with open(hosts_file, "w") as f:
                        f.write("localhost:1\\n")
                    # the next commit sees the change once the driver has asked this world to
                    # stop (its discovery runs every second): wait for that, not a fixed time
                    deadline = time.monotonic() + 60
                    while el.world.current().updates() == 0 and time.monotonic() < deadline:
                        time.sleep(0.05)
                state.step += 1
                state.commit()
            return hvd.size()
        return hvd.rank(), loop(state)

    if __name__ == "__main__":
        print("MAIN BLOCK", flush=True)      # once: the ranks do not run it
        what = sys.argv[1]
        if what == "ok":
            for result in hvlite.run(work, args=(3,), kwargs={"scale": 2}, np=3):
                print("RESULT", sorted(result.items()), flush=True)
        elif what == "runner":             # Horovod's module path and deprecated np=
            from hvlite.runner import run
            for result in run(work, args=(5,), np=3, hosts="localhost:3"):
                print("RESULT", sorted(result.items()), flush=True)
        elif what == "fail":
            try:
                hvlite.run(fail_on_1, num_proc=3)
            except RuntimeError as e:
                print("FAILED", e, flush=True)
        elif what == "unpicklable":
            import threading
            try:
                hvlite.run(work, args=(threading.Lock(),), num_proc=2)
            except ValueError as e:
                print("REFUSED", e, flush=True)
        elif what == "main_block":
            def in_main_block(x):                # not there when the ranks run the script again
                return x + 1
            try:
                print("RESULT", hvlite.run(in_main_block, args=(1,), num_proc=2), flush=True)
            except RuntimeError as e:
                print("FAILED", e, flush=True)
        elif what == "elastic":
            with open("hosts", "w") as f:
                f.write("localhost:2\\n")
            with open("discover.sh", "w") as f:
                f.write("#!/bin/sh\\ncat %s\\n" % os.path.abspath("hosts"))
            os.chmod("discover.sh", 0o755)
            print("RESULT", hvlite.run(elastic_train, args=(os.path.abspath("hosts"),), num_proc=2,
                                       min_num_proc=1, max_num_proc=2,
                                       host_discovery_script=os.path.abspath("discover.sh")), flush=True)
        elif what == "interrupt":          # the caller gets Ctrl-C while the job runs
            try:
                hvlite.run(wait_forever, args=(os.path.abspath("started"),), num_proc=2,
                           min_num_proc=1)
            except KeyboardInterrupt:
                print("INTERRUPTED", flush=True)
        print("LEFT", sorted(n for n in os.listdir(".") if n.startswith(".hvlite-run-")), flush=True)
''')


def run_driver(args, cwd):
    """Run a driver script in a process group of its own, with a hard timeout: past it, the
    group (the driver and the hvlrun it started, which ends its ranks) gets SIGTERM, then
    SIGKILL after STOP_GRACE seconds, and the test fails."""
    with subprocess.Popen([sys.executable] + args, cwd=cwd, env=job_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          stdin=subprocess.DEVNULL, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=120 * MULTIPLIER)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                out, err = proc.communicate(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
            pytest.fail("driver timed out (a hang): %s\n--- stdout\n%s\n--- stderr\n%s"
                        % (args, out[-4000:], err[-4000:]))
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def drive(tmp_path, what):
    script = tmp_path / "driver.py"
    script.write_text(SCRIPT)
    r = run_driver([str(script), what], str(tmp_path))
    return r.stdout, r.stderr


def test_results_come_back_by_rank(tmp_path):
    out, err = drive(tmp_path, "ok")
    results = [line for line in out.splitlines() if line.startswith("RESULT")]
    assert len(results) == 3, out + err
    for rank, line in enumerate(results):
        got = dict(eval(line[len("RESULT "):]))      # noqa: S307 - our own repr of plain values
        assert got["rank"] == rank and got["size"] == 3 and got["value"] == 6, got
        assert got["total"] == 6.0, got                  # 1 + 2 + 3, a real allreduce
        assert got["argv"][1:] == ["ok"] and got["cwd"] == str(tmp_path), got
        assert got["source"], got                        # the function itself, not a copy
    assert out.count("MAIN BLOCK") == 1, out
    assert "LEFT []" in out, out


def test_hvlite_runner_run_is_horovods_runner_run(tmp_path):
    out, err = drive(tmp_path, "runner")
    results = [dict(eval(line[len("RESULT "):])) for line in out.splitlines()   # noqa: S307
               if line.startswith("RESULT")]
    assert [(r["rank"], r["size"], r["value"], r["total"]) for r in results] == \
        [(0, 3, 5, 6.0), (1, 3, 5, 6.0), (2, 3, 5, 6.0)], out + err
    assert "LEFT []" in out, out


def test_a_rank_exception_reaches_the_caller(tmp_path):
    out, err = drive(tmp_path, "fail")
    assert "FAILED hvlite.runner.run: the job failed (hvlrun exited with code" in out, out + err
    assert "rank 1 raised:" in out and "KeyError: 'no such thing on rank 1'" in out, out
    assert "rank 0 raised" not in out and "rank 2" not in out, out   # "fine", and sys.exit(0)
    assert "LEFT []" in out, out


def test_unpicklable_argument_is_refused_before_starting(tmp_path):
    out, err = drive(tmp_path, "unpicklable")
    assert "REFUSED hvlite.runner.run: cannot pickle the function and its arguments" in out, out + err
    assert "LEFT []" in out and "hvlrun" not in err, out + err
    assert sorted(os.listdir(tmp_path)) == ["driver.py"]


def test_a_function_of_the_main_block_goes_by_value(tmp_path):
    """The ranks run the script again without its main block: a function defined there reaches
    them by value (cloudpickle, where installed, as in Horovod), or fails naming it."""
    out, err = drive(tmp_path, "main_block")
    try:
        import cloudpickle  # noqa: F401
        assert "RESULT [2, 2]" in out, out + err
    except ImportError:
        assert "FAILED hvlite.runner.run: the job failed" in out and "in_main_block" in out, out + err


def test_a_script_without_main_guard_fails_saying_so(tmp_path):
    """Its ranks run it again, reach run() at its top level, and are refused (no job from a
    rank); the caller's run() then fails with the ranks' message."""
    script = tmp_path / "unguarded.py"
    script.write_text("import hvlite\n\ndef f():\n    return 1\n\n"
                      "print('RESULT', hvlite.run(f, num_proc=2), flush=True)\n")
    r = run_driver([str(script)], str(tmp_path))
    assert r.returncode != 0 and "RESULT" not in r.stdout, r.stdout + r.stderr
    assert r.stderr.count("RuntimeError: hvlite.runner.run: the job failed") == 1, r.stderr  # one job
    assert "put the call under `if __name__ == '__main__':`" in r.stderr, r.stderr


def test_elastic_results_are_the_last_worlds(tmp_path):
    """World 1 (2 ranks) ends for a re-form when the hosts shrink; world 2 (1 rank) finishes:
    one result, world 2's, and the re-form is not a failure."""
    out, err = drive(tmp_path, "elastic")
    assert "RESULT [(0, 1)]" in out, out + err
    assert "exited with code 1" not in err, err


def test_an_interrupted_caller_lets_hvlrun_end_its_job(tmp_path):
    """Ctrl-C in the caller: hvlrun gets SIGINT and time to end its elastic job in order, so its
    commit folder is removed (subprocess.run killed it after 0.25 s and left it behind)."""
    import time
    script = tmp_path / "driver.py"
    script.write_text(SCRIPT)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    with subprocess.Popen([sys.executable, str(script), "interrupt"], cwd=str(tmp_path),
                          env=job_env({"TMPDIR": str(tmp)}), text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          start_new_session=True) as proc:
        try:
            deadline = time.monotonic() + 60 * MULTIPLIER
            while not (tmp_path / "started").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert (tmp_path / "started").exists(), "the job never started"
            assert [n for n in os.listdir(tmp) if n.startswith("hvlrun-elastic-")]
            os.kill(proc.pid, signal.SIGINT)        # the caller only, as a KeyboardInterrupt
            out, err = proc.communicate(timeout=60 * MULTIPLIER)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.communicate(timeout=STOP_GRACE)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.communicate()
    assert "INTERRUPTED" in out and "LEFT []" in out, out + err
    assert "hvlrun got SIGINT" in err, err                  # hvlrun ended the job itself
    assert not [n for n in os.listdir(tmp) if n.startswith("hvlrun-elastic-")], os.listdir(tmp)
