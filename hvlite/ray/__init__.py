"""hvlite on Ray: Horovod's ``horovod.ray`` API (``RayExecutor``, ``ElasticRayExecutor``) and a
Ray Train trainer (``HvliteTrainer``, ``HvliteConfig``), on hvlrun's launcher and supervision
(``hvlite/cluster``).

Importing it imports Ray; ``import hvlite`` does not. ``HvliteTrainer`` and ``HvliteConfig``
import Ray Train (``pip install "ray[train]"``) when first used. Module map: ``slot`` (the actor
of one worker), ``executor`` (RayExecutor), ``elastic`` (elastic jobs that follow the cluster's
nodes), ``train`` (the Ray Train backend and trainer), ``train_worker`` (its part inside Ray
Train's workers). See ``docs/guides/ray.md``.
"""
from ..cluster.job import JobError
from .elastic import ElasticRayExecutor
from .executor import RayExecutor, Settings

__all__ = ["RayExecutor", "ElasticRayExecutor", "Settings", "JobError", "HvliteTrainer",
           "HvliteConfig"]

_RAY_TRAIN = ("HvliteTrainer", "HvliteConfig")


def __getattr__(name):
    # Ray Train imports pandas and pyarrow: only those who train with it pay for them
    if name in _RAY_TRAIN:
        from . import train
        return getattr(train, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
