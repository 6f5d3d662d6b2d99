"""Finds the NCCL library the engine's GPU plane will load at run time (stdlib only).

NCCL is never linked: a CPU machine must load hvlite without it, and the NCCL a user has is
usually the one their torch brought. Order, as the GPU guide documents it
(``docs/guides/gpus.md``, "Which NCCL is used"):

1. ``HVLITE_NCCL_LIB``, else Horovod's ``HOROVOD_NCCL_LIB``, else Horovod's
   ``HOROVOD_NCCL_HOME``: the first that is set names ``libnccl.so.2`` itself or the folder
   holding it (Horovod's ``HOROVOD_NCCL_LIB`` is a folder; ``HOROVOD_NCCL_HOME`` is NCCL's
   prefix, whose ``lib/`` holds it). Set but naming no library is an error (a setting the
   user wrote is never silently passed over).
2. The ``nvidia-nccl-cu*`` wheel installed in this Python (torch's CUDA builds depend on it),
   found through the wheel's own file list (:func:`hvlite._mpi_find.wheel_file`, which finds
   the mpich wheel's mpicc too).
3. The system's: ``libnccl.so.2`` where the loader finds it (``ldconfig``'s cache,
   ``LD_LIBRARY_PATH``), asked through :func:`ctypes.util.find_library`.

Contract:
  * :func:`find_nccl` returns a :class:`NcclLibrary`: the path (or soname) and where it came
    from, or ``path`` None when none of the three has one; ``tried`` lists what was looked at,
    for messages. Raises :class:`NcclNotFound` only for a variable of step 1 that names no
    library. Loads nothing.
  * :func:`engine_library` is what the engine is told to load (``hvlite.init()`` puts it in
    ``HVLITE_NCCL_LIB``): the library a variable of step 1 names (a folder resolved to the file
    in it), else the wheel's, else None, where the engine's own ``dlopen("libnccl.so.2")``
    finds the system's; where Horovod's variables name no library it is what steps 2-3 find
    (the soname for the system's), so the engine never reads Horovod's folder as a library.
    Reads metadata only; loads nothing.
  * :func:`nccl_version` loads the library (``ctypes``; no GPU needed) and returns its version
    as ``"2.32.3"``. Raises :class:`NcclNotFound` when it cannot be loaded or is not NCCL (no
    ``ncclGetVersion``).
  * :func:`version_code` is NCCL's version code (``23007`` for 2.30.7) of the library
    :func:`find_nccl` names, 0 where none can be used: a wheel's from its metadata (loading
    nothing), any other by loading it. What ``hvlite.nccl_built()`` returns, as Horovod's does.
"""
import ctypes
import ctypes.util
import os
from dataclasses import dataclass, field
from typing import List, Mapping, Optional

from ._mpi_find import wheel_file

SONAME = "libnccl.so.2"
# torch's CUDA 13 and CUDA 12 builds depend on these; NVIDIA's unsuffixed name last.
WHEELS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl")


class NcclNotFound(RuntimeError):
    """The NCCL library asked for cannot be used; the message says which and why."""


@dataclass
class NcclLibrary:
    """The NCCL library :func:`find_nccl` chose, and where it looked.

    Attributes:
        path: an absolute path; the soname (``libnccl.so.2``) for the system's, which the
            loader resolves; None when none was found.
        source: the variable that named it (``"HVLITE_NCCL_LIB"``, ...), the wheel's name,
            ``"system"``, or ``""`` when none was found.
        tried: what was looked at, in order, for messages.
    """
    path: Optional[str]
    source: str
    tried: List[str] = field(default_factory=list)


# Where a user names the library, first set first: hvlite's, then Horovod's two.
VARIABLES = ("HVLITE_NCCL_LIB", "HOROVOD_NCCL_LIB", "HOROVOD_NCCL_HOME")


def _given(environ: Mapping[str, str]):
    """(variable, value) of the first variable of VARIABLES that is set, or (None, None)."""
    for variable in VARIABLES:
        value = environ.get(variable, "").strip()
        if value:
            return variable, value
    return None, None


def _library_at(variable: str, value: str) -> str:
    """The library ``variable=value`` names: the file, or libnccl.so.2 in the folder (in its
    ``lib/`` for HOROVOD_NCCL_HOME). NcclNotFound if there is none."""
    path = os.path.join(value, "lib") if variable == "HOROVOD_NCCL_HOME" else value
    if os.path.isdir(path):
        path = os.path.join(path, SONAME)
    if not os.path.isfile(path):
        raise NcclNotFound("%s=%s: no %s there (it names the library or the folder holding it%s)"
                           % (variable, value, SONAME,
                              "; NCCL's prefix, with lib/" if variable == "HOROVOD_NCCL_HOME" else ""))
    return os.path.abspath(path)


