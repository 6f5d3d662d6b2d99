"""What `pip install .` puts on disk loads MPI from where it should, and only from there.

- ``test_pip_install_into_an_empty_venv``: a copy of the checkout's sources is installed with a
  plain ``pip install .`` (build isolation: pip builds in a temporary environment holding the
  mpich wheel) into a new venv, with no MPI wrapper on PATH, so the build takes the mpich wheel.
  Every RUNPATH/RPATH entry of the installed engine is ``$ORIGIN``-relative (nothing absolute,
  nothing of the temporary build environment, which pip deletes and anyone could recreate in the
  world-writable temp folder to plant a libmpi) and leads to the venv's own ``libmpi``;
  ``_build_info.json`` records no temporary path; torch was not pulled in; and, run from a folder
  outside the checkout, ``hvlrun --check-build`` and a 2-rank allreduce work with the installed
  package, whose ranks map the venv's ``libmpi``. About half a minute with pip's cache warm.
- ``test_checkout_build_loader_path``: the checkout's own build in place (``make build``) holds
  no temporary path either and finds its MPI.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from jobs import MULTIPLIER, ROOT

# Not copied: version control, environments, build outputs and caches of the checkout.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                     ".pytest_cache", "*.so", "*.o", "_core.c", "_build_info.json")
BUILD_ENV = "pip-build-env"


def loader_path(so):
    """The RUNPATH and RPATH entries of the shared object ``so``, in order (readelf -d)."""
    out = subprocess.run(["readelf", "-d", so], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    entries = []
    for kind, value in re.findall(r"\((RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[([^\]]*)\]",
                                  out.stdout):
        entries += value.split(":")
    return entries


def resolve(entry, so):
    """The folder a loader-path entry of ``so`` names (``$ORIGIN`` = the folder of ``so``)."""
    origin = os.path.dirname(os.path.realpath(so))
    return os.path.realpath(entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin))


def assert_loader_path_is_safe(so, info, lib_dir=None):
    """Every entry is where the build's MPI lies at run time, none a temporary build path: for
    the mpich wheel only $ORIGIN-relative entries leading to a folder with libmpi (``lib_dir``
    when given); for a site MPI absolute folders that exist."""
    entries = loader_path(so)
    assert entries, "no RUNPATH/RPATH in %s: libmpi would not be found" % so
    assert not any(BUILD_ENV in e or e.startswith(tempfile.gettempdir()) for e in entries), entries
    if info["mpi_source"] == "pypi-mpich":
        assert all(e.startswith(("$ORIGIN/", "${ORIGIN}/")) for e in entries), entries
        folders = [resolve(e, so) for e in entries]
        assert all(glob.glob(os.path.join(f, "libmpi.so*")) for f in folders), (entries, folders)
        if lib_dir is not None:
            assert folders == [os.path.realpath(lib_dir)], (entries, folders)
    else:
        assert all(os.path.isabs(e) and os.path.isdir(e) for e in entries), entries
    return entries


def assert_no_temporary_path(info):
    text = json.dumps(info)
    assert BUILD_ENV not in text, info
    for key in ("mpicc", "mpi_bindir"):
        if key in info:
            assert os.path.isabs(info[key]) and os.path.exists(info[key]), info


def clean_env(venv):
    """An environment that can reach no MPI but the new venv's own: no MPI wrapper on PATH, no
    HVLITE_MPICC, nothing of the checkout on PYTHONPATH, no LD_LIBRARY_PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HVLITE_MPICC", "HOROVOD_MPICC", "PYTHONPATH", "LD_LIBRARY_PATH",
                        "VIRTUAL_ENV", "PYTHONHOME", "HVLITE_MPIEXEC")}
    path = [d for d in os.environ.get("PATH", os.defpath).split(os.pathsep)
            if d and not os.path.exists(os.path.join(d, "mpicc"))]
    env["PATH"] = os.pathsep.join([os.path.join(venv, "bin")] + path)
    return env


def run(cmd, cwd, env, timeout):
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=timeout * MULTIPLIER, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, "%s failed (rc %d)\n--- stdout\n%s\n--- stderr\n%s" % (
        " ".join(cmd), out.returncode, out.stdout[-4000:], out.stderr[-4000:])
    return out.stdout


