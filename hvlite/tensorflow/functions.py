"""Variable and object collectives for TensorFlow (Horovod's ``broadcast_variables``,
``broadcast_``, ``broadcast_object``, ``allgather_object``), and the TF1 session hook that
broadcasts the global variables (``BroadcastGlobalVariablesHook``).

Start every rank from the same weights with ``hvd.broadcast_variables(model.variables,
root_rank=0)`` after the variables exist; share Python objects (a config, a list of files)
with ``hvd.broadcast_object``.

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
    """Assign ``root_rank``'s values to ``variables`` on every rank.

    Every rank of the process set must call it with the same list of variables (shapes,
    dtypes), in the same order. The variables go to the engine together, so they fuse. Works
    eagerly and inside a ``tf.function``.

    Args:
        variables: a list of ``tf.Variable`` (or Keras variables), e.g. ``model.variables``.
        root_rank: the rank whose values every rank receives.
        process_set: the set to broadcast in (default: every rank).
        inplace: accepted for compatibility (the variables are always assigned).
        name: a base name for the engine; generated when None.
    Returns:
        None eagerly; inside a ``tf.function``, the op that does the assignments.
    Raises:
        TypeError: a variable of an unsupported dtype (before anything is sent).
        MismatchError: the ranks disagree on the variables' shapes or dtypes.
    """
    variables = list(variables)
    if not variables:
        return None
    outs = _broadcast_values(variables, root_rank, name, process_set)
    assigns = [v.assign(out) for v, out in zip(variables, outs)]
    return None if tf.executing_eagerly() else tf.group(*assigns)


def broadcast_global_variables(root_rank):
    """Broadcast ``root_rank``'s TF1 global variables (``tf.compat.v1.global_variables()``) to
    every rank: in a TF1 graph, returns the op that assigns them (run it in a session).

    Every rank must build the op and run it.

    Args:
        root_rank: the rank whose values every rank takes.
    Returns:
        The op that broadcasts and assigns the variables.
    Raises:
        RuntimeError: eagerly or inside a ``tf.function``, where there is no global variable
            collection (as in Horovod): use ``broadcast_variables(model.variables, root_rank)``.
    """
    if tf.executing_eagerly() or in_function():
        raise RuntimeError("hvlite.tensorflow.broadcast_global_variables(root_rank) needs a TF1 "
                           "graph (global variable collection); in eager mode or a tf.function "
                           "call broadcast_variables(variables, root_rank)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank,
                               name="broadcast_global_variables") or tf.no_op()


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A TF1 ``SessionRunHook`` that broadcasts ``root_rank``'s global variables when a
    ``MonitoredSession`` starts, so every rank begins from the same values, whether initialized
    at random or restored from a checkpoint. Every rank must use it.

    Args:
        root_rank: the rank whose variables every rank takes.
        device: the device for the broadcast op (data goes through host memory anyway).
    """

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        """The rank whose variables every rank takes."""
        self.device = device
        """The device of the broadcast op."""
        self.bcast_op = None
        """The broadcast op, built by ``begin()`` (None before)."""

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
    """Assign ``root_rank``'s values to ``variables`` on every rank, as
    :func:`broadcast_variables` does, and return the values assigned (Horovod's ``broadcast_``).

    Args:
        variables: a list of ``tf.Variable``.
        root_rank: the rank whose values every rank takes.
        name: a base name for the engine; generated when None.
        process_set: the set to broadcast in (default: every rank).
    Returns:
        The values assigned, one per variable (in a graph, tensors that run the assignment when
        evaluated, as Horovod's).
    Raises:
        TypeError: a variable of an unsupported dtype (before anything is sent).
        MismatchError: the ranks disagree on the variables' shapes or dtypes.
    """
    variables = list(variables)
    if not variables:
        return []
    outs = _broadcast_values(variables, root_rank, name, process_set)
    return [v.assign(out) for v, out in zip(variables, outs)]


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Return ``root_rank``'s ``obj`` on every rank (any picklable object). A Python call, run
    at once: not inside a ``tf.function``.

    Every rank of the process set must call it, in the same order. Objects travel as pickles:
    only unpickle data from ranks of your own job.

    Args:
        obj: the object to send (on the root; ignored elsewhere).
        root_rank: the rank whose object every rank gets.
        session: TF1's session; ignored (objects go through the engine directly).
        name: a name for the engine; generated when None.
        process_set: the set to broadcast in (default: every rank).
    Returns:
        The root's object.
    Raises:
        RuntimeError: called while tracing a ``tf.function``.
    """
    _eager_only("broadcast_object")
    return _broadcast_object(obj, root_rank, name=name, process_set=process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """Horovod's TF1 helper: return a function ``fn(obj)`` that returns ``root_rank``'s ``obj`` on
    every rank; each call is a :func:`broadcast_object`, so every rank calls the function the
    same number of times.

    Args:
        root_rank: the rank whose object every rank gets.
        session: ignored (objects go through the engine directly, eagerly or beside a TF1
            graph).
        name: a name for the engine; generated when None.
        process_set: the set to broadcast in (default: every rank).
    Returns:
        The function.
    """
    def broadcast_fn(obj):
        return broadcast_object(obj, root_rank, name=name, process_set=process_set)
    return broadcast_fn


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Return the list of every rank's ``obj`` (any picklable object), in rank order. A Python
    call, run at once: not inside a ``tf.function``.

    Every rank of the process set must call it, in the same order.

    Args:
        obj: this rank's object.
        session: TF1's session; ignored.
        name: a name for the engine; generated when None.
        process_set: the set to gather over (default: every rank).
    Returns:
        A list with one object per rank of the set.
    Raises:
        RuntimeError: called while tracing a ``tf.function``.
    """
    _eager_only("allgather_object")
    return _allgather_object(obj, name=name, process_set=process_set)


def _eager_only(what):
    # a TF1 graph (Session) is fine: the call runs now, in Python, like an eager one
    if in_function():
        raise RuntimeError("hvlite.tensorflow.%s works on Python objects and cannot run inside "
                           "a tf.function; call it eagerly" % what)
