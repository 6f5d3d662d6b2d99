"""Adasum on one rank (a one-rank MPI job): the identity, with prescale and postscale applied;
the refusals (reducescatter, dtypes other than float16/32/64) raised at submit with the tensor
named; and the C status and exception class they map to."""
import ml_dtypes
import numpy as np
import pytest

import hvlite as hvd
from hvlite.errors import HvliteNotSupportedError


@pytest.fixture(scope="module", autouse=True)
def engine():
    hvd.init()
    yield
    c = hvd.engine_counters()
    assert c["tensors_submitted"] == c["tensors_done"]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_one_rank_is_the_identity(dtype):
    x = np.linspace(-3, 5, 24).astype(dtype).reshape(4, 6)
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Adasum), x)
    got = hvd.allreduce(x, op=hvd.Adasum, prescale_factor=0.5, postscale_factor=4.0)
    np.testing.assert_array_equal(got, (x * dtype(2)).astype(dtype))
    outs = hvd.grouped_allreduce([x, x[:1], np.zeros(0, dtype)], op=hvd.Adasum)
    for out, want in zip(outs, [x, x[:1], np.zeros(0, dtype)]):
        np.testing.assert_array_equal(out, want)


def test_refusals_name_the_tensor():
    with pytest.raises(HvliteNotSupportedError, match="'rs': reducescatter does not support"):
        hvd.reducescatter(np.ones((2, 2), np.float32), op=hvd.Adasum, name="rs")
    for dtype in (np.int8, np.int64, np.bool_, ml_dtypes.bfloat16):
        name = np.dtype(dtype).name
        with pytest.raises(HvliteNotSupportedError, match="'%s'.*not %s" % (name, name)):
            hvd.allreduce(np.ones(3, dtype), op=hvd.Adasum, name=name)
    assert issubclass(HvliteNotSupportedError, NotImplementedError)
    assert issubclass(HvliteNotSupportedError, hvd.HvliteError)
    assert hvd._lib.lib.HVL_ADASUM == hvd.Adasum
