"""Loads the compiled engine ``hvlite._core`` and exposes its ``ffi`` and ``lib``.

Contract: importing this module either gives ``ffi``/``lib`` or raises ``ImportError`` saying how
to build the engine. The core normally finds libmpi through its rpath; when it does not (a
moved venv or checkout), libmpi is preloaded from the places the build may have used: the
recorded MPI (an absolute folder; a wheel's build records none), then this Python's prefix
(mpich wheel).
"""
import ctypes
import glob
import json
import os
import sys


def _candidates():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        with open(os.path.join(here, "_build_info.json")) as f:
            bindir = json.load(f).get("mpi_bindir")
    except (OSError, ValueError):
        bindir = None
    if isinstance(bindir, str) and os.path.isabs(bindir):
        yield os.path.join(os.path.dirname(bindir), "lib")
    yield os.path.join(sys.prefix, "lib")


def _preload_libmpi():
    for libdir in _candidates():
        for path in sorted(glob.glob(os.path.join(libdir, "libmpi.so*"))):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return True
            except OSError:
                continue
    return False


try:
    from ._core import ffi, lib
except ImportError as first:
    if not _preload_libmpi():
        raise ImportError("hvlite's engine could not be loaded (%s). Build it with "
                          "'pip install .' in this environment." % first) from first
    from ._core import ffi, lib  # noqa: F401
