"""hvlite.tensorflow: Horovod's TensorFlow API (``import horovod.tensorflow as hvd``) on the
hvlite engine, for TensorFlow 2.21.

Contract: the public names are Horovod's documented ones, with its signatures and semantics;
a Horovod script runs with only its import changed. Basics (``init``, ``rank``, ``size``, ...)
and exceptions are hvlite's own (``HorovodInternalError`` is ``HvliteError``). Collectives
(``ops``, ``functions``) work eagerly and inside ``tf.function``; ``DistributedGradientTape``
allreduces gradients; ``elastic`` holds Horovod's elastic states; Keras 3 support is in
``hvlite.tensorflow.keras``. This package never imports ``hvlite.torch``. Decisions where
Horovod's docs are silent are in each module's docstring (names inside tf.function:
``hvlite.tensorflow._bridge``).
"""
from ..basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built,
                      gloo_enabled, init, is_initialized, local_rank, local_size, mpi_built,
                      mpi_enabled, mpi_threads_supported,
                      is_homogeneous, nccl_built, rank, rocm_built, shutdown,
                      size)
from ..errors import (HorovodInternalError, HorovodVersionMismatchError, HvliteError, HvliteInvalidArgument,
                      HvliteShutdownError, HvliteTimeoutError, MismatchError,
                      HvliteDeadlockError)
from ..process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from ..timeline import start_timeline, stop_timeline
from .compression import Compression
from . import elastic
from ..elastic import HostsUpdatedInterrupt
from .functions import (allgather_object, broadcast_, broadcast_global_variables, broadcast_object,
                        broadcast_object_fn, broadcast_variables)
from .gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from .ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce, alltoall, barrier,
                  broadcast, grouped_allgather, grouped_allreduce, grouped_reducescatter, join,
                  local_rank_op, local_size_op, process_set_included_op, rank_op, reducescatter,
                  size_op)

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "cross_rank", "cross_size", "is_homogeneous",
           "mpi_threads_supported", "mpi_built", "mpi_enabled",
           "nccl_built", "gloo_built", "gloo_enabled", "cuda_built", "rocm_built", "ddl_built",
           "ccl_built", "HorovodInternalError", "HorovodVersionMismatchError", "HvliteError", "HvliteInvalidArgument",
           "HvliteShutdownError", "HvliteTimeoutError", "MismatchError", "HvliteDeadlockError", "ProcessSet", "add_process_set", "remove_process_set",
           "global_process_set", "Compression", "Sum", "Average", "Min", "Max", "Product",
           "Adasum", "allreduce", "grouped_allreduce", "allgather", "grouped_allgather",
           "broadcast",
           "alltoall", "reducescatter", "grouped_reducescatter", "barrier", "join", "size_op",
           "rank_op", "local_size_op", "local_rank_op", "process_set_included_op",
           "broadcast_global_variables", "broadcast_variables", "broadcast_", "broadcast_object",
           "broadcast_object_fn", "allgather_object", "SyncBatchNormalization",
           "DistributedGradientTape", "PartialDistributedGradientTape",
           "DistributedOptimizer", "start_timeline", "stop_timeline", "elastic",
           "HostsUpdatedInterrupt"]


def DistributedOptimizer(optimizer, *args, **kwargs):
    """Horovod's ``hvd.DistributedOptimizer``: for a TF1 optimizer
    (``tf.compat.v1.train.Optimizer``) ``hvlite.tensorflow.optimizer_v1``'s wrapper, whose
    ``compute_gradients`` allreduces; for a Keras 3 optimizer the same as
    ``hvlite.tensorflow.keras.DistributedOptimizer``.

    Raises:
        TypeError: ``optimizer`` is neither.
        ValueError: ``op=Adasum``, which Horovod's ``hvd.DistributedOptimizer`` refuses for
            Keras optimizers (``hvlite.tensorflow.keras.DistributedOptimizer`` takes it and
            Adasum-reduces the gradients, as Horovod's Keras one does); the TF1 wrapper's
            refusals (its module docstring).
    """
    import tensorflow as tf
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        from .optimizer_v1 import DistributedOptimizerV1
        return DistributedOptimizerV1(optimizer, *args, **kwargs)
    if kwargs.get("op") == Adasum:
        raise ValueError("op == Adasum is not supported with Keras optimizers by "
                         "hvd.DistributedOptimizer; use hvlite.tensorflow.keras."
                         "DistributedOptimizer (Adasum of the gradients)")
    from .keras import DistributedOptimizer as keras_distributed_optimizer
    return keras_distributed_optimizer(optimizer, *args, **kwargs)


def __getattr__(name):
    # SyncBatchNormalization subclasses a Keras layer: Keras is imported when it is first asked
    # for, not by ``import hvlite.tensorflow``.
    if name == "SyncBatchNormalization":
        from .sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
