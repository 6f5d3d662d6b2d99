"""Command building, flags, dry-run and build info: pure functions and ``main([...])`` in-process
(``--dry-run``/``--check-build`` start no job)."""

import json
import os
import shlex
import signal
import sys

import pytest

from hvlite.runner import main
from hvlite.runner.cli import build_info, launch
from hvlite.runner.hosts.hostlist import Host
from hvlite.runner.world.mpi_command import (build_command, flavour_from_version, format_command,
                                       launcher_env)
from hvlite.runner.world.rank_exec import describe_exit, rank_from_env

PY = "/opt/py/bin/python3"
WRAP = [PY, "-m", "hvlite.runner.world.rank_exec", "--"]


def test_mpich_command_with_hosts_env_and_mpi_args():
    argv = build_command("mpich", "/m/mpiexec", 4, [Host("h1", 2), Host("h2", 2)],
                         {"HVLITE_CYCLE_TIME": "5", "OMP_NUM_THREADS": "1"},
                         "-bind-to core -genv X 'a b'", ["train.py", "--lr", "0.1"], python=PY)
    assert argv == ["/m/mpiexec", "-n", "4", "-hosts", "h1:2,h2:2",
                    "-genv", "HVLITE_CYCLE_TIME", "5", "-genv", "OMP_NUM_THREADS", "1",
                    "-bind-to", "core", "-genv", "X", "a b"] + WRAP + ["train.py", "--lr", "0.1"]


def test_mpich_localhost_only_adds_no_host_option():
    argv = build_command("unknown", "mpiexec", 2, [Host("localhost", 2)], {}, "", ["x"],
                         python=PY, export_names=["PATH"])
    assert argv == ["mpiexec", "-n", "2"] + WRAP + ["x"]


def test_openmpi_command_exports_names():
    argv = build_command("openmpi", "mpirun", 3, [Host("a", 1), Host("b", 2)],
                         {"HVLITE_LOG_LEVEL": "debug"}, "--bind-to none", ["x", "y"],
                         python=PY, export_names=["PATH", "HVLITE_LOG_LEVEL"])
    assert argv == ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3",
                    "-H", "a:1,b:2", "-x", "HVLITE_LOG_LEVEL", "-x", "PATH",
                    "--bind-to", "none"] + WRAP + ["x", "y"]


def test_command_errors():
    with pytest.raises(ValueError, match="no command"):
        build_command("mpich", "mpiexec", 1, None, {}, "", [])
    with pytest.raises(ValueError):
        build_command("mpich", "mpiexec", 1, None, {}, "-genv 'unbalanced", ["x"])


