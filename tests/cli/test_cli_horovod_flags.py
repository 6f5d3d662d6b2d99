"""horovodrun's command line under hvlrun (``cli/horovod_flags.py``), checked with ``main([...
--dry-run])`` in-process: Horovod's flag names and ``--no-*`` switches, ``--config-file``, the
flags hvlite has nothing behind (named, the job runs) and the ones it refuses (``--gloo``).
tests/test_horovod_flags_job.py runs a real job with them."""

import shlex

import pytest

from hvlite.runner import main
from hvlite.runner.cli.flags import build_parser, check_usage
from hvlite.runner.cli.horovod_flags import HOROVODRUN_FLAGS, NO_EFFECT, flag_table

HOROVOD_EXAMPLE_CONFIG = """\
params:
  fusion_threshold_mb: 32
  cycle_time_ms: 10
  cache_capacity: 2048
  hierarchical_allreduce: true
  hierarchical_allgather: false
autotune:
  enabled: true
  log_file: /tmp/autotune_log.csv
  warmup_samples: 5
  steps_per_sample: 20
  bayes_opt_max_samples: 50
  gaussian_process_noise: 0.9
timeline:
  filename: /tmp/timeline.json
  mark_cycles: false
stall_check:
  enabled: true
  warning_time_seconds: 120
  shutdown_time_seconds: 0
library_options:
  mpi_threads_disable: false
logging:
  level: warning
  with_timestamp: true
"""


