"""Horovod's ``hvd.DistributedOptimizer`` for TF1 optimizers (``tf.compat.v1.train.Optimizer``).

``hvd.DistributedOptimizer(tf.compat.v1.train.AdamOptimizer(...))`` returns one of these: a TF1
optimizer whose ``minimize``/``compute_gradients`` average the gradients over every rank.

Contract:
- ``DistributedOptimizerV1(optimizer, name=None, use_locking=False, ...)`` takes Horovod's
  parameters and returns a ``tf.compat.v1.train.Optimizer``. ``minimize``,
  ``compute_gradients`` and ``apply_gradients`` work in a TF1 graph run by a ``Session`` and
  eagerly (with a callable loss, as TF1 optimizers need there). Slots (``get_slot``,
  ``get_slot_names``) and ``variables`` are the wrapped optimizer's, so checkpoints hold its
  slots. Every rank must compute gradients for the same variables, in the same order.
- Gradients: ``compute_gradients`` returns the wrapped optimizer's, allreduced over the process
  set by ``gradient_tape.allreduce_gradients`` (dense ones fused, or in ``groups``;
  ``tf.IndexedSlices`` allgathered, or densified with ``sparse_as_dense``; ``None`` kept).
  Those of variables given to ``register_local_var`` stay on this rank (divided by the set's
  size with ``scale_local_gradients``, as Horovod does).
- ``backward_passes_per_step=N`` > 1: each step adds its local gradients to accumulators
  (local variables: run ``tf.compat.v1.local_variables_initializer()``, as with Horovod);
  every N-th step they are allreduced (summed over the steps, or averaged with
  ``average_aggregated_gradients``) and ``apply_gradients`` applies them; on the other steps
  it applies nothing and only advances ``global_step``. The allreduce is one op run at every
  step that sends only on the N-th (``ops._allreduce_when``), so no collective waits inside a
  ``tf.cond``. ``tf.IndexedSlices`` need ``sparse_as_dense`` here (``ValueError``, as Horovod).
- ``op=Adasum``: Horovod's delta optimizer. ``compute_gradients`` is the wrapped optimizer's
  (local); ``apply_gradients`` applies the update locally and, every
  ``backward_passes_per_step``-th step, Adasum-reduces each variable's change since the last
  such step (``delta_start`` slots) and sets the variable to the start plus the reduced change.
  Global process set only (``NotImplementedError``, as Horovod); the engine's Adasum rules
  hold (2^k ranks, floating-point variables).
- Refused with ``ValueError``, before anything is built: ``gradient_predivide_factor`` with an
  op other than Average, Adasum with ``average_aggregated_gradients``, ``groups`` neither an
  integer > 0 nor a list of lists of variables, ``backward_passes_per_step`` < 1.
- Horovod's ``device_dense`` and ``device_sparse`` are accepted and have no effect (data goes
  through host memory).
"""
import tensorflow as tf

from ..collectives import Adasum, Average, reduce_op
from ..process_sets import global_process_set, rank_and_size, set_id_of
from ._bridge import op_name
from .compression import Compression
from .gradient_tape import _key, _scale_factors, allreduce_gradients, grouping
from .ops import _allreduce_when

__all__ = ["DistributedOptimizerV1"]

_LOCAL = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]


def _when(pred, true_fn, false_fn):
    """``tf.cond`` of two functions that build ops: a boolean tensor that runs the chosen
    one's ops (returning ops from branches is not portable across TF's two conds)."""
    def branch(fn):
        def body():
            with tf.control_dependencies([op for op in [fn()] if op is not None]):
                return tf.constant(True)
        return body
    return tf.cond(pred, branch(true_fn), branch(false_fn))


class _Wrapper(tf.compat.v1.train.Optimizer):
    """What both wrappers share: the wrapped optimizer's slots and variables."""

    def __init__(self, optimizer, name, use_locking):
        super().__init__(use_locking=use_locking, name=name)
        self._optimizer = optimizer

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