def test_launcher_env_only_for_openmpi_as_root():
    assert launcher_env("openmpi", 0) == {"OMPI_ALLOW_RUN_AS_ROOT": "1",
                                          "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    assert launcher_env("openmpi", 1000) == {}
    assert launcher_env("mpich", 0) == {}


@pytest.mark.parametrize("text, flavour", [
    ("HYDRA build details:\n    Version: 5.0.2", "mpich"),
    ("mpirun (Open MPI) 4.1.5\n\nReport bugs to ...", "openmpi"),
    ("mpiexec (OpenRTE) 2.1.1", "openmpi"),
    ("prterun (PRRTE) 3.0.0", "openmpi"),
    ("Intel(R) MPI Library for Linux", "unknown"),
])
def test_flavour_from_version(text, flavour):
    assert flavour_from_version(text) == flavour


def test_format_command_quotes():
    text = format_command(["mpiexec", "-n", "2", "python", "-c", "print('a b')"],
                          {"B": "x y", "A": "1"})
    assert text == ("export A=1\nexport B='x y'\n"
                    "mpiexec -n 2 python -c 'print('\"'\"'a b'\"'\"')'\n")


def dry_run(capsys, *args):
    """Run ``main([... --dry-run])``; return (exports dict, command argv)."""
    assert main(["--dry-run", "--mpi-flavour", "mpich"] + list(args)) == 0
    lines = capsys.readouterr().out.splitlines()
    exports = dict(line[len("export "):].split("=", 1) for line in lines[:-1])
    return exports, shlex.split(lines[-1])


def test_dry_run_knobs_become_env(capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    exports, argv = dry_run(capsys, "-np", "2", "--fusion-threshold-mb", "64",
                            "--cycle-time-ms", "2.5", "--cache-capacity", "1024",
                            "--timeline-filename", "/tmp/tl.json", "--stall-check-seconds", "60",
                            "--stall-shutdown-seconds", "0", "--log-level", "debug",
                            "python", "train.py")
    assert exports == {"HVLITE_FUSION_THRESHOLD": "67108864", "HVLITE_CYCLE_TIME": "2.5",
                       "HVLITE_CACHE_CAPACITY": "1024", "HVLITE_TIMELINE": "/tmp/tl.json",
                       "HVLITE_STALL_CHECK_TIME_SECONDS": "60",
                       "HVLITE_STALL_SHUTDOWN_TIME_SECONDS": "0", "HVLITE_LOG_LEVEL": "debug"}
    for name, value in exports.items():
        assert argv[argv.index(name) - 1:argv.index(name) + 2] == ["-genv", name, value]


def test_knob_table_is_the_only_mapping():
    variables = [variable for _, variable, _, _ in launch.KNOBS]
    assert len(set(variables)) == len(variables)
    assert all(v.startswith("HVLITE_") for v in variables)


def test_fractional_fusion_threshold_is_bytes(capsys):
    exports, _ = dry_run(capsys, "-np", "1", "--fusion-threshold-mb", "0.5", "x")
    assert exports["HVLITE_FUSION_THRESHOLD"] == "524288"


def test_flags_after_the_command_belong_to_it(capsys):
    _, argv = dry_run(capsys, "-np", "2", "python", "train.py", "--lr", "0.1", "-H", "x",
                      "--dry-run")
    assert argv[1:3] == ["-n", "2"] and "-hosts" not in argv
    assert argv[-8:] == ["--", "python", "train.py", "--lr", "0.1", "-H", "x", "--dry-run"]
    _, argv = dry_run(capsys, "-np", "2", "--", "-weird-program", "-np", "3")
    assert argv[-4:] == ["--", "-weird-program", "-np", "3"]


def test_dash_m_runs_a_module_with_this_python(capsys):
    _, argv = dry_run(capsys, "-np", "2", "-m", "pytest", "-q", "-x", "tests")
    assert argv[-6:] == [sys.executable, "-m", "pytest", "-q", "-x", "tests"]


def test_omp_num_threads_from_cores_and_local_ranks(capsys, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert dry_run(capsys, "-np", "2", "x")[0]["OMP_NUM_THREADS"] == "4"
    assert dry_run(capsys, "-np", "16", "x")[0]["OMP_NUM_THREADS"] == "1"
    exports, argv = dry_run(capsys, "-H", "localhost:2,elsewhere:2", "x")
    assert exports["OMP_NUM_THREADS"] == "4"
    assert argv[1:5] == ["-n", "4", "-hosts", "localhost:2,elsewhere:2"]
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert "OMP_NUM_THREADS" not in dry_run(capsys, "-np", "2", "x")[0]


def test_hostfile_is_passed_in_flavour_syntax(capsys, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb:1\n")
    _, argv = dry_run(capsys, "--hostfile", str(hostfile), "x")
    assert argv[1:5] == ["-n", "3", "-hosts", "a:2,b:1"]


def test_dry_run_openmpi(capsys, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert main(["--dry-run", "--mpi-flavour", "openmpi", "-H", "a:2", "--log-level", "info",
                 "x"]) == 0
    out = capsys.readouterr().out
    assert "export OMPI_ALLOW_RUN_AS_ROOT=1\n" in out
    assert "export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n" in out
    argv = shlex.split(out.splitlines()[-1])
    assert argv[1:7] == ["--allow-run-as-root", "--oversubscribe", "-np", "2", "-H", "a:2"]
    assert "-x" in argv and argv[argv.index("HVLITE_LOG_LEVEL") - 1] == "-x"


@pytest.mark.parametrize("args, fragment", [
    (["x"], "-np is required"),
    (["-np", "2"], "no command"),
    (["-H", "a:2", "-np", "3", "x"], "-np 3 is larger than the 2 slots"),
    (["-H", "a:zz", "x"], "bad slot count 'zz'"),
    (["-np", "1", "--cycle-time-ms", "fast", "x"], "is not a number"),
    (["-np", "1", "--cache-capacity", "-1", "x"], "is not an integer"),
    (["-np", "1", "--mpi-args", "-genv 'x", "x"], "quotation"),
    (["-np", "1", "-H", "a", "--hostfile", "f", "x"], "not allowed with"),
])
def test_usage_errors_return_2(capsys, args, fragment):
    assert main(["--dry-run"] + args) == 2
    assert fragment in capsys.readouterr().err


def test_load_build_info(tmp_path):
    assert build_info.load_build_info(tmp_path / "absent.json") is None
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"version": "0.1.0", "mpi_source": "site"}))
    assert build_info.load_build_info(good)["mpi_source"] == "site"
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        build_info.load_build_info(bad)


def _executable(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho 'HYDRA build details:'\n")
    path.chmod(0o755)
    return str(path)


def test_find_mpiexec_order(tmp_path):
    site = _executable(tmp_path / "site" / "bin" / "mpiexec")
    on_path = _executable(tmp_path / "path" / "mpirun")
    info = {"mpi_source": "site", "mpi_bindir": str(tmp_path / "site" / "bin")}
    env = {"PATH": str(tmp_path / "path")}
    assert build_info.find_mpiexec(info, dict(env, HVLITE_MPIEXEC="/x/mpiexec"))[0] == "/x/mpiexec"
    assert build_info.find_mpiexec(info, env) == (site, "from build info (site)")
    assert build_info.find_mpiexec({"mpi_source": "site", "mpi_bindir": "/nope"}, env)[0] \
        == on_path
    assert build_info.find_mpiexec(None, env) == (on_path, "found on PATH")
    assert build_info.find_mpiexec(None, {"PATH": str(tmp_path / "empty")}) == (None, "not found")
    wheel = os.path.join(sys.prefix, "bin", "mpiexec")
    if os.access(wheel, os.X_OK):
        assert build_info.find_mpiexec({"mpi_source": "pypi-mpich"}, env)[0] == wheel


def test_check_build_report_not_built(tmp_path):
    fake = _executable(tmp_path / "mpiexec")
    report = build_info.check_build_report(None, fake, "found on PATH")
    assert "NOT BUILT" in report
    assert "mpiexec: %s (found on PATH), flavour mpich" % fake in report
    assert "[ ] MPI" in report and "[ ] NCCL" in report and "[ ] shared memory" in report


def test_check_build_report_built():
    info = {"version": "0.1.0", "mpi_source": "site", "mpi_vendor": "MPICH Version: 5.0.2\nx"}
    engine = {"planes": ["nccl", "hierarchical", "mpi"], "nccl": True, "shm": False, "cuda": True,
              "cuda_driver": None}
    report = build_info.check_build_report(info, None, "not found", {}, engine)
    assert "hvlite version: 0.1.0" in report and "MPI source: site" in report
    assert "MPI vendor: MPICH Version: 5.0.2\n" in report
    assert "mpiexec: none found" in report
    assert "[X] MPI" in report and "[X] NCCL" in report and "[ ] shared memory" in report
    assert "[X] CUDA tensors (the driver is loaded at run time: not found on this machine)" in report
    assert "    1. NCCL: " in report and "    2. hierarchical: " in report and "    3. MPI: " in report
    assert "no plane of this build runs them on the GPU" not in report     # NCCL runs some
    unloadable = build_info.check_build_report(info, None, "not found", {}, None)
    assert "engine: could not be loaded" in unloadable and "[ ] MPI" in unloadable


def test_check_build_marks_the_experimental_gpu_switches():
    """The GPU defaults are the paths that have run on a GPU; what has not is one switch away,
    marked experimental, each said on or off for this environment."""
    info = {"version": "0.1.0", "mpi_source": "site"}
    engine = {"planes": ["nccl", "shm", "mpi"], "nccl": True, "shm": True, "cuda": True}
    report = build_info.check_build_report(info, None, "not found", {"HVLITE_NCCL_OVERLAP": "1"}, engine)
    tail = report.split("Experimental GPU switches (not yet run on a GPU; off unless set):\n")[1].splitlines()
    assert tail[0].startswith("    HVLITE_GPU_READY_ONLY: off: hold CUDA tensors")
    assert tail[1].startswith("    HVLITE_NCCL_OVERLAP: ON here (1): leave NCCL batches running")
    assert tail[2].startswith("    HVLITE_STAGED_PIECE: off: stage an allreduce")
    assert "GPU paths that have run on a GPU (the defaults)" in report
    no_cuda = build_info.check_build_report(info, None, "not found", {}, dict(engine, cuda=False))
    assert "Experimental GPU" not in no_cuda


def test_check_build_asks_the_engines_registry():
    """The planes come from the built engine (its registry), in its order, not from a list kept
    beside it."""
    engine = build_info.ask_engine()
    assert engine is not None
    assert engine["planes"] == ["nccl", "shm", "hierarchical", "mpi"] and engine["cuda"] and engine["nccl"]
    report = build_info.check_build_report(build_info.load_build_info(), None, "not found", {},
                                           engine)
    assert "[X] MPI" in report and "[X] NCCL" in report and "[X] shared memory" in report
    assert "    1. NCCL: CUDA allreduce, allgather, broadcast, alltoall and reducescatter" in report
    assert "CUDA tensors: on NCCL where it runs them; otherwise" in report
    assert "\nNCCL library: " in report          # where it would come from, or what was tried


def test_rank_from_env_order():
    assert rank_from_env({}) == 0
    assert rank_from_env({"SLURM_PROCID": "4", "PMIX_RANK": "3"}) == 3
    assert rank_from_env({"OMPI_COMM_WORLD_RANK": "2", "PMI_RANK": "1"}) == 1
    # hydra's -pmi-port mode: PMI_ID (and PMI_PORT), no PMI_RANK
    assert rank_from_env({"PMI_ID": "2", "PMI_PORT": "h:1", "SLURM_PROCID": "0"}) == 2


def test_describe_exit():
    assert describe_exit(1, 12, "h", 0) is None
    assert describe_exit(1, 12, "h", 3) == "hvlrun: rank 1 (pid 12 on h) exited with code 3"
    assert describe_exit(2, 13, "h", -signal.SIGKILL) == \
        "hvlrun: rank 2 (pid 13 on h) was killed by signal 9 (SIGKILL)"


def test_timeline_flags(capsys):
    exports, argv = dry_run(capsys, "-np", "2", "--timeline-filename", "/tmp/t l.json",
                            "--timeline-mark-cycles", "python", "train.py")
    assert exports["HVLITE_TIMELINE_MARK_CYCLES"] == "1"
    assert argv[argv.index("HVLITE_TIMELINE") + 1] == "/tmp/t l.json"        # one argument
    exports, _ = dry_run(capsys, "-np", "2", "--timeline-filename", "/tmp/t.json", "python", "train.py")
    assert "HVLITE_TIMELINE_MARK_CYCLES" not in exports


def test_check_build_report_lists_data_planes_in_priority_order():
    info = {"version": "0.1.0", "mpi_source": "site"}
    engine = {"planes": ["shm", "hierarchical", "mpi"], "nccl": False, "shm": True, "cuda": True}
    report = build_info.check_build_report(info, None, "not found", {}, engine)
    planes = report.split("Data planes")[1].splitlines()[1:4]
    assert [p.split(":")[0].split(". ")[1] for p in planes] == ["shared memory", "hierarchical", "MPI"]
    assert "on; HVLITE_SHM_DISABLE=1 turns it off" in planes[0]
    assert "off; hvlrun --hierarchical-allreduce" in planes[1]
    off = build_info.check_build_report(info, None, "not found", {"HOROVOD_SHM_DISABLE": "1"}, engine)
    assert "OFF: HVLITE_SHM_DISABLE is set" in off
    hier = build_info.check_build_report(info, None, "not found",
                                         {"HVLITE_HIERARCHICAL_ALLREDUCE": "1"}, engine)
    assert "on: HVLITE_HIERARCHICAL_ALLREDUCE is set" in hier


def test_check_build_flags_change_the_data_planes(capsys):
    assert main(["--check-build", "--shm-disable"]) == 0
    out = capsys.readouterr().out
    if "NOT BUILT" not in out:
        assert "OFF: HVLITE_SHM_DISABLE is set" in out


def test_shm_flags(capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    exports, _ = dry_run(capsys, "-np", "2", "--hierarchical-allreduce", "--shm-disable",
                         "--shm-chunk-mb", "0.5", "python", "train.py")
    assert exports["HVLITE_HIERARCHICAL_ALLREDUCE"] == "1"
    assert exports["HVLITE_SHM_DISABLE"] == "1"
    assert exports["HVLITE_SHM_CHUNK"] == str(512 * 1024)
