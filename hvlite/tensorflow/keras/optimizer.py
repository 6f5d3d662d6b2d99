"""Keras 3 ``DistributedOptimizer``: the wrapped optimizer, with gradients allreduced first.

``model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(...)), ...)``: every
step of ``model.fit`` then averages the gradients over every rank before applying them. Mixed
precision (``LossScaleOptimizer``) and gradient accumulation (``backward_passes_per_step``)
work as in Horovod; XLA (``jit_compile=True``) does not.

Contract:
- ``DistributedOptimizer(optimizer, ...)`` returns an optimizer of a subclass of the wrapped
  optimizer's class (same class name and module, so models saved with it load anywhere as the
  plain optimizer). ``apply``/``apply_gradients`` (what ``model.fit``'s train step calls)
  allreduce the gradients over every rank (``hvlite.tensorflow.gradient_tape``'s
  ``allreduce_gradients``: fused, positional names, IndexedSlices allgathered) and then run
  the wrapped class's own update; everything else (learning rate and schedules, ``get_config``,
  variables, loss scaling) is the wrapped optimizer's. An unbuilt optimizer is re-created from
  its config (as Horovod does); an already built one (with state) is converted in place.
- Every rank must train the same model the same way (same variables, same steps).
- Mixed precision: a ``LossScaleOptimizer`` skips the steps whose gradients have an infinity or
  a NaN, and every rank must skip the same ones (the allreduce runs in the steps applied).
  A ``LossScaleOptimizer`` around a distributed optimizer (what ``model.compile`` makes under
  the ``mixed_float16`` policy, or ``LossScaleOptimizer(DistributedOptimizer(opt))``) is given,
  when it builds its inner optimizer, a check agreed over the ranks: the gradients count as
  finite only where they are on every rank (one int32 allreduce per step), as Keras's own does
  across the replicas of a ``tf.distribute`` strategy. ``DistributedOptimizer`` given a
  ``LossScaleOptimizer``, and ``load_model``/``wrap_in_place`` given one, make that same form
  in place (its inner optimizer distributed, the check agreed), so however each rank got its
  optimizer (a root that loaded a checkpoint, the others compiling afresh) every rank runs
  the same collectives.
- ``model.compile(jit_compile=True)`` (XLA) cannot run the engine call: ``apply`` then raises
  ``ValueError`` asking for ``jit_compile=False`` (Keras picks XLA by itself only on GPUs).
- ``backward_passes_per_step=N`` > 1 (Horovod's local gradient aggregation) is Keras 3's own
  ``gradient_accumulation_steps=N`` on the wrapped optimizer: each step adds its local
  gradients to the accumulators, and every N-th step the accumulated gradients are allreduced
  and applied, so ranks communicate once per N steps. Keras averages them over the N steps;
  with ``average_aggregated_gradients=False`` (Horovod's default) they are summed instead, as
  in Horovod. The optimizer must be unbuilt (accumulators are made at build) and not a
  ``LossScaleOptimizer``; ``ValueError`` otherwise, as for an optimizer that already has
  ``gradient_accumulation_steps``. Keras saves ``gradient_accumulation_steps``, not the sum or
  average rule: a re-wrapped optimizer (``load_model``, ``wrap_in_place``) averages unless told.
"""
import operator
import sys

import keras
import tensorflow as tf

from ...collectives import reduce_op
from ...process_sets import global_process_set, rank_and_size
from ..compression import Compression
from .._bridge import library, op_name
from ..gradient_tape import _key, _local_layer_list, _scale_factors, allreduce_gradients, grouping
from ..ops import Average, Min, allreduce

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "is_distributed",
           "wrap_in_place"]

_CLASSES = {}


def _in_xla_context():
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:   # pragma: no cover
        return False
    if tf.executing_eagerly():
        return False
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


