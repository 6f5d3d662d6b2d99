"""The element types the engine knows, and their mapping from NumPy dtypes.

Contract: ``to_engine(np_dtype) -> int`` returns the ``HVL_*`` code or raises ``TypeError``
naming the unsupported dtype. bfloat16 arrays come from the ``ml_dtypes`` package (as used by
JAX and TensorFlow); the mapping goes by dtype name so that package stays optional.
"""
import numpy as np

from ._lib import lib

_BY_NAME = {
    "uint8": lib.HVL_UINT8, "int8": lib.HVL_INT8, "uint16": lib.HVL_UINT16,
    "int16": lib.HVL_INT16, "int32": lib.HVL_INT32, "int64": lib.HVL_INT64,
    "float16": lib.HVL_FLOAT16, "bfloat16": lib.HVL_BFLOAT16, "float32": lib.HVL_FLOAT32,
    "float64": lib.HVL_FLOAT64, "bool": lib.HVL_BOOL,
}

SUPPORTED = tuple(_BY_NAME)
_BY_DTYPE = {}      # np.dtype -> code, filled on first use (a dict hit is the hot path)


def to_engine(dtype):
    """The engine's code for a NumPy dtype (or anything ``np.dtype`` accepts)."""
    try:
        return _BY_DTYPE[dtype]
    except (KeyError, TypeError):
        pass
    name = np.dtype(dtype).name
    try:
        code = _BY_NAME[name]
    except KeyError:
        raise TypeError("hvlite does not support dtype %s (supported: %s)"
                        % (name, ", ".join(SUPPORTED))) from None
    if isinstance(dtype, np.dtype):
        _BY_DTYPE[dtype] = code
    return code
