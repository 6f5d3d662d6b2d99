"""Finds the MPI to build the engine against (build time only; stdlib only).

Order, as documented in docs/install.md: ``HVLITE_MPICC`` (a path to an mpicc) -> ``mpicc`` on PATH
-> the PyPI ``mpich`` wheel installed in this Python (``<prefix>/bin/mpicc``). The compiler
wrapper is asked for its flags (``-show`` for MPICH/Intel MPI, ``--showme`` for Open MPI) and
the flags are split into include dirs, library dirs, libraries and other arguments for cffi.

``find_mpi()`` returns an ``MpiBuild``; raises ``RuntimeError`` naming every place tried.
The wrapper's own rpaths are taken out of its flags: :func:`rpath_args` decides what goes on the
engine's loader path, once the build knows where the module will be loaded from, and nothing
else does (:func:`split_rpaths` also takes Python's own rpath out of the link command):

* a site MPI: its real library folders (the wrapper's rpaths and ``-L`` folders);
* the mpich wheel: only ``$ORIGIN``-relative paths, to the ``lib`` folder of the mpich wheel
  installed beside hvlite at run time (``$ORIGIN/../../..`` = ``<prefix>/lib`` for a venv or
  system install; ``$ORIGIN/../.venv/lib`` for a checkout built in place with its ``.venv``).
  Never the folder the build found the wheel in when that is pip's isolated build environment:
  a temporary folder, deleted after the build, in a world-writable directory where anyone could
  plant a ``libmpi`` for every rank to load.
"""
import os
import shlex
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field


@dataclass
class MpiBuild:
    mpicc: str
    source: str                      # "site" or "pypi-mpich"
    include_dirs: list = field(default_factory=list)
    library_dirs: list = field(default_factory=list)
    libraries: list = field(default_factory=list)
    compile_args: list = field(default_factory=list)
    link_args: list = field(default_factory=list)       # without any rpath
    rpath_dirs: list = field(default_factory=list)      # the wrapper's rpaths, then library_dirs


def wheel_file(wheel, suffix):
    """The real path of the file ending in `suffix` that the installed `wheel` lists, found
    through the wheel's own file list, so it is found wherever pip put it (a venv, pip's isolated
    build environment, ~/.local); None if the wheel is not installed or lists no such file.
    Also finds NCCL's library in torch's nvidia-nccl wheel (hvlite/_nccl_find.py)."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution
        dist = distribution(wheel)
    except (ImportError, PackageNotFoundError):
        return None
    for f in dist.files or ():
        name = str(f).replace("\\", "/")
        if name == suffix or name.endswith("/" + suffix):
            path = os.path.realpath(str(dist.locate_file(f)))
            if os.path.isfile(path):
                return path
    return None


def _candidates():
    """(mpicc, source, label) in the documented order; the wheel's own mpicc is "pypi-mpich"
    however it was named (HVLITE_MPICC, PATH, or found through the wheel)."""
    wheel = wheel_file("mpich", "bin/mpicc")

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


RPATH_OPTIONS = ("-rpath", "--rpath", "-R")


def split_rpaths(args):
    """Split compiler/linker arguments into (the arguments without rpaths, the rpath folders).

    Understands the spellings compiler wrappers and Python's ``LDSHARED`` use: ``-Wl,-rpath,D``,
    ``-Wl,-rpath=D``, ``-Wl,-rpath -Wl,D``, ``-Wl,-R,D``, ``-Xlinker -rpath -Xlinker D`` (and
    ``--rpath``); other ``-Wl,`` options, also in the same comma list, are kept. Cannot fail.
    """
    kept, dirs, want_dir = [], [], False
    it = iter(args)
    for a in it:
        if a == "-Xlinker":
            opts, prefix = [next(it, "")], None
        elif a.startswith("-Wl,"):
            opts, prefix = a[4:].split(","), "-Wl,"
        else:
            kept.append(a)
            continue
        rest = []
        for opt in opts:
            if want_dir:
                dirs.append(opt)
                want_dir = False
            elif opt in RPATH_OPTIONS:
                want_dir = True
            elif opt.split("=", 1)[0] in ("-rpath", "--rpath") and "=" in opt:
                dirs.append(opt.split("=", 1)[1])
            else:
                rest.append(opt)
        if rest:
            kept += [prefix + ",".join(rest)] if prefix else ["-Xlinker", rest[0]]
    return kept, dirs


def _parse(mpicc, source, args):
    args, rpath_dirs = split_rpaths(args)
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
    for d in rpath_dirs + b.library_dirs:
        if d not in b.rpath_dirs:
            b.rpath_dirs.append(d)
    return b


def wheel_prefix_at_run_time(mpi):
    """The prefix (``<prefix>/lib`` holds libmpi) of the mpich wheel that a build in place of
    this Python will load: where the build found it if that is this Python's own environment
    (a venv, the system, the user's site), else this Python's data folder, where pip installs
    the wheel as hvlite's runtime dependency (the build found it in pip's isolated build
    environment, which is deleted afterwards). Cannot fail."""
    found = os.path.realpath(os.path.dirname(os.path.dirname(mpi.mpicc)))
    own = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, site.getuserbase())}
    return found if found in own else os.path.realpath(sysconfig.get_path("data"))


def rpath_args(mpi, in_place_dir=None):
    """The ``-Wl,-rpath`` arguments that let the engine module find libmpi, and nothing else.

    Args:
        mpi: the ``MpiBuild`` from :func:`find_mpi`.
        in_place_dir: the folder the module is built into and loaded from (a checkout's
            ``hvlite/``); None when it is installed into site-packages (a wheel).

    Returns:
        For a site MPI its library folders (absolute); for the mpich wheel ``$ORIGIN``-relative
        paths to the wheel's library folders where they lie at run time: beside the installed
        package in this Python's install scheme, or, built in place, in the environment of
        :func:`wheel_prefix_at_run_time`. Cannot fail.
    """
    if mpi.source != "pypi-mpich":
        return ["-Wl,-rpath," + d for d in mpi.rpath_dirs]
    found = os.path.realpath(os.path.dirname(os.path.dirname(mpi.mpicc)))
    if in_place_dir is None:
        where = {"base": os.sep + "prefix", "platbase": os.sep + "prefix"}   # any prefix will do
        prefix = sysconfig.get_path("data", vars=where)
        module_dir = os.path.join(sysconfig.get_path("platlib", vars=where), "hvlite")
    else:
        prefix, module_dir = wheel_prefix_at_run_time(mpi), os.path.realpath(in_place_dir)
    args = []
    for d in mpi.library_dirs:
        inside = os.path.relpath(os.path.realpath(d), found)       # "lib"
        if inside.startswith(os.pardir):
            continue                  # not the wheel's own folder: nothing to find there
        path = os.path.relpath(os.path.join(prefix, inside), module_dir)
        args.append("-Wl,-rpath,$ORIGIN/" + path)
    return args


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
