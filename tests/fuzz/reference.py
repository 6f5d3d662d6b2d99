"""Seeded inputs, NumPy references and the result check of the collective fuzzer.

Contract (no hvlite import; numpy and ml_dtypes only):
- ``inputs(call, rank)`` is rank ``rank``'s input array for ``call`` (a plan.Call), a pure
  function of the call's data seed, dtype and shape, so every rank rebuilds every other rank's
  input. Integers span their whole range (sums and products wrap, as the engine's and MPI's
  do); floats are in [-2, 2] (products: magnitudes in [0.5, 2]), so nothing overflows.
- ``expected(calls, members, me)`` is what rank ``me`` must get from one collective whose call
  on each member (by global rank) is ``calls[r]``: the array, and for alltoall with splits also
  the received splits. A member with no call has joined (hvlite.join): it stands in with
  zeros for an allreduce (other ops fail while a member has joined, as in Horovod). It
  follows the engine's documented arithmetic: prescale each input, reduce, then Average
  (integers: wrapped sum divided toward zero) and postscale; integer scaling in double,
  rounded toward zero and saturated; bool Sum/Max are "any", Min/Product "all".
- ``check(call, got, want, n)`` raises ``Mismatch`` unless ``got`` has ``want``'s dtype and
  shape and equal values: bit for bit for integers, bool and every data movement; for floating-
  point reductions within a bound on reduction-order rounding of n ranks' values.
"""
import zlib

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8, "float32": 2.0 ** -24,
                 "float64": 2.0 ** -53}
SMALLEST = {"float16": 2.0 ** -24, "bfloat16": 2.0 ** -133, "float32": 2.0 ** -149,
            "float64": 2.0 ** -1074}


class Mismatch(AssertionError):
    """A result that differs from the reference."""


def np_dtype(name):
    return BFLOAT16 if name == "bfloat16" else np.dtype(name)


def inputs(call, rank):
    """Rank `rank`'s input for `call` (contiguous; fuzz.py makes the strided view itself)."""
    rng = np.random.default_rng([call.data, rank, zlib.crc32(call.dtype.encode()), len(call.shape)])
    dtype, shape = np_dtype(call.dtype), call.shape
    if call.dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if call.reduce == "Product" and call.op in ("allreduce", "reducescatter"):
        values = rng.uniform(0.5, 2.0, size=shape) * rng.choice((-1.0, 1.0), size=shape)
    else:
        values = rng.uniform(-2.0, 2.0, size=shape)
    return np.asarray(values).astype(dtype)


def scale_int(x, factor):
    """The engine's integer scaling: in double, saturated to the type's range, rounded toward
    zero (reduce.c hvl__scale)."""
    if factor == 1.0:
        return x
    info = np.iinfo(x.dtype)
    v = x.astype(np.float64) * factor
    lo, hi = float(info.min), float(info.max)
    inside = (v > lo) & (v < hi)
    truncated = np.trunc(np.where(inside, v, 0.0)).astype(x.dtype)
    saturated = np.where(v <= lo, np.array(info.min, x.dtype), np.array(info.max, x.dtype))
    return np.asarray(np.where(inside, truncated, saturated), dtype=x.dtype)


def reduce_int(stack, op, n, pre, post):
    """Integer reduction of stack (ranks on axis 0), as the engine computes it."""
    stack = np.stack([scale_int(x, pre) for x in stack])
    if op in ("Sum", "Average"):
        total = stack.sum(axis=0, dtype=stack.dtype)          # wraps, as MPI's and the shm kernels'
        if op == "Average":                                    # C division: toward zero
            wide = total.astype(np.int64)
            q = wide // n
            total = np.where((wide % n != 0) & (wide < 0), q + 1, q).astype(stack.dtype)
    elif op == "Product":
        total = stack.prod(axis=0, dtype=stack.dtype)
    else:
        total = stack.min(axis=0) if op == "Min" else stack.max(axis=0)
    return scale_int(np.asarray(total, dtype=stack.dtype), post)


def reduce_float(stack, op, n, pre, post):
    """Exact (float64) reduction of the float stack; the dtype's rounding is left to check()."""
    wide = stack.astype(np.float64) * pre
    if op in ("Sum", "Average"):
        total = wide.sum(axis=0) * (post / n if op == "Average" else post)
    elif op == "Product":
        total = wide.prod(axis=0) * post
    else:
        total = (wide.min(axis=0) if op == "Min" else wide.max(axis=0)) * post
    return total


