"""Single-process tests of the engine through the Python layer (a one-rank MPI job): argument
checks, name generation, one-rank semantics of every collective, and the float16/bfloat16
conversion kernels over every 16-bit pattern (via scale factors) against NumPy/ml_dtypes."""
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import hvlite as hvd
from hvlite import dtypes
from hvlite.handles import auto_name

ROOT = __file__.rsplit("/tests/", 1)[0]


@pytest.fixture(scope="module", autouse=True)
def engine():
    hvd.init()
    yield
    c = hvd.engine_counters()
    assert c["tensors_submitted"] == c["tensors_done"]


def test_dtype_mapping():
    assert dtypes.to_engine(np.float32) == hvd._lib.lib.HVL_FLOAT32
    assert dtypes.to_engine(ml_dtypes.bfloat16) == hvd._lib.lib.HVL_BFLOAT16
    for bad in (np.complex64, np.uint32, np.uint64, object):
        with pytest.raises(TypeError, match="does not support dtype"):
            dtypes.to_engine(bad)


def test_auto_names_count_per_kind():
    a, b = auto_name("unit"), auto_name("unit")
    assert a.startswith("unit.noname.") and int(b.rsplit(".", 1)[1]) == int(a.rsplit(".", 1)[1]) + 1


def test_one_rank_semantics():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert hvd.size() == 1 and hvd.rank() == 0
    assert np.array_equal(hvd.allreduce(x), x)
    assert np.array_equal(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5), x)
    assert np.array_equal(hvd.allgather(x), x)
    assert np.array_equal(hvd.broadcast(x, 0), x)
    out, recv = hvd.alltoall(x, splits=[3])
    assert np.array_equal(out, x) and list(recv) == [3]
    assert np.array_equal(hvd.reducescatter(x, op=hvd.Sum), x)
    assert np.array_equal(hvd.allreduce(np.array([7, -7, 5], np.int32), op=hvd.Average), [7, -7, 5])
    hvd.barrier()


def test_gathered_results_own_the_engines_memory():
    """allgather/alltoall hand the engine's result buffer to the array (no copy): the array is
    writable, outlives its handle, and a taken result cannot be taken again."""
    import gc
    from hvlite._lib import ffi, lib
    from hvlite.handles import NULL, address, result_buffer, submit
    x = np.arange(6, dtype=np.float64).reshape(3, 2)
    outs = [hvd.allgather(x, name="own.%d" % i) for i in range(3)] + [hvd.alltoall(x, name="own.a2a")]
    gc.collect()
    for out in outs:
        assert out.flags.writeable and out.flags.c_contiguous
        np.testing.assert_array_equal(out, x)
        out += 1
        np.testing.assert_array_equal(out, x + 1)
    empty = hvd.allgather(np.zeros((0, 4), np.int8), name="own.empty")
    assert empty.shape == (0, 4) and empty.dtype == np.int8

    def finish(h):
        shape, owner, count = result_buffer(h)
        assert shape == (3, 2) and count == 6
        assert lib.hvl_result_take(h._id, ffi.new("void **")) == lib.HVL_ERR_INVALID_ARG
        return ffi.string(lib.hvl_last_error()).decode()
    h = submit(lib.HVL_ALLGATHER, "own.twice", dtypes.to_engine(x.dtype), x.shape, address(x),
               NULL, (x,), finish)
    assert "has no result to take" in h.wait()


@pytest.mark.parametrize("busy", [0, 1])
def test_a_failed_handle_keeps_its_buffers_exactly_when_the_engine_says_they_are_busy(monkeypatch, busy):
    """After an error, the engine says whether work it gave up on may still touch the buffers
    (hvl_buffers_busy): kept for good then, let go otherwise. The engine's answer is set here
    (an error of a batch stopped on the GPU needs a GPU); the handle's own wait is real."""
    from hvlite import handles
    from hvlite._lib import lib
    from hvlite.handles import address, submit

    class Answers:             # the engine's lib, but this handle "failed" and is as busy as said
        def __getattr__(self, name):
            return getattr(lib, name)

        def hvl_wait(self, hid, timeout):
            rc = lib.hvl_wait(hid, timeout)
            return lib.HVL_ERR_SHUT_DOWN if rc == lib.HVL_OK else rc

        def hvl_buffers_busy(self, hid, out):
            assert lib.hvl_buffers_busy(hid, out) == lib.HVL_OK and out[0] == 0   # it succeeded
            out[0] = busy
            return lib.HVL_OK
    x = np.ones(4, np.float32)
    kept = len(handles._stranded)
    monkeypatch.setattr(handles, "lib", Answers())
    h = submit(lib.HVL_ALLREDUCE, "busy.%d" % busy, dtypes.to_engine(x.dtype), x.shape, address(x),
               address(x), (x,), None)
    with pytest.raises(hvd.HvliteError):
        h.wait()
    assert len(handles._stranded) == kept + busy
    if busy:
        assert handles._stranded[-1] == (x,)


def test_reducescatter_rows_split():
    lib = hvd._lib.lib
    assert [lib.hvl_reducescatter_rows(7, r, 3) for r in range(3)] == [3, 2, 2]
    assert [lib.hvl_reducescatter_rows(2, r, 3) for r in range(3)] == [1, 1, 0]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("factor", [0.5, 3.0, 1e-3])
