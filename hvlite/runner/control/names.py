"""What hvlrun and the programs it starts on every host agree on: their names and variables.

Contract: constants only; imports nothing. hvlrun (``world/start.py``, ``world/settings.py``)
starts the programs below and sets the variables for them: for every rank through the
launcher, for the host guards through the remote shell. The job secret's variable belongs to
the line protocol (``hvlite/protocol/wire.py``: ``ENV_SECRET``).

  * The modules run with ``python -m``: the rank wrapper (every rank), MPICH's launcher hook
    (the remote shell, for every remote host) and the host guard (on every remote host).
  * ``HVLRUN_CONTROL_ADDR``: ``host:port`` of hvlrun's control server (unset: no channel).
  * ``HVLRUN_HEARTBEAT_TIMEOUT``: seconds of silence after which hvlrun counts as lost (0: never).
  * ``HVLRUN_OUTPUT_DIR``: where each rank also writes its raw output (``--output-filename``).
  * ``HVLRUN_HOST``: set by a host guard for what runs below it: the host's name in hvlrun's
    host list.
  * ``HVLRUN_RSH``: the remote shell the launcher hook reaches other hosts with.
  * ``HVLRUN_OMP_AUTO``: ``1`` when hvlrun chose ``OMP_NUM_THREADS`` (the user did not set
    it): each rank wrapper sets it again from its own host's cores and local ranks.
"""

__all__ = ["RANK_EXEC_MODULE", "REMOTE_SHELL_MODULE", "HOST_GUARD_MODULE", "ENV_CONTROL_ADDR",
           "ENV_HEARTBEAT", "ENV_OUTPUT_DIR", "ENV_PREFIX_TIME", "ENV_HOST", "ENV_RSH",
           "ENV_OMP_AUTO"]

RANK_EXEC_MODULE = "hvlite.runner.world.rank_exec"
REMOTE_SHELL_MODULE = "hvlite.runner.hosts.remote_shell"
HOST_GUARD_MODULE = "hvlite.runner.hosts.host_guard"

ENV_CONTROL_ADDR = "HVLRUN_CONTROL_ADDR"
ENV_HEARTBEAT = "HVLRUN_HEARTBEAT_TIMEOUT"
ENV_OUTPUT_DIR = "HVLRUN_OUTPUT_DIR"
ENV_PREFIX_TIME = "HVLRUN_PREFIX_TIMESTAMP"
ENV_HOST = "HVLRUN_HOST"
ENV_RSH = "HVLRUN_RSH"
ENV_OMP_AUTO = "HVLRUN_OMP_AUTO"
