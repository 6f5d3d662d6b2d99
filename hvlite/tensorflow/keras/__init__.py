"""hvlite.tensorflow.keras: Horovod's ``horovod.tensorflow.keras`` API for Keras 3 (TensorFlow
backend) on the hvlite engine.

``import hvlite.tensorflow.keras as hvd``, then wrap the optimizer with
``hvd.DistributedOptimizer`` before ``model.compile``, and pass
``hvd.callbacks.BroadcastGlobalVariablesCallback(0)`` (and usually
``hvd.callbacks.MetricAverageCallback()``) to ``model.fit``: every rank then trains the same
model on its own share of the data. The :doc:`TensorFlow guide </guides/tensorflow>` shows a
whole script.

Contract: the public names are Horovod's documented ones: basics (``init``, ``rank``,
``size``, ...), ``DistributedOptimizer`` (``.optimizer``), ``broadcast_global_variables``,
value collectives ``allreduce``/``allgather``/``broadcast``/``reducescatter`` (eager tensors in,
eager tensors out), ``load_model`` (re-wraps the saved optimizer), the callbacks in
``hvlite.tensorflow.keras.callbacks`` and ``elastic`` (``KerasState``, the elastic callbacks).
Keras 3 keeps no global variable collection, so ``broadcast_global_variables`` takes the model
whose (and whose optimizer's) variables to send; Horovod itself refuses this call under TF2
eager execution.
"""
import keras

from ...basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built,
                       gloo_enabled, init, is_initialized, local_rank, local_size, mpi_built,
                       mpi_enabled, mpi_threads_supported,
                       is_homogeneous, nccl_built, rank, rocm_built,
                       shutdown, size)
from ...errors import HorovodInternalError, HorovodVersionMismatchError, HvliteDeadlockError, HvliteError, MismatchError
from ...process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from ...timeline import start_timeline, stop_timeline
from .. import functions as _functions
from .. import ops as _ops
from ..compression import Compression
from ..ops import Adasum, Average, Max, Min, Product, Sum
from ..sync_batch_norm import SyncBatchNormalization  # noqa: F401 - registered for load_model
from . import callbacks, elastic
from ...elastic import HostsUpdatedInterrupt
from .callbacks import _model_variables
from .optimizer import (DistributedOptimizer, PartialDistributedOptimizer, is_distributed,
                        wrap_in_place)

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
           "cross_rank", "cross_size", "is_homogeneous",
           "mpi_threads_supported", "mpi_built", "mpi_enabled",
           "nccl_built", "gloo_built", "gloo_enabled", "cuda_built", "rocm_built", "ddl_built",
           "ccl_built", "HorovodInternalError", "HorovodVersionMismatchError", "HvliteError", "MismatchError", "HvliteDeadlockError", "ProcessSet", "add_process_set", "remove_process_set",
           "global_process_set", "Compression", "Sum", "Average", "Min", "Max", "Product", "Adasum",
           "DistributedOptimizer", "PartialDistributedOptimizer", "broadcast_global_variables",
           "allreduce", "allgather",
           "broadcast", "reducescatter", "load_model", "callbacks", "start_timeline",
           "stop_timeline", "elastic", "HostsUpdatedInterrupt"]


