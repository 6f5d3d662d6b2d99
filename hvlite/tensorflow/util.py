"""``hvlite.tensorflow.util``: the module path of Horovod's ``horovod.tensorflow.util``, for the
helpers scripts and Horovod's tests take from it.

Contract: ``_executing_eagerly()`` is True when TensorFlow runs eagerly here (not while tracing
a ``tf.function``, not in a TF1 graph); ``vars_to_refs``/``refs_to_vars`` turn (nested lists
of) ``tf.Variable`` into hashable references and back. Nothing here is a collective.
"""
import tensorflow as tf

__all__ = ["vars_to_refs", "refs_to_vars"]


def _executing_eagerly():
    """True if TensorFlow executes eagerly at this point."""
    return tf.executing_eagerly()


def vars_to_refs(variables):
    """A variable's ``ref()``, or a tuple of them for a (nested) list."""
    if isinstance(variables, list):
        return tuple(vars_to_refs(v) for v in variables)
    return variables.ref()


def refs_to_vars(refs):
    """The inverse of ``vars_to_refs``: variables for (nested tuples of) references."""
    if isinstance(refs, tuple):
        return [refs_to_vars(r) for r in refs]
    return refs.deref()
