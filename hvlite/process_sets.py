"""Process sets: the groups of ranks a collective runs on.

Contract: ``global_process_set`` (every rank, id 0) is the only set the engine runs so far;
``_set_id(process_set)`` turns the ``process_set=`` argument (``None`` or a ``ProcessSet``)
into the engine's id and raises ``ValueError`` for a set that is not registered.
"""

__all__ = ["ProcessSet", "global_process_set"]


class ProcessSet:
    """A group of ranks (Horovod's ``hvd.ProcessSet``)."""

    def __init__(self, ranks=None):
        self.ranks = None if ranks is None else sorted(int(r) for r in ranks)
        self.process_set_id = None

    def __repr__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)


global_process_set = ProcessSet()
global_process_set.process_set_id = 0


def _set_id(process_set):
    if process_set is None or process_set is global_process_set:
        return 0
    if isinstance(process_set, ProcessSet) and process_set.process_set_id == 0:
        return 0
    raise ValueError("process set %r is not registered with hvlite (only the global "
                     "process set is supported so far)" % (process_set,))
