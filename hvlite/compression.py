"""The compressor interface shared by the framework adapters (Horovod's ``hvd.Compression``).

Contract: a compressor has static ``compress(tensor) -> (tensor_to_send, ctx)`` and
``decompress(tensor, ctx) -> tensor``. ``NoneCompressor`` passes any tensor through; each
adapter adds its own float16 compressor (casting is framework-specific).
"""

__all__ = ["Compressor", "NoneCompressor"]


class Compressor:
    """Interface: compress before a collective, decompress after it."""

    @staticmethod
    def compress(tensor):
        """Returns (tensor to send, context for ``decompress``)."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Returns the tensor as the caller expects it, from what the collective returned."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor
