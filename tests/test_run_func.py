"""hvlite.run (Horovod's horovod.run): a function of the caller's own script runs on every rank
of a new job, and the results come back by rank; the script's `if __name__ == "__main__"` block
does not run again on the ranks; a rank's exception reaches the caller as a RuntimeError naming
the rank; an unpicklable function is a ValueError before anything starts; the working folder is
removed. Each driver is a real script run by a real Python, with a hard timeout."""
import os
import subprocess
import sys
import textwrap

from jobs import MULTIPLIER, job_env

SCRIPT = textwrap.dedent('''
    import os, sys
    import numpy as np
    import hvlite

    ARGV = list(sys.argv)           # the caller's argv, on the ranks too

    def work(x, scale=1):
        import hvlite as hvd
        hvd.init()
        total = hvd.allreduce(np.array([hvd.rank() + 1.0]), op=hvd.Sum, name="total")
        return {"rank": hvd.rank(), "size": hvd.size(), "value": x * scale,
                "total": float(total[0]), "argv": ARGV, "cwd": os.getcwd()}

    def fail_on_1():
        import hvlite as hvd
        if hvd.rank() == 1:
            raise KeyError("no such thing on rank 1")
        return "fine"

    if __name__ == "__main__":
        print("MAIN BLOCK", flush=True)      # once: the ranks do not run it
        what = sys.argv[1]
        if what == "ok":
            for result in hvlite.run(work, args=(3,), kwargs={"scale": 2}, np=3):
                print("RESULT", sorted(result.items()), flush=True)
        elif what == "fail":
            try:
                hvlite.run(fail_on_1, num_proc=2)
            except RuntimeError as e:
                print("FAILED", e, flush=True)
        elif what == "lambda":
            try:
                hvlite.run(lambda: 1, num_proc=2)
            except ValueError as e:
                print("REFUSED", e, flush=True)
        print("LEFT", sorted(n for n in os.listdir(".") if n.startswith(".hvlite-run-")), flush=True)
''')


def drive(tmp_path, what):
    script = tmp_path / "driver.py"
    script.write_text(SCRIPT)
    r = subprocess.run([sys.executable, str(script), what], capture_output=True, text=True,
                       cwd=str(tmp_path), env=job_env(), timeout=120 * MULTIPLIER,
                       stdin=subprocess.DEVNULL)
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
    assert out.count("MAIN BLOCK") == 1, out
    assert "LEFT []" in out, out


def test_a_rank_exception_reaches_the_caller(tmp_path):
    out, err = drive(tmp_path, "fail")
    assert "FAILED hvlite.run: the job failed (hvlrun exited with code" in out, out + err
    assert "rank 1 raised:" in out and "KeyError: 'no such thing on rank 1'" in out, out
    assert "LEFT []" in out, out


def test_unpicklable_function_is_refused_before_starting(tmp_path):
    out, err = drive(tmp_path, "lambda")
    try:
        import cloudpickle  # noqa: F401
        assert "REFUSED" not in out, out       # cloudpickle sends lambdas
    except ImportError:
        assert "REFUSED hvlite.run: cannot pickle the function" in out, out + err
    assert "LEFT []" in out and "hvlrun" not in err, out + err
    assert os.listdir(tmp_path) == ["driver.py"]