def broadcast_global_variables(root_rank, model=None):
    """Assign root_rank's variables of ``model`` (and of its optimizer, if built) on every rank.

    Every rank must call it, with the same model structure.

    Args:
        root_rank: the rank whose values every rank takes.
        model: a Keras model (or a list of variables).
    Raises:
        ValueError: no model given (Keras 3 has no global variable collection).
    """
    if model is None:
        raise ValueError("Keras 3 has no global variables: call broadcast_global_variables("
                         "root_rank, model) or use callbacks.BroadcastGlobalVariablesCallback")
    variables = _model_variables(model) if isinstance(model, keras.Model) else list(model)
    _functions.broadcast_variables(variables, root_rank, name="broadcast_global_variables")


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0,
              op=None, compression=Compression.none):
    """Reduce ``value`` element-wise over every rank (default op: Average) and return a tensor; as
    :func:`hvlite.tensorflow.allreduce`, over every rank.

    Collective: every rank calls it, in the same order.

    Args:
        value: a tensor, or anything ``tf.convert_to_tensor`` takes.
        name: as for :func:`hvlite.tensorflow.allreduce`.
        average: deprecated (Horovod's); False means Sum. Use ``op``.
        prescale_factor: multiply the input by this before the reduction.
        postscale_factor: multiply the result by this after it.
        op: ``hvd.Average`` (the default), ``Sum``, ``Min``, ``Max``, ``Product`` or ``Adasum``.
        compression: ``Compression.none`` or ``Compression.fp16``.
    Returns:
        The reduced tensor.
    Raises:
        TypeError: an unsupported dtype (before anything is sent).
        HvliteError: what the engine reports, as for :func:`hvlite.tensorflow.allreduce`.
    """
    return _ops.allreduce(value, average=average, op=op, name=name, compression=compression,
                          prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def allgather(value, name=None):
    """As :func:`hvlite.tensorflow.allgather`, over every rank: concatenate every rank's ``value``
    along the first dimension and return a tensor. Collective.

    Args:
        value: a tensor, or anything ``tf.convert_to_tensor`` takes.
        name: as for :func:`hvlite.tensorflow.allreduce`.
    """
    return _ops.allgather(value, name=name)


def broadcast(value, root_rank, name=None):
    """As :func:`hvlite.tensorflow.broadcast`, over every rank: return ``root_rank``'s ``value`` as
    a tensor. Collective.

    Args:
        value: a tensor, or anything ``tf.convert_to_tensor`` takes.
        root_rank: the rank whose value every rank gets.
        name: as for :func:`hvlite.tensorflow.allreduce`.
    """
    return _ops.broadcast(value, root_rank, name=name)


def reducescatter(value, name=None, op=Average):
    """As :func:`hvlite.tensorflow.reducescatter`, over every rank: reduce ``value`` and return
    this rank's rows of the result as a tensor. Collective.

    Args:
        value: a tensor (at least 1-d), or anything ``tf.convert_to_tensor`` takes.
        name: as for :func:`hvlite.tensorflow.allreduce`.
        op: ``hvd.Average`` (the default), ``Sum``, ``Min``, ``Max`` or ``Product``.
    """
    return _ops.reducescatter(value, name=name, op=op)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none, legacy_opts=False, average_aggregated_gradients=True):
    """Load a Keras model saved with or without hvlite, with its optimizer distributed.

    Args:
        filepath: a ``.keras`` file (anything ``keras.models.load_model`` reads; models with
            ``hvlite.tensorflow.SyncBatchNormalization`` included).
        custom_optimizers: optimizer classes the file needs, beyond Keras's own.
        custom_objects: other custom objects, as for ``keras.models.load_model``.
        compression: compression for the re-wrapped optimizer.
        legacy_opts: Horovod's switch for files saved with ``tf.keras.optimizers.legacy``
            optimizers. Keras 3 has none: such a file's optimizer is read as the Keras 3
            optimizer of the same name, as ``keras.models.load_model`` reads it, either way.
        average_aggregated_gradients: for an optimizer saved with gradient accumulation (Keras
            keeps ``gradient_accumulation_steps``, which ``backward_passes_per_step`` sets):
            average the accumulated steps (Keras's rule, the default here), or sum them with
            False (Horovod's ``backward_passes_per_step`` default; the file cannot say which
            one the model was trained with).
    Returns:
        The model; its optimizer (with the saved state) allreduces gradients.
    """
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects.setdefault(cls.__name__, cls)
    model = keras.models.load_model(filepath, custom_objects=objects)
    if getattr(model, "optimizer", None) is not None:
        wrap_in_place(model.optimizer, compression=compression)
        inner = getattr(model.optimizer, "inner_optimizer", model.optimizer)
        inner._hvlite_average_aggregated = bool(average_aggregated_gradients)
    return model
