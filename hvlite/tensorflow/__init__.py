"""hvlite.tensorflow: Horovod's TensorFlow API (``import horovod.tensorflow as hvd``) on the
hvlite engine, for TensorFlow 2.21.

``import hvlite.tensorflow as hvd`` in place of Horovod's import, and a script runs unchanged:
``hvd.init()``, the collectives (eagerly, inside ``tf.function`` and in TF1 graphs, with
gradients), ``DistributedGradientTape`` for custom training loops, ``DistributedOptimizer`` for
TF1 and Keras optimizers, ``broadcast_variables`` to start every rank from the same values,
and ``hvd.elastic``. Keras's ``model.fit`` is :mod:`hvlite.tensorflow.keras`'s. The
:doc:`TensorFlow guide </guides/tensorflow>` shows them at work.

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
from . import elastic, mpi_ops, util
from .mpi_ops import check_num_rank_power_of_2  # noqa: F401 - Horovod's module has it too
from .util import _executing_eagerly  # noqa: F401 - Horovod's namespace has it
from ..elastic import HostsUpdatedInterrupt
from .functions import (BroadcastGlobalVariablesHook, allgather_object, broadcast_,
                        broadcast_global_variables, broadcast_object, broadcast_object_fn,
                        broadcast_variables)
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
           "broadcast_global_variables", "BroadcastGlobalVariablesHook", "broadcast_variables", "broadcast_", "broadcast_object",
           "broadcast_object_fn", "allgather_object", "SyncBatchNormalization",
           "DistributedGradientTape", "PartialDistributedGradientTape",
           "DistributedOptimizer", "start_timeline", "stop_timeline", "elastic",
           "HostsUpdatedInterrupt"]


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="",
                         device_sparse="", compression=Compression.none, sparse_as_dense=False,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Wrap an optimizer so that it averages gradients over every rank before applying them
    (Horovod's ``hvd.DistributedOptimizer``, with its parameters in its order).

    For a TF1 optimizer (``tf.compat.v1.train.Optimizer``) the result is a TF1 optimizer whose
    ``compute_gradients`` allreduces (``op=Adasum``: Horovod's Adasum-of-deltas optimizer);
    for a Keras 3 optimizer it is :func:`hvlite.tensorflow.keras.DistributedOptimizer`'s.

    Args:
        optimizer: a ``tf.compat.v1.train.Optimizer`` or a ``keras.optimizers.Optimizer``.
        name: the wrapper's name (default: ``Distributed`` and the optimizer's class name for
            TF1; the optimizer's own for Keras).
        use_locking: TF1's; ignored for Keras optimizers, as Horovod ignores it.
        device_dense: accepted for compatibility; data goes through host memory.
        device_sparse: accepted for compatibility.
        compression: ``Compression.none`` or ``Compression.fp16``.
        sparse_as_dense: densify ``tf.IndexedSlices`` gradients before reducing them.
        backward_passes_per_step: accumulate gradients locally over this many steps, then
            allreduce and apply them.
        op: ``hvd.Average`` (the default), ``hvd.Sum``, or ``hvd.Adasum`` (TF1 only).
        gradient_predivide_factor: with Average, divide by it before the sum and multiply by
            it over the size after.
        average_aggregated_gradients: with ``backward_passes_per_step`` > 1, average the
            accumulated gradients (default: sum them, as Horovod).
        num_groups: deprecated spelling of an integer ``groups``.
        groups: an integer > 0: send the gradients in this many fused groups; a list of lists
            of variables: each list's gradients together; None: one group the engine fuses.
        process_set: the set to average over (default: every rank).
        scale_local_gradients: divide the gradients of local variables (TF1's
            ``register_local_var``) by the set's size.
    Returns:
        The distributed optimizer.
    Raises:
        TypeError: ``optimizer`` is neither.
        ValueError: ``op=Adasum`` with a Keras optimizer, which Horovod's
            ``hvd.DistributedOptimizer`` refuses too (``hvlite.tensorflow.keras.
            DistributedOptimizer`` takes it and Adasum-reduces the gradients, as Horovod's Keras
            one does); ``gradient_predivide_factor`` with an op other than Average; bad
            ``groups``; the wrappers' own refusals.
    """
    import tensorflow as tf
    options = dict(name=name, device_dense=device_dense, device_sparse=device_sparse,
                   compression=compression, sparse_as_dense=sparse_as_dense,
                   backward_passes_per_step=backward_passes_per_step, op=op,
                   gradient_predivide_factor=gradient_predivide_factor,
                   average_aggregated_gradients=average_aggregated_gradients,
                   num_groups=num_groups, groups=groups, process_set=process_set,
                   scale_local_gradients=scale_local_gradients)
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        from .optimizer_v1 import DistributedOptimizerV1
        return DistributedOptimizerV1(optimizer, use_locking=use_locking, **options)
    if op == Adasum:
        raise ValueError("op == Adasum is not supported with Keras optimizers by "
                         "hvd.DistributedOptimizer; use hvlite.tensorflow.keras."
                         "DistributedOptimizer (Adasum of the gradients)")
    from .keras import DistributedOptimizer as keras_distributed_optimizer
    return keras_distributed_optimizer(optimizer, **options)


def __getattr__(name):
    # SyncBatchNormalization subclasses a Keras layer: Keras is imported when it is first asked
    # for, not by ``import hvlite.tensorflow``.
    if name == "SyncBatchNormalization":
        from .sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
