"""The timeline: a Chrome trace of the engine's work, started and stopped at run time.

Open the file in https://ui.perfetto.dev or chrome://tracing. ``hvlrun --timeline-filename``
(``HVLITE_TIMELINE``) records one from ``init()`` on instead.

Contract: ``start_timeline(file_path, mark_cycles=False)`` and ``stop_timeline()`` are Horovod's
functions. They may be called on every rank (or on rank 0 alone): only rank 0 writes the file,
and on other ranks they do nothing. The file is a JSON array of Chrome trace events (open it in
https://ui.perfetto.dev or chrome://tracing) and is valid JSON at every moment, also when the job
is killed. ``HVLITE_TIMELINE=path`` (``hvlrun --timeline-filename``) starts one at ``init()``;
what it contains is described in ``csrc/timeline_json.c``.
"""
import os

from ._lib import lib
from .errors import _check

__all__ = ["start_timeline", "stop_timeline"]


def _require_init(what):
    if not lib.hvl_is_initialized():
        raise ValueError("hvlite has not been initialized; call hvlite.init() before %s()" % what)


def start_timeline(file_path, mark_cycles=False):
    """Start writing a timeline to ``file_path`` (rank 0 writes; other ranks do nothing).

    A timeline already being written is finished and closed first.

    Args:
        file_path: path of the JSON file to create (str or os.PathLike); rank 0 truncates it.
        mark_cycles: also mark the start of every engine cycle (CYCLE_START).
    Raises:
        ValueError: hvlite is not initialized, or file_path is empty or not a path.
        HvliteInvalidArgument: (rank 0) the file cannot be created or written; the message names
            the path and the reason.
    """
    _require_init("start_timeline")
    if not isinstance(file_path, (str, bytes, os.PathLike)) or not os.fspath(file_path):
        raise ValueError("start_timeline() needs a file path, got %r" % (file_path,))
    _check(lib.hvl_timeline_start(os.fsencode(file_path), 1 if mark_cycles else 0))


def stop_timeline():
    """Finish and close the timeline being written (a no-op if there is none).

    Raises:
        ValueError: hvlite is not initialized.
    """
    _require_init("stop_timeline")
    _check(lib.hvl_timeline_stop())