class _DistributedOptimizerV1(_Wrapper):
    def __init__(self, optimizer, name, use_locking, reduce_kwargs, passes, average_aggregated,
                 scale_local):
        super().__init__(optimizer, name, use_locking)
        self._reduce_kwargs = reduce_kwargs
        self._passes = passes
        self._average_aggregated = average_aggregated
        self._scale_local = scale_local
        self._local = set()
        self._counter = None        # backward_passes_per_step > 1: steps since the last reduce
        self._accumulators = None

    def register_local_var(self, var):
        """Keep ``var``'s gradient on this rank (not allreduced)."""
        self._local.add(_key(var))

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's (gradient, variable) pairs, the gradients allreduced (see the
        module docstring for ``backward_passes_per_step``)."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not pairs:
            return pairs
        grads, variables = (list(t) for t in zip(*pairs))
        if self._passes > 1:
            grads = self._aggregate(grads, variables)
        else:
            grads = self._reduce(grads, variables)
        return list(zip(grads, variables))

    def _reduce(self, grads, variables, when=None):
        """Allreduce the gradients of shared variables; local ones stay (scaled)."""
        shared = [i for i, v in enumerate(variables) if _key(v) not in self._local]
        reduced = allreduce_gradients([grads[i] for i in shared], "%s.grads" % self.get_name(),
                                      variables=[variables[i] for i in shared], when=when,
                                      **self._reduce_kwargs)
        out = list(grads)
        for i, g in zip(shared, reduced):
            out[i] = g
        if self._scale_local and len(shared) < len(grads):
            size = float(rank_and_size(self._reduce_kwargs["process_set"])[1])
            for i, (g, v) in enumerate(zip(grads, variables)):
                if g is None or _key(v) not in self._local:
                    continue
                out[i] = (tf.IndexedSlices(g.values / size, g.indices, g.dense_shape)
                          if isinstance(g, tf.IndexedSlices) else g / size)
        return out

    def _dense(self, grad):
        if isinstance(grad, tf.IndexedSlices):
            if not self._reduce_kwargs["sparse_as_dense"]:
                raise ValueError("tf.IndexedSlices gradients with backward_passes_per_step > 1 "
                                 "need sparse_as_dense=True")
            return tf.convert_to_tensor(grad)
        return grad

    def _aggregate(self, grads, variables):
        grads = [None if g is None else self._dense(g) for g in grads]
        if self._counter is None:
            with tf.init_scope():
                self._counter = tf.compat.v1.Variable(0, dtype=tf.int32, trainable=False,
                                                      collections=_LOCAL,
                                                      name="%s_aggregation_counter" % self.get_name())
                self._accumulators = [
                    None if g is None else tf.compat.v1.Variable(
                        tf.zeros(g.shape, g.dtype), trainable=False, collections=_LOCAL,
                        name="%s_aggregated_%d" % (self.get_name(), i))
                    for i, g in enumerate(grads)]
        count = self._counter.read_value()
        first = tf.equal(count, 0)
        with tf.control_dependencies([count]):
            sums = [None if g is None else acc.assign(tf.where(first, g, acc + g))
                    for g, acc in zip(grads, self._accumulators)]
        with tf.control_dependencies([s for s in sums if s is not None]):
            count = self._counter.assign_add(1)
        reduce_now = tf.equal(count, self._passes)
        with tf.control_dependencies([count]):
            reduced = self._reduce(sums, variables, when=reduce_now)
        if self._average_aggregated:
            reduced = [None if g is None else g / tf.cast(self._passes, g.dtype) for g in reduced]
        with tf.control_dependencies([g for g in reduced if g is not None]):
            reset = self._counter.assign(tf.where(reduce_now, 0, count))
        with tf.control_dependencies([reset]):
            return [None if g is None else tf.identity(g) for g in reduced]

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """The wrapped optimizer's update; with ``backward_passes_per_step`` > 1 only at the
        steps whose gradients were reduced (the others advance ``global_step`` only)."""
        if self._passes == 1 or self._counter is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step,
                                                   name=name)
        grads_and_vars = list(grads_and_vars)
        with tf.control_dependencies([g for g, _ in grads_and_vars if g is not None]):
            apply_now = tf.equal(self._counter.read_value(), 0)

        def count_step():
            if global_step is None:
                return None
            return global_step.assign_add(tf.constant(1, global_step.dtype.base_dtype),
                                          read_value=False)
        return _when(apply_now, lambda: self._optimizer.apply_gradients(
            grads_and_vars, global_step=global_step, name=name), count_step)


