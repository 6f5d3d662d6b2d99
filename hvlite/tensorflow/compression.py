"""Gradient compression for allreduce (Horovod's ``hvd.Compression``).

Contract: a compressor has ``compress(tensor) -> (tensor, ctx)`` and
``decompress(tensor, ctx) -> tensor``, both static and usable eagerly and in tf.function.
``Compression.none`` passes tensors through; ``Compression.fp16`` sends floating-point tensors
as float16 and casts the result back to their dtype (other dtypes pass through unchanged).
"""
import tensorflow as tf

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class Compressor:
    """Interface for compressing and decompressing a tensor around a collective."""

    @staticmethod
    def compress(tensor):
        """Returns (tensor to send, context for ``decompress``)."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Returns the tensor as the caller expects it, from what the collective returned."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16."""

    @staticmethod
    def compress(tensor):
        dtype = tensor.dtype
        if dtype.is_floating and dtype != tf.float16:
            tensor = tf.cast(tensor, tf.float16)
        return tensor, dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None or tensor.dtype == ctx else tf.cast(tensor, ctx)


class Compression:
    """The compressors by name: ``Compression.none`` and ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
