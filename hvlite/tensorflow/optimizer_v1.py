"""Horovod's ``hvd.DistributedOptimizer`` for TF1 optimizers (``tf.compat.v1.train.Optimizer``):
``compute_gradients`` returns the gradients allreduced over the process set; everything else is
the wrapped optimizer's.

Contract:
- ``DistributedOptimizerV1(optimizer, name=None, use_locking=False, compression=..., sparse_as_dense,
  op=Average, gradient_predivide_factor=1.0, num_groups=0, process_set=...)`` returns a
  ``tf.compat.v1.train.Optimizer``. ``minimize``, ``compute_gradients`` and ``apply_gradients``
  work in a TF1 graph run by a ``Session`` and eagerly (with a callable loss, as TF1 optimizers
  need there). The reduction is ``gradient_tape.allreduce_gradients``: dense gradients fused,
  ``tf.IndexedSlices`` allgathered (or densified), ``None`` kept; names are positional, so every
  rank must compute gradients for the same variables in the same order.
- ``apply_gradients``, slots (``get_slot``, ``get_slot_names``) and ``variables`` are the
  wrapped optimizer's, so checkpoints hold its slots.
- Refused with ``ValueError``, before anything is built: ``backward_passes_per_step`` > 1 (use
  a Keras 3 optimizer with ``gradient_accumulation_steps``), ``groups`` (use ``num_groups``),
  ``op=Adasum`` (Horovod's TF1 Adasum optimizer is not built), and
  ``gradient_predivide_factor`` with an op other than Average.
- Horovod's ``device_dense``, ``device_sparse``, ``average_aggregated_gradients`` and
  ``scale_local_gradients`` are accepted and have no effect here (they concern placement, or
  gradient accumulation, which is refused).
"""
import tensorflow as tf

from ..collectives import Adasum, Average, reduce_op
from ..process_sets import global_process_set
from .compression import Compression
from .gradient_tape import _scale_factors, allreduce_gradients

__all__ = ["DistributedOptimizerV1"]


class _DistributedOptimizerV1(tf.compat.v1.train.Optimizer):
    def __init__(self, optimizer, name, use_locking, reduce_kwargs):
        super().__init__(use_locking=use_locking, name=name)
        self._optimizer = optimizer
        self._reduce_kwargs = reduce_kwargs

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's (gradient, variable) pairs, the gradients allreduced."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not pairs:
            return pairs
        grads, variables = zip(*pairs)
        reduced = allreduce_gradients(list(grads), "%s.grads" % self.get_name(), **self._reduce_kwargs)
        return list(zip(reduced, variables))

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizerV1(optimizer, name=None, use_locking=False, device_dense="",
                           device_sparse="", compression=Compression.none, sparse_as_dense=False,
                           backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                           average_aggregated_gradients=False, num_groups=0, groups=None,
                           process_set=global_process_set, scale_local_gradients=True):
    """Wrap a ``tf.compat.v1.train.Optimizer`` (see the module docstring)."""
    op = reduce_op(None, op)
    if backward_passes_per_step != 1:
        raise ValueError("DistributedOptimizer(backward_passes_per_step=%r) is not supported for "
                         "tf.compat.v1.train optimizers; use a Keras 3 optimizer with "
                         "gradient_accumulation_steps" % (backward_passes_per_step,))
    if groups is not None:
        raise ValueError("DistributedOptimizer(groups=...) is not supported; use num_groups")
    if op == Adasum:
        raise ValueError("op=Adasum is not supported for tf.compat.v1.train optimizers; use "
                         "hvlite.tensorflow.keras.DistributedOptimizer(op=Adasum) with a Keras 3 "
                         "optimizer, or DistributedGradientTape(op=Adasum)")
    _scale_factors(op, gradient_predivide_factor)     # its ValueError, now rather than at build
    return _DistributedOptimizerV1(
        optimizer, name or "Distributed%s" % type(optimizer).__name__, use_locking,
        dict(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
             gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
             process_set=process_set))
