"""Variable and object collectives for TensorFlow (Horovod's ``broadcast_variables``,
``broadcast_``, ``broadcast_object``, ``allgather_object``), and the TF1 session hook that
broadcasts the global variables (``BroadcastGlobalVariablesHook``).

Contract: collectives (every rank of the process set calls them, in the same order).
``broadcast_variables`` sends every variable in one engine submission (they fuse) and assigns
root_rank's values on every rank; it works eagerly and inside ``tf.function``.
``BroadcastGlobalVariablesHook(root_rank)`` is a ``tf.compat.v1.train.SessionRunHook``: it
builds ``broadcast_global_variables(root_rank)`` in the graph a ``MonitoredSession`` finalizes
(``begin``) and runs it once the session is created and its variables initialized or restored
(``after_create_session``); every rank uses it, with the same graph. The object
collectives are eager-only Python calls (objects travel as pickles; only unpickle data from
ranks of your own job).
"""
import tensorflow as tf

from ..objects import allgather_object as _allgather_object, broadcast_object as _broadcast_object
from ..process_sets import global_process_set
from ._bridge import in_function, library, np_dtype, op_name, unchained
from .ops import _broadcast_raw

__all__ = ["broadcast_global_variables", "broadcast_variables", "broadcast_", "broadcast_object",
           "broadcast_object_fn", "allgather_object", "BroadcastGlobalVariablesHook"]


def _broadcast_values(variables, root_rank, name, process_set):
    values = [tf.convert_to_tensor(v) for v in variables]
    for v in values:
        np_dtype(v.dtype)
    base = op_name("broadcast_variables", name, process_set)
    with unchained():
        return _broadcast_raw(values, ["%s.%d" % (base, i) for i in range(len(values))],
                              root_rank, process_set)


@library
def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False,
                        name=None):
    """Assign root_rank's values to ``variables`` on every rank.

    Every rank must call it with the same list of variables (shapes, dtypes), in the same order.

    Args:
        variables: list of tf.Variable (or Keras variables).
        root_rank: the rank whose values every rank receives.
        process_set: the global process set.
        inplace: accepted for compatibility (variables are always assigned).
        name: base engine name; generated when None.
    Returns:
        None eagerly; inside a tf.function, the op that does the assignments.
    Raises:
        TypeError: a variable of an unsupported dtype. Engine errors as ``allreduce``.
    """
    variables = list(variables)
    if not variables:
        return None
    outs = _broadcast_values(variables, root_rank, name, process_set)
    assigns = [v.assign(out) for v, out in zip(variables, outs)]
    return None if tf.executing_eagerly() else tf.group(*assigns)


def broadcast_global_variables(root_rank):
    """Broadcast root_rank's TF1 global variables (``tf.compat.v1.global_variables()``): in a
    TF1 graph, returns the op that assigns them.

    Raises:
        RuntimeError: eagerly or in a tf.function, where no global variable collection exists
            (as in Horovod): use ``broadcast_variables(model.variables, root_rank)``.
    """
    if tf.executing_eagerly() or in_function():
        raise RuntimeError("hvlite.tensorflow.broadcast_global_variables(root_rank) needs a TF1 "
                           "graph (global variable collection); in eager mode or a tf.function "
                           "call broadcast_variables(variables, root_rank)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank,
                               name="broadcast_global_variables") or tf.no_op()


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Broadcast root_rank's global variables when a ``MonitoredSession`` (TF1 graph) starts,
    so every rank begins from the same values, whether initialized at random or restored
    from a checkpoint. Every rank must use it."""

    def __init__(self, root_rank, device=""):
        """Args:
            root_rank: the rank whose variables every rank takes.
            device: the device for the broadcast op (data goes through host memory anyway).
        """
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.bcast_op = None

    def begin(self):
        """Build the broadcast op in the graph being finalized (again for a new graph)."""
        graph = tf.compat.v1.get_default_graph()
        if self.bcast_op is None or self.bcast_op.graph is not graph:
            with tf.device(self.device):
                self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        """Run the broadcast (collective: every rank's session does it once)."""
        session.run(self.bcast_op)


@library
def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast of variables (Horovod's ``broadcast_``).

    Returns:
        The values assigned, one per variable (in a graph, tensors that run the assignment
        when evaluated, as Horovod's).
    """
    variables = list(variables)
    if not variables:
        return []
    outs = _broadcast_values(variables, root_rank, name, process_set)
    return [v.assign(out) for v, out in zip(variables, outs)]


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Return root_rank's picklable ``obj`` on every rank (eager only; ``session`` is ignored).

    Raises:
        RuntimeError: called while tracing a tf.function.
    """
    _eager_only("broadcast_object")
    return _broadcast_object(obj, root_rank, name=name, process_set=process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Horovod's TF1 helper: a function ``fn(obj)`` that returns root_rank's ``obj`` on every rank,
    callable again and again (each call is ``broadcast_object``; ``session`` is ignored, since
    objects go through the engine directly, eagerly or beside a TF1 graph).
    """
    def broadcast_fn(obj):
        return broadcast_object(obj, root_rank, name=name, process_set=process_set)
    return broadcast_fn


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Return the list of every rank's picklable ``obj``, in rank order (eager only).

    Raises:
        RuntimeError: called while tracing a tf.function.
    """
    _eager_only("allgather_object")
    return _allgather_object(obj, name=name, process_set=process_set)


def _eager_only(what):
    # a TF1 graph (Session) is fine: the call runs now, in Python, like an eager one
    if in_function():
        raise RuntimeError("hvlite.tensorflow.%s works on Python objects and cannot run inside "
                           "a tf.function; call it eagerly" % what)
