"""Gradient compression for the wire (Horovod's ``hvd.Compression``).

Contract: ``compress(tensor) -> (tensor_to_send, ctx)`` and ``decompress(tensor, ctx) ->
tensor`` are pure functions; ``Compression.fp16`` sends floating tensors as float16 and restores
their dtype, and leaves other dtypes alone. Both are differentiable (plain casts).
"""
import torch

from ..compression import Compressor, NoneCompressor

__all__ = ["Compressor", "NoneCompressor", "FP16Compressor", "Compression"]


class FP16Compressor(Compressor):
    """Sends floating tensors as float16 (half the bytes; about 3 significant digits) and
    gives the result back in the original dtype; other dtypes pass through."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx) if ctx is not None else tensor


class Compression:
    """The compressors, for ``compression=`` of ``allreduce`` and ``DistributedOptimizer``:
    ``Compression.none`` (the default: tensors as they are) and ``Compression.fp16`` (floating
    tensors sent as float16)."""
    none = NoneCompressor
    """The default, which sends tensors as they are."""
    fp16 = FP16Compressor
    """Floating-point tensors are sent as float16 and the result cast back to their dtype."""
