"""The NCCL data plane (csrc/backends/backend_nccl.c and nccl_set.c, its binding
csrc/util/nccl_lib.c), checked on a machine without a GPU.

What a GPU-less machine can show (the GPU runs are tests/test_gpu.py's):
- the plane is built in and first in the registry, and ``--check-build`` says so;
- its declarations are NVIDIA's: both files compile against nccl.h (torch's nvidia-nccl wheel,
  which ``make setup`` installs), where static assertions compare every slot with the header's
  prototype, the constants with the header's, and our config struct with the header's prefix;
- which sets take NCCL: the decision rule and the per-batch rule, called directly (a probe
  compiled with the plane's file and loaded beside the engine);
- a job that never submits a CUDA tensor maps neither NCCL nor CUDA, even though init pointed
  the engine at the wheel's NCCL.
"""
import ctypes
import glob
import os
import subprocess
import sys
import textwrap

import pytest

import hvlite
from hvlite import _nccl_find
from hvlite._lib import lib

from c_check import CSRC, compile_c, cuda_header_dir, load_probe


def nccl_header():
    """nccl.h of an installed nvidia-nccl wheel, else the system's, else None."""
    for wheel in _nccl_find.WHEELS:
        path = _nccl_find.wheel_file(wheel, "nvidia/nccl/include/nccl.h")
        if path:
            return path
    return "/usr/include/nccl.h" if os.path.isfile("/usr/include/nccl.h") else None


def test_plane_is_built_in_and_first():
    # Horovod's nccl_built() is NCCL's version code (its test_torch.py skips alltoall below 2700)
    assert hvlite.nccl_built() == _nccl_find.version_code()
    if _nccl_find.engine_library({}):
        assert hvlite.nccl_built() >= 21400, hvlite.nccl_built()
    assert _nccl_find.version_code({"HVLITE_NCCL_LIB": "/no/such/libnccl.so.2"}) == 0
    names = []
    for index in range(lib.hvl_backend_count()):
        plane = hvlite._lib.ffi.new("hvl_backend_counters *")
        assert lib.hvl_get_backend_counters(index, plane) == 0
        names.append(hvlite._lib.ffi.string(plane.name).decode())
    assert names == ["nccl", "shm", "hierarchical", "mpi"]


def test_plane_declarations_match_nccl_h():
    header, cuda = nccl_header(), cuda_header_dir()
    if header is None or cuda is None:
        pytest.skip("no nccl.h (nvidia-nccl wheel) or no CUDA toolkit headers (nccl.h includes "
                    "cuda_runtime.h) on this machine")
    for plane_file in ("backend_nccl.c", "nccl_set.c"):
        compile_c(["-fsyntax-only", "-I", cuda, "-include", header, os.path.join(CSRC, "backends", plane_file)])
    compile_c(["-fsyntax-only", "-I", cuda, "-include", header, os.path.join(CSRC, "util", "nccl_lib.c")])


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    return load_probe("nccl_plane_probe", tmp_path_factory.mktemp("probe"))


def verdict(probe, members, ranks=None):
    """members: (host, bus, device, ok, why) per member; returns (verdict, why)."""
    n = len(members)
    ranks = ranks or list(range(n))
    strings = lambda values: (ctypes.c_char_p * n)(*[v.encode() for v in values])
    ints = lambda values: (ctypes.c_int * n)(*values)
    why = ctypes.create_string_buffer(400)
    v = probe.probe_verdict(n, ints(ranks), strings([m[0] for m in members]),
                            strings([m[1] for m in members]), ints([m[2] for m in members]),
                            ints([m[3] for m in members]), strings([m[4] for m in members]), why, 400)
    return v, why.value.decode()


def test_each_rank_on_its_own_gpu_takes_nccl(probe):
    assert verdict(probe, [("a", "0000:01:00.0", 0, 1, ""), ("a", "0000:02:00.0", 1, 1, "")])[0] == 1
    # the same bus id on two hosts is two GPUs
    assert verdict(probe, [("a", "0000:01:00.0", 0, 1, ""), ("b", "0000:01:00.0", 0, 1, "")])[0] == 1


def test_ranks_sharing_a_gpu_stay_staged_and_say_why(probe):
    v, why = verdict(probe, [("a", "0000:01:00.0", 0, 1, ""), ("a", "0000:02:00.0", 1, 1, ""),
                             ("a", "0000:01:00.0", 0, 1, "")], ranks=[4, 5, 6])
    assert v == 0
    assert why == ("ranks 4 and 6 share the GPU 0000:01:00.0 on one host (NCCL refuses two ranks on "
                   "one GPU; give each rank its own GPU, or its own NCCL_HOSTID)")


