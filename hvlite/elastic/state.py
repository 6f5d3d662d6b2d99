"""Horovod's elastic ``State`` and ``ObjectState``, on commits that survive any worker's death.

An elastic job keeps what must survive a change of workers in a state object, usually an
:class:`ObjectState` (or a framework's: ``hvlite.torch.elastic.TorchState``,
``hvlite.tensorflow.elastic.TensorFlowKerasState``), and calls its :meth:`State.commit` every
few batches. When workers are lost or added, every worker of the new world starts from the
last commit, which hvlrun keeps; only the steps after it are done again. Every rank creates
the same state and calls ``commit()`` at the same points.

Contract:
  * :class:`State` is the base: ``commit()`` saves the state and (rank 0, in a world an elastic
    hvlrun manages) stores it in the driver's commit store before returning, then checks for
    host updates; ``check_host_updates()`` raises :class:`HostsUpdatedInterrupt` on every rank
    at the same call when the driver asked the world to stop (the ranks agree on rank 0's
    answer). ``save()``/``restore()`` keep and bring back an in-memory copy; ``sync()`` gives
    every rank rank 0's state and checks it; ``register_reset_callbacks()``/``on_reset()``
    as Horovod. ``commit``, ``check_host_updates`` and ``sync`` are collective (every rank
    calls them, in the same order); so is ``save`` when the state holds an elastic sampler.
  * At the start of a world, :meth:`State._begin_world` (called by ``hvlite.elastic.run``) puts
    the job's last commit on every rank (rank 0 fetches it, every rank gets its bytes, decodes
    and loads them) or, before the first commit, rank 0's current state; then every rank
    checks that its state encodes to the same digest as rank 0's, else
    :class:`StateMismatchError` names the ranks that differ. In a re-formed world the reset
    callbacks run next.
  * ``State(bcast_object, get_rank)`` takes Horovod's arguments (kept as ``_bcast_object`` and
    ``_rank``, which Horovod-style subclasses use in their own ``sync``). A subclass written for
    Horovod (its own ``save``/``restore``/``sync``, state kept in this process) works in a
    plain job and in the first world of an elastic one; at a commit in an elastic hvlrun job it
    fails on every rank with :class:`StateNotCommittableError`, which says what to use: hvlite
    restarts every worker of a re-formed world from the stored commit, which needs the state
    as values (an ``ObjectState``, ``TorchState``, ... or ``_capture``/``_apply``), where
    Horovod keeps the survivors' memory and broadcasts a pickle of it to the new workers.
  * :class:`ObjectState` keeps the keyword arguments it was given as attributes. A value with
    ``state_dict()``/``load_state_dict()`` (a model, an optimizer, a sampler, a scheduler) is
    saved through them and loaded back in place; any other value is copied and assigned back.
    Values must fit the commit format (``codec.py``): a ``TypeError`` naming the value says so
    at the first save. Adapters convert their tensors by overriding :meth:`ObjectState._leaf`
    and :meth:`ObjectState._unleaf`.
  * Errors: ``HvliteError`` when rank 0 cannot store or fetch a commit (on every rank, naming
    the store and the cause), :class:`StateMismatchError`, ``codec.CommitFormatError`` for a
    corrupt commit.
"""
from typing import Any, Callable, List, Optional

import numpy as np

from ..basics import rank
from ..errors import HostsUpdatedInterrupt, HvliteError
from ..ops import allgather, broadcast
from ..protocol.commit_client import CommitStoreError
from . import codec
from .sampler import ElasticIndexSampler
from .world import World, agree, current

__all__ = ["HostsUpdatedInterrupt", "StateMismatchError", "StateNotCommittableError",
           "StateEncodingError", "State", "ObjectState"]


class StateMismatchError(HvliteError):
    """After a restore or sync, some ranks hold a state that differs from rank 0's."""


class StateNotCommittableError(HvliteError, TypeError):
    """A state whose class does not say what its state is (a Horovod-style subclass) was
    committed in an elastic hvlrun job, which must store it."""


class StateEncodingError(TypeError):
    """Rank 0's state does not fit the commit format; raised on every rank at once (``commit``,
    ``sync``), with rank 0's message."""