class _DistributedAdasumOptimizerV1(_Wrapper):
    def __init__(self, optimizer, name, use_locking, compression, passes):
        super().__init__(optimizer, name, use_locking)
        self._compression = compression
        self._passes = passes
        self._step = None

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's (local) gradients: Adasum combines the updates instead."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    def get_slot(self, var, name):
        slot = super(_Wrapper, self).get_slot(var, name)
        return slot if slot is not None else self._optimizer.get_slot(var, name)

    def get_slot_names(self):
        return super(_Wrapper, self).get_slot_names() + self._optimizer.get_slot_names()

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Apply locally; every ``backward_passes_per_step``-th step, Adasum-combine each
        variable's change since the previous such step (module docstring)."""
        grads_and_vars = list(grads_and_vars)
        variables = [v for g, v in grads_and_vars if g is not None]
        with tf.init_scope():
            starts = [self._zeros_slot(v, "delta_start", self.get_name()) for v in variables]
            if self._step is None:
                self._step = tf.compat.v1.Variable(0, dtype=tf.int64, trainable=False,
                                                   name="%s_step" % self.get_name())
        step = self._step.read_value()
        first = tf.equal(step, 0)
        with tf.control_dependencies([step]):
            marked = [s.assign(tf.where(first, v.read_value(), s)) for s, v in zip(starts, variables)]
        with tf.control_dependencies(marked):
            update = self._optimizer.apply_gradients(grads_and_vars, global_step=global_step,
                                                     name=name)
        reduce_now = tf.equal(step % self._passes, self._passes - 1)
        with tf.control_dependencies([update]):      # every read below sees the update
            current = [v.read_value() for v in variables]
        deltas = [c - s for c, s in zip(current, marked)]
        packed = [self._compression.compress(d) for d in deltas]
        base = op_name("%s.deltas" % self.get_name())
        reduced = _allreduce_when(reduce_now, [p[0] for p in packed],
                                  ["%s.%d" % (base, i) for i in range(len(packed))],
                                  Adasum, 1.0, 1.0, global_process_set)
        assigns = []
        for v, slot, s, c, r, (_, ctx) in zip(variables, starts, marked, current, reduced, packed):
            new_start = tf.where(reduce_now, s + self._compression.decompress(r, ctx), s)
            assigns.append(slot.assign(new_start))
            assigns.append(v.assign(tf.where(reduce_now, new_start, c)))
        with tf.control_dependencies(assigns):
            return self._step.assign_add(1, read_value=False)


def DistributedOptimizerV1(optimizer, name=None, use_locking=False, device_dense="",
                           device_sparse="", compression=Compression.none, sparse_as_dense=False,
                           backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                           average_aggregated_gradients=False, num_groups=0, groups=None,
                           process_set=global_process_set, scale_local_gradients=True):
    """Wrap a ``tf.compat.v1.train.Optimizer`` so that its gradients are allreduced; what
    ``hvlite.tensorflow.DistributedOptimizer`` returns for a TF1 optimizer (see there for the
    arguments, and the module docstring for the details).

    Returns:
        A ``tf.compat.v1.train.Optimizer`` sharing the wrapped one's slots and variables,
        with ``register_local_var(var)`` to keep a variable's gradient on this rank.
    Raises:
        ValueError: see the module docstring's list of refusals.
        NotImplementedError: ``op=Adasum`` with a process set other than the global one.
    """
    op = reduce_op(None, op)
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
            or backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be an integer >= 1, got %r"
                         % (backward_passes_per_step,))
    _scale_factors(op, gradient_predivide_factor)     # its ValueError, now rather than at build
    num_groups, groups = grouping(num_groups, groups, "DistributedOptimizer")
    if op == Adasum:
        if average_aggregated_gradients:
            raise ValueError("op=Adasum does not support average_aggregated_gradients=True")
        if set_id_of(process_set) != 0:
            raise NotImplementedError("DistributedOptimizer(op=Adasum) of a tf.compat.v1 "
                                      "optimizer reduces over the global process set only")
        return _DistributedAdasumOptimizerV1(
            optimizer, name or "DistributedDelta%s" % type(optimizer).__name__, use_locking,
            compression, backward_passes_per_step)
    return _DistributedOptimizerV1(
        optimizer, name or "Distributed%s" % type(optimizer).__name__, use_locking,
        dict(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
             gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
             groups=groups, process_set=process_set),
        backward_passes_per_step, bool(average_aggregated_gradients), scale_local_gradients)