class _DistributedMixin:
    """Put in front of the wrapped optimizer's class; see the module docstring."""

    _hvlite_options = dict(compression=Compression.none, sparse_as_dense=False, op=Average,
                           gradient_predivide_factor=1.0, num_groups=0, groups=None,
                           process_set=global_process_set)

    @library
    def apply(self, grads, trainable_variables=None):
        """Allreduce ``grads`` over every rank, then apply them as the wrapped optimizer does.

        Every rank must call it with the same gradient list, in the same order.

        Raises:
            ValueError: running under XLA (``jit_compile=True``).
        """
        grads = list(grads)
        if grads and not self.gradient_accumulation_steps:
            grads = self._hvlite_reduce(grads, trainable_variables)
        return super().apply(grads, trainable_variables)

    def build(self, var_list):
        # Keras's LossScaleOptimizer.build builds its inner optimizer (at the latest in its
        # first apply, before its check for infinities): when that is this one, its check is
        # made to agree over the ranks (see the module docstring)
        caller = sys._getframe(1).f_locals.get("self")
        if isinstance(caller, keras.optimizers.LossScaleOptimizer) and caller.inner_optimizer is self:
            caller.__class__ = _in_front(_FiniteEverywhere, caller.__class__)
            object.__setattr__(caller, "_hvlite_process_set", self._hvlite_options["process_set"])
        return super().build(var_list)

    def _backend_apply_gradients(self, grads, trainable_variables):
        # With gradient accumulation Keras adds each step's local gradients to its accumulators
        # and, every N-th step only, clips the accumulated ones (averaged over the steps) and
        # applies them: they are reduced there (_clip_gradients), once per N steps, before the
        # clipping, as without accumulation. The variables are kept for the local-layer rule
        # (past Keras's attribute tracking, which would count them as the optimizer's own).
        object.__setattr__(self, "_hvlite_step_variables", list(trainable_variables))
        return super()._backend_apply_gradients(grads, trainable_variables)

    def _clip_gradients(self, grads):
        if self.gradient_accumulation_steps:       # an update step's accumulated gradients
            grads = list(grads)
            if not getattr(self, "_hvlite_average_aggregated", True):
                grads = [None if g is None else g * self.gradient_accumulation_steps for g in grads]
            grads = self._hvlite_reduce(grads, self._hvlite_step_variables)
        return super()._clip_gradients(grads)

    def _hvlite_reduce(self, grads, trainable_variables):
        if _in_xla_context():
            raise ValueError("hvlite's DistributedOptimizer cannot run under XLA: compile the "
                             "model with jit_compile=False")
        variables = (self._trainable_variables if trainable_variables is None
                     else list(trainable_variables))
        local = getattr(self, "_hvlite_local", None)
        if local:
            return _reduce_shared(grads, variables, [_key(v) in local for v in variables],
                                  self._hvlite_scale_local, self._hvlite_options)
        return allreduce_gradients(grads, "DistributedOptimizer", variables=variables,
                                   **self._hvlite_options)


def _reduce_shared(grads, variables, is_local, scale_local, options):
    """Allreduce the gradients of shared variables; keep the local ones (divided by the set's
    size when ``scale_local``, as Horovod's PartialDistributedOptimizer does)."""
    reduced = iter(allreduce_gradients([g for g, l in zip(grads, is_local) if not l],
                                       "DistributedOptimizer",
                                       variables=[v for v, l in zip(variables, is_local) if not l],
                                       **options))
    size = rank_and_size(options["process_set"])[1]
    out = []
    for g, local in zip(grads, is_local):
        if not local:
            out.append(next(reduced))
        elif g is None or not scale_local:
            out.append(g)
        elif isinstance(g, tf.IndexedSlices):
            out.append(tf.IndexedSlices(g.values / size, g.indices, g.dense_shape))
        else:
            out.append(g / size)
    return out


