"""hvlite.keras: Horovod's ``horovod.keras`` under hvlite's name, so that ``import horovod.keras
as hvd`` becomes ``import hvlite.keras as hvd``.

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
    """``horovod.keras.DistributedOptimizer``: ``hvlite.tensorflow.keras.DistributedOptimizer``
    with ``horovod.keras``'s parameters, in its order (see there for each)."""
    return _distributed_optimizer(optimizer, name=name, device_dense=device_dense,
                                  device_sparse=device_sparse, compression=compression,
                                  sparse_as_dense=sparse_as_dense,
                                  gradient_predivide_factor=gradient_predivide_factor, op=op,
                                  num_groups=num_groups, groups=groups)


def allreduce(value, name=None, average=True, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none):
    """Allreduce a tensor-compatible value over every rank: Average, or Sum with
    ``average=False``, or ``op`` when given; returns a tensor. Collective: every rank calls
    it, in the same order."""
    return _allreduce(value, name=name, average=None if op is not None else average,
                      prescale_factor=prescale_factor, postscale_factor=postscale_factor, op=op,
                      compression=compression)
