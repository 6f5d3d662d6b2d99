"""Errors every rank must see: mismatched shape/dtype/op/reduce op/root raise MismatchError on
every rank, naming the tensor and the rank groups; a name reused before its first request was
synchronized is rejected on the rank that reuses it, however long ago that request completed;
local mistakes raise TypeError/ValueError before any communication.
The engine keeps working after each error. SPMD: run by hvlrun."""
import time

import numpy as np
import pytest

import hvlite as hvd

RANK, SIZE = hvd.rank(), hvd.size()
ODD = 1   # the rank that disagrees


def others():
    return ",".join(str(r) for r in range(SIZE) if r != ODD)


def expect_mismatch(fn, name, field, mine, odd):
    with pytest.raises(hvd.MismatchError) as info:
        fn()
    msg = str(info.value)
    assert "'%s'" % name in msg and field in msg, msg
    ranks_word = "ranks" if SIZE > 2 else "rank"
    assert "%s on %s %s" % (mine, ranks_word, others()) in msg, msg
    assert "%s on rank %d" % (odd, ODD) in msg, msg


def test_shape_mismatch():
    shape = (4,) if RANK == ODD else (3,)
    expect_mismatch(lambda: hvd.allreduce(np.zeros(shape, np.float32), name="shape.x"),
                    "shape.x", "shape", "[3]", "[4]")


def test_dtype_mismatch():
    dtype = np.float16 if RANK == ODD else np.float32
    expect_mismatch(lambda: hvd.allreduce(np.zeros(3, dtype), name="dtype.x"),
                    "dtype.x", "dtype", "float32", "float16")


def test_op_mismatch():
    x = np.zeros((2, 2), np.float32)
    fn = (lambda: hvd.allgather(x, name="op.x")) if RANK == ODD else (lambda: hvd.allreduce(x, name="op.x"))
    expect_mismatch(fn, "op.x", "op", "allreduce", "allgather")


def test_reduce_op_mismatch():
    op = hvd.Max if RANK == ODD else hvd.Sum
    expect_mismatch(lambda: hvd.allreduce(np.zeros(2, np.int32), name="rop.x", op=op),
                    "rop.x", "reduce op", "Sum", "Max")


def test_root_mismatch():
    root = 1 if RANK == ODD else 0
    expect_mismatch(lambda: hvd.broadcast(np.zeros(2, np.int32), root, name="root.x"),
                    "root.x", "root rank", "root 0", "root 1")


def test_allgather_trailing_dims_mismatch():
    shape = (RANK + 1, 3 if RANK == ODD else 2)
    expect_mismatch(lambda: hvd.allgather(np.zeros(shape, np.int64), name="ag.x"),
                    "ag.x", "shape", "[*, 2]", "[*, 3]")


def test_engine_still_works_after_errors():
    got = hvd.allreduce(np.full(3, RANK, np.int64), op=hvd.Sum, name="after.errors")
    assert (got == sum(range(SIZE))).all()


def test_duplicate_in_flight_name():
    """Rank 0 reuses the name of its own allreduce while it is surely in flight: the others
    submit theirs only after a barrier that rank 0 reaches once it has retried the name."""
    if RANK == 0:
        first = hvd.allreduce_async(np.ones(2, np.float32), name="dup", op=hvd.Sum)
        with pytest.raises(hvd.HvliteInvalidArgument, match="'dup' is already in flight"):
            hvd.allreduce_async(np.ones(2, np.float32), name="dup")
        assert not hvd.poll(first)     # no other rank has submitted 'dup' yet
        hvd.barrier()
        assert (hvd.synchronize(first) == SIZE).all()
    else:
        hvd.barrier()                  # rank 0 has retried the name
        assert (hvd.allreduce(np.ones(2, np.float32), name="dup", op=hvd.Sum) == SIZE).all()
    # the name is free again once the first one was synchronized
    assert (hvd.allreduce(np.ones(2, np.float32), name="dup", op=hvd.Sum) == SIZE).all()