class _FiniteEverywhere:
    """Put in front of a LossScaleOptimizer whose inner optimizer is distributed."""

    def check_finite(self, grads):
        """Finite where the gradients are finite on every rank of the set (else every rank
        skips the step, and the inner optimizer's allreduce runs on every rank or on none);
        a rank outside the set trains alone, on its own check."""
        finite = super().check_finite(grads)
        process_set = self._hvlite_process_set
        if rank_and_size(process_set)[0] < 0:
            return finite
        name = op_name("LossScaleOptimizer.finite", None, process_set)
        everywhere = allreduce(tf.cast(finite, tf.int32), op=Min, name=name, process_set=process_set)
        return tf.equal(everywhere, 1)


def _in_front(mixin, cls):
    """``cls`` with ``mixin`` in front: same name and module, so a saved model loads anywhere."""
    if issubclass(cls, mixin):
        return cls
    if (mixin, cls) not in _CLASSES:
        _CLASSES[mixin, cls] = type(cls.__name__, (mixin, cls),
                                    {"__module__": cls.__module__, "__doc__": cls.__doc__})
    return _CLASSES[mixin, cls]


def is_distributed(optimizer):
    """Whether ``optimizer`` allreduces its gradients.

    Args:
        optimizer: a Keras optimizer; for a ``LossScaleOptimizer``, its inner one is asked.
    Returns:
        True if :func:`DistributedOptimizer` (or :func:`wrap_in_place`) made it.
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return isinstance(optimizer, _DistributedMixin)


def wrap_in_place(optimizer, **options):
    """Make an existing (possibly built) optimizer distributed, keeping its state.

    A ``LossScaleOptimizer`` keeps its place around its inner optimizer, which is made
    distributed, and gets the agreed check (what ``compile`` makes under ``mixed_float16``),
    so a rank that loaded it trains with the same collectives as ranks that compiled afresh.

    Args:
        optimizer: a Keras optimizer.
        **options: ``compression``, ``sparse_as_dense``, ``op``, ``gradient_predivide_factor``,
            ``num_groups``, ``groups``, ``process_set``, as for :func:`DistributedOptimizer`.
    Returns:
        ``optimizer`` itself, now distributed.
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        wrap_in_place(optimizer.inner_optimizer, **options)
        optimizer.__class__ = _in_front(_FiniteEverywhere, optimizer.__class__)
        object.__setattr__(optimizer, "_hvlite_process_set",
                           optimizer.inner_optimizer._hvlite_options["process_set"])
        return optimizer
    optimizer.__class__ = _in_front(_DistributedMixin, optimizer.__class__)
    _set_options(optimizer, options)
    return optimizer