def _store_error(what: str, error: Optional[Exception], failed: bool) -> None:
    """Raise on every rank when rank 0 could not talk to the commit store (``failed``)."""
    if failed:
        detail = str(error) if error is not None else "see rank 0's error"
        raise HvliteError("hvlite.elastic: rank 0 could not %s: %s" % (what, detail))


class State:
    """Horovod's elastic state: the base class of :class:`ObjectState` and the frameworks'
    states, which say what the state holds.

    A subclass written for Horovod, with its own ``save``/``restore``/``sync``, works in a
    plain job and in an elastic job's first world; an elastic hvlrun job refuses to commit it
    (``StateNotCommittableError``), since hvlite restarts every worker from the stored commit:
    keep such state in an :class:`ObjectState` instead.

    Args:
        bcast_object: Horovod's ``hvd.broadcast_object``; kept as ``self._bcast_object`` for
            subclasses written for Horovod, whose ``sync`` calls it.
        get_rank: Horovod's ``hvd.rank``; kept as ``self._rank``.
    """

    def __init__(self, bcast_object: Any = None, get_rank: Any = None) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: List[Callable[[], None]] = []
        self._saved: Any = None
        self._updates_seen = 0
        self.commit_seq = 0
        """The number of the last commit stored or restored (0 before any)."""

    # --- what a subclass provides ----------------------------------------------------------
    def _committable(self) -> None:
        """Raise StateNotCommittableError unless the class says what its state is."""
        if type(self)._capture is State._capture:
            raise StateNotCommittableError(
                "hvlite.elastic: %s subclasses State with Horovod's own save/restore/sync, which "
                "keep the state in this process; an elastic hvlrun job restarts every worker of "
                "a re-formed world from the last commit it stored, so the state must be values "
                "hvlite can commit: keep it in an ObjectState (keyword values; models, "
                "optimizers and samplers through their state_dict), TorchState or "
                "TensorFlowKerasState, or give the class _capture()/_apply() (see "
                "hvlite.elastic.state)" % type(self).__name__)

    def _capture(self) -> Any:
        """Return a copy of the live state as a commit tree."""
        raise NotImplementedError

    def _apply(self, tree: Any) -> None:
        """Make the live state equal ``tree`` (which stays unchanged)."""
        raise NotImplementedError

    # --- Horovod's API ----------------------------------------------------------------------
    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Run ``callbacks`` after each re-form of the world, once the state is restored (to
        scale the learning rate to the new size, say).

        Args:
            callbacks: a list of functions that take no arguments; run in registration order.
        """
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Run the reset callbacks, in registration order."""
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: int) -> None:
        """Horovod's notification hook; does nothing. hvlite learns of host changes at each
        commit (from the driver's answer), so nothing needs to arrive here.

        Args:
            timestamp: Horovod's time of the update (unused).
            update_res: Horovod's kind of update (unused).
        """

    def save(self) -> None:
        """Keep a copy of the current state in memory (what ``restore()`` brings back)."""
        self._saved = self._capture()

    def restore(self) -> None:
        """Bring back the state of the last ``save()``/``commit()`` on this rank."""
        if self._saved is not None:
            self._apply(self._saved)

    def reset(self) -> None:
        """Horovod's hook, called before ``on_reset`` in a re-formed world. Nothing to do here:
        a re-formed world is new processes, whose state the commit already restored."""

    def commit(self) -> None:
        """Save the state as the point every rank comes back to, then check for host updates.

        Collective: every rank calls it at the same point. In a world an elastic hvlrun
        manages, rank 0 stores the state with hvlrun before any rank returns; elsewhere it is
        a ``save()``. Commit often enough that redoing the steps since the last one is cheap,
        and rarely enough that storing it is (the whole state is sent each time).

        Raises:
            HostsUpdatedInterrupt: on every rank, when hvlrun asked the world to stop here (the
                commit is kept; ``hvlite.elastic.run`` re-forms the world and goes on).
            StateNotCommittableError: a Horovod-style subclass in an elastic hvlrun job.
            StateEncodingError: a value the commit format cannot hold (named in the message; a
                TypeError, on every rank).
            HvliteError: rank 0 could not store the commit (on every rank, naming the cause).
        """
        world = current()
        if world.managed:
            self._committable()
        try:
            self.save()
        except StateNotCommittableError:
            raise
        except TypeError as e:    # every rank holds the same state: every rank raises this
            raise StateEncodingError("hvlite.elastic: the state cannot be committed: %s"
                                     % e) from e
        if not world.managed:
            return
        seq, updates, error = 0, 0, None
        data: Optional[bytes] = None
        if rank() == 0:
            try:
                data = codec.encode(self._saved)
                seq, updates = world.put(data)
            except (CommitStoreError, TypeError) as e:
                error = e
        # 1: the store failed (a peer's or hvlrun's trouble); 2: the state cannot be encoded
        # (the program's own error, raised as TypeError on every rank: no re-form helps)
        failed, seq, updates = agree([0 if error is None else 1 if data is not None else 2,
                                      seq, updates], "commit")
        if failed == 2:
            raise StateEncodingError("hvlite.elastic: rank 0's state cannot be committed: %s"
                                     % (error or "see rank 0's error"))
        _store_error("store the commit", error, failed == 1)
        self.commit_seq = seq
        self._interrupt_if(updates, committed=True)

    def check_host_updates(self) -> None:
        """Raise :class:`HostsUpdatedInterrupt` on every rank if the driver asked the world to
        stop (its hosts changed). Collective; a no-op outside an elastic hvlrun."""
        world = current()
        if not world.managed:
            return
        updates, error = 0, None
        if rank() == 0:
            try:
                updates = world.updates()
            except CommitStoreError as e:
                error = e
        failed, updates = agree([error is not None, updates], "hosts")
        _store_error("ask hvlrun about host updates", error, failed)
        self._interrupt_if(updates, committed=False)

    def _interrupt_if(self, updates: int, committed: bool) -> None:
        if updates > self._updates_seen:
            self._updates_seen = updates
            raise HostsUpdatedInterrupt(committed=committed)

    def sync(self) -> None:
        """Give every rank rank 0's current state, and check it. Collective.

        Raises:
            StateEncodingError: on every rank (a TypeError), when rank 0's state does not fit
                the commit format.
            StateMismatchError: some rank's state differs from rank 0's after loading it.
        """
        data, error = None, None
        try:
            tree = self._capture()     # on every rank: capturing a sampler is collective
            if rank() == 0:
                data = codec.encode(tree)
        except TypeError as e:
            error = e
        self._load_everywhere(data, error)

    # --- the world's start ------------------------------------------------------------------
    def _load_everywhere(self, data: Optional[bytes], error: Optional[Exception] = None) -> None:
        """Rank 0's commit bytes to every rank; load them; check every rank agrees."""
        failed, size = agree([error is not None, len(data) if data is not None else 0],
                             "state.size")
        if failed:
            raise StateEncodingError("hvlite.elastic: rank 0's state cannot be committed: %s"
                                     % (error or "see rank 0's error"))
        buffer = np.frombuffer(data, np.uint8) if data is not None else np.empty(size, np.uint8)
        received = broadcast(buffer, 0, name="hvlite.elastic.state.data")
        tree = codec.decode(memoryview(received))
        self._apply(tree)
        self._saved = tree
        self._verify()

    def _verify(self) -> None:
        """Every rank encodes its live state; the digests must all equal rank 0's."""
        mine = np.frombuffer(codec.tree_digest(self._capture()), np.uint8)
        digests = allgather(mine.reshape(1, -1), name="hvlite.elastic.state.digest")
        differ = [r for r in range(len(digests)) if not np.array_equal(digests[r], digests[0])]
        if differ:
            raise StateMismatchError(
                "hvlite.elastic: after loading rank 0's state, rank%s %s hold%s a different "
                "state (digest of the encoded state differs from rank 0's)"
                % ("s" if len(differ) > 1 else "", ",".join(map(str, differ)),
                   "" if len(differ) > 1 else "s"))

    def _begin_world(self, world: World) -> int:
        """Put the job's last commit (or rank 0's state) on every rank, checked; run the reset
        callbacks in a re-formed world. Returns the commit's number (0: none). Collective."""
        if not world.managed:
            self.sync()
            return 0
        got, error = None, None
        if rank() == 0:
            try:
                got = world.fetch()
            except CommitStoreError as e:
                error = e
        failed, seq = agree([error is not None, got[0] if got else 0], "fetch")
        _store_error("fetch the last commit", error, failed)
        if seq:
            self._committable()
            self._load_everywhere(got[1] if got else None)
        else:
            self.sync()
        self.commit_seq = seq
        if world.number > 1:
            self.reset()
            self.on_reset()
        return seq


