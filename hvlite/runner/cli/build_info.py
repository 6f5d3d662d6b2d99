"""What the engine was built with, read without importing the engine.

Contract:
  * The engine's build writes ``hvlite/_build_info.json`` next to ``hvlite/__init__.py``; it is
    found relative to this package (never by importing ``hvlite``) and may be absent, which means
    "engine not built". Keys used: ``version``, ``mpi_source`` ("pypi-mpich" or "site"),
    ``mpi_bindir``, ``mpi_vendor``, ``nccl``, ``shm``.
  * :func:`find_mpiexec` looks in this order: ``$HVLITE_MPIEXEC``; the build's MPI
    (``<mpi_bindir>/mpiexec`` for "site", ``<sys.prefix>/bin/mpiexec`` for "pypi-mpich");
    ``mpiexec`` then ``mpirun`` on ``PATH``. A candidate from the build info that does not exist
    is skipped.
  * :func:`check_build_report` formats the ``--check-build`` text: the build, the features, and
    the data planes in the engine's priority order with whether the settings leave each on; it
    runs at most one ``mpiexec --version``.
"""

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Mapping, Optional, Tuple

from ..world.mpi_command import query_flavour

__all__ = ["BUILD_INFO_PATH", "load_build_info", "find_mpiexec", "check_build_report"]

BUILD_INFO_PATH = Path(__file__).resolve().parents[2] / "_build_info.json"


def load_build_info(path: Optional[Path] = None) -> Optional[dict]:
    """Read the engine's build info.

    Args:
        path: the JSON file; :data:`BUILD_INFO_PATH` when omitted.

    Returns:
        The parsed dict, or None if the file does not exist (engine not built).

    Raises:
        ValueError: if the file exists but is not a JSON object.
    """
    path = BUILD_INFO_PATH if path is None else Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        info = json.loads(text)
    except ValueError as e:
        raise ValueError("%s is not valid JSON: %s" % (path, e)) from e
    if not isinstance(info, dict):
        raise ValueError("%s does not hold a JSON object" % path)
    return info


def _build_candidate(info: Optional[Mapping]) -> Optional[Path]:
    """Return the mpiexec that belongs to the build's MPI, or None if unknown."""
    if not info:
        return None
    source = info.get("mpi_source")
    if source == "site" and info.get("mpi_bindir"):
        return Path(info["mpi_bindir"]) / "mpiexec"
    if source == "pypi-mpich":
        return Path(sys.prefix) / "bin" / "mpiexec"
    return None


def find_mpiexec(info: Optional[Mapping],
                 environ: Optional[Mapping[str, str]] = None) -> Tuple[Optional[str], str]:
    """Choose the ``mpiexec`` to launch with.

    Args:
        info: the build info from :func:`load_build_info`, or None.
        environ: the environment to read ``HVLITE_MPIEXEC`` and ``PATH`` from;
            ``os.environ`` when omitted.

    Returns:
        ``(path, how)``: the executable (None if none was found) and a few words on where it
        came from, e.g. ``"from build info (pypi-mpich)"``.
    """
    environ = os.environ if environ is None else environ
    if environ.get("HVLITE_MPIEXEC"):
        return environ["HVLITE_MPIEXEC"], "from $HVLITE_MPIEXEC"
    candidate = _build_candidate(info)
    if candidate is not None and os.access(str(candidate), os.X_OK):
        return str(candidate), "from build info (%s)" % info.get("mpi_source")
    for name in ("mpiexec", "mpirun"):
        found = shutil.which(name, path=environ.get("PATH"))
        if found:
            return found, "found on PATH"
    return None, "not found"


def _box(flag: bool) -> str:
    """Return ``[X]`` or ``[ ]``. Cannot fail."""
    return "[X]" if flag else "[ ]"


def check_build_report(info: Optional[Mapping], mpiexec: Optional[str], how: str,
                       environ: Optional[Mapping[str, str]] = None) -> str:
    """Format the ``--check-build`` report.

    Args:
        info: the build info, or None when the engine is not built.
        mpiexec: the mpiexec :func:`find_mpiexec` chose, or None.
        how: where it came from (second value of :func:`find_mpiexec`).
        environ: the settings that decide which data planes are on; ``os.environ`` when omitted.

    Returns:
        The report, several lines ending in a newline.
    """
    lines = []
    if info is None:
        lines.append("hvlite engine: NOT BUILT (no %s); build it with `pip install -e .`"
                     % BUILD_INFO_PATH)
    else:
        lines.append("hvlite version: %s" % info.get("version", "unknown"))
        lines.append("MPI source: %s" % info.get("mpi_source", "unknown"))
        vendor = str(info.get("mpi_vendor", "unknown")).strip().splitlines() or ["unknown"]
        lines.append("MPI vendor: %s" % vendor[0])
    if mpiexec is None:
        lines.append("mpiexec: none found (set HVLITE_MPIEXEC or put mpiexec on PATH)")
    else:
        lines.append("mpiexec: %s (%s), flavour %s" % (mpiexec, how, query_flavour(mpiexec)))
    built = info is not None
    lines += ["", "Available features:",
              "    %s MPI" % _box(built),
              "    %s NCCL" % _box(built and bool(info.get("nccl"))),
              "    %s shared memory" % _box(built and bool(info.get("shm")))]
    if built:
        lines += ["", "Data planes, in the order the engine offers each collective to them:"]
        lines += ["    %d. %s" % (i + 1, text) for i, text in enumerate(_data_planes(info, environ))]
    return "\n".join(lines) + "\n"


def _setting(environ: Mapping[str, str], suffix: str) -> str:
    """Return ``HVLITE_<suffix>`` (or its ``HOROVOD_`` alias) from ``environ``, else ``""``."""
    return environ.get("HVLITE_" + suffix, environ.get("HOROVOD_" + suffix, "")).strip()


def _data_planes(info: Mapping, environ: Optional[Mapping[str, str]]) -> list:
    """Describe each backend of the engine's registry (csrc/backends/backend.c), in its priority order,
    with whether this environment's settings leave it on. Cannot fail."""
    environ = os.environ if environ is None else environ
    shm_off = _setting(environ, "SHM_DISABLE") not in ("", "0")
    hier_on = _setting(environ, "HIERARCHICAL_ALLREDUCE") not in ("", "0")
    planes = ["NCCL: GPU buffers (%s)" % ("built" if info.get("nccl") else "not built")]
    if not info.get("shm"):
        planes.append("shared memory: not built")
    else:
        planes.append("shared memory: collectives of a set whose ranks share one host, but "
                      "broadcasts of 1 MiB or more at 2 ranks (%s)"
                      % ("OFF: HVLITE_SHM_DISABLE is set" if shm_off else "on; HVLITE_SHM_DISABLE=1 turns it off"))
        planes.append("hierarchical: allreduce of a set spread over hosts (%s)"
                      % ("on: HVLITE_HIERARCHICAL_ALLREDUCE is set" if hier_on and not shm_off
                         else "off; hvlrun --hierarchical-allreduce turns it on"))
    planes.append("MPI: everything else (always)")
    return planes