@pytest.mark.parametrize("submit", [
    lambda name: hvd.allreduce_async(np.ones(2, np.float32), name=name, op=hvd.Sum),
    lambda name: hvd.allgather_async(np.ones((1, 2), np.float32), name=name),
    lambda name: hvd.broadcast_async(np.ones(2, np.float32), 0, name=name),
], ids=["allreduce", "allgather", "broadcast"])
def test_name_stays_taken_until_synchronized(submit):
    """Horovod's *_duplicate_name_error tests, without their race: a request that has certainly
    completed (polled until done) still holds its name until it is synchronized, so submitting
    the name again raises on every rank that does so; after synchronize it is free again."""
    first = submit("x")
    deadline = time.monotonic() + 30
    while not hvd.poll(first):
        assert time.monotonic() < deadline, "the first 'x' did not complete"
        time.sleep(0.01)
    with pytest.raises(hvd.HvliteInvalidArgument, match="'x' is already in flight on this rank") as raised:
        submit("x")
    assert "not been synchronized" in str(raised.value)
    hvd.synchronize(first)
    hvd.synchronize(submit("x"))      # free again: every rank runs it


def test_a_dropped_handle_frees_its_name_once_its_request_is_done():
    """Horovod's fire-and-forget pattern (its *_duplicate_name_error tests never synchronize):
    a handle dropped while its request is pending keeps the name (a second submission right
    after it fails, on every rank that makes one); once the request is done, the next wait
    releases the handle with its name and buffers."""
    from hvlite import handles
    x = np.ones(2, np.float32)
    for turn in (0, 1):                # rank 0 first (pending), then the others (completing)
        if (RANK == 0) == (turn == 0):
            hvd.allreduce_async(x, name="dropped", op=hvd.Sum)      # dropped at once
            with pytest.raises(hvd.HvliteInvalidArgument, match="'dropped' is already in flight"):
                hvd.allreduce_async(x, name="dropped")
        hvd.barrier()
    hvd.barrier()                      # a cycle after the one that ran 'dropped': done everywhere
    assert (hvd.allreduce(x, name="dropped", op=hvd.Sum) == SIZE).all()
    assert not handles._orphans and not handles._keep_alive      # nothing else is pending


def test_local_argument_errors():
    with pytest.raises(TypeError, match="numpy.ndarray"):
        hvd.allreduce([1, 2, 3])
    with pytest.raises(TypeError, match="complex64"):
        hvd.allreduce(np.zeros(2, np.complex64))
    with pytest.raises(ValueError, match="reduce op"):
        hvd.allreduce(np.zeros(2), op=42)
    with pytest.raises(hvd.HvliteInvalidArgument, match="root rank"):
        hvd.broadcast(np.zeros(2), root_rank=SIZE)
    with pytest.raises(hvd.HvliteInvalidArgument, match="splits"):
        hvd.alltoall(np.zeros(SIZE + 1), splits=[1] * SIZE)
    with pytest.raises(hvd.HvliteInvalidArgument, match="bool"):
        hvd.allreduce(np.zeros(2, bool), op=hvd.Average)
    with pytest.raises(ValueError, match="read-only"):
        a = np.zeros(2)
        a.flags.writeable = False
        hvd.allreduce_(a)


def test_mismatch_detected_for_very_long_names():
    """The check compares values, so a name longer than any message buffer still cannot hide a
    shape mismatch (it once did: ranks silently got half-reduced data)."""
    name = "layer." * 400 + "weight"
    shape = (8,) if RANK == ODD else (4,)
    expect_mismatch(lambda: hvd.allreduce(np.ones(shape, np.float32), name=name),
                    name, "shape", "[4]", "[8]")


def test_long_shapes_compare_by_value():
    """Shapes whose text would be cut still compare dimension by dimension (0-element tensors
    may have many large dimensions)."""
    big = 10 ** 17
    shape = (0,) + (big,) * 14 + ((big + 1) if RANK == ODD else big,)
    with pytest.raises(hvd.MismatchError, match="shape"):
        _submit_shape(shape)


def _submit_shape(shape):
    """Enqueue a 0-element float32 allreduce whose declared shape is `shape`."""
    from hvlite._lib import lib
    from hvlite.handles import NULL, submit
    return submit(lib.HVL_ALLREDUCE, "long.shape", lib.HVL_FLOAT32, shape, NULL, NULL, None, None,
                  reduce_op=hvd.Sum).wait()
