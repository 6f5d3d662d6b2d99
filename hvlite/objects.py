"""Collectives on Python objects (Horovod's ``broadcast_object``/``allgather_object``).

Contract: both are collectives (every rank calls, same order). Objects travel as pickles in
uint8 arrays, made with cloudpickle where it can be imported (as Horovod does: lambdas,
closures and classes defined in a function travel too), else with the standard pickle; only
unpickle data from ranks of your own job. Each call runs the same two collectives on every
rank whatever happens, so an object that cannot be pickled raises ``pickle.PicklingError`` on
every rank, naming the ranks that could not pickle theirs, and leaves no rank waiting; other
errors as in ``hvlite.ops``.
"""
import pickle

import numpy as np

from .basics import rank
from .handles import auto_name
from .ops import allgather, broadcast

try:
    import cloudpickle as _pickler
except ImportError:   # pragma: no cover - cloudpickle is an optional dependency
    _pickler = pickle

__all__ = ["broadcast_object", "allgather_object"]


def _dumps(obj):
    """(bytes, error): the pickle of ``obj`` and None, or the error's text and the error."""
    try:
        return _pickler.dumps(obj), None
    except Exception as e:     # noqa: BLE001 - pickling raises TypeError, AttributeError, ...
        return ("%s: %s" % (type(e).__name__, e)).encode("utf-8", "replace"), e


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Return ``root_rank``'s ``obj`` on every rank.

    Every rank of the process set must call it, in the same order.

    Args:
        obj: any object cloudpickle (or, without it, pickle) can pickle (only the root's is
            used).
        root_rank: the rank whose object every rank gets.
        name: a base name for the two broadcasts it runs (generated when None).
        process_set: the set to broadcast in (None: every rank).
    Returns:
        The root's object (on the root ``obj`` itself, elsewhere an unpickled copy).
    Raises:
        HvliteError: as for :func:`hvlite.ops.broadcast`.
        pickle.PicklingError: the root's ``obj`` cannot be pickled (on every rank, with the
            root's error; on the root chained to it).
    """
    name = name or auto_name("broadcast_object", process_set)
    error = None
    if rank() == root_rank:
        data, error = _dumps(obj)
        payload = np.frombuffer(data, dtype=np.uint8)
        header = np.array([payload.size, error is None], dtype=np.int64)
    else:
        payload, header = None, np.zeros(2, dtype=np.int64)
    header = broadcast(header, root_rank, name=name + ".size", process_set=process_set)
    if payload is None:
        payload = np.empty(int(header[0]), dtype=np.uint8)
    data = broadcast(payload, root_rank, name=name + ".data", process_set=process_set)
    if not header[1]:
        raise pickle.PicklingError("broadcast_object '%s': rank %d cannot pickle its object: %s"
                                   % (name, root_rank, data.tobytes().decode("utf-8", "replace"))
                                   ) from error
    return obj if rank() == root_rank else pickle.loads(data.tobytes())


def allgather_object(obj, name=None, process_set=None):
    """Return every rank's ``obj``, as a list in rank order.

    Every rank of the process set must call it, in the same order.

    Args:
        obj: any object cloudpickle (or, without it, pickle) can pickle.
        name: a base name for the two allgathers it runs (generated when None).
        process_set: the set to gather over (None: every rank).
    Returns:
        A list with one unpickled object per rank of the set.
    Raises:
        HvliteError: as for :func:`hvlite.ops.allgather`.
        pickle.PicklingError: a rank's ``obj`` cannot be pickled (on every rank, naming those
            ranks by their place in the set, with the first one's error).
    """
    name = name or auto_name("allgather_object", process_set)
    data, error = _dumps(obj)
    payload = np.frombuffer(data, dtype=np.uint8)
    headers = allgather(np.array([[payload.size, error is None]], dtype=np.int64),
                        name=name + ".size", process_set=process_set)
    data = allgather(payload, name=name + ".data", process_set=process_set)
    sizes = headers[:, 0]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    parts = [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(sizes))]
    failed = [i for i in range(len(sizes)) if not headers[i, 1]]
    if failed:
        raise pickle.PicklingError("allgather_object '%s': rank(s) %s of the set cannot pickle "
                                   "their object; rank %d's error: %s"
                                   % (name, failed, failed[0],
                                      parts[failed[0]].decode("utf-8", "replace"))) from error
    return [pickle.loads(part) for part in parts]
