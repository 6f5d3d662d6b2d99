"""Seeded inputs and NumPy references for the SPMD tests.

Every rank can compute every other rank's input (``inputs(seed, rank, dtype, shape)``), so each
rank checks its own result against a NumPy reference computed from all ranks' inputs. Values are
small integers, so sums, products, min and max are exact in every dtype and in any reduction
order; only averages and scale factors round, and those compare with a dtype tolerance.
"""
import zlib

import numpy as np

try:
    import ml_dtypes
    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BFLOAT16 = None

DTYPES = [np.dtype(t) for t in ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16",
                                "float32", "float64", "bool")] + ([BFLOAT16] if BFLOAT16 else [])
FLOATS = [d for d in DTYPES if d.kind == "f" or d == BFLOAT16]
SHAPES = [(), (0,), (1,), (7,), (3, 4), (2, 0, 3), (33, 5)]
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6, "float64": 1e-12}


def inputs(seed, rank, dtype, shape, noncontiguous=False):
    """Rank ``rank``'s input: small integers (0..3 unsigned, -3..3 signed), as dtype."""
    rng = np.random.default_rng([seed, rank, zlib.crc32(dtype.name.encode()), len(shape)])
    full = (shape[0] * 2,) + tuple(shape[1:]) if noncontiguous and shape else shape
    if dtype == np.bool_:
        values = rng.integers(0, 2, size=full)
    elif dtype.kind == "u":
        values = rng.integers(0, 4, size=full)
    else:
        values = rng.integers(-3, 4, size=full)
    values = np.asarray(values).astype(dtype)
    return values[::2] if noncontiguous and shape else values


def reduce(stack, op, dtype, size):
    """Reference reduction of ``stack`` (ranks along axis 0) for reduce op name ``op``."""
    wide = stack.astype(np.float64) if dtype.kind in "fV" or dtype == BFLOAT16 else stack.astype(np.int64)
    if dtype == np.bool_:
        return (np.all(stack, axis=0) if op in ("Min", "Product") else np.any(stack, axis=0))
    if op in ("Sum", "Average"):
        total = wide.sum(axis=0)
        if op == "Sum":
            return total.astype(dtype)
        if dtype.kind in "iu":
            return (np.sign(total) * (np.abs(total) // size)).astype(dtype)
        return (total / size).astype(dtype)
    if op == "Min":
        return wide.min(axis=0).astype(dtype)
    if op == "Max":
        return wide.max(axis=0).astype(dtype)
    return wide.prod(axis=0).astype(dtype)


def assert_equal(actual, expected, what, dtype=None, exact=True):
    """Exact for integers and exact-by-construction floats; dtype tolerance otherwise."""
    assert actual.shape == expected.shape, "%s: shape %s, expected %s" % (what, actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, "%s: dtype %s, expected %s" % (what, actual.dtype, expected.dtype)
    if exact or dtype is None or dtype.name not in TOLERANCE:
        ok = np.array_equal(actual, expected)
    else:
        ok = np.allclose(actual.astype(np.float64), expected.astype(np.float64),
                         rtol=TOLERANCE[dtype.name], atol=TOLERANCE[dtype.name])
    assert ok, "%s: got %r, expected %r" % (what, actual, expected)
