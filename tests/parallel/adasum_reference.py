"""A NumPy reference of Adasum for the SPMD tests (tests/parallel/test_adasum*.py).

Two vectors combine as (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b, with a coefficient of 1
for a zero vector; ranks combine pairwise in rank order, (v0 + v1) + (v2 + v3), as Horovod
documents. Each level's result is rounded to the dtype, as the engine stores it. Each tensor of
a fused batch is reduced on its own.
"""
import numpy as np

ZERO_NORM_SQ = np.sqrt(np.finfo(np.float64).tiny)   # a squared norm below this is a zero vector
# |engine - reference| <= TOLERANCE * max|reference|: the dot products are summed in another
# order, so a coefficient may differ in its last bits and a level's rounding by one ulp.
TOLERANCE = {"float16": 4e-3, "float32": 2e-6, "float64": 1e-12}


def adasum_pair(a, b):
    """Adasum of two float64 vectors."""
    ab, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1.0 - ab / (2.0 * aa) if aa >= ZERO_NORM_SQ else 1.0
    cb = 1.0 - ab / (2.0 * bb) if bb >= ZERO_NORM_SQ else 1.0
    return ca * a + cb * b


def adasum(tensors, dtype):
    """The Adasum of one tensor given every rank's value (a list in rank order; the count is a
    power of 2), in ``dtype`` and the tensors' shape."""
    dtype = np.dtype(dtype)
    shape = np.shape(tensors[0])
    level = [np.asarray(t, dtype=dtype).astype(np.float64).ravel() for t in tensors]
    while len(level) > 1:
        level = [adasum_pair(level[i], level[i + 1]).astype(dtype).astype(np.float64)
                 for i in range(0, len(level), 2)]
    return level[0].astype(dtype).reshape(shape)


def assert_close(got, expected, what):
    """Within the dtype's TOLERANCE of the reference (relative to its largest value)."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.dtype == expected.dtype and got.shape == expected.shape, \
        "%s: %s %s, expected %s %s" % (what, got.dtype, got.shape, expected.dtype, expected.shape)
    if not expected.size:
        return
    scale = max(float(np.abs(expected.astype(np.float64)).max()), 1e-30)
    err = float(np.abs(got.astype(np.float64) - expected.astype(np.float64)).max())
    assert err <= TOLERANCE[expected.dtype.name] * scale, \
        "%s: off by %g (max |value| %g)\n got %s\n expected %s" % (what, err, scale,
                                                                   got.ravel()[:8],
                                                                   expected.ravel()[:8])
