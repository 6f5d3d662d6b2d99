"""Running NumPy-level hvlite collectives on TensorFlow tensors, eagerly and inside tf.function.

Contract:
- ``run(np_fn, tensors, out_dtypes)`` calls ``np_fn(list_of_numpy_arrays) -> list_of_arrays``
  on the tensors' values. Eagerly it runs at once; while tracing a ``tf.function`` it adds one
  stateful ``tf.numpy_function`` op, so the collective runs at every execution of the graph, in
  program order (TensorFlow chains stateful ops of a function in the order they were created,
  which is the same order on every rank). Engine errors raised by ``np_fn`` surface eagerly as
  the hvlite exception, of a class that also derives from the ``tf.errors`` class Horovod's ops
  raise (``MismatchError`` is a ``FailedPreconditionError``, ``HvliteInvalidArgument`` an
  ``InvalidArgumentError``); inside a graph, ``tf.numpy_function`` turns them into a
  ``tf.errors.OpError`` carrying the message (``InvalidArgumentError`` for the ``ValueError``
  ones, ``UnknownError`` for the others: the numpy_function op picks the class).
- Copies: eager CPU tensors are read through ``np.asarray`` (no copy); results that are
  64-byte aligned (engine memory, ``hvlite.buffers``, which the ops allocate their results in)
  come back to TensorFlow through DLPack (no copy); bfloat16, which DLPack cannot describe, and
  unaligned results are copied once by ``tf.convert_to_tensor``. Inside a graph, ``tf.numpy_function`` hands NumPy
  arrays in and out (measured cheaper here than ``tf.py_function``, whose body runs eager ops).
- ``op_name(kind, name)`` gives the engine name of one call: the user's name, else in eager mode
  ``hvlite.handles.auto_name(kind)`` (the same on every rank that calls in the same order), and
  in a graph ``<path>.<kind>.<n>``. The path names the traced functions from the outermost
  down to the one being traced (``train/step``), and the counter is kept per trace of that
  function; control-flow branches and loop bodies count in the function around them. So every
  execution of a traced function reuses the same names (the engine's response cache then hits),
  and a retrace on one rank only, of any function, outer or inner, cannot shift the names of
  the others (Keras traces a step twice on a rank whose model builds its variables in it). The
  numbers in TF's generated functions' names (``__backward_step_63``) are dropped: they count
  traces, which ranks need not share. A TF1 ``tf.Graph`` (run by a Session) has no name: it is
  ``graph<k>``, numbered in the order hvlite first sees each graph.
- Order: each engine call holds a TensorFlow thread until every rank has made it, so every rank
  must run a graph's collectives in one order. In a ``tf.function`` each collective writes one
  order variable of hvlite's just before and just after it, and follows the previous collective
  of its function; TensorFlow orders ops that write one variable in program order, and with
  them calls of inner functions and branches that hold collectives (which it does not order by
  themselves when they read variables), so a function's collectives run one at a time, in the
  order they were made, on every rank, also in gradient functions TensorFlow builds without
  automatic ordering. Names that repeat within a step (an inner function called twice) are
  then calls one after the other, which the engine allows. In a TF1 graph, see ``run`` and
  ``chained``.
- ``np_dtype(tf_dtype)`` maps a TensorFlow dtype to NumPy and raises ``TypeError`` for a dtype
  the engine does not support, before anything is sent.
- ``wait_all(handles)`` (``hvlite.handles``') waits for every handle and then raises the first
  error, so nothing is left in flight, and no name taken, when one request of a group fails.
"""
import collections
import contextlib
import itertools
import re

import numpy as np
import tensorflow as tf
from tensorflow.python.framework.func_graph import FuncGraph
from tensorflow.python.ops.control_flow_v2_func_graphs import ControlFlowFuncGraph

from .. import errors
from ..buffers import is_aligned
from ..dtypes import by_name
from ..handles import auto_name, wait_all
from ..process_sets import rank_and_size

_from_dlpack = tf.experimental.dlpack.from_dlpack
try:
    from tensorflow.python.eager.record import could_possibly_record as _could_possibly_record
except ImportError:     # pragma: no cover - older/newer layouts: always record
    def _could_possibly_record():
        return True


