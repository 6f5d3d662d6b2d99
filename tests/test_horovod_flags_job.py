"""horovodrun's flags in real 2-rank jobs (hard timeouts): what they change in the engine (stall
check from a config file and switched off, MPI's thread level, timestamps on log lines, the
engine thread's cores) and in
hvlrun's output (a timestamp before each forwarded line). tests/cli/test_cli_horovod_flags.py
checks the flags' mapping without a job."""
import os
import re

import pytest

from jobs import run_job

STAMPED_LOG = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} hvlite rank 0 tid \d+\] INFO: "
                         r"hvlite starting: 2 ranks .*MPI_THREAD_MULTIPLE not granted")
STAMPED_LINE = re.compile(r"^\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\[1\]<stdout>: "
                          r"stall scenario done on rank 1$", re.M)


def test_config_file_stall_check_timestamps_and_mpi_thread_level(tmp_path):
    config = tmp_path / "horovod.yaml"
    config.write_text("stall_check:\n  warning_time_seconds: 1\n"
                      "library_options:\n  mpi_threads_disable: true\n"
                      "logging:\n  level: info\n  with_timestamp: true\n")
    flags = ["--config-file", str(config), "--prefix-output-with-timestamp"]
    job = run_job(2, ["python", "tests/scenarios/stall.py"], timeout=60, hvlrun_args=flags)
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    assert out.count("stall: tensor 'lonely'") == 2, out       # the config file's 1 s
    assert STAMPED_LOG.search(out), out
    assert STAMPED_LINE.search(job.stdout), job.stdout

    job = run_job(2, ["python", "tests/scenarios/stall.py"], timeout=60,
                  hvlrun_args=flags + ["--no-stall-check"])
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    assert "stall: tensor" not in out and out.count("stall scenario done") == 2, out


def test_thread_affinity_pins_each_engine_thread_to_its_core():
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs 2 cores to pin 2 ranks apart")
    listed = "%d,%d" % (cores[1], cores[0])             # local rank 0 on the second core
    job = run_job(2, ["python", "tests/scenarios/thread_affinity.py"], timeout=60,
                  hvlrun_args=["--thread-affinity", listed])
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    for local_rank, core in enumerate((cores[1], cores[0])):
        assert "local rank %d: engine thread on cores [%d], main thread on cores %s" \
            % (local_rank, core, cores) in out, out
    # horovodrun's --thread-affinity takes one number: with 2 ranks on the host, that names fewer
    # cores than ranks, so no rank is pinned (as in Horovod), and each says why
    job = run_job(2, ["python", "tests/scenarios/thread_affinity.py"], timeout=60,
                  hvlrun_args=["--thread-affinity", str(cores[1])])
    out = job.stdout + job.stderr
    assert job.returncode == 0, out
    assert out.count("names fewer cores than this host has ranks; the engine threads are not "
                     "pinned") == 2, out
    for local_rank in (0, 1):
        assert "local rank %d: engine thread on cores %s" % (local_rank, cores) in out, out
