"""Finding and ending every process below one process (Linux ``/proc``).

Contract:
  * :func:`descendants` lists the live (not zombie) processes whose parent chain leads to a
    given pid, read from ``/proc/<pid>/stat``; processes that vanish while it reads are skipped.
  * :func:`become_subreaper` makes orphans of the caller's descendants re-parent to the caller
    instead of to init, so they stay findable after a process in the middle of the tree dies.
  * :func:`kill_tree` sends SIGTERM to all descendants, waits up to ``grace`` seconds, then sends
    SIGKILL until none is left or ``deadline`` seconds have passed. It never signals the root.
  * :func:`reap_zombies` collects the caller's zombie children except those it names.
  Off Linux the functions do nothing (no ``/proc``): a tree cannot be found there.
"""

import ctypes
import ctypes.util
import errno
import os
import signal
import time
from typing import Dict, Iterable, List

__all__ = ["descendants", "become_subreaper", "kill_tree", "reap_zombies"]

_PR_SET_CHILD_SUBREAPER = 36


def _table() -> Dict[int, List[int]]:
    """Return {parent pid: [child pids]} for every live process. Cannot fail."""
    children: Dict[int, List[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return children
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
        except OSError:
            continue  # it ended while we looked
        fields = stat[stat.rfind(b")") + 2:].split()  # the command name may hold spaces
        if len(fields) < 2 or fields[0] == b"Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    return children


def descendants(root: int) -> List[int]:
    """Return the live processes below ``root`` (children first). Cannot fail."""
    children = _table()
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, ()):
            found.append(child)
            frontier.append(child)
    return found


def become_subreaper() -> bool:
    """Ask Linux to re-parent orphaned descendants to this process. Returns True if it did."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _signal_all(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except OSError:
            pass  # already gone


def reap_zombies(keep: Iterable[int] = ()) -> None:
    """Collect this process's zombie children, except the pids in ``keep`` (their owners, e.g.
    ``subprocess.Popen``, collect them). Cannot fail."""
    keep = set(keep)
    for pid in _zombie_children() - keep:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _zombie_children() -> set:
    me = str(os.getpid()).encode()
    zombies = set()
    try:
        names = [n for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return zombies
    for name in names:
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 1 and fields[0] == b"Z" and fields[1] == me:
            zombies.add(int(name))
    return zombies


def kill_tree(root: int, grace: float, deadline: float = 10.0, keep: Iterable[int] = ()) -> List[int]:
    """End every process below ``root``: SIGTERM, then SIGKILL after ``grace`` seconds.

    Args:
        root: the process whose descendants end (it is not signalled).
        grace: seconds between SIGTERM and the first SIGKILL.
        deadline: seconds after which it gives up (processes stuck in the kernel).
        keep: children of the caller that its own code reaps (not collected here).

    Returns:
        The descendants still alive at the deadline (empty on success).
    """
    start = time.monotonic()
    pids = descendants(root)
    _signal_all(pids, signal.SIGTERM)
    while pids and time.monotonic() - start < deadline:
        time.sleep(0.05)
        if root == os.getpid():
            reap_zombies(keep)
        pids = descendants(root)
        if pids and time.monotonic() - start >= grace:
            _signal_all(pids, signal.SIGKILL)
    return pids


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists (zombies included). Cannot fail."""
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM
    return True
