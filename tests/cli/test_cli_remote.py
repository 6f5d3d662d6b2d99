"""Reaching other hosts, in one process: the remote-shell flags in dry runs (ssh, srun,
--ssh-command, --network-interface, Open MPI), the remote shell and guard command lines, the
host guard's secret reading, the interface lookup, ending process trees (with orphans), and
a guard or rank wrapper ending what it runs when hvlrun is gone with the reader of its stderr."""

import os
import shlex
import subprocess
import sys
import tempfile
import time

import pytest

from hvlite.runner import main
from hvlite.runner.hosts.host_guard import read_secret
from hvlite.runner.hosts.hostlist import interface_ipv4, is_local
from hvlite.runner.hosts.remote_shell import (guard_command, srun_template, ssh_template,
                                        transport_argv)

from .conftest import hvlrun_env
from .live import alive

HOSTS = ["-H", "alpha:2,beta:2"]


def dry_run(capsys, *args, flavour="mpich"):
    assert main(["--dry-run", "--mpi-flavour", flavour] + list(args)) == 0
    lines = capsys.readouterr().out.splitlines()
    exports = dict(line[len("export "):].split("=", 1) for line in lines[:-1])
    return {k: shlex.split(v)[0] if v else v for k, v in exports.items()}, shlex.split(lines[-1])


