"""Horovod's ``hvd.elastic.run`` decorator for hvlite's re-forming worlds.

Decorate the function that trains (it takes the state first); call it with the state. In a job
that an elastic ``hvlrun`` runs, a lost worker or a change of hosts ends the current world and
the function starts again in the next one, from the last commit.

Contract: ``run(func)`` returns ``wrapper(state, *args, **kwargs)``, which
  1. puts the job's last commit (or, before the first, rank 0's state) on every rank and checks
     that every rank holds the same state; in a re-formed world it then runs the state's reset
     callbacks (``State._begin_world``); rank 0 reports to hvlrun that the world is ready;
  2. calls ``func(state, *args, **kwargs)`` and returns what it returns, once every rank's
     ``func`` returned (a barrier, in a managed world);
  3. in a world an elastic hvlrun manages, ends this process when the world must end, so the
     driver can re-form the job (MPI cannot change a running world's ranks):
       * ``HostsUpdatedInterrupt`` (raised on every rank at the same commit or host check):
         the state is committed if it was not already, then every rank exits with
         ``HOSTS_UPDATED_CODE``; the next world goes on from exactly here.
       * an ``HvliteError`` saying a peer is gone or silent (``HorovodInternalError``, not a
         mismatch, deadlock or invalid argument, which are the program's own errors): exits
         with ``PEER_LOST_CODE`` at once; the next world goes on from the last commit, and
         the steps since are done again (on every rank: the ranks' state after the last commit is
         dropped everywhere).
       * an error the ranks agreed on that a new world would meet again
         (``StateNotCommittableError``, ``StateMismatchError``, ``StateEncodingError``): every
         rank prints it and exits with ``PROGRAM_ERROR_CODE``; the driver ends the job (exit 1)
         instead of re-forming it.
     Anything else propagates (the rank fails; the driver re-forms without blaming peers).
  Outside an elastic hvlrun, errors propagate unchanged (there is no one to re-form the job).
  ``make_run(is_peer_error)`` builds the decorator with an adapter's own test for errors that
  wrap hvlite's (TensorFlow surfaces them as ``tf.errors.OpError`` inside a graph).
"""
import functools
import os
import sys
import traceback
from typing import Any, Callable, Optional

from ..basics import rank
from ..ops import barrier
from ..errors import HvliteDeadlockError, HvliteError, HvliteInvalidArgument, MismatchError
from ..protocol.commit_client import CommitStoreError
from ..protocol.elastic_env import HOSTS_UPDATED_CODE, PEER_LOST_CODE, PROGRAM_ERROR_CODE
from .state import (HostsUpdatedInterrupt, State, StateEncodingError, StateMismatchError,
                    StateNotCommittableError)
from .world import current

__all__ = ["run", "make_run"]

_PROGRAM_ERRORS = (MismatchError, HvliteInvalidArgument, HvliteDeadlockError)
# raised on every rank at the same point, and again in any re-formed world: the job ends
_AGREED_ERRORS = (StateNotCommittableError, StateMismatchError, StateEncodingError)


def _hvlite_peer_error(error: BaseException) -> bool:
    return isinstance(error, HvliteError) and not isinstance(error, _PROGRAM_ERRORS
                                                             + _AGREED_ERRORS)


def _say(me: int, message: str) -> None:
    """``me``: this rank, read when the world began (the message must not need the engine)."""
    sys.stdout.flush()
    sys.stderr.write("hvlite.elastic: rank %d: %s\n" % (me, message))
    sys.stderr.flush()


def _leave_world(me: int, state: State, interrupt: HostsUpdatedInterrupt) -> None:
    """Every rank ends after an agreed host update; the state is committed first."""
    world = current()
    if not interrupt.committed:
        try:
            state.commit()
        except HostsUpdatedInterrupt:
            pass                      # stored; the driver's request is the one already seen
    if me == 0:
        _say(me, "world %d ends at commit #%d: the hosts changed, hvlrun re-forms the job"
             % (world.number, state.commit_seq))
    raise SystemExit(HOSTS_UPDATED_CODE)


def _end_job(me: int, managed: bool) -> None:
    """Every rank, after an agreed error a new world would meet again: print it and exit
    with PROGRAM_ERROR_CODE, so the driver ends the job (re-raise it outside an elastic hvlrun).
    Call from an ``except`` block."""
    if not managed:
        raise                         # noqa: PLE0704 - the error being handled
    traceback.print_exc()
    _say(me, "the job ends: a re-formed world would fail the same way")
    raise SystemExit(PROGRAM_ERROR_CODE) from None


def make_run(is_peer_error: Optional[Callable[[BaseException], bool]] = None
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Return Horovod's ``run`` decorator, for a framework adapter.

    Args:
        is_peer_error: an extra test for errors that mean a peer is gone, for adapters whose
            framework wraps hvlite's errors (TensorFlow's ``tf.errors.OpError``).
    Returns:
        The decorator ``run``, where ``run(func)`` returns ``wrapper(state, *args, **kwargs)``.
    """
    def peer_error(error: BaseException) -> bool:
        return _hvlite_peer_error(error) or bool(is_peer_error and is_peer_error(error))

    def run(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
            world = current()
            me = rank()
            try:
                seq = state._begin_world(world)
            except _AGREED_ERRORS:
                _end_job(me, world.managed)
            if world.managed and me == 0:
                try:
                    world.ready(seq)
                except CommitStoreError as e:
                    _say(me, "warning: could not report the world ready: %s" % e)
            try:
                result = func(state, *args, **kwargs)
                if world.managed:
                    # leave together: a rank that exits shuts the engine down on every rank,
                    # which would fail a slower rank still inside the last commit
                    barrier()
                return result
            except HostsUpdatedInterrupt as interrupt:
                if not world.managed:
                    raise
                _leave_world(me, state, interrupt)
            except _AGREED_ERRORS:
                _end_job(me, world.managed)
            except Exception as error:     # noqa: BLE001 - sorted below, re-raised otherwise
                if not (world.managed and peer_error(error)):
                    raise
                _say(me, "%s: %s; this world ends, hvlrun re-forms the job from commit #%d"
                     % (type(error).__name__, error, state.commit_seq))
                os._exit(PEER_LOST_CODE)   # the world's MPI is broken: no orderly shutdown
            return None
        return wrapper
    return run


run = make_run()
"""Horovod's ``hvd.elastic.run`` decorator. Decorate ``train(state, ...)`` with it so that an
elastic job goes on from the last commit when it loses or gains workers (see the module
description)."""