def test_a_member_without_nccl_keeps_the_set_staged(probe):
    v, why = verdict(probe, [("a", "0000:01:00.0", 0, 1, ""),
                             ("b", "", 0, 0, "NCCL could not be loaded from libnccl.so.2 (gone)")],
                     ranks=[0, 3])
    assert (v, why) == (0, "rank 3: NCCL could not be loaded from libnccl.so.2 (gone)")


def test_a_member_without_a_device_leaves_the_set_undecided(probe):
    """A rank that joined before its first CUDA tensor has no device yet: ask again later."""
    assert verdict(probe, [("a", "0000:01:00.0", 0, 1, ""), ("a", "", -1, 0, "")])[0] == -1


def test_nccl_hostid_is_the_host(probe, monkeypatch):
    key = ctypes.create_string_buffer(128)
    monkeypatch.setenv("NCCL_HOSTID", "rank-7")
    probe.probe_host_key(key, 128)
    assert key.value == b"id:rank-7"
    monkeypatch.delenv("NCCL_HOSTID")
    probe.probe_host_key(key, 128)
    assert key.value.decode().startswith(os.uname().nodename + ":")


def can_run(probe, op, dtype, reduce_op=None, pre=1.0, post=1.0, even=1, memory=None, chosen=1, pools=1,
            nranks=2):
    reduce_op = lib.HVL_SUM if reduce_op is None else reduce_op
    memory = lib.HVL_MEMORY_CUDA if memory is None else memory
    return probe.probe_can_run(chosen, pools, op, reduce_op, dtype, memory, ctypes.c_double(pre),
                               ctypes.c_double(post), even, nranks)


def test_which_batches_run_on_nccl(probe):
    all_reduce, f32 = lib.HVL_ALLREDUCE, lib.HVL_FLOAT32
    for dtype in (lib.HVL_UINT8, lib.HVL_INT8, lib.HVL_INT32, lib.HVL_INT64, lib.HVL_FLOAT16,
                  lib.HVL_BFLOAT16, lib.HVL_FLOAT32, lib.HVL_FLOAT64):
        for op in (lib.HVL_SUM, lib.HVL_AVERAGE, lib.HVL_MIN, lib.HVL_MAX, lib.HVL_PRODUCT):
            assert can_run(probe, all_reduce, dtype, op), (dtype, op)
    for dtype in (lib.HVL_UINT16, lib.HVL_INT16, lib.HVL_BOOL):        # NCCL has no such type
        assert not can_run(probe, all_reduce, dtype)
    assert can_run(probe, lib.HVL_BROADCAST, lib.HVL_BOOL)             # bytes: any dtype
    # scale factors fold into a pre-multiplied sum only where the reduction is linear
    assert can_run(probe, all_reduce, f32, lib.HVL_SUM, pre=0.5, post=3.0)
    assert can_run(probe, all_reduce, lib.HVL_BFLOAT16, lib.HVL_AVERAGE, pre=0.5)
    assert not can_run(probe, all_reduce, f32, lib.HVL_MAX, pre=2.0)
    assert not can_run(probe, all_reduce, f32, lib.HVL_PRODUCT, post=2.0)
    assert not can_run(probe, all_reduce, lib.HVL_INT32, lib.HVL_SUM, pre=2.0)
    assert not can_run(probe, all_reduce, f32, lib.HVL_ADASUM)
    # ... and only where the tensors' type holds that multiplier (NCCL multiplies in it): float16
    # between 2^-14 and 65504, so 1e-3 * 1e-3 / 3 ranks (subnormal: 7% off) is staged
    f16, bf16 = lib.HVL_FLOAT16, lib.HVL_BFLOAT16
    assert not can_run(probe, all_reduce, f16, lib.HVL_AVERAGE, pre=1e-3, post=1e-3, nranks=3)
    assert can_run(probe, all_reduce, f16, lib.HVL_AVERAGE, pre=0.1, post=0.1, nranks=3)
    assert can_run(probe, all_reduce, f16, lib.HVL_SUM, pre=1e-4)
    assert not can_run(probe, all_reduce, f16, lib.HVL_SUM, pre=1e-5)
    assert not can_run(probe, all_reduce, f16, lib.HVL_SUM, pre=300.0, post=300.0)
    assert can_run(probe, all_reduce, f16, lib.HVL_AVERAGE, pre=2.0, post=0.5, nranks=4096)  # ncclAvg
    assert can_run(probe, all_reduce, bf16, lib.HVL_SUM, pre=1e-3, post=1e-3)
    assert can_run(probe, all_reduce, f32, lib.HVL_AVERAGE, pre=1e-20, post=1e-15, nranks=3)
    assert not can_run(probe, all_reduce, f32, lib.HVL_SUM, pre=1e-30, post=1e-30)
    assert can_run(probe, all_reduce, lib.HVL_FLOAT64, lib.HVL_SUM, pre=1e-30, post=1e-30)
    assert can_run(probe, lib.HVL_REDUCESCATTER, f32, lib.HVL_SUM, even=1)
    assert not can_run(probe, lib.HVL_REDUCESCATTER, f32, lib.HVL_SUM, even=0)
    # results the engine sizes are allocated on the GPU, stream-ordered: bytes, any dtype, but
    # only where every member's GPU has memory pools
    for op in (lib.HVL_ALLGATHER, lib.HVL_ALLTOALL):
        for dtype in (lib.HVL_BOOL, lib.HVL_INT16, lib.HVL_BFLOAT16, lib.HVL_FLOAT64):
            assert can_run(probe, op, dtype), (op, dtype)
        assert not can_run(probe, op, f32, pools=0)
    assert can_run(probe, all_reduce, f32, pools=0)                   # the others need none
    # host tensors and sets that did not choose NCCL stay off it
    assert not can_run(probe, all_reduce, f32, memory=lib.HVL_MEMORY_HOST)
    assert not can_run(probe, all_reduce, f32, chosen=0)


