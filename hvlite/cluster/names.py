"""The variables the cluster pieces agree on (constants only; imports nothing).

  * ``HVLRUN_CLUSTER_HOSTS``: the host table the driver keeps (``job.py``), read by ``rsh.py``.
  * ``HVLRUN_CLUSTER_KEY``: the job's key, which every agent, remote shell and rank process
    proves it knows (environment only, never a command line).
  * ``HVLRUN_CLUSTER_SLOTS``: set by an agent for what it runs: its host's agent addresses in
    slot order, where each rank process finds its slot's (``worker.py``).
"""

__all__ = ["ENV_HOSTS", "ENV_KEY", "ENV_SLOTS"]

ENV_HOSTS = "HVLRUN_CLUSTER_HOSTS"
ENV_KEY = "HVLRUN_CLUSTER_KEY"
ENV_SLOTS = "HVLRUN_CLUSTER_SLOTS"
