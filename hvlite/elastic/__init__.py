"""hvlite.elastic: Horovod's elastic API, framework-neutral (the adapters build on it).

A job that ``hvlrun --min-np/--max-np/--host-discovery-script`` runs survives losing and gaining
workers: decorate the training function with :func:`run`, keep what must survive in a
:class:`State` (``ObjectState``, or a framework's: ``hvlite.torch.elastic.TorchState``), and
call ``state.commit()`` regularly; a re-formed world goes on from the last commit.

Contract: ``run`` (the decorator), ``State``, ``ObjectState``, ``HostsUpdatedInterrupt`` (and
``HorovodInternalError``, as Horovod's ``horovod.common.elastic`` has them) and
``ElasticIndexSampler`` (the index logic of ``ElasticSampler``), with Horovod's documented
behaviour, on worlds that an elastic ``hvlrun`` (``--min-np``/``--max-np``/
``--host-discovery-script``) re-forms when workers are lost or added: the last commit lives in
hvlrun, every world starts from it with every rank's state checked identical, and the steps
after it are the only ones done again. Commits are bytes in the format of ``codec.py`` (no
pickle). ``hvlite.torch.elastic`` and ``hvlite.tensorflow(.keras).elastic`` add the framework
states. Module map: ``codec`` (commit bytes), ``world`` (this process's world, rank 0's line to
hvlrun), ``state`` (State, ObjectState), ``run`` (the decorator), ``sampler``.
"""
from ..errors import HorovodInternalError, HostsUpdatedInterrupt
from .run import make_run, run
from .sampler import ElasticIndexSampler
from .state import (ObjectState, State, StateEncodingError, StateMismatchError,
                    StateNotCommittableError)

__all__ = ["run", "make_run", "State", "ObjectState", "HostsUpdatedInterrupt",
           "HorovodInternalError", "StateMismatchError", "StateNotCommittableError",
           "StateEncodingError", "ElasticIndexSampler"]
