"""Finds the MPI to build the engine against (build time only; stdlib only).

Order, as documented in the README: ``HVLITE_MPICC`` (a path to an mpicc) -> ``mpicc`` on PATH
-> the PyPI ``mpich`` wheel installed in this Python (``<prefix>/bin/mpicc``). The compiler
wrapper is asked for its flags (``-show`` for MPICH/Intel MPI, ``--showme`` for Open MPI) and
the flags are split into include dirs, library dirs, libraries and other arguments for cffi.

``find_mpi()`` returns an ``MpiBuild``; raises ``RuntimeError`` naming every place tried.
For the wheel, the extension also gets an rpath relative to its own location
(``$ORIGIN/../../..`` = ``<prefix>/lib`` of a venv or system install) so the installed core
finds libmpi without ``LD_LIBRARY_PATH``.
"""
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field


@dataclass
class MpiBuild:
    mpicc: str
    source: str                      # "site" or "pypi-mpich"
    include_dirs: list = field(default_factory=list)
    library_dirs: list = field(default_factory=list)
    libraries: list = field(default_factory=list)
    compile_args: list = field(default_factory=list)
    link_args: list = field(default_factory=list)


def _wheel_mpicc():
    """mpicc of the installed mpich wheel, found through the wheel's own file list, so it is
    recognised wherever pip put it (a venv, pip's isolated build environment, ~/.local)."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution
        dist = distribution("mpich")
    except (ImportError, PackageNotFoundError):
        return None
    for f in dist.files or ():
        if str(f).replace("\\", "/").endswith("bin/mpicc"):
            path = os.path.realpath(str(dist.locate_file(f)))
            if os.path.isfile(path):
                return path
    return None


def _candidates():
    """(mpicc, source, label) in the documented order; the wheel's own mpicc is "pypi-mpich"
    however it was named (HVLITE_MPICC, PATH, or found through the wheel)."""
    wheel = _wheel_mpicc()

    def source(path):
        return "pypi-mpich" if wheel and os.path.realpath(path) == wheel else "site"
    env = os.environ.get("HVLITE_MPICC") or os.environ.get("HOROVOD_MPICC")
    if env:
        yield env, source(env), "HVLITE_MPICC=" + env
        return
    on_path = shutil.which("mpicc")
    if on_path and source(on_path) == "site":
        yield on_path, "site", "mpicc on PATH (" + on_path + ")"
    if wheel:
        yield wheel, "pypi-mpich", "the mpich wheel (" + wheel + ")"


def _show(mpicc):
    for flag in ("-show", "--showme"):
        try:
            out = subprocess.run([mpicc, flag], capture_output=True, text=True, timeout=60)
        except OSError:
            return None
        if out.returncode == 0 and out.stdout.strip():
            return shlex.split(out.stdout.strip())[1:]   # drop the compiler name
    return None


def _parse(mpicc, source, args):
    b = MpiBuild(mpicc=mpicc, source=source)
    it = iter(args)
    for a in it:
        if a.startswith("-I"):
            b.include_dirs.append(a[2:] or next(it))
        elif a.startswith("-L"):
            b.library_dirs.append(a[2:] or next(it))
        elif a.startswith("-l"):
            b.libraries.append(a[2:] or next(it))
        elif a.startswith("-Wl,") or a in ("-pthread",):
            b.link_args.append(a)
        elif a == "-Xlinker":
            b.link_args += [a, next(it)]
        elif a.startswith("-D") or a.startswith("-f"):
            b.compile_args.append(a)
        else:
            b.link_args.append(a)
    if source == "pypi-mpich":
        b.link_args.append("-Wl,-rpath,$ORIGIN/../../..")
    for d in b.library_dirs:
        b.link_args.append("-Wl,-rpath," + d)
    return b


def find_mpi():
    tried = []
    for mpicc, source, label in _candidates():
        args = _show(mpicc)
        if args is not None:
            return _parse(mpicc, source, args)
        tried.append(label)
    raise RuntimeError(
        "hvlite: no MPI found to build against (tried: %s). Install the MPI wheel with "
        "'pip install mpich', put your site's mpicc on PATH, or set HVLITE_MPICC=/path/to/mpicc."
        % (", ".join(tried) or "HVLITE_MPICC, mpicc on PATH, the mpich wheel"))
