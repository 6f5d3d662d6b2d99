"""cffi builder for ``hvlite._core`` (API mode), used by setup.py.

Contract: ``ffibuilder`` compiles every ``.c`` file under ``csrc/`` (its folders: ``core``,
``backends``, ``kernels``, ``observe``, ``util``) into one extension module whose cdef is
the part of ``csrc/hvlite.h`` between the cffi markers, so constants and prototypes come from C
and no Python copy needs keeping in sync. MPI compile/link flags come from ``hvlite._mpi_find``
(``HVLITE_MPICC`` -> ``mpicc`` on PATH -> the PyPI ``mpich`` wheel), without rpaths: setup.py's
build_ext adds the loader path, once it knows where the module goes. Raises ``RuntimeError``
when no MPI can be found, naming what was tried.

``HVLITE_SANITIZE`` (unset or empty: the normal build, unchanged) builds an instrumented engine
for the sanitizer runs (``tools/sanitizers/run.py``, ``make test-asan`` / ``make test-tsan``):
``address`` = AddressSanitizer + UndefinedBehaviorSanitizer, ``thread`` = ThreadSanitizer. Such a
build needs its runtime preloaded into the (uninstrumented) Python, so it is made in a copy of the
tree, never in a checkout's own ``hvlite/``. Any other value raises ``ValueError``.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _mpi_find  # noqa: E402  (a sibling file, importable without the package)

from cffi import FFI  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")


def read_cdef():
    """The declarations between the cffi markers of csrc/hvlite.h, minus C-only syntax."""
    text = open(os.path.join(CSRC, "hvlite.h")).read()
    body = text.split("/* --- cffi cdef begins --- */")[1].split("/* --- cffi cdef ends --- */")[0]
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    return body


# Flags per HVLITE_SANITIZE value: (compile, link). -O1 and frame pointers keep reports' stacks
# whole; -fno-wrapv undoes Python's -fwrapv so that UBSan sees signed overflow as the bug it is
# in C (the normal build must not rely on wrapping either).
SANITIZE_FLAGS = {
    "": ([], []),
    "address": (["-fsanitize=address,undefined,float-cast-overflow", "-fno-omit-frame-pointer",
                 "-fno-wrapv", "-g", "-O1"], ["-fsanitize=address,undefined"]),
    "thread": (["-fsanitize=thread", "-fno-omit-frame-pointer", "-g", "-O1"],
               ["-fsanitize=thread"]),
}


def sanitize_flags():
    """(compile args, link args) that HVLITE_SANITIZE asks for; ([], []) when it is unset."""
    mode = os.environ.get("HVLITE_SANITIZE", "").strip()
    if mode not in SANITIZE_FLAGS:
        raise ValueError("HVLITE_SANITIZE=%r: use address (ASan + UBSan), thread (TSan), or leave "
                         "it unset" % mode)
    return SANITIZE_FLAGS[mode]


def make_builder():
    mpi = _mpi_find.find_mpi()
    sources, folders = [], [CSRC]
    for here, dirs, files in sorted(os.walk(CSRC)):
        dirs.sort()
        folders += [os.path.join(here, d) for d in dirs]
        sources += sorted(os.path.relpath(os.path.join(here, f)) for f in files if f.endswith(".c"))
    san_compile, san_link = sanitize_flags()
    ffi = FFI()
    ffi.cdef(read_cdef())
    ffi.set_source(
        "hvlite._core",
        '#include "hvlite.h"\n',
        sources=sources,
        include_dirs=folders + mpi.include_dirs,
        library_dirs=mpi.library_dirs,
        libraries=mpi.libraries,
        extra_compile_args=["-std=c11", "-D_GNU_SOURCE", "-O2", "-Wall", "-Wextra"] + mpi.compile_args
        + san_compile,
        extra_link_args=mpi.link_args + ["-lpthread", "-lm"] + san_link,
    )
    return ffi, mpi


ffibuilder, MPI_FOUND = make_builder()

if __name__ == "__main__":
    # By hand: the build in place that setup.py makes, whose build_ext puts the MPI's run-time
    # library folders on the module's loader path (_mpi_find.rpath_args) and writes the build info.
    import subprocess
    sys.exit(subprocess.call([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=ROOT))
