"""Compiling engine files by themselves, for the unit tests that check them without a GPU:
the CUDA toolkit's include folder, the build's MPI include flags, a syntax-only compile, and
test probes (small C files that call the engine's internal functions) loaded beside the engine,
called with a bound so that a wait that never ends fails its test instead of hanging it."""
import ctypes
import glob
import os
import shutil
import subprocess
import sys
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSRC = os.path.join(ROOT, "csrc")
ENGINE_INCLUDES = [os.path.join(CSRC, d) for d in ("", "util", "core", "backends", "kernels", "observe")]


def cuda_header_dir():
    """A folder holding the toolkit's cuda.h, or None."""
    candidates = [os.path.join(os.environ[v], "include") for v in ("CUDA_HOME", "CUDA_PATH")
                  if os.environ.get(v)]
    candidates += ["/usr/local/cuda/include"] + sorted(glob.glob("/usr/local/cuda-*/include"))
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.join(os.path.dirname(os.path.dirname(nvcc)), "include"))
    return next((d for d in candidates if os.path.isfile(os.path.join(d, "cuda.h"))), None)


def compiler():
    found = shutil.which("cc") or shutil.which("gcc")
    if found is None:
        pytest.skip("no C compiler")
    return found


def mpi_include_args():
    """-I flags for the build's MPI (the engine's headers include mpi.h)."""
    sys.path.insert(0, os.path.join(ROOT, "hvlite"))
    try:
        import _mpi_find
    finally:
        sys.path.pop(0)
    return [arg for folder in _mpi_find.find_mpi().include_dirs for arg in ("-I", folder)]


def sanitize_args():
    """The sanitizer flags of the engine's build when HVLITE_SANITIZE is set (a sanitizer run,
    tools/sanitizers/run.py, sets it): a probe compiled beside an instrumented engine is
    instrumented alike, so the engine files it includes run under the sanitizer too."""
    sys.path.insert(0, os.path.join(ROOT, "hvlite"))
    try:
        import _build
    finally:
        sys.path.pop(0)
    compile_args, link_args = _build.sanitize_flags()
    return compile_args + link_args


def compile_c(args, timeout=120):
    """Runs the compiler with the engine's warnings as errors; the test fails with its output."""
    # A sanitizer run's preloaded runtime is for the tests, not for the compiler or the mpicc
    # script asked for MPI's flags (their own leaks would be reported as the run's).
    preload = os.environ.pop("LD_PRELOAD", None)
    try:
        command = [compiler(), "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror"] + sanitize_args()
        for folder in ENGINE_INCLUDES:
            command += ["-I", folder]
        command += mpi_include_args() + list(args)
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    finally:
        if preload is not None:
            os.environ["LD_PRELOAD"] = preload
    assert done.returncode == 0, " ".join(command) + "\n" + done.stderr


def load_probe(name, folder):
    """tests/unit/NAME.c compiled into `folder` and loaded after the engine, whose symbols it
    uses (made global first)."""
    from hvlite import _core
    out = os.path.join(str(folder), name + ".so")
    compile_c(["-shared", "-fPIC", "-o", out, os.path.join(ROOT, "tests", "unit", name + ".c")])
    ctypes.CDLL(_core.__file__, mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL(out)


CALL_LIMIT_S = 20


def bounded(fn, *args):
    """fn(*args) on a thread of its own, waited for CALL_LIMIT_S: (its result, the engine's last
    error message on that thread, which is per thread). Still running then: the test fails, and
    the thread is left behind (a daemon, stuck in C)."""
    from hvlite._lib import ffi, lib
    out = []
    thread = threading.Thread(target=lambda: out.append((fn(*args), ffi.string(lib.hvl_last_error()).decode())),
                              daemon=True)
    thread.start()
    thread.join(CALL_LIMIT_S)
    assert out, f"{getattr(fn, '__name__', fn)} did not return in {CALL_LIMIT_S} s: it hangs"
    return out[0]