def dry_run(capsys, *args):
    """``main([--dry-run ...])``: (exports dict, mpiexec argv, hvlrun's stderr)."""
    assert main(["--dry-run", "--mpi-flavour", "mpich"] + [str(a) for a in args]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    exports = dict(line[len("export "):].split("=", 1) for line in lines[:-1])
    return exports, shlex.split(lines[-1]), captured.err


def refused(capsys, *args):
    """``main([...])`` must be a usage error: its ``hvlrun: error:`` line."""
    assert main(["--dry-run", "--mpi-flavour", "mpich"] + [str(a) for a in args]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "hvlrun: error:" in line]
    assert len(errors) == 1, errors
    return errors[0]


def test_a_horovodrun_command_line_runs_unchanged(capsys):
    exports, argv, err = dry_run(
        capsys, "-np", "4", "-hostfile", "launch/hostfile.example", "--mpi",
        "--stall-check-warning-time-seconds", "30", "--stall-check-shutdown-time-seconds", "90",
        "--no-autotune", "--no-hierarchical-allreduce", "--no-timeline-mark-cycles",
        "--cache-capacity", "512", "--disable-cache", "--log-with-timestamp",
        "--mpi-threads-disable",
        "--binding-args", "-bind-to core", "--prefix-output-with-timestamp",
        "--thread-affinity", "3, 7",
        "python", "train.py")
    assert {k: v for k, v in exports.items() if k.startswith(("HVLITE_", "HVLRUN_P"))} == {
        "HVLITE_STALL_CHECK_TIME_SECONDS": "30", "HVLITE_STALL_SHUTDOWN_TIME_SECONDS": "90",
        "HVLITE_AUTOTUNE": "0", "HVLITE_HIERARCHICAL_ALLREDUCE": "0",
        "HVLITE_TIMELINE_MARK_CYCLES": "0", "HVLITE_CACHE_CAPACITY": "512",
        "HVLITE_LOG_HIDE_TIME": "0", "HVLITE_MPI_THREADS_DISABLE": "1",
        "HVLITE_THREAD_AFFINITY": "3,7",
        "HVLRUN_PREFIX_TIMESTAMP": "1"}, exports
    assert argv[argv.index("-hosts") + 1] == "node01:4,node02:4"
    binding = argv.index("-bind-to")
    assert argv[binding:binding + 2] == ["-bind-to", "core"] and argv[-2:] == ["python", "train.py"]
    assert err == ""


def test_switches_and_their_horovod_opposites(capsys):
    exports, _, _ = dry_run(capsys, "-np", "1", "--stall-check", "--log-hide-timestamp",
                            "--no-mpi-threads-disable", "x")
    assert (exports["HVLITE_STALL_CHECK_DISABLE"], exports["HVLITE_LOG_HIDE_TIME"],
            exports["HVLITE_MPI_THREADS_DISABLE"]) == ("0", "1", "0")
    exports, _, _ = dry_run(capsys, "-np", "1", "--no-stall-check", "--no-log-hide-timestamp", "x")
    assert (exports["HVLITE_STALL_CHECK_DISABLE"], exports["HVLITE_LOG_HIDE_TIME"]) == ("1", "0")
    exports, _, _ = dry_run(capsys, "-np", "1", "x")        # not given: nothing set
    assert not any(name.startswith("HVLITE_") for name in exports)


def test_horovods_example_config_file(capsys, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(HOROVOD_EXAMPLE_CONFIG)
    exports, _, err = dry_run(capsys, "-np", "2", "--config-file", config, "python", "train.py")
    assert {k: v for k, v in exports.items() if k.startswith("HVLITE_")} == {
        "HVLITE_FUSION_THRESHOLD": str(32 << 20), "HVLITE_CYCLE_TIME": "10",
        "HVLITE_CACHE_CAPACITY": "2048", "HVLITE_HIERARCHICAL_ALLREDUCE": "1",
        "HVLITE_AUTOTUNE": "1", "HVLITE_AUTOTUNE_LOG": "/tmp/autotune_log.csv",
        "HVLITE_AUTOTUNE_WARMUP_SAMPLES": "5", "HVLITE_AUTOTUNE_STEPS_PER_SAMPLE": "20",
        "HVLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "50",
        "HVLITE_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.9",
        "HVLITE_TIMELINE": "/tmp/timeline.json", "HVLITE_TIMELINE_MARK_CYCLES": "0",
        "HVLITE_STALL_CHECK_DISABLE": "0", "HVLITE_STALL_CHECK_TIME_SECONDS": "120",
        "HVLITE_STALL_SHUTDOWN_TIME_SECONDS": "0", "HVLITE_MPI_THREADS_DISABLE": "0",
        "HVLITE_LOG_LEVEL": "warning", "HVLITE_LOG_HIDE_TIME": "0"}
    assert err == ""        # hierarchical_allgather: false asks for what hvlite does anyway


def test_the_command_line_wins_over_the_config_file(capsys, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(HOROVOD_EXAMPLE_CONFIG)
    exports, _, _ = dry_run(capsys, "-np", "2", "--config-file", config, "--cycle-time-ms", "3",
                            "--no-autotune", "--no-stall-check", "--log-without-timestamp", "x")
    assert (exports["HVLITE_CYCLE_TIME"], exports["HVLITE_AUTOTUNE"],
            exports["HVLITE_STALL_CHECK_DISABLE"], exports["HVLITE_LOG_HIDE_TIME"]) == \
        ("3", "0", "1", "1")
    assert exports["HVLITE_FUSION_THRESHOLD"] == str(32 << 20)


def test_flags_hvlite_has_nothing_behind_are_named_and_the_job_runs(capsys, tmp_path):
    exports, _, err = dry_run(capsys, "-np", "1", "--hierarchical-allgather", "--torus-allreduce",
                              "--num-nccl-streams", "0", "--gloo-timeout-seconds", "30",
                              "--tcp", "x")
    notes = err.splitlines()
    assert [line.split()[2] for line in notes] == [
        "--hierarchical-allgather", "--torus-allreduce", "--num-nccl-streams",
        "--gloo-timeout-seconds", "--tcp"], notes
    assert all(line.startswith("hvlrun: note: ") and "has no effect in hvlite: " in line
               for line in notes[:-1])
    assert "keeps NCCL off InfiniBand" in notes[-1] and exports["NCCL_IB_DISABLE"] == "1"
    _, _, err = dry_run(capsys, "-np", "1", "--no-torus-allreduce", "--no-hierarchical-allgather",
                        "x")
    assert err == ""
    config = tmp_path / "config.yaml"
    config.write_text("library_options:\n  num_nccl_streams: 4\n")
    _, _, err = dry_run(capsys, "-np", "1", "--config-file", config, "x")
    assert err.startswith("hvlrun: note: --num-nccl-streams has no effect"), err


@pytest.mark.parametrize("text, message", [
    ("params:\n  cycle_tme_ms: 5\n", "unknown key params.cycle_tme_ms (known: fusion_threshold_mb"),
    ("parameters:\n  cycle_time_ms: 5\n", "unknown section 'parameters'"),
    ("params:\n  cycle_time_ms: -1\n", "params.cycle_time_ms: '-1' must be a finite number >= 0"),
    ("autotune:\n  enabled: yes please\n", "autotune.enabled must be true or false"),
    ("params: [1, 2]\n", "section params must hold key: value lines"),
    ("- 1\n- 2\n", "expected sections (params, autotune, ...), got a list"),
    ("params: {cycle_time_ms: 5\n", "is not YAML"),
    ("controller: gloo\n", "controller gloo: hvlite has no such controller; it runs on MPI"),
    ("controller: ucx\n", "controller ucx: hvlite has no such controller"),
    ("logging:\n  level: true\n", "logging.level: True is not a name"),
    ("params:\n  cycle_time_ms: true\n", "params.cycle_time_ms: True is not a number"),
    ("params:\n  cache_capacity: 2.5\n", "params.cache_capacity: '2.5' is not an integer >= 0"),
    ("timeline:\n  mark_cycles: 2\n", "timeline.mark_cycles must be true or false, not 2"),
    ("library_options:\n  thread_affinity: 0,x\n", "'x' is not an integer >= 0"),
])
def test_config_file_errors_name_what_is_wrong(capsys, tmp_path, text, message):
    config = tmp_path / "config.yaml"
    config.write_text(text)
    assert message in refused(capsys, "-np", "1", "--config-file", config, "x")


def test_config_values_as_horovod_reads_them(capsys, tmp_path):
    """Whole floats for integers, 0/1 for switches, Horovod's own test file's hide_timestamp,
    an empty controller; a controller in the file yields to --mpi on the command line."""
    config = tmp_path / "config.yaml"
    config.write_text("params:\n  cache_capacity: 1024.0\n  fusion_threshold_mb: 0.5\n"
                      "stall_check:\n  warning_time_seconds: 60.0\n"
                      "timeline:\n  mark_cycles: 1\n"
                      "logging:\n  hide_timestamp: true\n"
                      "library_options:\n  thread_affinity: 1\n"
                      "controller:\n")
    exports, _, _ = dry_run(capsys, "-np", "1", "--config-file", config, "x")
    assert (exports["HVLITE_CACHE_CAPACITY"], exports["HVLITE_FUSION_THRESHOLD"],
            exports["HVLITE_STALL_CHECK_TIME_SECONDS"], exports["HVLITE_TIMELINE_MARK_CYCLES"],
            exports["HVLITE_LOG_HIDE_TIME"], exports["HVLITE_THREAD_AFFINITY"]) == \
        ("1024", str(1 << 19), "60", "1", "1", "1")
    config.write_text("controller: gloo\nparams:\n  cycle_time_ms: 4\n")
    exports, _, _ = dry_run(capsys, "-np", "1", "--mpi", "--config-file", config, "x")
    assert exports["HVLITE_CYCLE_TIME"] == "4"


def test_a_missing_config_file_is_named(capsys, tmp_path):
    line = refused(capsys, "-np", "1", "--config-file", tmp_path / "none.yaml", "x")
    assert "--config-file %s: No such file or directory" % (tmp_path / "none.yaml") in line


@pytest.mark.parametrize("flag, message", [
    ("--gloo", "--gloo: hvlite has no Gloo controller; it runs on MPI"),
    ("--jsrun", "--jsrun: hvlrun does not start jobs with LSF's jsrun"),
])
def test_controllers_hvlite_does_not_have_are_refused(capsys, flag, message):
    assert message in refused(capsys, "-np", "1", flag, "x")


def test_version_and_check_build_short_name(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("hvlrun (hvlite) ")
    assert main(["-cb"]) == 0
    assert "Available features:" in capsys.readouterr().out


def test_every_horovodrun_flag_is_accepted_with_a_status():
    """The table the migration page is generated from covers horovodrun 0.28's every flag,
    hvlrun's parser takes each, and what it says matches what hvlrun does with them."""
    known = {option for action in build_parser()._actions for option in action.option_strings}
    table = flag_table()
    assert [flag for flag, _, _ in table] == list(HOROVODRUN_FLAGS)
    assert set(HOROVODRUN_FLAGS) <= known, sorted(set(HOROVODRUN_FLAGS) - known)
    by_status = {}
    for flag, status, _ in table:
        by_status.setdefault(status, set()).add(flag)
    assert by_status["no effect"] == set(NO_EFFECT)
    assert by_status["refused"] == {"--gloo", "--jsrun"}


def test_horovods_timeout_variables_are_hvlruns_defaults(monkeypatch):
    monkeypatch.delenv("HVLRUN_START_TIMEOUT", raising=False)
    monkeypatch.setenv("HOROVOD_START_TIMEOUT", "77")
    monkeypatch.setenv("HOROVOD_ELASTIC_TIMEOUT", "99")
    args = build_parser().parse_args(["-np", "2", "--min-np", "1", "x"])
    check_usage(args, ["x"])
    assert (args.start_timeout, args.elastic_timeout) == (77.0, 99.0)
    monkeypatch.setenv("HVLRUN_START_TIMEOUT", "5")          # hvlrun's own variable first
    args = build_parser().parse_args(["-np", "2", "--elastic-timeout", "3", "--min-np", "1", "x"])
    check_usage(args, ["x"])
    assert (args.start_timeout, args.elastic_timeout) == (5.0, 3.0)   # and the flag over both
