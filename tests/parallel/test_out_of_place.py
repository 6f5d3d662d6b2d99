"""Out-of-place allreduce, broadcast and reducescatter through engine memory (hvlite.buffers),
NumPy and torch, every dtype, checked on every rank against a NumPy reference: large results
(from 4 MiB) must be huge-page engine buffers (2 MiB-aligned); with the crossover lowered to
0 every shape (0-d, 0-element, ...) goes through engine memory too; a steady loop reuses its
buffers. SPMD: run by hvlrun (tests/test_spmd.py)."""
import math

import numpy as np
import pytest
import torch

import hvlite as hvd
import hvlite.torch as th
from hvlite import buffers
from reference import DTYPES, SHAPES, assert_equal, inputs, reduce

RANK, SIZE = hvd.rank(), hvd.size()
HUGE_MIN = buffers.HUGE_MIN     # engine buffers from 4 MiB are 2 MiB-aligned: recognisable
HUGE_PAGE = 2 << 20
TORCH = {d: getattr(torch, d.name) for d in DTYPES}     # the same names, bfloat16 included
torch.set_num_threads(1)


def everyone(seed, dtype, shape):
    return [inputs(seed, r, dtype, shape) for r in range(SIZE)]


def large_shape(dtype):
    """Every rank's reducescatter part just over the crossover; dim 0 splits unevenly."""
    return (SIZE * (HUGE_MIN // dtype.itemsize // 4) + 1, 4)


def all_ops(dtype):
    return ["Sum", "Min", "Max", "Product"] + ([] if dtype == np.bool_ else ["Average"])


class NumpyApi:
    module = hvd

    @staticmethod
    def tensor(array, dtype):
        return array

    @staticmethod
    def values(result, dtype):
        return result

    @staticmethod
    def memory(result):
        return result.ctypes.data, result.nbytes


class TorchApi:
    module = th

    @staticmethod
    def tensor(array, dtype):
        """A torch tensor with ``array``'s values (small integers: exact in every dtype)."""
        wide = array.astype(np.bool_ if dtype == np.bool_ else np.int64)
        return torch.from_numpy(np.array(wide, order="C")).to(TORCH[dtype])   # 0-d stays 0-d

    @staticmethod
    def values(result, dtype):
        """The NumPy array of a torch result, in ``dtype`` (via float64/int64: exact here)."""
        if result.dtype == torch.bool:
            return result.numpy()
        wide = result.to(torch.float64 if result.dtype.is_floating_point else torch.int64)
        return wide.numpy().astype(dtype)

    @staticmethod
    def memory(result):
        return result.data_ptr(), result.numel() * result.element_size()


BLOCK = 1 << 18     # elements compared at once


def check_blocks(api, got, expected_of, what, dtype, exact=True):
    """``got`` against ``expected_of(rows)`` a block of rows at a time: a float64 reference of
    a 12 MiB int8 result over 3 ranks would take 300 MB per rank."""
    if not got.shape:
        assert_equal(api.values(got, dtype), expected_of(Ellipsis), what, dtype, exact)
        return
    step = max(1, BLOCK // max(1, math.prod(got.shape[1:])))
    for start in range(0, max(1, got.shape[0]), step):
        rows = slice(start, min(start + step, got.shape[0]))
        assert_equal(api.values(got[rows], dtype), expected_of(rows), what, dtype, exact)


def run(api, dtype, shape, seed, check_memory, opnames, roots):
    """Out-of-place allreduce and reducescatter with each op, broadcast from each root."""
    xs = everyone(seed, dtype, shape)
    mine = api.tensor(xs[RANK], dtype)
    counts = [shape[0] // SIZE + (1 if r < shape[0] % SIZE else 0) for r in range(SIZE)] if shape else []
    first = sum(counts[:RANK])
    for opname in opnames:
        op = getattr(api.module, opname)
        what = "%s %s %s %s" % (api.__name__, opname, dtype, shape)
        got = api.module.allreduce(mine, op=op)
        check_memory(*api.memory(got))
        check_blocks(api, got, lambda rows: reduce(np.stack([x[rows] for x in xs]), opname, dtype, SIZE),
                     "allreduce " + what, dtype, exact=opname != "Average")
        if shape:
            got = api.module.reducescatter(mine, op=op)
            check_memory(*api.memory(got))
            assert got.shape[0] == counts[RANK]
            check_blocks(api, got, lambda rows: reduce(np.stack(
                [x[first + rows.start:first + rows.stop] for x in xs]), opname, dtype, SIZE),
                "reducescatter " + what, dtype, exact=opname != "Average")
    for root in roots:
        got = api.module.broadcast(mine, root)
        check_memory(*api.memory(got))
        check_blocks(api, got, lambda rows: xs[root][rows],
                     "broadcast root %d %s %s %s" % (root, api.__name__, dtype, shape), dtype)
    assert_equal(xs[RANK], inputs(seed, RANK, dtype, shape), "inputs untouched")


def huge_page_buffer(address, nbytes):
    assert nbytes >= HUGE_MIN and address % HUGE_PAGE == 0, \
        "a %d-byte result is not an engine buffer" % nbytes


def engine_buffer(address, nbytes):
    assert address % buffers.ALIGNMENT == 0 or nbytes == 0, "result not 64-byte aligned"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_large_results_are_engine_buffers_numpy(dtype):
    run(NumpyApi, dtype, large_shape(dtype), 21, huge_page_buffer, ["Sum"], [SIZE - 1])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_large_results_are_engine_buffers_torch(dtype):
    run(TorchApi, dtype, large_shape(dtype), 22, huge_page_buffer, ["Sum"], [SIZE - 1])


@pytest.fixture
def engine_memory_at_every_size(monkeypatch):
    monkeypatch.setattr(buffers, "ENGINE_MEMORY_MIN", 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_shape_through_engine_memory_numpy(dtype, engine_memory_at_every_size):
    for i, shape in enumerate(SHAPES):
        run(NumpyApi, dtype, shape, 30 + i, engine_buffer, all_ops(dtype), range(SIZE))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_shape_through_engine_memory_torch(dtype, engine_memory_at_every_size):
    for i, shape in enumerate(SHAPES):
        run(TorchApi, dtype, shape, 40 + i, engine_buffer, all_ops(dtype), range(SIZE))


def test_a_steady_loop_reuses_its_buffers():
    """Out-of-place calls in a loop take their results from the engine's cache: once warm, the
    results cycle through the same few buffers instead of new memory every call."""
    x = np.ones(3 * HUGE_MIN // 4, np.float32)     # 12 MiB
    t = torch.ones(2 * HUGE_MIN // 4)               # 8 MiB: another size, so its own buffers
    seen_np, seen_torch, out, tout = set(), set(), None, None
    for step in range(8):
        out = hvd.allreduce(x, op=hvd.Sum, name="steady.np")
        tout = th.allreduce(t, op=th.Sum, name="steady.torch")
        if step >= 2:
            seen_np.add(out.ctypes.data)
            seen_torch.add(tout.data_ptr())
        assert out[0] == SIZE and out[-1] == SIZE and float(tout[-1]) == SIZE
    assert len(seen_np) <= 2 and len(seen_torch) <= 2, (seen_np, seen_torch)