def find_nccl(environ: Optional[Mapping[str, str]] = None) -> NcclLibrary:
    """The NCCL library to load, in the documented order (see the module's docstring).

    Args:
        environ: the variables to read (``os.environ`` when None).
    Returns:
        An :class:`NcclLibrary`, whose ``path`` is None when no step found one. Loads nothing.
    Raises:
        NcclNotFound: a variable of step 1 is set but names no library.
    """
    environ = os.environ if environ is None else environ
    variable, value = _given(environ)
    if variable:
        return NcclLibrary(_library_at(variable, value), variable, [variable])
    tried = ["%s (unset)" % "/".join(VARIABLES)]
    path, wheel = _from_wheel()
    if path:
        return NcclLibrary(path, wheel, tried + [wheel])
    tried.append("the %s wheels (none installed in this Python)" % "/".join(WHEELS))
    if ctypes.util.find_library("nccl"):
        return NcclLibrary(SONAME, "system", tried + ["system"])
    tried.append("the system (%s not on the loader's path)" % SONAME)
    return NcclLibrary(None, "", tried)


def engine_library(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The NCCL library the engine is told to load (``HVLITE_NCCL_LIB``, set by ``init()``).

    Args:
        environ: the variables to read (``os.environ`` when None).
    Returns:
        A path, the soname, or None where the engine's own ``dlopen`` should look (see the
        module's docstring). Reads metadata only; never raises for a bad setting (the engine
        reports a bad ``HVLITE_NCCL_LIB`` where it loads it).
    """
    environ = os.environ if environ is None else environ
    variable, value = _given(environ)
    if variable:
        try:
            return _library_at(variable, value)
        except NcclNotFound:
            if variable == "HVLITE_NCCL_LIB":
                return None       # the engine reports it where it loads it
    path = _from_wheel()[0]
    return path or (SONAME if variable else None)


def _from_wheel():
    """(libnccl.so.2 of the first installed wheel of WHEELS, its name), or (None, None)."""
    for wheel in WHEELS:
        path = wheel_file(wheel, "nvidia/nccl/lib/" + SONAME)
        if path:
            return path, wheel
    return None, None


def version_code(environ: Optional[Mapping[str, str]] = None) -> int:
    """NCCL's version code (``23007`` for 2.30.7) of the library :func:`find_nccl` names, or
    0 if there is none or it cannot be loaded; what ``hvlite.nccl_built()`` returns.

    Args:
        environ: the variables to read (``os.environ`` when None).
    """
    try:
        library = find_nccl(environ)
        if library.path is None:
            return 0
        path, wheel = _from_wheel()
        if wheel and os.path.realpath(library.path) == path:
            from importlib.metadata import version
            major, minor, patch = (int(part) for part in version(wheel).split(".")[:3])
            return major * 10000 + minor * 100 + patch
        return _loaded_code(library)
    except (NcclNotFound, ValueError):
        return 0


def nccl_version(library: NcclLibrary) -> str:
    """Load ``library`` with ``ctypes`` (no GPU needed) and return its version as text.

    Args:
        library: what :func:`find_nccl` returned, with a ``path``.
    Returns:
        The version, e.g. ``"2.32.3"``.
    Raises:
        NcclNotFound: the library cannot be loaded, or is not NCCL (no ``ncclGetVersion``).
    """
    return format_version(_loaded_code(library))


def _loaded_code(library: NcclLibrary) -> int:
    """NCCL's version code, asked of the library loaded with ctypes."""
    try:
        lib = ctypes.CDLL(library.path)
    except OSError as e:
        raise NcclNotFound("cannot load NCCL from %s (%s): %s"
                           % (library.path, library.source, e)) from None
    try:
        get_version = lib.ncclGetVersion
    except AttributeError:
        raise NcclNotFound("%s (%s) is not NCCL: it has no ncclGetVersion"
                           % (library.path, library.source)) from None
    code = ctypes.c_int(0)
    if get_version(ctypes.byref(code)) != 0:
        raise NcclNotFound("ncclGetVersion failed in %s" % library.path)
    return code.value


def format_version(code: int) -> str:
    """NCCL's version code as text (``23007`` -> ``"2.30.7"``).

    Args:
        code: major*10000 + minor*100 + patch since NCCL 2.9, major*1000 + minor*100 + patch
            before (nccl.h's ``NCCL_VERSION``).
    """
    if code >= 10000:
        return "%d.%d.%d" % (code // 10000, code % 10000 // 100, code % 100)
    return "%d.%d.%d" % (code // 1000, code % 1000 // 100, code % 100)
