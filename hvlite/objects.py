"""Collectives on picklable Python objects (Horovod's ``broadcast_object``/``allgather_object``).

Objects travel as pickles: unpickle only what ranks of your own job send.

Contract: both are collectives (every rank calls, same order). Objects travel as pickles in
uint8 arrays; only unpickle data from ranks of your own job. Errors as in ``hvlite.ops``.
"""
import pickle

import numpy as np

from .basics import rank
from .handles import auto_name
from .ops import allgather, broadcast

__all__ = ["broadcast_object", "allgather_object"]


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Return ``root_rank``'s ``obj`` on every rank.

    Every rank of the process set must call it, in the same order.

    Args:
        obj: any picklable object (only the root's is used).
        root_rank: the rank whose object every rank gets.
        name: a base name for the two broadcasts it runs (generated when None).
        process_set: the set to broadcast in (None: every rank).
    Returns:
        The root's object (on the root ``obj`` itself, elsewhere an unpickled copy).
    Raises:
        HvliteError: as for :func:`hvlite.ops.broadcast`.
        pickle.PicklingError: the root's ``obj`` cannot be pickled (raised on the root).
    """
    name = name or auto_name("broadcast_object", process_set)
    if rank() == root_rank:
        payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        length = np.array([payload.size], dtype=np.int64)
    else:
        payload, length = None, np.zeros(1, dtype=np.int64)
    length = broadcast(length, root_rank, name=name + ".size", process_set=process_set)
    if payload is None:
        payload = np.empty(int(length[0]), dtype=np.uint8)
    data = broadcast(payload, root_rank, name=name + ".data", process_set=process_set)
    return obj if rank() == root_rank else pickle.loads(data.tobytes())


def allgather_object(obj, name=None, process_set=None):
    """Return every rank's ``obj``, as a list in rank order.

    Every rank of the process set must call it, in the same order.

    Args:
        obj: any picklable object.
        name: a base name for the two allgathers it runs (generated when None).
        process_set: the set to gather over (None: every rank).
    Returns:
        A list with one unpickled object per rank of the set.
    Raises:
        HvliteError: as for :func:`hvlite.ops.allgather`.
        pickle.PicklingError: ``obj`` cannot be pickled (raised on its rank).
    """
    name = name or auto_name("allgather_object", process_set)
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    sizes = allgather(np.array([payload.size], dtype=np.int64), name=name + ".size",
                      process_set=process_set)
    data = allgather(payload, name=name + ".data", process_set=process_set)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [pickle.loads(data[offsets[i]:offsets[i + 1]].tobytes()) for i in range(len(sizes))]