def test_half_kernels_round_like_numpy(dtype, factor):
    """Every 16-bit pattern, scaled in float32 and rounded back, as NumPy/ml_dtypes do."""
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(dtype)
    got = hvd.allreduce(x, op=hvd.Sum, postscale_factor=factor)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = (x.astype(np.float32) * np.float32(factor)).astype(dtype)
    g, e = got.astype(np.float32), expected.astype(np.float32)
    same = (g == e) | (np.isnan(g) & np.isnan(e))
    assert same.all(), "first differences: %r vs %r" % (got[~same][:5], expected[~same][:5])


def run_py(code, env=None):
    import os
    full_env = dict(os.environ, PYTHONPATH=ROOT, **(env or {}))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=full_env, cwd=ROOT)


def test_queries_before_init_raise():
    r = run_py("import hvlite\ntry:\n    hvlite.rank()\nexcept ValueError as e:\n    print('VE', e)")
    assert "VE hvlite has not been initialized" in r.stdout, r.stderr


def test_collective_before_init_and_after_shutdown():
    code = """
import numpy as np, hvlite
try:
    hvlite.allreduce(np.ones(2))
except ValueError as e:      # HvliteNotInitializedError, a ValueError as in Horovod
    assert isinstance(e, hvlite.HvliteNotInitializedError)
    print('before:', e)
hvlite.init(); hvlite.init()   # idempotent
hvlite.shutdown()
try:
    hvlite.allreduce(np.ones(2))
except hvlite.HvliteShutdownError as e:
    print('after:', e)
try:
    hvlite.init()
except hvlite.HvliteError as e:
    print('reinit:', e)
"""
    r = run_py(code)
    assert "before: hvlite is not initialized" in r.stdout, r.stdout + r.stderr
    assert "after: hvlite has been shut down" in r.stdout, r.stdout + r.stderr
    assert "reinit:" in r.stdout and "finalized" in r.stdout, r.stdout + r.stderr


def test_unknown_setting_warns_and_horovod_alias_is_read():
    r = run_py("import hvlite; hvlite.init(); hvlite.shutdown()",
               env={"HVLITE_FUSION_TRESHOLD": "1", "HOROVOD_LOG_LEVEL": "debug"})
    assert "unknown setting HVLITE_FUSION_TRESHOLD" in r.stderr, r.stderr
    assert "settings: fusion_threshold=134217728" in r.stderr, r.stderr   # debug via the alias


def test_the_gpu_defaults_are_the_paths_that_ran_on_a_gpu():
    """What has not run on a GPU is one switch away, off by default and marked experimental in
    the settings table: holding CUDA tensors until written, NCCL batches left running, staged
    pieces."""
    r = run_py("import hvlite; hvlite.init(); hvlite.shutdown()", env={"HVLITE_LOG_LEVEL": "trace"})
    for name, default in (("GPU_READY_ONLY", "0"), ("NCCL_OVERLAP", "0"), ("STAGED_PIECE", "0")):
        line = "HVLITE_%s (default %s): experimental (not yet run on a GPU)" % (name, default)
        assert line in r.stderr, (name, r.stderr[-3000:])


def test_init_rejects_a_comm_that_is_neither_ranks_nor_a_communicator():
    with pytest.raises(ValueError, match="comm"):
        hvd.init(comm=object())


def test_init_on_a_list_of_one_rank_and_on_mpi4py_comm_self():
    code = """
import numpy as np, hvlite
for bad in ([1], [0, 0]):
    try:
        hvlite.init(comm=bad)
    except ValueError as e:
        print('bad:', e)
hvlite.init(comm=[0])
print('ranks:', hvlite.rank(), hvlite.size(), hvlite.allreduce(np.arange(3.0), op=hvlite.Sum))
hvlite.shutdown()
"""
    r = run_py(code)
    assert "bad: hvlite init failed: init(comm=[1]): 1 is not a rank of MPI_COMM_WORLD (it has 1 rank)" \
        in r.stdout, r.stdout + r.stderr
    assert "bad: hvlite init failed: init(comm=[0, 0]): rank 0 is listed twice" in r.stdout, r.stdout + r.stderr
    assert "ranks: 0 1 [0. 1. 2.]" in r.stdout, r.stdout + r.stderr
    r = run_py("from mpi4py import MPI\nimport hvlite\nhvlite.init(comm=MPI.COMM_SELF)\n"
               "print('self:', hvlite.rank(), hvlite.size(), hvlite.global_process_set.mpi_comm == MPI.COMM_SELF)\n"
               "hvlite.shutdown()")
    assert "self: 0 1 True" in r.stdout, r.stdout + r.stderr


def test_init_twice_with_other_settings_raises():
    code = """
import os, hvlite
hvlite.init(); hvlite.init()                       # same settings: a no-op
os.environ['HVLITE_CYCLE_TIME'] = '5'
try:
    hvlite.init()
except ValueError as e:
    print('env:', e)
del os.environ['HVLITE_CYCLE_TIME']
try:
    hvlite.init(process_sets=[hvlite.ProcessSet([0])])
except ValueError as e:
    print('sets:', e)
hvlite.init(process_sets='dynamic')                # asks for nothing new
print('size', hvlite.global_process_set.size(), hvlite.global_process_set.rank())
"""
    r = run_py(code)
    assert "env: hvlite.init() was called again with different settings: HVLITE_CYCLE_TIME changed" in r.stdout, \
        r.stdout + r.stderr
    assert "sets: hvlite.init() was called again with process_sets=[[0]]" in r.stdout, r.stdout + r.stderr
    assert "size 1 0" in r.stdout, r.stdout + r.stderr
