"""The element types the engine knows: the one map from dtype names to engine codes.

Contract: ``by_name(name) -> int`` returns the ``HVL_*`` code of a dtype named as NumPy,
TensorFlow and torch (without its ``torch.`` prefix) name it: ``uint8``, ``int8``, ``uint16``,
``int16``, ``int32``, ``int64``, ``float16``, ``bfloat16``, ``float32``, ``float64``, ``bool``;
any other name raises ``TypeError`` naming it and the supported ones. ``to_engine(np_dtype)``
does the same for anything ``np.dtype`` accepts. bfloat16 arrays come from the ``ml_dtypes``
package (as used by JAX and TensorFlow); going by name keeps that package optional. The
adapters map their own dtype objects through ``by_name``, so this is the only table.
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


def by_name(name):
    """The engine's code for the dtype called ``name``.

    Raises:
        TypeError: the engine does not support that dtype.
    """
    try:
        return _BY_NAME[name]
    except KeyError:
        raise TypeError("hvlite does not support dtype %s (supported: %s)"
                        % (name, ", ".join(SUPPORTED))) from None


def to_engine(dtype):
    """The engine's code for a NumPy dtype (or anything ``np.dtype`` accepts); raises
    ``TypeError`` as ``by_name``."""
    try:
        return _BY_DTYPE[dtype]
    except (KeyError, TypeError):
        pass
    code = by_name(np.dtype(dtype).name)
    if isinstance(dtype, np.dtype):
        _BY_DTYPE[dtype] = code
    return code
