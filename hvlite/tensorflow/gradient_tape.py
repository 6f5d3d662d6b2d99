"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient()`` averages gradients
over every rank, and the gradient allreduce it shares with the Keras optimizer.

In a custom training loop, wrap the tape after the forward pass,
``tape = hvd.DistributedGradientTape(tape)``, and ``tape.gradient(loss, model.trainable_variables)``
returns gradients averaged over every rank, ready for ``optimizer.apply_gradients``.

Contract:
- ``DistributedGradientTape(tape, ...)`` returns an object that is a ``tf.GradientTape`` (of the
  wrapped tape's class) recording into the same tape; ``gradient(target, sources)`` returns the
  local gradients allreduced over every rank, in the structure of ``sources``. Every rank must
  call ``gradient`` with the same sources in the same order.
- ``allreduce_gradients(grads, ...)`` is the reduction itself: dense gradients go to the engine in
  ``num_groups`` submissions (one when ``num_groups`` is 0: the engine fuses them up to its
  threshold), each one graph op inside ``tf.function``; with ``groups`` (Horovod's list of
  lists of variables) one submission per listed group, in the order listed, then one per
  gradient whose variable no group lists; ``tf.IndexedSlices`` are allgathered
  (or densified with ``sparse_as_dense``); ``None`` stays ``None``. Names are positional
  (``<prefix>.<i>``), so they are the same on every rank and at every step (response cache
  hits) whatever the variables are called; eagerly the prefix itself is reused at every call.
- With ``op=Average``, ``gradient_predivide_factor`` f splits the averaging: gradients are
  multiplied by 1/f before the sum and by f/size after it (Horovod's semantics).
"""
import warnings

import tensorflow as tf

from ..collectives import reduce_op
from ..process_sets import global_process_set, rank_and_size
from ._bridge import chained, library, op_name
from .compression import Compression
from .ops import Average, _allreduce_group, _allreduce_when, _sparse_allreduce, _tensor

__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape"]


def _scale_factors(op, gradient_predivide_factor):
    if gradient_predivide_factor != 1.0:
        if op != Average:
            raise ValueError("gradient_predivide_factor needs op=Average")
        return 1.0 / gradient_predivide_factor, gradient_predivide_factor
    return 1.0, 1.0


def _split(indices, num_groups):
    if num_groups <= 0 or len(indices) <= 1:
        return [indices] if indices else []
    num_groups = min(num_groups, len(indices))
    per, extra = divmod(len(indices), num_groups)
    groups, start = [], 0
    for g in range(num_groups):
        stop = start + per + (1 if g < extra else 0)
        groups.append(indices[start:stop])
        start = stop
    return groups


def grouping(num_groups, groups, who):
    """Horovod's ``num_groups``/``groups`` pair as (number of groups, list of lists of
    variables or None): ``num_groups`` is the deprecated spelling of an integer ``groups``
    (it warns, as Horovod's does).

    Raises:
        ValueError: ``groups`` neither a list of lists of variables nor an integer > 0.
    """
    if num_groups:
        warnings.warn("%s: num_groups has been replaced by groups" % who, DeprecationWarning)
        if groups is None:
            groups = num_groups
    if groups is None:
        return 0, None
    if isinstance(groups, (list, tuple)):
        if not all(isinstance(g, (list, tuple)) for g in groups):
            raise ValueError("%s: groups must be an integer > 0 or a list of lists of variables"
                             % who)
        return 0, [list(g) for g in groups]
    if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0:
        raise ValueError("%s: groups must be an integer > 0 or a list of lists of variables, "
                         "got %r" % (who, groups))
    return groups, None


def _listed_groups(indices, variables, groups):
    """Split gradient positions by ``groups`` (lists of variables): one list per group, in the
    order of ``groups``, then each position whose variable no group lists, alone."""
    where = {}
    for g, group in enumerate(groups):
        for var in group:
            where.setdefault(_key(var), g)
    split = [[] for _ in groups]
    alone = []
    for i in indices:
        g = where.get(_key(variables[i]))
        (split[g] if g is not None else alone).append(i)
    return [group for group in split if group] + [[i] for i in alone]


@library
def allreduce_gradients(grads, prefix, compression=Compression.none, sparse_as_dense=False,
                        op=Average, gradient_predivide_factor=1.0, num_groups=0,
                        process_set=global_process_set, groups=None, variables=None,
                        when=None):
    """Allreduce a list of gradients (tensors, tf.IndexedSlices or None).

    Every rank must call it with the same list (shapes, dtypes, None positions), in order.

    Args:
        grads: list of gradients.
        prefix: engine name prefix for this list (positional suffixes are added).
        compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, process_set:
            as in ``DistributedGradientTape``.
        groups: None, or lists of variables whose gradients go to the engine together (see
            the module docstring); needs ``variables``.
        variables: the variable of each gradient (used by ``groups`` only).
        when: None, or a boolean scalar tensor, the same on every rank: reduce the dense
            gradients only where it is true when the op runs, else give them back as they
            are (``ops._allreduce_when``; no gradient through it).
    Returns:
        The list of reduced gradients, None where the input was None; the gradients unchanged
        on a rank that is not in ``process_set``.
    Raises:
        ValueError: gradient_predivide_factor with an op other than Average.
        HvliteError: what the engine reports, as for ``hvlite.tensorflow.allreduce``.
    """
    with chained():
        return _allreduce_gradients(grads, prefix, compression, sparse_as_dense, op,
                                    gradient_predivide_factor, num_groups, process_set, groups,
                                    variables, when)


def _allreduce_gradients(grads, prefix, compression, sparse_as_dense, op,
                         gradient_predivide_factor, num_groups, process_set, groups, variables,
                         when):
    op = reduce_op(None, op)
    pre, post = _scale_factors(op, gradient_predivide_factor)
    if rank_and_size(process_set)[0] < 0:
        return list(grads)      # not a member of the set: local gradients, as Horovod's
    base = prefix if tf.executing_eagerly() else op_name(prefix, process_set=process_set)
    grads = list(grads)
    out = list(grads)
    dense = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if not sparse_as_dense:
                out[i] = _sparse_allreduce(g, op, pre, post, "%s.%d" % (base, i), process_set)
                continue
            grads[i] = tf.convert_to_tensor(g)
        dense.append(i)
    split = (_listed_groups(dense, variables, groups) if groups is not None
             else _split(dense, num_groups))
    for group in split:
        packed = [compression.compress(_tensor(grads[i])) for i in group]
        names = ["%s.%d" % (base, i) for i in group]
        if when is None:
            reduced = _allreduce_group([p[0] for p in packed], names, op, pre, post, process_set)
        else:
            reduced = _allreduce_when(when, [p[0] for p in packed], names, op, pre, post,
                                      process_set)
        for i, r, (_, ctx) in zip(group, reduced, packed):
            out[i] = compression.decompress(r, ctx)
    return out


def _key(source):
    """A hashable identity for a variable: tf.Variable.ref(); Keras 3 variables have no ref()
    (their id, kept valid by the layer that owns them)."""
    return source.ref() if hasattr(source, "ref") else ("id", id(source))


class _DistributedGradientTape(tf.GradientTape):
    """Mixed into the wrapped tape's class by ``DistributedGradientTape``."""

    def register_local_source(self, source):
        """Keep ``source``'s gradient on this rank: ``gradient`` does not reduce it (and divides
        it by the set's size when ``scale_local_gradients``, as Horovod does)."""
        self._hvlite_local.add(_key(source))

    def _is_local(self, source):
        return _key(source) in self._hvlite_local

    @library
    def gradient(self, target, sources, output_gradients=None, use_generic_names=False,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """The gradients of ``target`` w.r.t. ``sources``, allreduced over every rank (those of
        registered local sources stay local).

        Every rank must call it with the same sources, in the same order.

        Args:
            target, sources, output_gradients: as for ``tf.GradientTape.gradient``.
            use_generic_names: accepted, as in Horovod (the engine names come from the tape's
                position in the program, not from the variables).
            unconnected_gradients: as for ``tf.GradientTape.gradient`` (after Horovod's four
                positional parameters).

        Returns:
            Gradients in the structure of ``sources`` (None where unconnected).
        Raises:
            HvliteError: as for ``allreduce_gradients``.
        """
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat = tf.nest.flatten(grads)
        flat_sources = tf.nest.flatten(sources)
        local = [self._is_local(s) for s in flat_sources]
        reduced = iter(allreduce_gradients([g for g, l in zip(flat, local) if not l],
                                           "DistributedGradientTape",
                                           variables=[s for s, l in zip(flat_sources, local)
                                                      if not l],
                                           **self._hvlite_options))
        size = rank_and_size(self._hvlite_options["process_set"])[1]
        out = []
        for g, is_local in zip(flat, local):
            if not is_local:
                out.append(next(reduced))
            elif g is None or not self._hvlite_scale_local:
                out.append(g)
            elif isinstance(g, tf.IndexedSlices):
                out.append(tf.IndexedSlices(g.values / size, g.indices, g.dense_shape))
            else:
                out.append(g / size)
        return tf.nest.pack_sequence_as(grads, out)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None,
                                       use_generic_names=False):
        """``gradient`` split into two lists of (source, gradient): local sources, the rest."""
        grads = self.gradient(target, sources, output_gradients)
        local, shared = [], []
        for s, g in zip(sources, grads):
            (local if self._is_local(s) else shared).append((s, g))
        return local, shared


def DistributedGradientTape(gradtape, device_dense="", device_sparse="",
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Wrap a ``tf.GradientTape`` so that ``gradient()`` allreduces the gradients.

    Every rank must call ``gradient`` with the same sources, in the same order. The tape also
    has Horovod's ``register_local_source(variable)`` (that variable's gradient stays on this
    rank) and ``get_local_and_global_gradients(target, sources)`` (two lists of (source,
    gradient): the local sources', the rest).

    Args:
        gradtape: the tape that recorded the forward pass (or a fresh one to use as a context).
        compression: ``Compression.none`` or ``Compression.fp16``.
        sparse_as_dense: densify ``tf.IndexedSlices`` gradients before reducing them (else
            their values and indices are allgathered).
        op: ``hvd.Average`` (the default), ``hvd.Sum``, or another reduce op.
        gradient_predivide_factor: with op Average, multiply the gradients by 1/f before the
            sum and by f/size after it (Horovod's).
        num_groups: deprecated spelling of an integer ``groups``.
        groups: an integer > 0: split dense gradients into this many fused submissions; a
            list of lists of variables: each list's gradients in one submission, each other
            gradient alone; None (default): one submission, fused by the engine.
        process_set: the set to reduce over (default: every rank); on a rank outside it,
            ``gradient`` returns the local gradients.
        scale_local_gradients: divide the gradients of sources registered with
            ``register_local_source`` by the set's size (Horovod's default).
        device_dense: accepted for compatibility (data goes through host memory).
        device_sparse: accepted for compatibility.
    Returns:
        A tape of the same class that records into the same tape.
    Raises:
        ValueError: gradient_predivide_factor with op other than Average; ``groups`` neither
            an integer > 0 nor a list of lists.
    """
    num_groups, groups = grouping(num_groups, groups, "DistributedGradientTape")
    _scale_factors(reduce_op(None, op), gradient_predivide_factor)
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__),
               {"__doc__": gradtape.__class__.__doc__})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._hvlite_options = dict(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                                gradient_predivide_factor=gradient_predivide_factor,
                                num_groups=num_groups, groups=groups, process_set=process_set)
    tape._hvlite_local = set()
    tape._hvlite_scale_local = scale_local_gradients
    return tape


def _local_layer_list(local_layers, who):
    """``local_layers`` (None, a Keras layer or a list of them) as a list; ValueError naming
    ``who`` when an item is not a Keras layer."""
    import keras
    if local_layers is None:
        return []
    if isinstance(local_layers, keras.layers.Layer):
        return [local_layers]
    if not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("%s: every local layer must be a keras.layers.Layer" % who)
    return list(local_layers)


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="",
                                   compression=Compression.none, sparse_as_dense=False,
                                   op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set,
                                   local_layers=None, scale_local_gradients=True):
    """As :func:`DistributedGradientTape`, but the gradients of the trainable weights of
    ``local_layers`` stay on this rank (divided by the set's size when
    ``scale_local_gradients``, as Horovod does). The arguments not listed here are as for
    :func:`DistributedGradientTape`.

    Args:
        local_layers: a Keras layer or a list of them.
    Returns:
        A tape of the same class that records into the same tape.
    Raises:
        ValueError: an item of ``local_layers`` is not a Keras layer; otherwise as
            :func:`DistributedGradientTape`.
    """
    local_layers = _local_layer_list(local_layers, "PartialDistributedGradientTape")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
