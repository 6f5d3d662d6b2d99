"""A real hvlrun job while a rogue client attacks its control channel: forged ``exit`` lines
(plain, with a made-up MAC, signed with a wrong secret, replayed from another connection),
garbage and an over-long line must not affect the job; they are dropped and counted. Also: the
channel listens on loopback when every rank is local, and the job secret is on no command
line and not in the ranks' environment."""

import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from hvlite.protocol.wire import MAX_LINE, Session, new_secret

from .conftest import MULTIPLIER, REPO, hvlrun_env

pytestmark = pytest.mark.usefixtures("need_mpiexec")

RANK_SCRIPT = r"""
import os, sys, time
rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
print("rank %d addr %s wrapper %d secret-in-env %s" % (rank, os.environ["HVLRUN_CONTROL_ADDR"],
      os.getppid(), "HVLRUN_SECRET" in os.environ), flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
print("rank %d done" % rank, flush=True)
"""


def hello(port):
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    line = b""
    while not line.endswith(b"\n"):
        line += sock.recv(1)
    return sock, line


def attack(port):
    """Play every rogue we can think of against the control server; returns how many lines
    it should have rejected."""
    plain = socket.create_connection(("127.0.0.1", port), timeout=5)
    plain.sendall(b"exit 1 3\nexit 0 9\n")                                  # the old protocol
    sock, server_hello = hello(port)                                       # made-up MAC
    sock.sendall(b"hvlrun-hello 1 " + b"ab" * 16 + b"\n1 exit 1 3 " + b"0" * 64 + b"\n")
    wrong = Session(new_secret(), server=False)                            # wrong secret
    sock2, server_hello2 = hello(port)
    sock2.sendall(wrong.hello())
    wrong.accept_hello(server_hello2)
    recorded = wrong.seal("exit 1 3")
    sock2.sendall(recorded)
    sock3, _ = hello(port)                                                 # a replay
    sock3.sendall(wrong.hello() + recorded)
    junk = socket.create_connection(("127.0.0.1", port), timeout=5)
    junk.sendall(os.urandom(3 * MAX_LINE))                                  # garbage, no newline
    time.sleep(0.5)
    for s in (plain, sock, sock2, sock3, junk):
        s.close()
    return 5


def test_rogue_client_cannot_stop_the_job(tmp_path):
    flag = tmp_path / "go"
    cmd = [sys.executable, "-m", "hvlite.runner", "-np", "2", sys.executable, "-c", RANK_SCRIPT,
           str(flag)]
    proc = subprocess.Popen(cmd, cwd=str(REPO), env=hvlrun_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60 * MULTIPLIER
        while len(re.findall(r"rank \d addr", "".join(out))) < 2:
            assert time.monotonic() < deadline and proc.poll() is None, "".join(out)
            time.sleep(0.05)
        info = re.findall(r"rank (\d) addr ([\d.]+):(\d+) wrapper (\d+) secret-in-env (\w+)", "".join(out))
        host, port = info[0][1], int(info[0][2])
        assert host == "127.0.0.1" and all(i[4] == "False" for i in info), info
        check_secret_stays_off_command_lines(int(info[0][3]))
        check_loopback_only(port)
        expected = attack(port)
        flag.write_text("go")
        stdout_rest, stderr = proc.communicate(timeout=60 * MULTIPLIER)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=5)
    stdout = "".join(out) + (stdout_rest or "")
    assert proc.returncode == 0, stdout + stderr
    assert stdout.count("done\n") == 2, stdout
    assert "first failure" not in stderr and "exited with code" not in stderr, stderr
    found = re.search(r"dropped (\d+) control messages? that failed authentication", stderr)
    assert found and int(found.group(1)) == expected, stderr


def check_secret_stays_off_command_lines(wrapper_pid):
    """The wrapper holds the secret in its environment; no process shows it on a command line."""
    environ = open("/proc/%d/environ" % wrapper_pid, "rb").read().split(b"\0")
    secret = next(v.split(b"=", 1)[1] for v in environ if v.startswith(b"HVLRUN_SECRET="))
    assert re.fullmatch(rb"[0-9a-f]{64}", secret), secret
    shown = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if secret in open("/proc/%s/cmdline" % name, "rb").read():
                    shown.append(name)
            except OSError:
                pass
    assert not shown, "the job secret is on the command line of pids %s" % shown


def check_loopback_only(port):
    """Every rank is local, so the channel must not be reachable on another address."""
    addresses = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                               capture_output=True, text=True).stdout
    for address in re.findall(r"inet ([\d.]+)/", addresses):
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=2).close()