def reduce_bool(stack, op):
    return np.all(stack, axis=0) if op in ("Min", "Product") else np.any(stack, axis=0)


def contribution(calls, r, c):
    """Member r's input to a reduction: its own, or zeros when it has joined (no call)."""
    return inputs(calls[r], r) if r in calls else np.zeros(c.shape, dtype=np_dtype(c.dtype))


def reduction(calls, members, c):
    """(reduced values over the members, bound per element or None for exact)."""
    stack = np.stack([contribution(calls, r, c) for r in members])
    n = len(members)
    if c.dtype == "bool":
        return reduce_bool(stack, c.reduce), None
    if np_dtype(c.dtype).kind in "iu":
        return reduce_int(stack, c.reduce, n, c.prescale, c.postscale), None
    exact = reduce_float(stack, c.reduce, n, c.prescale, c.postscale)
    u, k = UNIT_ROUNDOFF[c.dtype], 2 * n + 4
    post = abs(c.postscale / n if c.reduce == "Average" else c.postscale)
    if c.reduce == "Product":
        bound = k * u * np.abs(exact)
    else:
        magnitude = np.abs(stack.astype(np.float64) * c.prescale).sum(axis=0) * post
        bound = k * u * (magnitude + np.abs(exact))
    return exact, bound + k * SMALLEST[c.dtype]


def rows(dim0, set_rank, n):
    """Rows of dim 0 that set rank `set_rank` gets from a reducescatter (the first dim0 % n
    get one more)."""
    return dim0 // n + (1 if set_rank < dim0 % n else 0)


def expected(calls, members, me):
    """(array or float64 values, bound or None, received splits or None) for rank `me`."""
    c = calls[me]
    dtype = np_dtype(c.dtype)
    if c.op == "allreduce":
        values, bound = reduction(calls, members, c)
        return values, bound, None
    if c.op == "reducescatter":
        values, bound = reduction(calls, members, c)
        i = members.index(me)
        start = sum(rows(c.shape[0], j, len(members)) for j in range(i))
        stop = start + rows(c.shape[0], i, len(members))
        return values[start:stop], None if bound is None else bound[start:stop], None
    if c.op == "broadcast":
        return inputs(calls[c.root], c.root), None, None
    if c.op == "allgather":
        parts = [inputs(calls[r], r) if calls[r].shape else inputs(calls[r], r).reshape(1)
                 for r in members]
        return np.concatenate(parts).astype(dtype), None, None
    if c.op == "alltoall":
        i, n, parts, received = members.index(me), len(members), [], []
        for r in members:
            x = inputs(calls[r], r)
            splits = calls[r].splits or (x.shape[0] // n,) * n
            start = sum(splits[:i])
            parts.append(x[start:start + splits[i]])
            received.append(splits[i])
        out = np.concatenate(parts).astype(dtype) if parts else np.empty((0,) + c.shape[1:], dtype)
        return out, None, (np.array(received, dtype=np.int64) if c.splits is not None else None)
    raise ValueError(c.op)


def bits(a):
    """a's elements as unsigned integers of the same width (bool stays bool)."""
    if a.dtype == np.bool_:
        return np.array(a, order="C")
    view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return np.array(a, order="C").view(view)


def check(call, got, want, bound):
    """Raises Mismatch unless got matches want (see the module docstring)."""
    dtype = np_dtype(call.dtype)
    if not isinstance(got, np.ndarray):
        raise Mismatch("result is a %s, not an array" % type(got).__name__)
    if got.dtype != dtype or got.shape != np.shape(want):
        raise Mismatch("result %s%s, expected %s%s" % (got.dtype, got.shape, dtype, np.shape(want)))
    if bound is None:
        want = np.asarray(want).astype(dtype)
        differ = bits(got) != bits(want)      # by bits: -0.0 is not 0.0, NaN is itself
        if np.any(differ):
            bad = np.argwhere(differ) if got.ndim else [()]
            raise Mismatch("%d element(s) differ, first at %s: got %r, expected %r" % (
                len(bad), tuple(bad[0]), got[tuple(bad[0])], want[tuple(bad[0])]))
        return
    err = np.abs(got.astype(np.float64) - want)
    if not np.all(err <= bound):
        i = tuple(np.argwhere(~(err <= bound))[0])
        raise Mismatch("%s %s: got %r, expected %r within %.3g (error %.3g)" % (
            call.reduce, call.dtype, float(got[i]), float(want[i]), float(bound[i]), float(err[i])))
