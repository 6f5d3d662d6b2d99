"""What the engine was built with, learned without loading the engine into hvlrun.

Contract:
  * The engine's build writes ``hvlite/_build_info.json`` next to ``hvlite/__init__.py``; it is
    found relative to this package (never by importing ``hvlite``) and may be absent, which means
    "engine not built". Keys used: ``version``, ``mpi_source`` ("pypi-mpich" or "site"),
    ``mpi_bindir``, ``mpi_vendor``.
  * Which data planes were built, and whether CUDA tensors are taken, only the engine's registry
    knows (csrc/backends/backend.c): :func:`ask_engine` loads the engine in a child Python (the
    same hvlite as this hvlrun; nothing is initialised there) and asks it. It returns None when
    the engine cannot be loaded; it never loads CUDA (the driver is only looked for).
  * :func:`find_mpiexec` looks in this order: ``$HVLITE_MPIEXEC``; the build's MPI
    (``<mpi_bindir>/mpiexec`` for "site", ``<sys.prefix>/bin/mpiexec`` for "pypi-mpich");
    ``mpiexec`` then ``mpirun`` on ``PATH``. A candidate from the build info that does not exist
    is skipped.
  * :func:`check_build_report` formats the ``--check-build`` text: the build, the features, and
    the data planes in the engine's priority order with whether the settings leave each on, and
    the NCCL library a GPU plane would load (hvlite/_nccl_find.py, asked in the same child, which
    loads it to read its version; the launcher never does); it runs at most one
    ``mpiexec --version``.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional, Tuple

from ..world.mpi_command import query_flavour

__all__ = ["BUILD_INFO_PATH", "load_build_info", "ask_engine", "find_mpiexec", "check_build_report"]

BUILD_INFO_PATH = Path(__file__).resolve().parents[2] / "_build_info.json"
_PACKAGE_ROOT = Path(__file__).resolve().parents[3]     # the folder holding this hvlite

# Run in a child Python: the registry's planes in priority order, and the build facts it answers.
_ASK_ENGINE = """
import ctypes.util, json
from hvlite._lib import ffi, lib
out = ffi.new("hvl_backend_counters *")
planes = []
for i in range(lib.hvl_backend_count()):
    lib.hvl_get_backend_counters(i, out)
    planes.append(ffi.string(out.name).decode())
from hvlite import _nccl_find
try:
    found = _nccl_find.find_nccl()
    nccl_lib = {"path": found.path, "source": found.source, "tried": found.tried}
    if found.path:
        nccl_lib["version"] = _nccl_find.nccl_version(found)
except _nccl_find.NcclNotFound as e:
    nccl_lib = {"error": str(e)}
print(json.dumps({"planes": planes, "nccl": bool(lib.hvl_nccl_built()),
                  "shm": bool(lib.hvl_shm_built()), "cuda": bool(lib.hvl_cuda_built()),
                  "cuda_driver": ctypes.util.find_library("cuda"), "nccl_lib": nccl_lib}))