def test_ssh_is_the_default_with_port_and_identity(capsys, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    exports, argv = dry_run(capsys, *HOSTS, "-p", "2222", "-i", "/keys/id x", "python", "t.py")
    assert exports["HVLRUN_RSH"] == ssh_template(2222, "/keys/id x")
    assert shlex.split(exports["HVLRUN_RSH"]) == ["ssh", "-o", "BatchMode=yes", "-o",
                                                  "ConnectTimeout=10", "-p", "2222", "-i", "/keys/id x"]
    assert exports["HYDRA_LAUNCHER_EXTRA_ARGS"] == "-m hvlite.runner.hosts.remote_shell"
    at = argv.index("-launcher")
    assert argv[at:at + 4] == ["-launcher", "rsh", "-launcher-exec", sys.executable]
    assert "HVLRUN_SECRET" not in exports and "HVLRUN_CONTROL_ADDR" not in exports


def test_ssh_command_and_srun(capsys, monkeypatch, tmp_path):
    exports, _ = dry_run(capsys, *HOSTS, "--ssh-command", "site-rsh --fast", "x")
    assert exports["HVLRUN_RSH"] == "site-rsh --fast"
    exports, _ = dry_run(capsys, *HOSTS, "--remote-shell", "srun", "x")
    assert exports["HVLRUN_RSH"] == srun_template()
    srun = tmp_path / "srun"                 # inside an allocation, srun is the default
    srun.write_text("#!/bin/sh\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert dry_run(capsys, *HOSTS, "x")[0]["HVLRUN_RSH"] == srun_template()
    assert dry_run(capsys, *HOSTS, "--remote-shell", "ssh", "x")[0]["HVLRUN_RSH"] == ssh_template()


def test_local_jobs_get_no_remote_shell(capsys):
    exports, argv = dry_run(capsys, "-np", "2", "x")
    assert "HVLRUN_RSH" not in exports and "-launcher" not in argv
    exports, argv = dry_run(capsys, "-H", "localhost:1,127.0.0.1:1", "x")
    assert "HVLRUN_RSH" not in exports and "-launcher" not in argv


def test_network_interface(capsys, monkeypatch):
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("FI_TCP_IFACE", raising=False)
    exports, argv = dry_run(capsys, *HOSTS, "--network-interfaces", "eth0,ib0", "x")
    assert argv[argv.index("-iface") + 1] == "eth0"
    assert exports["NCCL_SOCKET_IFNAME"] == "eth0,ib0" and exports["FI_TCP_IFACE"] == "eth0"
    # given more than once (horovodrun's scripts do): every name is kept, each once
    exports, argv = dry_run(capsys, *HOSTS, "--network-interface", "eth0", "--network-interface",
                            "ib0,eth0", "x")
    assert exports["NCCL_SOCKET_IFNAME"] == "eth0,ib0" and argv[argv.index("-iface") + 1] == "eth0"
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "mine")     # the user's own setting stays
    assert "NCCL_SOCKET_IFNAME" not in dry_run(capsys, *HOSTS, "--network-interface", "eth0", "x")[0]


def test_openmpi_gets_the_remote_shell_as_its_agent(capsys, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    _, argv = dry_run(capsys, *HOSTS, "-p", "2200", "--network-interface", "eth1", "x",
                      flavour="openmpi")
    at = argv.index("plm_rsh_agent")
    assert argv[at + 1] == ssh_template(2200)
    assert "btl_tcp_if_include" in argv and "-launcher" not in argv
    _, argv = dry_run(capsys, *HOSTS, "--remote-shell", "srun", "x", flavour="openmpi")
    assert "plm_rsh_agent" not in argv


@pytest.mark.parametrize("args, fragment", [
    (["--ssh-command", "bad 'quote", "x"], "quotation"),
    (["--network-interface", "eth0,,", "x"], "empty name in --network-interface"),
    (["--heartbeat-timeout", "-1", "x"], "--heartbeat-timeout must be >= 0"),
])
def test_remote_usage_errors(capsys, args, fragment):
    assert main(HOSTS + args) == 2
    assert fragment in capsys.readouterr().err


def test_transport_and_guard_command_lines():
    assert transport_argv("ssh -p 22", "h2", "exec x") == ["ssh", "-p", "22", "h2", "exec x"]
    assert transport_argv("srun -w {host} sh -c", "n7", "exec x") == ["srun", "-w", "n7", "sh", "-c", "exec x"]
    with pytest.raises(ValueError):
        transport_argv("  ", "h", "x")
    line = guard_command("h 2", "10.0.0.1:5", 30, "/opt/my py/python", "/a b",
                         ['"/bin/hydra_pmi_proxy"', "--proxy-id", "1"])
    assert line == ("exec env PYTHONPATH='/a b' '/opt/my py/python' -m hvlite.runner.hosts.host_guard "
                    "--control 10.0.0.1:5 --host 'h 2' --heartbeat-timeout 30 -- "
                    '"/bin/hydra_pmi_proxy" --proxy-id 1')
    words = shlex.split(guard_command("h", "a:1", 0, "/py", None, check=True))
    assert words == ["exec", "/py", "-m", "hvlite.runner.hosts.host_guard", "--control", "a:1",
                     "--host", "h", "--heartbeat-timeout", "0", "--check"]


def test_remote_shell_without_configuration_fails_clearly():
    done = subprocess.run([sys.executable, "-m", "hvlite.runner.hosts.remote_shell", "h9", "proxy"],
                          env=hvlrun_env(drop=["HVLRUN_RSH"]),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 255 and "HVLRUN_RSH is not set: no way to reach host h9" in done.stderr


def test_guard_reads_one_line_of_secret_and_leaves_the_rest():
    read_end, write_end = os.pipe()
    os.write(write_end, b"abc123\nproxy input\n")
    os.close(write_end)
    assert read_secret(read_end) == "abc123"
    assert os.read(read_end, 100) == b"proxy input\n"
    os.close(read_end)


def test_guard_without_hvlrun_says_which_host():
    done = subprocess.run([sys.executable, "-m", "hvlite.runner.hosts.host_guard", "--control",
                           "127.0.0.1:1", "--host", "h5", "--check"], input="s" * 64 + "\n",
                          env=hvlrun_env(),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 255
    assert "hvlrun: host h5: cannot reach hvlrun's control channel at 127.0.0.1:1" in done.stderr


def test_interface_and_own_addresses():
    assert interface_ipv4("lo") == "127.0.0.1"
    with pytest.raises(ValueError, match="nosuch0"):
        interface_ipv4("nosuch0")
    assert is_local("127.0.0.1") and not is_local("192.0.2.254") and not is_local("node9")


KILL_TREE_CHECK = r"""
import os, signal, subprocess, sys, time
from hvlite.runner.procs.proctree import become_subreaper, descendants, kill_tree
script = ("import os, signal, subprocess, sys, time\n"
          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
          "if os.fork() == 0:\n"
          "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
          "    os._exit(0)\n"
          "time.sleep(60)\n")
assert become_subreaper()
child = subprocess.Popen([sys.executable, "-c", script])
deadline = time.monotonic() + 10
while len(descendants(os.getpid())) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
found = descendants(os.getpid())
assert child.pid in found and len(found) >= 2, found
start = time.monotonic()
assert kill_tree(os.getpid(), grace=0.3, keep=[child.pid]) == []
assert time.monotonic() - start < 5
assert child.wait(timeout=5) == -signal.SIGKILL
assert descendants(os.getpid()) == []
print("kill_tree OK")
"""


def test_kill_tree_ends_children_and_orphans():
    """A child that ignores SIGTERM and an orphaned grandchild (re-parented to the subreaper)
    both end; the caller does not. Runs in a process of its own: a subreaper keeps orphans."""
    done = subprocess.run([sys.executable, "-c", KILL_TREE_CHECK], capture_output=True, text=True,
                          timeout=60, env=hvlrun_env())
    assert done.returncode == 0 and "kill_tree OK" in done.stdout, done.stdout + done.stderr


def test_a_jobs_temporary_files_go_once_nobody_holds_them():
    """MPICH's proxy keeps its topology file in /tmp open for its life: the watcher of the job's
    process tree notes it, and it is removed only once its holder is gone. A file of the same
    name that no process of the job held is never touched."""
    from hvlite.runner.procs.job_files import FileWatcher, remove_unused
    ours = tempfile.mkstemp(prefix="hydra_hwloc_xmlfile_", dir="/tmp")
    theirs = tempfile.mkstemp(prefix="hydra_hwloc_xmlfile_", dir="/tmp")
    for fd, _ in (ours, theirs):
        os.close(fd)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "f = open(sys.argv[1]); print('open', flush=True); time.sleep(60)",
                               ours[1]], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "open\n"
        watcher = FileWatcher(os.getpid())
        watcher.look()
        seen = watcher.stop()
        assert ours[1] in seen and theirs[1] not in seen, seen
        assert remove_unused({ours[1]}, wait=0.3) == [] and os.path.exists(ours[1])  # held
        holder.kill()
        holder.wait(timeout=10)
        assert remove_unused({ours[1]}, wait=5) == [ours[1]] and not os.path.exists(ours[1])
        assert os.path.exists(theirs[1])
    finally:
        holder.kill()
        holder.wait(timeout=10)
        for _, path in (ours, theirs):
            if os.path.exists(path):
                os.unlink(path)


@pytest.mark.parametrize("who", ["guard", "wrapper"])
def test_hvlrun_lost_with_its_output_still_ends_the_job_here(tmp_path, who):
    """hvlrun gone, and with it whoever read the guard's or rank wrapper's stderr: saying why
    fails (EPIPE), and must not stop it from ending what it runs (it killed the thread or
    handler before anything was ended, so both lived on)."""
    from hvlite.protocol.wire import ENV_SECRET, new_secret
    from hvlite.runner.control.server import ControlServer
    secret, pidfile = new_secret(), tmp_path / "pid"
    server = ControlServer(secret, "127.0.0.1").start()
    addr = "127.0.0.1:%d" % server.port
    command = ["/bin/sh", "-c", "echo $$ > %s; exec sleep 1000" % pidfile]
    if who == "guard":
        argv = [sys.executable, "-m", "hvlite.runner.hosts.host_guard", "--control", addr,
                "--host", "hx", "--"] + command
        env = hvlrun_env()
    else:
        argv = [sys.executable, "-m", "hvlite.runner.world.rank_exec", "--"] + command
        env = hvlrun_env({"HVLRUN_CONTROL_ADDR": addr, ENV_SECRET: secret, "PMI_RANK": "0"})
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=write_end)
    os.close(write_end)
    child = None
    try:
        proc.stdin.write((secret + "\n").encode())     # the guard's secret; ignored otherwise
        proc.stdin.close()
        deadline = time.monotonic() + 20
        while child is None and time.monotonic() < deadline:
            text = pidfile.read_text() if pidfile.exists() else ""
            child = int(text) if text.endswith("\n") else None
            time.sleep(0.05)
        assert child is not None and proc.poll() is None, "never started"
        os.close(read_end)
        read_end = None
        server.close()
        proc.wait(timeout=20)
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "its child %d lives on" % child
    finally:
        server.close()
        if read_end is not None:
            os.close(read_end)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if child is not None and alive(child):
            os.kill(child, 9)


@pytest.mark.parametrize("sig,elastic", [("SIGTERM", False), ("SIGINT", True)])
def test_a_signal_during_the_host_check_ends_hvlrun_at_once(tmp_path, sig, elastic):
    """hvlrun checking a remote host whose shell hangs: a signal ends the check (the shell is
    killed) and hvlrun exits 128+signum at once (it waited for the check, then exited 125)."""
    import signal
    pidfile = tmp_path / "pid"
    shell = "sh -c 'echo $$ > %s; exec sleep 60' {host}" % pidfile
    argv = [sys.executable, "-m", "hvlite.runner", "-H", "fakehost:1", "--ssh-command", shell,
            "--start-timeout", "0"] + (["--min-np", "1"] if elastic else ["-np", "1"]) + ["true"]
    proc = subprocess.Popen(argv, env=hvlrun_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    shell_pid = None
    try:
        deadline = time.monotonic() + 20
        while shell_pid is None and time.monotonic() < deadline:
            text = pidfile.read_text() if pidfile.exists() else ""
            shell_pid = int(text) if text.endswith("\n") else None
            time.sleep(0.05)
        assert shell_pid is not None, "the check never started"
        sent = time.monotonic()
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 128 + getattr(signal, sig), err
        assert time.monotonic() - sent < 5, err
        assert "Traceback" not in err and "mpiexec" not in err, err    # no job was started
        deadline = time.monotonic() + 5
        while alive(shell_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(shell_pid), "the remote shell %d lives on" % shell_pid
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if shell_pid is not None and alive(shell_pid):
            os.kill(shell_pid, 9)


def test_openmpi_forwards_the_users_environment_to_every_rank(capsys, monkeypatch):
    """Open MPI forwards only what -x names: every variable but host-, shell- and
    launcher-specific ones (hydra forwards the whole environment by itself)."""
    given = {"NCCL_DEBUG": "INFO", "MY_VAR": "1", "HOROVOD_FUSION_THRESHOLD": "1",
             "OMPI_MCA_btl": "tcp,self", "PATH": os.environ["PATH"]}
    skipped = {"HOSTNAME": "here", "SSH_CLIENT": "1.2.3.4 5 6", "CUDA_VISIBLE_DEVICES": "0",
               "OMPI_COMM_WORLD_RANK": "3", "PMIX_RANK": "3", "OLDPWD": "/", "BASH_FUNC_f%%": "x"}
    for name, value in {**given, **skipped}.items():
        monkeypatch.setenv(name, value)
    _, argv = dry_run(capsys, *HOSTS, "x", flavour="openmpi")
    forwarded = {argv[i + 1] for i, a in enumerate(argv) if a == "-x"}
    assert set(given) <= forwarded, forwarded
    assert not set(skipped) & forwarded, forwarded
    _, argv = dry_run(capsys, *HOSTS, "x")                     # hydra: no list of names
    assert "-x" not in argv and "MY_VAR" not in argv


def test_a_slow_host_check_reads_the_secret_and_names_the_failure():
    """A remote shell that answers after several polls (0.1 s each) gets the secret once and
    is judged by its exit code (re-sending the secret on a later poll raised in the thread,
    and the host counted as passed)."""
    from hvlite.runner.hosts.host_check import check_hosts
    template = "sh -c 'sleep 0.5; read s; echo got $s; exit 3' {host}"
    errors = check_hosts(["hz"], template, "127.0.0.1:1", "s3cret", 30, sys.executable, None,
                         lambda: set(), 20)
    assert len(errors) == 1 and "host hz is not reachable" in errors[0], errors
    assert "exit code 3" in errors[0] and "got s3cret" in errors[0], errors
