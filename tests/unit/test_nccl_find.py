"""Which NCCL the GPU plane would load (hvlite/_nccl_find.py): HVLITE_NCCL_LIB (or Horovod's
HOROVOD_NCCL_LIB / HOROVOD_NCCL_HOME, the library or its folder), then torch's
nvidia-nccl wheel through its metadata, then the system's; what cannot be used is said plainly.
The wheel case runs where a wheel is installed (torch's CUDA builds bring one: the GPU machine);
here, `pip install --target DIR nvidia-nccl-cu13` and PYTHONPATH=DIR runs it too."""
import glob
import os
import sys
from importlib.metadata import PackageNotFoundError, distribution

import pytest

from hvlite import _nccl_find
from hvlite.runner.cli import build_info


def _installed_wheel():
    for name in _nccl_find.WHEELS:
        try:
            distribution(name)
            return name
        except PackageNotFoundError:
            pass
    return None


def _not_nccl():
    """A real shared library that is not NCCL: the mpich wheel's libmpi."""
    found = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmpi.so.*")))
    if not found:
        pytest.skip("no libmpi.so.* in %s/lib (the mpich wheel)" % sys.prefix)
    return found[0]


def test_version_codes():
    assert _nccl_find.format_version(23203) == "2.32.3"      # since 2.9: X*10000 + Y*100 + Z
    assert _nccl_find.format_version(21805) == "2.18.5"
    assert _nccl_find.format_version(2804) == "2.8.4"        # before: X*1000 + Y*100 + Z


def test_setting_that_names_no_file_is_an_error():
    with pytest.raises(_nccl_find.NcclNotFound, match="HVLITE_NCCL_LIB=/no/libnccl.so.2: no libnccl.so.2 there"):
        _nccl_find.find_nccl({"HVLITE_NCCL_LIB": "/no/libnccl.so.2"})


def test_horovods_variables_name_the_folder_or_the_library(tmp_path):
    """Horovod's HOROVOD_NCCL_LIB is NCCL's folder (HOROVOD_NCCL_HOME its prefix): the library
    in it is what the engine loads, also when hvlite's own variable is unset."""
    (tmp_path / "lib").mkdir()
    library = tmp_path / "lib" / "libnccl.so.2"
    library.write_bytes(b"")
    for variable, value in (("HOROVOD_NCCL_LIB", tmp_path / "lib"), ("HOROVOD_NCCL_LIB", library),
                            ("HOROVOD_NCCL_HOME", tmp_path), ("HVLITE_NCCL_LIB", tmp_path / "lib")):
        environ = {variable: str(value)}
        found = _nccl_find.find_nccl(environ)
        assert (found.path, found.source) == (str(library), variable), (variable, value)
        assert _nccl_find.engine_library(environ) == str(library), (variable, value)
    # hvlite's own variable wins over Horovod's
    assert _nccl_find.find_nccl({"HVLITE_NCCL_LIB": str(library),
                                 "HOROVOD_NCCL_LIB": "/elsewhere"}).source == "HVLITE_NCCL_LIB"
    with pytest.raises(_nccl_find.NcclNotFound, match="HOROVOD_NCCL_HOME=/no: no libnccl.so.2 there"):
        _nccl_find.find_nccl({"HOROVOD_NCCL_HOME": "/no"})
    # a folder of Horovod's without NCCL is never handed to the engine as a library
    fallback = _nccl_find.engine_library({"HOROVOD_NCCL_LIB": str(tmp_path)})
    assert fallback == (_nccl_find._from_wheel()[0] or "libnccl.so.2")


def test_setting_comes_first_and_a_library_without_nccl_is_refused():
    other = _not_nccl()
    found = _nccl_find.find_nccl({"HVLITE_NCCL_LIB": other})
    assert (found.path, found.source) == (other, "HVLITE_NCCL_LIB")
    with pytest.raises(_nccl_find.NcclNotFound, match="is not NCCL: it has no ncclGetVersion"):
        _nccl_find.nccl_version(found)


def test_nothing_found_says_what_was_tried():
    found = _nccl_find.find_nccl({})
    if found.path:
        pytest.skip("this Python has an NCCL (%s): nothing to miss" % found.source)
    assert found.tried[0] == "HVLITE_NCCL_LIB/HOROVOD_NCCL_LIB/HOROVOD_NCCL_HOME (unset)"
    assert "wheels" in found.tried[1]
    report = build_info.check_build_report(None, None, "not found", {}, {"nccl_lib": {
        "path": None, "source": "", "tried": found.tried}})
    assert "NCCL library: none found (tried HVLITE_NCCL_LIB/HOROVOD_NCCL_LIB/HOROVOD_NCCL_HOME " \
        "(unset); the nvidia-nccl" in report


@pytest.mark.skipif(_installed_wheel() is None,
                    reason="no nvidia-nccl wheel in this Python (torch's CUDA builds install one)")
def test_torchs_wheel_is_found_through_its_metadata():
    found = _nccl_find.find_nccl({})
    assert found.source == _installed_wheel()
    assert os.path.isabs(found.path) and found.path.endswith("/libnccl.so.2")
    version = _nccl_find.nccl_version(found)
    assert version.startswith("2."), version
    engine = build_info.ask_engine()      # --check-build's child finds and loads the same
    assert engine["nccl_lib"]["path"] == found.path
    assert engine["nccl_lib"]["version"] == version
