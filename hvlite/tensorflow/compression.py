"""Gradient compression for allreduce (Horovod's ``hvd.Compression``).

Pass ``compression=hvd.Compression.fp16`` to ``allreduce``, ``DistributedGradientTape`` or
``DistributedOptimizer`` to send floating-point tensors as float16: half the bytes, about three
significant digits.

Contract: a compressor has ``compress(tensor) -> (tensor, ctx)`` and
``decompress(tensor, ctx) -> tensor``, both static and usable eagerly and in tf.function.
``Compression.none`` passes tensors through; ``Compression.fp16`` sends floating-point tensors
as float16 and casts the result back to their dtype (other dtypes pass through unchanged).
"""
import tensorflow as tf

from ..compression import Compressor, NoneCompressor

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 and come back in their own dtype; other dtypes
    pass through unchanged."""

    @staticmethod
    def compress(tensor):
        """Returns (the tensor to send, as float16 if it is floating-point; its dtype)."""
        dtype = tensor.dtype
        if dtype.is_floating and dtype != tf.float16:
            tensor = tf.cast(tensor, tf.float16)
        return tensor, dtype

    @staticmethod
    def decompress(tensor, ctx):
        """Returns ``tensor`` cast back to the dtype ``compress`` recorded in ``ctx``."""
        return tensor if ctx is None or tensor.dtype == ctx else tf.cast(tensor, ctx)


class Compression:
    """The compressors by name, for ``compression=``: ``Compression.none`` and
    ``Compression.fp16``."""

    none = NoneCompressor
    """The default, which sends tensors as they are."""
    fp16 = FP16Compressor
    """Floating-point tensors are sent as float16 and the result cast back to their dtype."""