def _set_options(optimizer, options):
    # past Keras's attribute tracking: ``groups`` holds the model's variables, which would
    # otherwise count as the optimizer's own (saved, loaded and broadcast with its state)
    object.__setattr__(optimizer, "_hvlite_options",
                       dict(_DistributedMixin._hvlite_options, **options))


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Wrap a Keras 3 optimizer so that it allreduces gradients before applying them.

    Args:
        optimizer: a ``keras.optimizers.Optimizer`` (including LossScaleOptimizer).
        name: a new optimizer name (default: the wrapped optimizer's).
        compression: Compression.none or Compression.fp16.
        sparse_as_dense: densify tf.IndexedSlices gradients before reducing them.
        gradient_predivide_factor: with op Average, divide by it before the sum and multiply
            by it / size after.
        op: hvd.Average (default) or hvd.Sum, ...
        num_groups: deprecated spelling of an integer ``groups``.
        groups: an integer > 0: split the gradients into this many fused submissions; a list
            of lists of variables: each list's gradients in one submission, each other
            gradient alone; None (default): one submission, fused by the engine.
        backward_passes_per_step: apply (and allreduce) every this many steps, gradients
            accumulated locally in between (see the module docstring).
        average_aggregated_gradients: with backward_passes_per_step > 1, average the
            accumulated gradients over the steps (False, the default: sum them).
        device_dense: accepted for compatibility (data goes through host memory).
        device_sparse: accepted for compatibility.
        process_set: the set to reduce over (default: every rank).
        scale_local_gradients: accepted for compatibility (it applies to
            :func:`PartialDistributedOptimizer`'s local layers).
    Returns:
        The distributed optimizer (a new one, or ``optimizer`` itself if it was built).
    Raises:
        TypeError: not a Keras optimizer.
        ValueError: ``gradient_predivide_factor`` with an op other than Average; ``groups``
            neither an integer > 0 nor a list of lists; ``backward_passes_per_step`` < 1, or
            > 1 with a built, wrapped or ``LossScaleOptimizer`` optimizer, or one that already
            has ``gradient_accumulation_steps``.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError("DistributedOptimizer expects a keras.optimizers.Optimizer, got %s"
                        % type(optimizer).__name__)
    if backward_passes_per_step != 1:
        _check_accumulation(optimizer, backward_passes_per_step)
    num_groups, groups = grouping(num_groups, groups, "DistributedOptimizer")
    op = reduce_op(None, op)
    _scale_factors(op, gradient_predivide_factor)
    options = dict(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                   gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
                   groups=groups, process_set=process_set)
    if (optimizer.built or is_distributed(optimizer)
            or isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
        return wrap_in_place(optimizer, **options)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    if backward_passes_per_step != 1:
        config["gradient_accumulation_steps"] = operator.index(backward_passes_per_step)
    distributed = _in_front(_DistributedMixin, optimizer.__class__).from_config(config)
    # exclude_from_weight_decay() is kept outside the config: carry it over
    for attr in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern"):
        if hasattr(optimizer, attr):
            setattr(distributed, attr, getattr(optimizer, attr))
    _set_options(distributed, options)
    # Horovod's default sums the N steps' gradients; Keras's own accumulation averages them
    distributed._hvlite_average_aggregated = (backward_passes_per_step == 1
                                              or bool(average_aggregated_gradients))
    return distributed


def _check_accumulation(optimizer, passes):
    """backward_passes_per_step becomes the wrapped optimizer's gradient_accumulation_steps."""
    try:
        passes = operator.index(passes)
    except TypeError:
        passes = 0
    if passes < 1:
        raise ValueError("backward_passes_per_step must be an integer >= 1, got %r" % (passes,))
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError("backward_passes_per_step > 1 is not supported with a "
                         "LossScaleOptimizer: set gradient_accumulation_steps on its inner "
                         "optimizer and pass backward_passes_per_step=1")
    if optimizer.built or is_distributed(optimizer):
        raise ValueError("backward_passes_per_step > 1 needs an optimizer that has not been "
                         "built or wrapped yet (Keras makes its gradient accumulators at build)")
    if optimizer.gradient_accumulation_steps:
        raise ValueError("the optimizer already has gradient_accumulation_steps=%d: pass "
                         "backward_passes_per_step=1, or leave gradient_accumulation_steps unset"
                         % optimizer.gradient_accumulation_steps)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False,
                                gradient_predivide_factor=1.0, op=Average,
                                backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """As :func:`DistributedOptimizer`, but the gradients of ``local_layers``' trainable
    weights stay on this rank (divided by the set's size when ``scale_local_gradients``, as
    Horovod does). The arguments not listed here are as for :func:`DistributedOptimizer`.

    Args:
        local_layers: a Keras layer or a list of them.
        scale_local_gradients: divide the local gradients by the set's size (the default).
    Returns:
        The distributed optimizer.
    Raises:
        ValueError: an item of ``local_layers`` is not a Keras layer; otherwise as
            :func:`DistributedOptimizer`.
    """
    local_layers = _local_layer_list(local_layers, "PartialDistributedOptimizer")
    distributed = DistributedOptimizer(
        optimizer, name, device_dense, device_sparse, compression, sparse_as_dense,
        gradient_predivide_factor, op, backward_passes_per_step, average_aggregated_gradients,
        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients)
    distributed._hvlite_local = {_key(v) for layer in local_layers
                                 for v in layer.trainable_weights}
    distributed._hvlite_scale_local = scale_local_gradients
    return distributed