_DLPACK_DTYPES = frozenset(np.dtype(t) for t in (
    "uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "float32", "float64", "bool"))
_NP_DTYPES = {}     # tf.DType -> np.dtype, for the dtypes the engine supports


def np_dtype(dtype):
    """The NumPy dtype for a TensorFlow dtype the engine supports.

    Raises:
        TypeError: the engine does not support this dtype (e.g. string, complex, uint32).
    """
    try:
        return _NP_DTYPES[dtype]
    except (KeyError, TypeError):
        pass
    dtype = tf.as_dtype(dtype)
    by_name(dtype.name)     # TypeError for a dtype the engine does not support
    result = _NP_DTYPES[dtype] = np.dtype(dtype.as_numpy_dtype)
    return result


def needs_gradient():
    """False when no gradient tape is recording (eager calls then skip the gradient wrapper);
    always True while tracing a function."""
    if not tf.executing_eagerly():
        return True
    try:
        return _could_possibly_record()
    except Exception:   # noqa: BLE001 - private API changed: always record
        return True


def to_numpy(tensor):
    """A read-only NumPy view of an eager CPU tensor (a copy only for other devices)."""
    try:
        return np.asarray(tensor)
    except ValueError:      # 0-d bfloat16: __array__ gives a scalar
        return np.asarray(tensor.numpy())


def to_tensor(array):
    """A TensorFlow tensor holding ``array`` (shared through DLPack where possible)."""
    if array.dtype in _DLPACK_DTYPES and array.flags.writeable and is_aligned(array):
        try:
            return _from_dlpack(array.__dlpack__())
        except (BufferError, TypeError, ValueError):
            pass
    return tf.convert_to_tensor(array)


def _function_scopes(graph):
    """The traced functions enclosing ``graph``, innermost first: each FuncGraph on the way out
    that is not a control-flow branch or loop body; ``[graph]`` for a TF1 graph."""
    scopes = []
    while isinstance(graph, FuncGraph):
        if not isinstance(graph, ControlFlowFuncGraph):
            scopes.append(graph)
        graph = graph.outer_graph
    return scopes or [graph]


_TRACE_NUMBER = re.compile(r"_\d+(?=_|$)")


def _function_name(graph):
    """A traced function's name as every rank has it: TF's generated functions
    (``__backward_step_63``, ``__inference_...``) lose the trace numbers in their names; a
    user's function keeps its name (``layer_1``)."""
    return _TRACE_NUMBER.sub("", graph.name) if graph.name.startswith("__") else graph.name


_PLAIN_GRAPHS = itertools.count()


def _graph_prefix(graph):
    """A function's name; for a TF1 ``tf.Graph`` (run by a Session), which has none, a number
    given in the order hvlite first sees each graph (the same order on every rank)."""
    if isinstance(graph, FuncGraph):
        return _function_name(graph)
    prefix = getattr(graph, "_hvlite_prefix", None)
    if prefix is None:
        prefix = graph._hvlite_prefix = "graph%d" % next(_PLAIN_GRAPHS)
    return prefix


def in_function():
    """True while tracing a ``tf.function`` (not in eager mode, not in a TF1 graph)."""
    return isinstance(tf.compat.v1.get_default_graph(), FuncGraph)


def op_name(kind, name=None, process_set=None):
    """The engine name for one collective call (see the module docstring); counters are kept
    per process set, so calls on a set other ranks are not in do not shift their names.

    Raises:
        HvliteInvalidArgument: (a ValueError) while building a graph, ``process_set`` names
            no registered set (eagerly the call itself raises it).
    """
    if process_set is not None and not tf.executing_eagerly():
        rank_and_size(process_set)
    if name:
        return name
    if tf.executing_eagerly():
        return auto_name(kind, process_set)
    scopes = _function_scopes(tf.compat.v1.get_default_graph())
    counters = getattr(scopes[0], "_hvlite_name_counters", None)
    if counters is None:
        counters = scopes[0]._hvlite_name_counters = collections.Counter()
    key = (kind, getattr(process_set, "process_set_id", None) or 0)
    index = counters[key]
    counters[key] += 1
    path = "/".join(_graph_prefix(g) for g in reversed(scopes))
    return "%s.%s.%d" % (path, kind, index)


def submit_all(submit_one, items):
    """Call ``submit_one(item)`` for each item; if one submission fails, wait for the ones
    already in flight before raising. Returns the list of handles."""
    handles = []
    try:
        for item in items:
            handles.append(submit_one(item))
    except Exception:
        try:
            wait_all(handles)
        finally:
            raise
    return handles


# hvlite's engine errors, raised eagerly, are also the tf.errors class Horovod's ops raise
_TF_ERRORS = ((errors.MismatchError, tf.errors.FailedPreconditionError),
              (errors.HvliteInvalidArgument, tf.errors.InvalidArgumentError),
              (errors.HvliteTimeoutError, tf.errors.DeadlineExceededError),
              (errors.HvliteShutdownError, tf.errors.UnavailableError),
              (errors.HvliteError, tf.errors.UnknownError))
_TF_CLASSES = {}


def tf_error(error):
    """``error`` (an HvliteError) as an instance of a class deriving from both its own class
    and the matching ``tf.errors.OpError`` subclass, with the same message."""
    cls = type(error)
    both = _TF_CLASSES.get(cls)
    if both is None:
        tf_cls = next(t for h, t in _TF_ERRORS if issubclass(cls, h))

        def init(self, message):
            tf_cls.__init__(self, None, None, message)
        both = _TF_CLASSES[cls] = type(cls.__name__, (cls, tf_cls),
                                       {"__init__": init, "__module__": cls.__module__})
    return both(str(error))


def library(fn):
    """Keep AutoGraph out of hvlite's own code (it is plain Python control flow)."""
    return tf.autograph.experimental.do_not_convert(fn)


_UNCHAINED = [False]
_CALL_CHAIN = []    # while one call builds its list of ops (chained()): [its last op]


@contextlib.contextmanager
def unchained():
    """Ops made inside stay out of a TF1 graph's chains (variable broadcasts, usually run once
    on their own before training: chained, running one would run the training step's)."""
    _UNCHAINED[0] = True
    try:
        yield
    finally:
        _UNCHAINED[0] = False


@contextlib.contextmanager
def chained():
    """In a TF1 graph, the ops made inside (one call's list of gradients) form a chain of their
    own: each follows the one made before it, and none follows an op made outside, so fetching
    the training step runs no other collective, and fetching another op never runs the step's.
    Nested calls join the outermost chain."""
    if _CALL_CHAIN:
        yield
        return
    _CALL_CHAIN.append(None)
    try:
        yield
    finally:
        _CALL_CHAIN.pop()


def run(np_fn, tensors, out_dtypes):
    """Run ``np_fn`` on the tensors' values, eagerly or as one graph op.

    Args:
        np_fn: list of numpy arrays -> list of numpy arrays (one per ``out_dtypes``).
        tensors: list of tf.Tensor.
        out_dtypes: list of tf.DType of the results.
    Returns:
        List of tf.Tensor (static shapes unknown in a graph: callers set them).
    """
    if tf.executing_eagerly():
        try:
            arrays = np_fn([to_numpy(t) for t in tensors])
        except errors.HvliteError as e:
            raise tf_error(e) from e
        return [to_tensor(a) for a in arrays]

    graph = tf.compat.v1.get_default_graph()
    if isinstance(graph, FuncGraph):
        return _ordered_in_function(graph, np_fn, tensors, out_dtypes)
    ran = [False]

    def numpy_body(*values):     # 0-d inputs arrive as NumPy scalars
        ran[0] = True
        return np_fn([np.asarray(v) for v in values])
    # A TF1 graph runs ops that do not depend on each other in any order, and each engine call
    # holds a TensorFlow thread until every rank has made it, so ops fetched together must run
    # in one order on every rank: they are chained in the order they were made (tf.function
    # does the same for its stateful ops). One call's list of ops (chained()) is a chain of its
    # own; other ops chain to the one made before them, unless a Session has already run it.
    if _UNCHAINED[0]:
        deps = []
    elif _CALL_CHAIN:
        deps = [_CALL_CHAIN[0]] if _CALL_CHAIN[0] is not None else []
    else:
        chain = getattr(graph, "_hvlite_chain", None)
        deps = [chain[0]] if chain is not None and not chain[1][0] else []
    with tf.control_dependencies(deps):
        outs = tf.numpy_function(numpy_body, list(tensors), list(out_dtypes), stateful=True)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    if outs and not _UNCHAINED[0]:
        op = outs[0] if isinstance(outs[0], tf.Operation) else outs[0].op
        if _CALL_CHAIN:
            _CALL_CHAIN[0] = op
        else:
            graph._hvlite_chain = (op, ran)
    return outs


_ORDER = []     # the order variable (see the module docstring), made on first use


def _order_variable():
    """hvlite's order variable: made outside any function (``tf.init_scope``), on the CPU; None
    where that is a TF1 graph (a variable there would need a Session to initialize it)."""
    if not tf.compat.v1.executing_eagerly_outside_functions():
        return None         # checked first: an eager variable cannot be captured in a TF1 graph
    if not _ORDER:
        with tf.init_scope(), tf.device("/cpu:0"):
            _ORDER.append(tf.Variable(0, dtype=tf.int64, trainable=False, name="hvlite_order"))
    return _ORDER[0]


def _ordered_in_function(graph, np_fn, tensors, out_dtypes):
    """``run`` while tracing a function: one numpy_function op, after the previous collective
    of ``graph`` and between two writes of the order variable (module docstring, Order)."""
    order = _order_variable()
    last = getattr(graph, "_hvlite_last", None)
    with tf.control_dependencies([last] if last is not None else []):
        before = order.assign_add(1, read_value=False) if order is not None else last
    with tf.control_dependencies([before] if before is not None else []):
        outs = tf.numpy_function(lambda *values: np_fn([np.asarray(v) for v in values]),
                                 list(tensors), list(out_dtypes), stateful=True)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    done = [o if isinstance(o, tf.Operation) else o.op for o in outs[:1]] or [before]
    with tf.control_dependencies([d for d in done if d is not None]):
        graph._hvlite_last = (order.assign_add(1, read_value=False) if order is not None
                              else done[0])
    return outs
