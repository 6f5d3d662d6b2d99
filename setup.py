"""Builds hvlite: the C engine as the cffi module hvlite._core, against the MPI found by
hvlite/_mpi_find.py (HVLITE_MPICC -> mpicc on PATH -> the PyPI mpich wheel), and records what was
built in hvlite/_build_info.json, which `hvlrun --check-build` reads without importing the engine.
When built against the mpich wheel, that wheel becomes a runtime dependency (it provides libmpi
and mpiexec).

The engine module's loader path (RUNPATH) holds only where its MPI lies at run time
(_mpi_find.rpath_args): $ORIGIN-relative paths for the wheel, which depend on whether the module
is built in place (a checkout: `pip install --no-build-isolation -e .`, `setup.py build_ext
--inplace`) or for site-packages, so build_ext adds them; Python's own rpath (from its LDSHARED:
the extension does not link libpython) is left out. The build info records paths of the MPI only
where they are the ones used at run time: a site MPI, or the wheel of the environment a checkout
is built in place for; never pip's temporary build environment."""
import json
import os
import subprocess
import sys

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext

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


def write_build_info(mpi, folder, in_place):
    """Write _build_info.json into folder (the package folder the engine module is built into)."""
    bindir = os.path.dirname(mpi.mpicc)
    vendor = ""
    try:
        out = subprocess.run([os.path.join(bindir, "mpichversion")],
                             capture_output=True, text=True, timeout=30)
        vendor = out.stdout.splitlines()[0] if out.returncode == 0 and out.stdout else ""
    except OSError:
        pass
    info = {
        "version": VERSION,
        "mpi_source": mpi.source,
        "mpi_vendor": vendor,
    }
    if mpi.source == "pypi-mpich":
        # the wheel at run time is the one installed with hvlite (<sys.prefix>/bin/mpiexec): a
        # path is recorded only for a build in place, and it is that environment's wheel
        bindir = None
        if in_place:
            bindir = os.path.join(_mpi_find.wheel_prefix_at_run_time(mpi), "bin")
    if bindir:
        info.update(mpicc=os.path.join(bindir, os.path.basename(mpi.mpicc)), mpi_bindir=bindir)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "_build_info.json"), "w") as f:
        json.dump(info, f, indent=1)


class BuildExt(build_ext):
    """build_ext that puts only the MPI's run-time library folders on the engine's loader path
    and writes the build info beside the module (cffi's own build_ext subclasses this one)."""

    def run(self):
        self.hvlite_in_place = bool(self.inplace)   # build_ext.run clears it while building
        super().run()
        package = os.path.join(ROOT, "hvlite") if self.hvlite_in_place else \
            os.path.join(self.build_lib, "hvlite")
        write_build_info(mpi, package, self.hvlite_in_place)

    def build_extensions(self):
        for attr in ("linker_so", "linker_so_cxx"):
            if getattr(self.compiler, attr, None):
                setattr(self.compiler, attr, _mpi_find.split_rpaths(getattr(self.compiler, attr))[0])
        in_place_dir = os.path.join(ROOT, "hvlite") if self.hvlite_in_place else None
        for ext in self.extensions:
            ext.extra_link_args = list(ext.extra_link_args) + _mpi_find.rpath_args(mpi, in_place_dir)
        super().build_extensions()


mpi = _mpi_find.find_mpi()
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
    cmdclass={"build_ext": BuildExt},
    entry_points={"console_scripts": ["hvlrun = hvlite.runner.cli.launch:run"]},
    zip_safe=False,
)
