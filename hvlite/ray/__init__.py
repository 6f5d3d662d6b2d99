"""hvlite on Ray: Horovod's ``horovod.ray`` API (``RayExecutor``, ``ElasticRayExecutor``) and a
Ray Train backend, on hvlrun's launcher and supervision (``hvlite/cluster``).

Importing it imports Ray; ``import hvlite`` does not. Module map: ``slot`` (the actor of one
worker), ``executor`` (RayExecutor), ``elastic`` (elastic jobs that follow the cluster's nodes).
See ``docs/guides/ray.md``.
"""
from ..cluster.job import JobError
from .elastic import ElasticRayExecutor
from .executor import RayExecutor, Settings

__all__ = ["RayExecutor", "ElasticRayExecutor", "Settings", "JobError"]
