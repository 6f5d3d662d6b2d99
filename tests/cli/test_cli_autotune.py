"""hvlrun's autotune flags (Horovod's names) become HVLITE_AUTOTUNE* variables; bad values are
usage errors. ``main([... --dry-run])`` in-process: no job starts."""
import shlex

import pytest

from hvlite.runner import main


def dry_run(capsys, *args):
    """Run ``main([... --dry-run])``; return the exported variables as a dict."""
    assert main(["--dry-run", "--mpi-flavour", "mpich"] + list(args)) == 0
    lines = capsys.readouterr().out.splitlines()
    exports = dict(line[len("export "):].split("=", 1) for line in lines[:-1])
    argv = shlex.split(lines[-1])
    for name, value in exports.items():
        assert argv[argv.index(name) - 1:argv.index(name) + 2] == ["-genv", name, value]
    return exports


def test_autotune_flags_become_env(capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    exports = dry_run(capsys, "-np", "2", "--autotune", "--autotune-log-file", "/tmp/tune.csv",
                      "--autotune-warmup-samples", "0", "--autotune-steps-per-sample", "5",
                      "--autotune-bayes-opt-max-samples", "12",
                      "--autotune-gaussian-process-noise", "0.25", "python", "train.py")
    assert exports == {"HVLITE_AUTOTUNE": "1", "HVLITE_AUTOTUNE_LOG": "/tmp/tune.csv",
                       "HVLITE_AUTOTUNE_WARMUP_SAMPLES": "0",
                       "HVLITE_AUTOTUNE_STEPS_PER_SAMPLE": "5",
                       "HVLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "12",
                       "HVLITE_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.25"}


def test_autotune_is_off_unless_asked(capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert not any("AUTOTUNE" in name for name in dry_run(capsys, "-np", "2", "x"))


@pytest.mark.parametrize("args, fragment", [
    (["--autotune-steps-per-sample", "0"], "'0' must be at least 1"),
    (["--autotune-bayes-opt-max-samples", "0"], "'0' must be at least 1"),
    (["--autotune-warmup-samples", "-1"], "is not an integer"),
    (["--autotune-gaussian-process-noise", "noisy"], "is not a number"),
])
def test_autotune_flag_errors(capsys, args, fragment):
    rc = main(["--dry-run", "--mpi-flavour", "mpich", "-np", "1"] + args + ["x"])
    assert rc == 2
    assert fragment in capsys.readouterr().err
