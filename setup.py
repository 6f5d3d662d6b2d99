"""Builds hvlite: the C engine as the cffi module hvlite._core, against the MPI found by
hvlite/_mpi_find.py (HVLITE_MPICC -> mpicc on PATH -> the PyPI mpich wheel), and records what was
built in hvlite/_build_info.json, which `hvlrun --check-build` reads without importing the engine.
When built against the mpich wheel, that wheel becomes a runtime dependency (it provides libmpi
and mpiexec)."""
import json
import os
import subprocess
import sys

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "hvlite"))
import _mpi_find  # noqa: E402

VERSION = "0.1.0"


def mpich_wheel_version():
    try:
        from importlib.metadata import version
        return version("mpich")
    except Exception:
        return None


def write_build_info(mpi):
    vendor = ""
    try:
        out = subprocess.run([os.path.join(os.path.dirname(mpi.mpicc), "mpichversion")],
                             capture_output=True, text=True, timeout=30)
        vendor = out.stdout.splitlines()[0] if out.returncode == 0 and out.stdout else ""
    except OSError:
        pass
    info = {
        "version": VERSION,
        "mpi_source": mpi.source,
        "mpicc": mpi.mpicc,
        "mpi_bindir": os.path.dirname(mpi.mpicc),
        "mpi_vendor": vendor,
        "nccl": False,
        "shm": sys.platform.startswith("linux"),   # futex + /dev/shm: built wherever the engine builds
    }
    with open(os.path.join(ROOT, "hvlite", "_build_info.json"), "w") as f:
        json.dump(info, f, indent=1)


mpi = _mpi_find.find_mpi()
write_build_info(mpi)
requires = ["cffi>=1.15", "numpy>=1.23"]
if mpi.source == "pypi-mpich":
    v = mpich_wheel_version()
    requires.append("mpich==" + v if v else "mpich")

setup(
    name="hvlite",
    version=VERSION,
    description="Horovod-style distributed training on one C engine (MPI, shared memory, NCCL)",
    packages=find_packages(include=["hvlite", "hvlite.*"]),
    package_data={"hvlite": ["_build_info.json"]},
    python_requires=">=3.9",
    install_requires=requires,
    extras_require={"torch": ["torch>=2.1"], "tensorflow": ["tensorflow>=2.21", "keras>=3"],
                    "examples": ["scikit-learn"]},
    cffi_modules=["hvlite/_build.py:ffibuilder"],
    entry_points={"console_scripts": ["hvlrun = hvlite.runner:run"]},
    zip_safe=False,
)
