"""Simulated hosts for the multi-host tests: network namespaces on one bridge, real TCP between
them, and an ssh stand-in that runs a command "on" a host.

Contract:
  * ``SimHosts(n, workdir)`` creates, when used as a context manager (or after ``start()``),
    ``n`` hosts named ``h1``..``hn``. Each is a network namespace ``<tag>-hI`` with one interface
    ``eth0`` at ``10.A.B.I/24``, plugged into a bridge that lives in a namespace of its own
    (``<tag>-sw``), so nothing is added to the machine's own network. The tag holds this
    process's pid and random digits, and ``10.A.B`` is random: concurrent test runs never share
    a name, and their networks are separate anyway.
  * ``close()`` (also on leaving the ``with`` block, whatever happened) SIGKILLs every process
    left in the namespaces and deletes them. Namespaces left by a test run that died (its pid
    is gone) are removed by the next ``SimHosts``.
  * ``ssh`` is the path of the ssh stand-in, used as ``hvlrun --ssh-command``: it is called as
    ``ssh HOST COMMAND...`` (leading words starting with ``-`` are dropped, like hydra's ``-x``;
    options with arguments are not understood) and, as sshd on another machine would, runs the
    joined COMMAND with ``/bin/sh -c`` in HOST's network namespace, in a new session, with the
    host's own hostname and a private ``/dev/shm``. It waits for it (it plays the ssh client
    on the calling host). An unknown host fails like ssh: exit 255, "Could not resolve hostname".
  * Network namespaces separate the network only: processes, files and /tmp are shared, which
    is how the tests can look into every host. ``pids(host)`` lists a host's processes.
  * Needs root, ``ip`` (iproute2), ``nsenter``, ``unshare`` and ``setsid`` (util-linux);
    :func:`missing_requirements` says what is missing.
"""

import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

PREFIX = "hvlt"
_TOOLS = ("ip", "nsenter", "unshare", "setsid")


def missing_requirements() -> Optional[str]:
    """Return why simulated hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network namespaces)"
    absent = [t for t in _TOOLS if shutil.which(t) is None]
    if absent:
        return "simulated hosts need %s on PATH" % ", ".join(absent)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def _netns_names() -> List[str]:
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def _kill_netns(name: str) -> None:
    """SIGKILL every process in namespace ``name`` and delete it."""
    for _ in range(20):
        pids = [int(p) for p in _ip("netns", "pids", name, check=False).stdout.split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    _ip("netns", "del", name, check=False)


def remove_stale() -> None:
    """Delete namespaces that a test run which no longer exists left behind."""
    for name in _netns_names():
        if not name.startswith(PREFIX):
            continue
        digits = name[len(PREFIX):].split("x", 1)[0]
        if digits.isdigit() and not os.path.exists("/proc/%s" % digits):
            _kill_netns(name)


_STANDIN = """#!/bin/sh
# ssh stand-in for simulated hosts (tests/hosts/simhosts.py): ssh HOST COMMAND...
while [ "${1#-}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
%(cases)s
  *) echo "ssh: Could not resolve hostname $host: Name or service not known" >&2; exit 255 ;;
esac
exec setsid -w nsenter --net=/run/netns/"$ns" unshare --uts --mount /bin/sh -c \\
  'hostname "$1" && mount -t tmpfs -o size=512m,mode=1777 tmpfs /dev/shm && shift && exec /bin/sh -c "$*"' \\
  ssh "$name" "$@"
"""


class SimHosts:
    """``n`` simulated hosts on one bridge (see the module contract)."""

    def __init__(self, count: int, workdir: Path) -> None:
        self.tag = "%s%dx%s" % (PREFIX, os.getpid(), secrets.token_hex(3))
        self.subnet = "10.%d.%d" % (random.randint(200, 250), random.randint(0, 255))
        self.hosts = ["h%d" % i for i in range(1, count + 1)]
        self.ssh = str(Path(workdir) / "ssh-standin")
        self._made: List[str] = []

    def ns(self, host: str) -> str:
        """Return host's network namespace name."""
        return "%s-%s" % (self.tag, host)

    def addr(self, host: str) -> str:
        """Return host's eth0 address."""
        return "%s.%s" % (self.subnet, host[1:])

    def enter(self, host: str) -> List[str]:
        """Return the argv prefix that runs a command in host's network namespace."""
        return ["nsenter", "--net=/run/netns/%s" % self.ns(host)]

    def start(self) -> "SimHosts":
        """Create the switch, the hosts and the stand-in (close() on failure)."""
        remove_stale()
        try:
            switch = self.ns("sw")
            self._add_ns(switch)
            _ip("-n", switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", switch, "link", "set", "br0", "up")
            for i, host in enumerate(self.hosts, 1):
                self._add_host(host, "p%d" % i, switch)
            self._write_standin()
        except BaseException:
            self.close()
            raise
        return self

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)

    def _add_host(self, host: str, port: str, switch: str) -> None:
        ns = self.ns(host)
        self._add_ns(ns)
        _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", switch)
        _ip("-n", switch, "link", "set", port, "master", "br0")
        _ip("-n", switch, "link", "set", port, "up")
        _ip("-n", ns, "addr", "add", "%s/24" % self.addr(host), "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")

    def _write_standin(self) -> None:
        cases = "\n".join('  %s|%s) ns=%s; name=%s ;;' % (h, self.addr(h), self.ns(h), h)
                          for h in self.hosts)
        Path(self.ssh).write_text(_STANDIN % {"cases": cases})
        os.chmod(self.ssh, 0o755)

    def set_link(self, host: str, up: bool) -> None:
        """Cut (or restore) host's cable: its port on the switch goes down (or up)."""
        port = "p%d" % (self.hosts.index(host) + 1)
        _ip("-n", self.ns("sw"), "link", "set", port, "up" if up else "down")

    def counters(self, host: str) -> Tuple[int, int]:
        """Return host's eth0 (received, sent) bytes."""
        info = json.loads(_ip("-n", self.ns(host), "-j", "-s", "link", "show", "eth0").stdout)
        stats = info[0]["stats64"]
        return stats["rx"]["bytes"], stats["tx"]["bytes"]

    def all_counters(self) -> Dict[str, Tuple[int, int]]:
        """Return :meth:`counters` for every host."""
        return {h: self.counters(h) for h in self.hosts}

    def pids(self, host: str) -> List[int]:
        """Return the pids of the processes in host's network namespace."""
        return [int(p) for p in _ip("netns", "pids", self.ns(host), check=False).stdout.split()]

    def leftovers(self) -> Dict[str, List[str]]:
        """Return ``{host: [process descriptions]}`` for every host that still runs something."""
        left = {}
        for host in self.hosts:
            described = []
            for pid in self.pids(host):
                try:
                    cmd = Path("/proc/%d/cmdline" % pid).read_bytes().replace(b"\0", b" ")
                except OSError:
                    continue
                described.append("%d %s" % (pid, cmd.decode("utf-8", "replace")[:160]))
            if described:
                left[host] = described
        return left

    def kill_host(self, host: str) -> None:
        """SIGKILL every process on host (a host that crashed)."""
        for pid in self.pids(host):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def close(self) -> None:
        """Kill everything in the namespaces and delete them. Safe to call twice."""
        for name in reversed(self._made):
            _kill_netns(name)
        self._made = []

    def __enter__(self) -> "SimHosts":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
