"""hvlite on cluster engines (Ray, Spark): the pieces both share, importing neither engine.

A cluster engine gives hvlrun its hosts and a way to run a command on each: one agent per slot
(``agent.py``) inside the engine's worker (a Ray actor, a Spark task) is the far end of
hvlrun's remote shell (``rsh.py``); hvlrun starts, on every node, its host guard, MPI's proxy
and the ranks below the agent, and supervises them as on any host; each rank's process
(``worker.py``) serves its slot's calls, so the functions the driver sends run in a process of
the world hvlrun formed. The driver keeps the host table and runs hvlrun (``job.py``); frames
between them are authenticated with a key per job (``frames.py``).

``hvlite.ray`` and ``hvlite.spark`` build on this; ``import hvlite`` imports neither engine.
"""
from .job import JobError

__all__ = ["JobError"]