def load_in_a_process(probe, tmp_path, env):
    """The probe's loader run after init() in a process of its own; its one line of output."""
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent("""
        import ctypes, sys
        import hvlite
        from hvlite import _core
        hvlite.init()
        ctypes.CDLL(_core.__file__, mode=ctypes.RTLD_GLOBAL)
        probe = ctypes.CDLL(sys.argv[1])
        why = ctypes.create_string_buffer(5000)
        print("version", probe.probe_load(why, 5000), why.value.decode())
        hvlite.shutdown()
    """))
    done = subprocess.run([sys.executable, str(script), probe._name], capture_output=True, text=True,
                          timeout=120, cwd=str(tmp_path), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_loader_finds_every_symbol_in_the_wheels_nccl(probe, tmp_path):
    """The plane's dlopen/dlsym of the library init() points it at, in a process of its own (the
    library stays loaded): every symbol the plane calls is there, and the version is read."""
    wheel = _nccl_find.engine_library({})
    if wheel is None:
        pytest.skip("no nvidia-nccl wheel in this Python (make setup installs one)")
    env = {k: v for k, v in os.environ.items() if k != "HVLITE_NCCL_LIB"}
    out = load_in_a_process(probe, tmp_path, env)
    expected = _nccl_find.nccl_version(_nccl_find.NcclLibrary(wheel, "wheel"))
    major, minor, patch = (int(p) for p in expected.split("."))
    assert "version %d " % (major * 10000 + minor * 100 + patch) in out, out


def test_a_library_that_is_not_nccl_is_refused_saying_why(probe, tmp_path):
    libmpi = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmpi.so.*")))
    if not libmpi:
        pytest.skip("no libmpi.so.* in %s/lib (the mpich wheel)" % sys.prefix)
    out = load_in_a_process(probe, tmp_path, dict(os.environ, HVLITE_NCCL_LIB=libmpi[0]))
    assert "version -1 %s has no ncclGetVersion: NCCL 2.14 or later is needed" % libmpi[0] in out


def test_a_cpu_job_loads_neither_nccl_nor_cuda(tmp_path):
    """init() points the engine at the wheel's NCCL, but only a CUDA tensor loads it."""
    wheel = _nccl_find.engine_library({})
    script = tmp_path / "cpu_job.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import numpy as np
        import hvlite as hvd
        hvd.init()
        x = np.arange(1 << 12, dtype=np.float32)
        assert np.array_equal(hvd.allreduce(x, op=hvd.Sum), x * hvd.size())
        assert hvd.broadcast(x, 0).shape == x.shape
        hvd.shutdown()
        maps = open("/proc/self/maps").read()
        loaded = sorted({l.split()[-1] for l in maps.splitlines() if "libnccl" in l or "libcuda" in l})
        assert not loaded, loaded
        print("engine told:", os.environ.get("HVLITE_NCCL_LIB", ""))
    """))
    env = dict(os.environ)
    env.pop("HVLITE_NCCL_LIB", None)
    hvlrun = os.path.join(os.path.dirname(sys.executable), "hvlrun")
    done = subprocess.run([hvlrun, "-np", "2", sys.executable, str(script)], capture_output=True,
                          text=True, timeout=120, cwd=str(tmp_path), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("engine told: %s" % (wheel or "")) == 2, done.stdout
