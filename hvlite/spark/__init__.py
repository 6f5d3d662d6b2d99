"""hvlite on Spark: Horovod's ``horovod.spark.run`` and ``run_elastic`` on hvlrun's launcher
and supervision (``hvlite/cluster``): one Spark task per rank runs a node agent, each
executor's tasks are one hvlrun host, each rank runs the function in a process below its task.

Importing it imports pyspark; ``import hvlite`` does not. Module map: ``tasks`` (the tasks and
the driver's register of them), ``runner`` (``run``, ``run_elastic``). See
``docs/guides/spark.md``. Horovod's Spark ML estimators are not part of hvlite.
"""
from ..cluster.job import JobError
from .runner import run, run_elastic

__all__ = ["run", "run_elastic", "JobError"]