def _copy(obj: Any, leaf: Callable[[Any, str], Any], path: str) -> Any:
    """A commit tree holding copies of ``obj``'s contents; ``leaf`` converts anything that is
    not a plain value (or raises TypeError naming ``path``)."""
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    if isinstance(obj, (np.generic, codec.Array)):     # before tuple: Array is a NamedTuple
        return obj
    if isinstance(obj, dict):
        for k in obj:                  # the commit's rule for keys, checked at save time
            codec.encode_key(k, path)
        return {k: _copy(v, leaf, "%s[%r]" % (path, k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        items = [_copy(v, leaf, "%s[%d]" % (path, i)) for i, v in enumerate(obj)]
        return tuple(items) if isinstance(obj, tuple) else items
    if isinstance(obj, np.ndarray):
        return obj.copy()
    return leaf(obj, path)


def _rebuild(tree: Any, unleaf: Callable[[codec.Array], Any]) -> Any:
    """Fresh live objects from a commit tree (the tree stays unchanged)."""
    if isinstance(tree, codec.Array):                  # before tuple: Array is a NamedTuple
        return unleaf(tree)
    if isinstance(tree, dict):
        return {k: _rebuild(v, unleaf) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        items = [_rebuild(v, unleaf) for v in tree]
        return tuple(items) if isinstance(tree, tuple) else items
    if isinstance(tree, np.ndarray):
        return tree.copy()
    return tree


def _stateful(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None))


class ObjectState(State):
    """Horovod's ``ObjectState``: the keyword arguments, kept as attributes and committed.

    ``ObjectState(model=model, optimizer=optimizer, epoch=0, batch=0)`` makes ``state.model``,
    ``state.epoch``, ...; assign the attributes as training goes (``state.epoch = e``) and
    call ``state.commit()``. A value with ``state_dict()``/``load_state_dict()`` (a model, an
    optimizer, a sampler, a scheduler) is saved through them and loaded back in place; any
    other value (numbers, strings, bytes, lists, tuples, dicts, NumPy arrays) is copied and
    assigned back.

    Args:
        bcast_object: accepted for Horovod compatibility, not used (hvlite moves state as
            commit bytes, never as pickles).
        get_rank: accepted for Horovod compatibility, not used.
        **kwargs: the values to keep, by attribute name.
    Raises:
        TypeError: a value the commit format cannot hold, naming it (at construction, which
            saves a first copy).
    """

    def __init__(self, bcast_object: Any = None, get_rank: Any = None, **kwargs: Any) -> None:
        super().__init__(bcast_object, get_rank)
        self._names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self.save()

    def _leaf(self, obj: Any, path: str) -> Any:
        """Convert a framework object to something the commit format holds (adapters)."""
        raise TypeError("cannot commit %s of type %s: a commit holds numbers, strings, bytes, "
                        "lists, tuples, dicts and arrays" % (path, type(obj).__name__))

    def _unleaf(self, array: codec.Array) -> Any:
        """Turn an :class:`codec.Array` back into the framework's tensor (adapters)."""
        raise codec.CommitFormatError("a commit holds a %s tensor, but this state has no %s "
                                      "adapter" % (array.kind, array.kind))

    def _capture(self) -> Any:
        tree = {}
        for name in self._names:
            value = getattr(self, name)
            if isinstance(value, ElasticIndexSampler):
                value.merge_processed()      # collective: every rank's processed samples
            if _stateful(value):
                tree[name] = {"state_dict": _copy(value.state_dict(), self._leaf, name)}
            else:
                tree[name] = {"value": _copy(value, self._leaf, name)}
        return tree

    def _apply(self, tree: Any) -> None:
        if not isinstance(tree, dict) or set(tree) != set(self._names):
            raise codec.CommitFormatError("the commit holds %s, this state holds %s"
                                          % (sorted(tree) if isinstance(tree, dict) else tree,
                                             sorted(self._names)))
        for name in self._names:
            entry = tree[name]
            if "state_dict" in entry:
                getattr(self, name).load_state_dict(_rebuild(entry["state_dict"], self._unleaf))
            else:
                setattr(self, name, _rebuild(entry["value"], self._unleaf))
