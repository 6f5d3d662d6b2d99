"""The files a job's processes leave behind, removed when the job is over, whatever ended it.

MPI libraries keep per-job files in ``/dev/shm`` (MPICH: ``mpich_shm_*``) and unlink them in
``MPI_Finalize``; a rank killed by a signal never gets there, so every killed job would leave a
few MiB behind. hvlite's own segments are unlinked as soon as every rank has mapped them, so they
never stay. Likewise MPICH's process manager keeps the host's topology in
``/tmp/hydra_hwloc_xmlfile_*``, one file per proxy, open for the proxy's life and unlinked when
it exits cleanly: a proxy killed with its host's processes leaves it.

Contract:
  * A file is the job's only when one of the job's processes was seen holding it: mapping it
    (``/proc/PID/maps``: ``/dev/shm`` files named :data:`PREFIXES`) or keeping it open
    (``/proc/PID/fd``: files named :data:`TMP_PREFIXES`). Other jobs' files are never touched.
  * ``FileWatcher(root)`` notes, from a background thread, the job's files that the processes
    below ``root`` hold (the launcher's tree on hvlrun's host, a host guard's on the others),
    often at first and then every few seconds, until ``stop()``; ``look()`` notes them now
    (whoever is about to end the job calls it while the processes still hold them).
  * ``remove_unused(paths, wait)`` unlinks each of ``paths`` that still exists and that no process
    on this host maps or holds open any more, waiting up to ``wait`` seconds for the job's other
    processes to let go; returns the paths removed. It cannot fail (errors are skipped).
Linux only (``/proc``); elsewhere the watcher sees nothing and nothing is removed.
"""
import glob
import os
import threading
import time
from typing import Iterable, List, Set

from .proctree import descendants

__all__ = ["SHM_DIR", "PREFIXES", "TMP_PREFIXES", "FileWatcher", "remove_unused", "mapped_shm",
           "open_tmp", "held_files"]

SHM_DIR = "/dev/shm/"
# what to keep: MPI's per-job files; hvlite's own segments never keep a name, but may if killed
# inside their few milliseconds of setup
PREFIXES = ("mpich_shm_", "hvlite-")
# MPICH's proxies write the topology there (a fixed path, not $TMPDIR)
TMP_PREFIXES = ("/tmp/hydra_hwloc_xmlfile_",)
_DELETED = " (deleted)"


def mapped_shm(pid: int) -> Set[str]:
    """The job-owned /dev/shm files process ``pid`` maps (empty if it is gone)."""
    found = set()
    try:
        with open("/proc/%d/maps" % pid) as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1]
                if path.startswith(SHM_DIR) and path[len(SHM_DIR):].startswith(PREFIXES):
                    found.add(path.replace(_DELETED, ""))
    except OSError:
        pass
    return found


def open_tmp(pid: int) -> Set[str]:
    """The files of :data:`TMP_PREFIXES` process ``pid`` has open (empty if it is gone)."""
    found = set()
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return found
    for fd in fds:
        try:
            path = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if path.startswith(TMP_PREFIXES) and not path.endswith(_DELETED):
            found.add(path)
    return found


def held_files(pid: int) -> Set[str]:
    """The job's files process ``pid`` maps or holds open. Cannot fail."""
    return mapped_shm(pid) | open_tmp(pid)


class FileWatcher:
    """Notes the job's files a process tree holds while it runs (see the module doc)."""

    def __init__(self, root: int) -> None:
        self.paths: Set[str] = set()
        self._root = root
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        start = time.monotonic()
        while not self._stop.is_set():
            self.look()
            # MPI makes its files during init: look often at first, rarely afterwards
            age = time.monotonic() - start
            self._stop.wait(0.05 if age < 3 else 0.5 if age < 30 else 2.0)

    def look(self) -> None:
        """Note what the tree holds now (also called by whoever is about to end the job)."""
        for pid in descendants(self._root):
            self.paths |= held_files(pid)

    def stop(self) -> Set[str]:
        """Stop watching; the paths seen."""
        self._stop.set()
        self._thread.join(timeout=5)
        return set(self.paths)


def _held_by_anyone(paths: Set[str]) -> Set[str]:
    """The ``paths`` some process on this host maps (or, for temporary files, holds open)."""
    busy = set()
    tmp = {p for p in paths if p.startswith(TMP_PREFIXES)}
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                text = f.read()
        except OSError:
            continue
        busy |= {p for p in paths if p in text}
        if tmp - busy:
            busy |= tmp & open_tmp(int(maps.split("/")[2]))
    return busy


def remove_unused(paths: Iterable[str], wait: float = 5.0) -> List[str]:
    """Unlink the files of ``paths`` nobody holds any more (see the module doc)."""
    left = {p for p in paths if os.path.exists(p)}
    removed: List[str] = []
    deadline = time.monotonic() + wait
    while left:
        for path in sorted(left - _held_by_anyone(left)):
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass                  # gone already (another rank's wrapper), or not ours to remove
            left.discard(path)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return removed
