"""The build's MPI flags (hvlite/_mpi_find.py): the wrappers' own rpaths are taken out of their
flags, and the engine's loader path holds only where its MPI lies at run time: real folders for
a site MPI, $ORIGIN-relative paths for the mpich wheel, never pip's temporary build environment.
Nothing is built or run here (tests/test_install.py builds and installs)."""
import os
import shlex
import sys
import sysconfig

import pytest

from hvlite import _mpi_find

MPICH_WHEEL = ("cc -I/P/include -L/P/lib -Wl,-rpath -Wl,/P/lib -Wl,--enable-new-dtags -lmpi")
OPEN_MPI = ("gcc -I/usr/lib/x86_64-linux-gnu/openmpi/include -pthread "
            "-L/usr/lib/x86_64-linux-gnu/openmpi/lib -Wl,-rpath,/opt/ompi/lib -lmpi")
INTEL_MPI = ("gcc -I/opt/impi/include -L/opt/impi/lib/release -L/opt/impi/lib -Xlinker "
             "--enable-new-dtags -Xlinker -rpath -Xlinker /opt/impi/lib/release -Xlinker -rpath "
             "-Xlinker /opt/impi/lib -lmpi -lrt -Wl,-z,now")


def parse(show, mpicc="/opt/mpi/bin/mpicc", source="site"):
    return _mpi_find._parse(mpicc, source, shlex.split(show)[1:])


@pytest.mark.parametrize("args, kept, dirs", [
    (["-Wl,-rpath,/a", "-lm"], ["-lm"], ["/a"]),
    (["-Wl,-rpath", "-Wl,/a", "-Wl,--enable-new-dtags"], ["-Wl,--enable-new-dtags"], ["/a"]),
    (["-Wl,-O1,-rpath=/a,--as-needed", "-Wl,--rpath,/b"], ["-Wl,-O1,--as-needed"], ["/a", "/b"]),
    (["-Xlinker", "-rpath", "-Xlinker", "/a", "-Xlinker", "-z"], ["-Xlinker", "-z"], ["/a"]),
    (["gcc", "-shared", "-L/py/lib", "-Wl,-rpath,/py/lib", "-Wl,-R,/c"], ["gcc", "-shared", "-L/py/lib"],
     ["/py/lib", "/c"]),
])
def test_split_rpaths(args, kept, dirs):
    assert _mpi_find.split_rpaths(args) == (kept, dirs)


def test_wrapper_flags_lose_their_rpaths():
    wheel = parse(MPICH_WHEEL, "/P/bin/mpicc", "pypi-mpich")
    assert (wheel.include_dirs, wheel.library_dirs, wheel.libraries) == (["/P/include"], ["/P/lib"], ["mpi"])
    assert wheel.link_args == ["-Wl,--enable-new-dtags"]
    ompi = parse(OPEN_MPI)
    assert ompi.link_args == ["-pthread"]
    assert ompi.rpath_dirs == ["/opt/ompi/lib", "/usr/lib/x86_64-linux-gnu/openmpi/lib"]
    impi = parse(INTEL_MPI)
    assert impi.link_args == ["-Xlinker", "--enable-new-dtags", "-Wl,-z,now"]
    assert impi.libraries == ["mpi", "rt"]
    assert impi.rpath_dirs == ["/opt/impi/lib/release", "/opt/impi/lib"]


def test_site_mpi_gets_its_real_library_folders():
    ompi = parse(OPEN_MPI)
    assert _mpi_find.rpath_args(ompi) == _mpi_find.rpath_args(ompi, "/src/hvlite") == [
        "-Wl,-rpath,/opt/ompi/lib", "-Wl,-rpath,/usr/lib/x86_64-linux-gnu/openmpi/lib"]


def only_origin_paths(args):
    paths = [a[len("-Wl,-rpath,"):] for a in args]
    assert paths and all(a.startswith("-Wl,-rpath,$ORIGIN/") for a in args), args
    return [p[len("$ORIGIN/"):] for p in paths]


def test_wheel_built_in_pips_build_environment():
    """Installed into site-packages: the wheel's lib folder beside it (<prefix>/lib), relative,
    whatever folder the build found the wheel in; built in place (an editable install made with
    build isolation): the lib folder of this Python's environment, where pip installs the
    runtime dependency. Never the build environment itself."""
    wheel = parse(MPICH_WHEEL.replace("/P", "/tmp/pip-build-env-x/overlay"),
                  "/tmp/pip-build-env-x/overlay/bin/mpicc", "pypi-mpich")
    (rel,) = only_origin_paths(_mpi_find.rpath_args(wheel))
    where = {"base": "/venv", "platbase": "/venv"}
    module_dir = os.path.join(sysconfig.get_path("platlib", vars=where), "hvlite")
    assert os.path.normpath(os.path.join(module_dir, rel)) == \
        os.path.join(sysconfig.get_path("data", vars=where), "lib")
    if sysconfig.get_path("platlib", vars=where) == "/venv/lib/python%d.%d/site-packages" % sys.version_info[:2]:
        assert rel == "../../.."
    (rel,) = only_origin_paths(_mpi_find.rpath_args(wheel, "/src/hvlite"))
    assert "pip-build-env" not in rel
    assert os.path.normpath(os.path.join("/src/hvlite", rel)) == \
        os.path.join(os.path.realpath(sysconfig.get_path("data")), "lib")


def test_wheel_of_this_environment_built_in_place():
    prefix = os.path.realpath(sys.prefix)
    wheel = parse(MPICH_WHEEL.replace("/P", prefix), os.path.join(prefix, "bin", "mpicc"), "pypi-mpich")
    assert _mpi_find.wheel_prefix_at_run_time(wheel) == prefix
    (rel,) = only_origin_paths(_mpi_find.rpath_args(wheel, "/src/hvlite"))
    assert os.path.normpath(os.path.join("/src/hvlite", rel)) == os.path.join(prefix, "lib")
