"""The shared-memory data plane and hierarchical allreduce, against NumPy and against the MPI
backend. SPMD: run by tests/test_shm.py under hvlrun -np 2, 3 and 4.

The engine restarts with each configuration of CONFIGS, in order (mpi4py owns MPI, so it can):
the shm backend with its default chunk (1 MiB, or 4 MiB with more ranks than cores); with a
20 KiB chunk, so the same tensors cross many steps of both reduce paths (two-phase chunks above 16 KiB, one-phase below); the MPI
backend (HVLITE_SHM_DISABLE=1); hierarchical allreduce over 2 fake hosts. In each, every op x
dtype x shape (0-d, 0-element, odd counts, tensors larger than a chunk, fused batches) is checked
on every rank against NumPy, the engine's counters prove which backend ran, and the results are
compared with the shm configuration's on the same inputs: integers (sums and products that
wrap included) bit for bit, floats within the bound of a different reduction order.
"""
import os
import zlib

import numpy as np
import pytest
from mpi4py import MPI

import hvlite as hvd
from reference import BFLOAT16, DTYPES, assert_equal, reduce

OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max, "Product": hvd.Product}
RANK, SIZE = hvd.rank(), hvd.size()
SETTINGS = ("HVLITE_SHM_CHUNK", "HVLITE_SHM_DISABLE", "HVLITE_TEST_FAKE_HOSTS",
            "HVLITE_HIERARCHICAL_ALLREDUCE")
CONFIGS = {
    "shm": {},
    "shm-20k": {"HVLITE_SHM_CHUNK": "20480"},
    "mpi": {"HVLITE_SHM_DISABLE": "1"},
    "hier": {"HVLITE_TEST_FAKE_HOSTS": "2", "HVLITE_HIERARCHICAL_ALLREDUCE": "1",
             "HVLITE_SHM_CHUNK": "20480"},
}
MIB = 1 << 20
ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24, "float64": 2.0 ** -53}
# At 2 ranks the shm backend hands broadcasts of 1 MiB or more to MPI (measured faster there,
# csrc/backends/backend_shm.c); check_data_movement makes one such broadcast per root.
BIG_BROADCASTS_ON_MPI = SIZE if SIZE == 2 else 0
RESULTS = {}          # (config, dtype name) -> {case: (result, float rounding magnitude or None)}
_running = ["shm"]    # the configuration the engine runs now (conftest started it plainly)


def use(config):
    """Restart the engine with CONFIGS[config] unless it already runs with it."""
    if _running[0] == config:
        return
    # every rank gets here first: the first rank to shut down stops the engine of all, which
    # would fail a rank still importing this file (the first test selected may switch)
    MPI.COMM_WORLD.Barrier()
    hvd.shutdown()
    for key in SETTINGS:
        os.environ.pop(key, None)
    os.environ.update(CONFIGS[config])
    MPI.COMM_WORLD.Barrier()
    hvd.init()
    _running[0] = config


def is_float(dtype):
    return dtype.kind == "f" or dtype == BFLOAT16


def small(seed, rank, dtype, shape):
    """Small integers (exact in every dtype and reduction order), cheap for large shapes."""
    n = int(np.prod(shape))
    k = (np.arange(n, dtype=np.int64) * (2 * rank + 3) + seed * 7 + rank) % 7
    if dtype == np.bool_:
        k = k % 2
    elif dtype.kind == "u":
        k = k % 4
    else:
        k = k - 3
    return k.astype(dtype).reshape(shape)


