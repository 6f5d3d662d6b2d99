"""The job's shared-memory files, removed when the job is over, whatever ended it.

MPI libraries keep per-job files in ``/dev/shm`` (MPICH: ``mpich_shm_*``) and unlink them in
``MPI_Finalize``; a rank killed by a signal never gets there, so every killed job would leave a
few MiB behind. hvlite's own segments are unlinked as soon as every rank has mapped them, so they
never stay.

Contract:
  * ``ShmWatcher(root)`` notes, from a background thread, the ``/dev/shm`` files that the
    processes below ``root`` map (``/proc/PID/maps``: the launcher's tree on hvlrun's host, a
    host guard's on the others), often at first and then every few seconds, until ``stop()``.
  * ``remove_unused(paths, wait)`` unlinks each of ``paths`` that still exists and that no process
    on this host maps any more, waiting up to ``wait`` seconds for the job's other processes to
    let go. It removes only files this job's processes were seen to map, so another job's files
    are never touched; returns the paths removed. It cannot fail (errors are skipped).
Linux only (``/proc``); elsewhere the watcher sees nothing and nothing is removed.
"""
import glob
import os
import threading
import time
from typing import Iterable, List, Set

from .proctree import descendants

__all__ = ["ShmWatcher", "remove_unused", "mapped_shm"]

SHM_DIR = "/dev/shm/"
# what to keep: MPI's per-job files; hvlite's own segments never keep a name, but may if killed
# inside their few milliseconds of setup
PREFIXES = ("mpich_shm_", "hvlite-")


def mapped_shm(pid: int) -> Set[str]:
    """The job-owned /dev/shm files process ``pid`` maps (empty if it is gone)."""
    found = set()
    try:
        with open("/proc/%d/maps" % pid) as maps:
            for line in maps:
                path = line.rstrip("\n").split(None, 5)[-1]
                if path.startswith(SHM_DIR) and path[len(SHM_DIR):].startswith(PREFIXES):
                    found.add(path.replace(" (deleted)", ""))
    except OSError:
        pass
    return found


class ShmWatcher:
    """Notes the shared-memory files a process tree maps while it runs (see the module doc)."""

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
            # MPI maps its files during init: look often at first, rarely afterwards
            age = time.monotonic() - start
            self._stop.wait(0.05 if age < 3 else 0.5 if age < 30 else 2.0)

    def look(self) -> None:
        """Note what the tree maps now (also called by whoever is about to end the job)."""
        for pid in descendants(self._root):
            self.paths |= mapped_shm(pid)

    def stop(self) -> Set[str]:
        """Stop watching; the paths seen."""
        self._stop.set()
        self._thread.join(timeout=5)
        return set(self.paths)


def _mapped_by_anyone(paths: Set[str]) -> Set[str]:
    busy = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                text = f.read()
        except OSError:
            continue
        busy |= {p for p in paths if p in text}
    return busy


def remove_unused(paths: Iterable[str], wait: float = 5.0) -> List[str]:
    """Unlink the files of ``paths`` nobody maps any more (see the module doc)."""
    left = {p for p in paths if os.path.exists(p)}
    removed: List[str] = []
    deadline = time.monotonic() + wait
    while left:
        for path in sorted(left - _mapped_by_anyone(left)):
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