"""


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


def ask_engine(timeout: float = 60.0) -> Optional[dict]:
    """Ask the built engine's registry (see the module contract).

    Returns:
        ``{"planes": [names in priority order], "nccl", "shm", "cuda": bools, "cuda_driver":
        the CUDA driver library found on this machine or None}``, or None when the engine
        cannot be loaded (not built, or its MPI library missing). Cannot fail.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH")]))
    try:
        done = subprocess.run([sys.executable, "-c", _ASK_ENGINE], env=env, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        answer = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return answer if isinstance(answer, dict) and isinstance(answer.get("planes"), list) else None


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
                       environ: Optional[Mapping[str, str]] = None,
                       engine: Optional[Mapping] = None) -> str:
    """Format the ``--check-build`` report.

    Args:
        info: the build info, or None when the engine is not built.
        mpiexec: the mpiexec :func:`find_mpiexec` chose, or None.
        how: where it came from (second value of :func:`find_mpiexec`).
        environ: the settings that decide which data planes are on; ``os.environ`` when omitted.
        engine: the engine's answer (:func:`ask_engine`), or None when it could not be loaded.

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
        if engine is None:
            lines.append("engine: could not be loaded (run `python -c 'import hvlite'` to see why)")
    if mpiexec is None:
        lines.append("mpiexec: none found (set HVLITE_MPIEXEC or put mpiexec on PATH)")
    else:
        lines.append("mpiexec: %s (%s), flavour %s" % (mpiexec, how, query_flavour(mpiexec)))
    engine = engine or {}
    planes = engine.get("planes", [])
    cuda = "CUDA tensors"
    if engine.get("cuda"):
        cuda += " (the driver is loaded at run time: %s on this machine)" % (
            "found, %s" % engine["cuda_driver"] if engine.get("cuda_driver") else "not found")
    lines += ["", "Available features:",
              "    %s MPI" % _box("mpi" in planes),
              "    %s NCCL" % _box(bool(engine.get("nccl"))),
              "    %s shared memory" % _box(bool(engine.get("shm"))),
              "    %s %s" % (_box(bool(engine.get("cuda"))), cuda)]
    if "nccl_lib" in engine:
        lines.append("NCCL library: %s" % _describe_nccl_lib(engine["nccl_lib"]))
    if planes:
        lines += ["", "Data planes (the engine's registry), in the order it offers each "
                      "collective to them:"]
        lines += ["    %d. %s" % (i + 1, _describe_plane(name, environ))
                  for i, name in enumerate(planes)]
        if engine.get("cuda") and not engine.get("nccl"):
            lines.append("    CUDA tensors: staged through host memory to the planes above "
                         "(no plane of this build runs them on the GPU)")
        elif engine.get("cuda"):
            lines.append("    CUDA tensors: on NCCL where it runs them; otherwise (ranks sharing "
                         "a GPU, no NCCL, Adasum, scale factors NCCL cannot fold: the GPU guide, "
                         "docs/guides/gpus.md) staged through host memory to the host planes")
    if engine.get("cuda"):
        lines += ["", "GPU paths that have run on a GPU (the defaults): NCCL batches waited for, "
                      "the staged path whole, CUDA tensors negotiated as soon as submitted.",
                  "Experimental GPU switches (not yet run on a GPU; off unless set):"]
        lines += ["    %s %s" % (_switch(environ, suffix), what) for suffix, what in EXPERIMENTAL_GPU]
    return "\n".join(lines) + "\n"


# The GPU mechanisms written since the paths above ran on a GPU: one switch away, off by default
EXPERIMENTAL_GPU = [("GPU_READY_ONLY", "hold CUDA tensors out of negotiation until the GPU wrote them"),
                    ("NCCL_OVERLAP", "leave NCCL batches running while the engine negotiates the next"),
                    ("STAGED_PIECE", "stage an allreduce through host memory in pieces of that many bytes")]


def _switch(environ: Optional[Mapping[str, str]], suffix: str) -> str:
    """``HVLITE_<suffix>`` and whether this environment turns it on. Cannot fail."""
    value = _setting(os.environ if environ is None else environ, suffix)
    state = "ON here (%s)" % value if value not in ("", "0") else "off"
    return "HVLITE_%s: %s:" % (suffix, state)


def _describe_nccl_lib(found: Mapping) -> str:
    """The child's answer on the NCCL library, in one line. Cannot fail."""
    if found.get("error"):
        return "unusable: %s" % found["error"]
    if not found.get("path"):
        return "none found (tried %s)" % "; ".join(found.get("tried", []))
    return "NCCL %s from %s (%s)" % (found.get("version", "?"), found["path"], found["source"])


def _setting(environ: Mapping[str, str], suffix: str) -> str:
    """Return ``HVLITE_<suffix>`` (or its ``HOROVOD_`` alias) from ``environ``, else ``""``."""
    return environ.get("HVLITE_" + suffix, environ.get("HOROVOD_" + suffix, "")).strip()


def _describe_plane(name: str, environ: Optional[Mapping[str, str]]) -> str:
    """One plane of the registry, with whether this environment's settings leave it on. Cannot
    fail (a plane this launcher does not know is named as it is)."""
    environ = os.environ if environ is None else environ
    shm_off = _setting(environ, "SHM_DISABLE") not in ("", "0")
    hier_on = _setting(environ, "HIERARCHICAL_ALLREDUCE") not in ("", "0")
    if name == "nccl":
        return ("NCCL: CUDA allreduce, allgather, broadcast, alltoall and reducescatter of sets "
                "whose ranks each have their own GPU (%s)" % ("OFF: HVLITE_NCCL_DISABLE is set"
                                        if _setting(environ, "NCCL_DISABLE") not in ("", "0")
                                        else "on; HVLITE_NCCL_DISABLE=1 turns it off"))
    if name == "shm":
        return ("shared memory: collectives of a set whose ranks share one host, but broadcasts "
                "of 1 MiB or more at 2 ranks (%s)" % ("OFF: HVLITE_SHM_DISABLE is set" if shm_off
                                                      else "on; HVLITE_SHM_DISABLE=1 turns it off"))
    if name == "hierarchical":
        return ("hierarchical: allreduce of a set spread over hosts (%s)"
                % ("on: HVLITE_HIERARCHICAL_ALLREDUCE is set" if hier_on and not shm_off
                   else "off; hvlrun --hierarchical-allreduce turns it on"))
    if name == "mpi":
        return "MPI: everything else in host memory (always)"
    return name