def random(seed, rank, dtype, shape):
    """Full-range integers (sums and products wrap), floats of magnitude 0.5..2 of either sign."""
    rng = np.random.default_rng([seed, rank, zlib.crc32(dtype.name.encode())])
    if dtype == np.bool_:
        values = rng.integers(0, 2, size=shape)
    elif not is_float(dtype):
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)
    else:
        values = rng.uniform(0.5, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    return np.asarray(values).astype(dtype)


def wrapped(stack, opname, dtype):
    """NumPy reduction in the dtype itself: integer sums and products wrap, as MPI's do."""
    if dtype == np.bool_:
        return np.all(stack, axis=0) if opname in ("Min", "Product") else np.any(stack, axis=0)
    return {"Sum": lambda: stack.sum(axis=0, dtype=dtype), "Product": lambda: stack.prod(axis=0, dtype=dtype),
            "Min": lambda: stack.min(axis=0), "Max": lambda: stack.max(axis=0)}[opname]()


def assert_close(got, ref, magnitude, dtype, what, slack=2.0):
    """|got - ref| within `slack` times the rounding bound of SIZE + 1 roundings of `magnitude`."""
    assert got.shape == ref.shape and got.dtype == dtype, "%s: %s %s" % (what, got.shape, got.dtype)
    bound = slack * (SIZE + 1) * ROUNDOFF[dtype.name] * magnitude + 1e-300
    err = np.abs(got.astype(np.float64) - np.asarray(ref, dtype=np.float64))
    assert (err <= bound).all(), "%s: off by %g (bound %g)" % (what, err.max(), np.max(bound))


def big(dtype, per_row=1):
    """Rows of `per_row` elements making just over 1 MiB (the default chunk), an odd count."""
    return MIB // (per_row * dtype.itemsize) + 4099


def check_allreduce(dtype, got):
    ops = [o for o in OPS if not (dtype == np.bool_ and o == "Average")]
    for shape in [(), (0,), (1,), (7,), (33, 5), (2, 0, 3), (12345,), (big(dtype),)]:
        xs = [small(1, r, dtype, shape) for r in range(SIZE)]
        stack = np.stack(xs)
        for opname in ops:
            out = hvd.allreduce(xs[RANK], op=OPS[opname], name="ar.%s.%s" % (opname, shape))
            assert_equal(out, reduce(stack, opname, dtype, SIZE), "allreduce %s %s %s"
                         % (opname, dtype, shape), dtype, exact=opname != "Average")
            got["small", opname, shape] = out, None
    randoms = [random(2, r, dtype, (big(dtype),)) for r in range(SIZE)]
    for opname in ["Sum", "Min", "Max"] + ([] if dtype == np.bool_ else ["Product"]):
        xs = [np.abs(x) for x in randoms] if opname == "Product" and is_float(dtype) else randoms
        out = hvd.allreduce(xs[RANK], op=OPS[opname], name="rand.%s" % opname)
        what = "allreduce %s of random %s" % (opname, dtype)
        magnitude = None
        if is_float(dtype) and opname in ("Sum", "Product"):
            wide = np.stack(xs).astype(np.float64)
            ref = wide.sum(axis=0) if opname == "Sum" else wide.prod(axis=0)
            magnitude = np.abs(wide).sum(axis=0) if opname == "Sum" else np.abs(ref)
            assert_close(out, ref, magnitude, dtype, what)
        else:
            assert_equal(out, wrapped(np.stack(xs), opname, dtype), what)
        got["random", opname] = out, magnitude


def check_fused(dtype, got):
    """Tensors submitted together share one collective; each keeps its own result."""
    shapes = [(5,), (0,), (3, 7), (big(dtype) // 3,), (), (1001,)]
    xs = [[random(3 + i, r, dtype, s) for r in range(SIZE)] for i, s in enumerate(shapes)]
    if is_float(dtype):
        outs = hvd.grouped_allreduce([x[RANK] for x in xs], op=hvd.Average, prescale_factor=0.5,
                                     postscale_factor=3.0, name="fused")
        for i, s in enumerate(shapes):
            wide = np.stack(xs[i]).astype(np.float64)
            magnitude = np.abs(wide).sum(axis=0) * 1.5 / SIZE
            assert_close(outs[i], wide.sum(axis=0) * 1.5 / SIZE, magnitude, dtype,
                         "fused average %s %s" % (dtype, s), slack=4.0)
            got["fused", i] = outs[i], magnitude
    else:
        outs = hvd.grouped_allreduce([x[RANK] for x in xs], op=hvd.Max if dtype == np.bool_ else hvd.Sum,
                                     name="fused")
        for i, s in enumerate(shapes):
            expected = wrapped(np.stack(xs[i]), "Max" if dtype == np.bool_ else "Sum", dtype)
            assert_equal(outs[i], expected, "fused %s %s" % (dtype, s))
            got["fused", i] = outs[i], None


def check_data_movement(dtype, got):
    """allgather, broadcast, alltoall: every byte where it belongs, small and over a chunk."""
    for trailing, rows in [((3,), 1), ((), 0), ((7,), big(dtype, 7))]:
        xs = [small(4, r, dtype, (rows + (r + 1) % 3,) + trailing) for r in range(SIZE)]
        out = hvd.allgather(xs[RANK], name="ag.%s" % (trailing,))
        assert_equal(out, np.concatenate(xs), "allgather %s rows %d" % (dtype, rows))
        got["allgather", trailing] = out, None
    for root in range(SIZE):
        for shape in [(), (7,), (big(dtype),)]:
            xs = [small(5 + root, r, dtype, shape) for r in range(SIZE)]
            out = hvd.broadcast(xs[RANK], root, name="bc.%d.%s" % (root, shape))
            assert_equal(out, xs[root], "broadcast root %d %s %s" % (root, dtype, shape))
    for base in (0, big(dtype, 5 * SIZE)):
        def splits_of(r):
            return [base + (r + d) % 3 for d in range(SIZE)]
        xs = [small(6, r, dtype, (sum(splits_of(r)), 5)) for r in range(SIZE)]
        pieces = []
        for src in range(SIZE):
            offsets = np.concatenate([[0], np.cumsum(splits_of(src))])
            pieces.append(xs[src][offsets[RANK]:offsets[RANK + 1]])
        out, recv = hvd.alltoall(xs[RANK], splits=splits_of(RANK), name="a2a.%d" % base)
        assert_equal(out, np.concatenate(pieces), "alltoall %s base %d" % (dtype, base))
        assert list(recv) == [splits_of(src)[RANK] for src in range(SIZE)]
        got["alltoall", base] = out, None


def check_reducescatter(dtype, got):
    ops = [o for o in OPS if not (dtype == np.bool_ and o == "Average")]
    for rows in (2 * SIZE + 1, SIZE, 1, 0, big(dtype, 3) + SIZE + 1):
        for opname in ops if rows < 100 else ["Sum", "Max"]:
            xs = [small(7, r, dtype, (rows, 3)) for r in range(SIZE)]
            full = reduce(np.stack(xs), opname, dtype, SIZE)
            counts = [rows // SIZE + (1 if r < rows % SIZE else 0) for r in range(SIZE)]
            start = sum(counts[:RANK])
            out = hvd.reducescatter(xs[RANK], op=OPS[opname], name="rs.%s.%d" % (opname, rows))
            assert_equal(out, full[start:start + counts[RANK]], "reducescatter %s %s rows %d"
                         % (opname, dtype, rows), dtype, exact=opname != "Average")
            got["reducescatter", opname, rows] = out, None


def run_checks(config, dtype):
    """Every check above in configuration `config` on `dtype`, and that the expected backend ran
    them; returns (and keeps in RESULTS) the results by case."""
    use(config)
    before = hvd.engine_counters()
    got = {}
    check_allreduce(dtype, got)
    check_fused(dtype, got)
    check_data_movement(dtype, got)
    check_reducescatter(dtype, got)
    ran = {k: v - before[k] for k, v in hvd.engine_counters().items()}
    if config.startswith("shm"):
        assert ran["shm_collectives"] == ran["collectives"] - BIG_BROADCASTS_ON_MPI > 0, ran
    elif config == "mpi":
        assert ran["shm_collectives"] == 0 and ran["hierarchical_collectives"] == 0, ran
    else:
        assert ran["shm_collectives"] == 0 and ran["hierarchical_collectives"] > 0, ran
    RESULTS[config, dtype.name] = got
    return got


def compare_with_shm(config, dtype, got):
    """The same inputs through the shm backend gave the same results: bit for bit, except float
    reductions of random values, which may differ by the rounding of another order. The shm
    results are those of its own test when that ran earlier in the session (the usual order),
    else they are made now (a test selected alone), so the comparison is always made."""
    base = RESULTS.get(("shm", dtype.name)) or run_checks("shm", dtype)
    assert base.keys() == got.keys()
    for case, (ours, magnitude) in got.items():
        what = "%s vs shm: %s %s" % (config, dtype, case)
        if magnitude is None:
            assert_equal(ours, base[case][0], what)
        else:
            assert_close(ours, base[case][0], magnitude, dtype, what, slack=4.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_backend(config, dtype):
    got = run_checks(config, dtype)
    if config != "shm":
        compare_with_shm(config, dtype, got)


def test_hierarchical_topology_and_one_collective_each():
    """Two fake hosts: ranks split in halves; one allreduce is one hierarchical collective."""
    use("hier")
    hosts = [r * 2 // SIZE for r in range(SIZE)]   # consecutive halves (engine.c)
    local_ranks = [hosts[:r].count(hosts[r]) for r in range(SIZE)]
    assert hvd.local_size() == hosts.count(hosts[RANK]) and hvd.local_rank() == local_ranks[RANK]
    assert hvd.cross_size() == local_ranks.count(local_ranks[RANK])   # hosts with that local rank
    assert hvd.cross_rank() == hosts[RANK]
    before = hvd.engine_counters()["hierarchical_collectives"]
    out = hvd.allreduce(np.full(100003, RANK + 1, np.int64), op=hvd.Sum, name="hier.one")
    assert (out == SIZE * (SIZE + 1) // 2).all()
    assert hvd.engine_counters()["hierarchical_collectives"] == before + 1


def test_no_segment_file_while_running():
    """The segment is unlinked as soon as every rank has mapped it: nothing to leak."""
    use("shm")
    leader = MPI.COMM_WORLD.bcast(os.getpid(), root=0)
    names = [n for n in os.listdir("/dev/shm") if n.startswith("hvlite-%d-%d-" % (os.getuid(), leader))]
    assert names == [], names
    assert (hvd.allreduce(np.ones(10), op=hvd.Sum, name="alive") == SIZE).all()


def test_topology_of_two_fake_hosts():
    """HVLITE_TEST_FAKE_HOSTS=2 puts rank r on host r * 2 // size: local and cross ranks follow,
    and the job is homogeneous only when both hosts run as many ranks (not at 3 ranks: 2 and 1)."""
    use("hier")
    host_of = [r * 2 // SIZE for r in range(SIZE)]
    members = [r for r in range(SIZE) if host_of[r] == host_of[RANK]]
    assert (hvd.local_size(), hvd.local_rank()) == (len(members), members.index(RANK))
    assert hvd.cross_rank() == host_of[RANK]
    assert hvd.is_homogeneous() == (SIZE % 2 == 0)
