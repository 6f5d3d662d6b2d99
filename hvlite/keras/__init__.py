"""hvlite.keras: Horovod's ``horovod.keras`` under hvlite's name, so that ``import horovod.keras
as hvd`` becomes ``import hvlite.keras as hvd``.

It holds what :mod:`hvlite.tensorflow.keras` holds (Keras 3 on TensorFlow), with
``horovod.keras``'s own signatures where they differ: ``DistributedOptimizer``, ``allreduce``
and ``callbacks.BestModelCheckpoint``.

Contract: the contents of ``hvlite.tensorflow.keras`` (Keras 3 on the TensorFlow backend: Horovod's
two Keras modules hold the same API, and Keras 3 is one package), except where
``horovod.keras``'s signatures differ from ``horovod.tensorflow.keras``'s, which are
``horovod.keras``'s here: ``DistributedOptimizer(optimizer, name, device_dense, device_sparse,
compression, sparse_as_dense, gradient_predivide_factor, op, num_groups, groups)`` (no gradient
accumulation or process set, as there), ``allreduce(..., average=True, ...)`` (an ``op`` given
wins over ``average``, where Horovod raises), and ``callbacks.BestModelCheckpoint`` (no
``save_weights_only``). ``hvlite.keras.callbacks`` and ``hvlite.keras.elastic`` import as
submodules; ``elastic`` is ``hvlite.tensorflow.keras.elastic``.
"""
import sys

from ..tensorflow.keras import *  # noqa: F401,F403 - the API, named in __all__
from ..tensorflow.keras import __all__, elastic  # noqa: F401
del callbacks  # noqa: F821 - the star import's: horovod.keras.callbacks is this package's own
from ..tensorflow.keras import allreduce as _allreduce
from ..tensorflow.keras.optimizer import DistributedOptimizer as _distributed_optimizer
from ..tensorflow.compression import Compression
from ..tensorflow.ops import Average
from . import callbacks  # noqa: F401 - horovod.keras.callbacks

sys.modules[__name__ + ".elastic"] = elastic


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, num_groups=0, groups=None):
    """As :func:`hvlite.tensorflow.keras.DistributedOptimizer`, with the parameters of
    ``horovod.keras.DistributedOptimizer`` in its order (no gradient accumulation or process
    set, as there): ``optimizer``, ``name``, ``device_dense``, ``device_sparse``,
    ``compression``, ``sparse_as_dense``, ``gradient_predivide_factor``, ``op``, ``num_groups``
    and ``groups``, each as there.

    Returns:
        The distributed optimizer.
    """
    return _distributed_optimizer(optimizer, name=name, device_dense=device_dense,
                                  device_sparse=device_sparse, compression=compression,
                                  sparse_as_dense=sparse_as_dense,
                                  gradient_predivide_factor=gradient_predivide_factor, op=op,
                                  num_groups=num_groups, groups=groups)


def allreduce(value, name=None, average=True, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none):
    """Reduce ``value`` over every rank and return a tensor: Average, or Sum with
    ``average=False``, or ``op`` when given (where Horovod would raise for both).

    Collective: every rank calls it, in the same order.

    Args:
        value: a tensor, or anything ``tf.convert_to_tensor`` takes.
        name: as for :func:`hvlite.tensorflow.allreduce`.
        average: True (the default) for Average, False for Sum; ignored when ``op`` is given.
        prescale_factor: multiply the input by this before the reduction.
        postscale_factor: multiply the result by this after it.
        op: a reduce op (``hvd.Sum``, ...), which wins over ``average``.
        compression: ``Compression.none`` or ``Compression.fp16``.
    Returns:
        The reduced tensor.
    Raises:
        TypeError: an unsupported dtype (before anything is sent).
        HvliteError: what the engine reports, as for :func:`hvlite.tensorflow.allreduce`.
    """
    return _allreduce(value, name=name, average=None if op is not None else average,
                      prescale_factor=prescale_factor, postscale_factor=postscale_factor, op=op,
                      compression=compression)