RANK_CHECK = """
import hvlite, numpy as np
hvlite.init()
got = hvlite.allreduce(np.full(3, hvlite.rank() + 1.0), op=hvlite.Sum, name="installed")
assert (got == 3.0).all(), got
libmpi = sorted({l.split()[-1] for l in open("/proc/self/maps") if "/libmpi" in l})
print("rank %d: hvlite %s libmpi %s" % (hvlite.rank(), hvlite.__file__, libmpi))
hvlite.shutdown()
"""


METADATA = """
import json
from importlib.metadata import metadata, version
m = metadata("hvlite")
print(json.dumps({"version": version("hvlite"), "license": m["License-Expression"],
                  "python": m["Requires-Python"], "readme": m["Description-Content-Type"],
                  "description": m.get_payload(), "classifiers": m.get_all("Classifier"),
                  "extras": m.get_all("Provides-Extra")}))
"""


def assert_metadata(py, cwd, env):
    """The installed package's metadata: one version (hvlite/__init__.py's), Apache-2.0, the
    Python versions the tests run on, the README as its long description, the extras."""
    meta = json.loads(run([py, "-c", METADATA], cwd, env, 60))
    with open(os.path.join(ROOT, "hvlite", "__init__.py")) as f:
        written = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)
    assert meta["version"] == written, meta["version"]
    assert meta["license"] == "Apache-2.0", meta
    assert meta["python"] == ">=3.11", meta
    assert meta["readme"] == "text/markdown", meta
    with open(os.path.join(ROOT, "README.md")) as f:
        assert meta["description"].strip() == f.read().strip()
    assert "Programming Language :: Python :: 3.11" in meta["classifiers"], meta
    assert sorted(meta["extras"]) == ["examples", "ray", "spark", "tensorflow", "torch"], meta


def test_pip_install_into_an_empty_venv(tmp_path):
    src, venv, away = tmp_path / "src", str(tmp_path / "venv"), tmp_path / "elsewhere"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCES, symlinks=True)
    away.mkdir()
    run([sys.executable, "-m", "venv", venv], str(away), clean_env(venv), 120)
    py, env = os.path.join(venv, "bin", "python"), clean_env(venv)
    run([py, "-m", "pip", "install", "-q", "."], str(src), env, 600)

    site = run([py, "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"],
               str(away), env, 60).strip()
    assert not os.path.exists(os.path.join(site, "torch")), "pip install . pulled in torch"
    package = os.path.join(site, "hvlite")
    with open(os.path.join(package, "_build_info.json")) as f:
        info = json.load(f)
    assert info["mpi_source"] == "pypi-mpich", info
    assert "mpi_bindir" not in info and "mpicc" not in info, info   # a wheel's: found at run time
    assert_no_temporary_path(info)
    (so,) = glob.glob(os.path.join(package, "_core*.so"))
    assert_loader_path_is_safe(so, info, lib_dir=os.path.join(venv, "lib"))

    assert_metadata(py, str(away), env)
    report = run([os.path.join(venv, "bin", "hvlrun"), "--check-build"], str(away), env, 120)
    assert "MPI source: pypi-mpich" in report, report
    assert "mpiexec: %s" % os.path.join(venv, "bin", "mpiexec") in report, report
    out = run([os.path.join(venv, "bin", "hvlrun"), "-np", "2", py, "-c", RANK_CHECK],
              str(away), dict(env, HVLITE_LOG_LEVEL="warning"), 180)
    lines = re.findall(r"rank (\d): hvlite (\S+) libmpi \['([^']+)'\]", out)
    assert sorted(r for r, _, _ in lines) == ["0", "1"], out
    for _, module, libmpi in lines:
        assert module.startswith(package + os.sep), out
        assert os.path.realpath(libmpi) == os.path.realpath(os.path.join(venv, "lib", "libmpi.so.12")), out


def test_checkout_build_loader_path():
    with open(os.path.join(ROOT, "hvlite", "_build_info.json")) as f:
        info = json.load(f)
    assert_no_temporary_path(info)
    (so,) = glob.glob(os.path.join(ROOT, "hvlite", "_core*.so"))
    assert_loader_path_is_safe(so, info)
