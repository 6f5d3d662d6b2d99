"""The one table of the variables hvlrun reads from its environment or sets for what it starts.

Contract: :data:`LAUNCHER_VARIABLES` rows are ``(name, kind, doc)``: ``kind`` is ``"read"``
(hvlrun reads it from the user's environment), ``"set"`` (hvlrun sets it for the ranks, the
host guards or the remote shell; a user never needs to) or ``"test"`` (tests only). The
engine's own ``HVLITE_*`` settings are ``csrc/core/param.c``'s table, not this one. The
settings reference (``docs/reference/settings.md``, written by ``tools/docs_reference.py``) is
generated from both, and ``tests/test_docs.py`` checks that every ``HVLITE_*``/``HVLRUN_*``
name in the code is in one of them. Constants only; imports nothing but the names.
"""
from ...protocol.elastic_env import ENV_KEY, ENV_REASON, ENV_STORE, ENV_WORLD
from ...protocol.wire import ENV_SECRET
from ..control.names import (ENV_CONTROL_ADDR, ENV_HEARTBEAT, ENV_HOST, ENV_OMP_AUTO,
                             ENV_OUTPUT_DIR, ENV_PREFIX_TIME, ENV_RSH)

__all__ = ["LAUNCHER_VARIABLES"]

LAUNCHER_VARIABLES = (
    ("HVLRUN_START_TIMEOUT", "read",
     "default of --start-timeout: seconds for every rank to start (30; 0 waits forever)"),
    (ENV_HEARTBEAT, "read",
     "default of --heartbeat-timeout (30 s); hvlrun also sets it for the ranks and host guards"),
    (ENV_SECRET, "set",
     "the job's secret for the authenticated control channel; removed from the program's "
     "environment before it starts"),
    (ENV_CONTROL_ADDR, "set", "host:port of hvlrun's control channel"),
    (ENV_OUTPUT_DIR, "set", "where each rank also writes its output (--output-filename)"),
    (ENV_PREFIX_TIME, "set", "1: each forwarded output line starts with the local time "
                             "(--prefix-output-with-timestamp)"),
    (ENV_HOST, "set", "a remote host's name in hvlrun's host list, set by its host guard"),
    (ENV_RSH, "set", "the remote shell MPI's launcher reaches other hosts with"),
    (ENV_OMP_AUTO, "set", "1: hvlrun chose OMP_NUM_THREADS, and each rank's wrapper sets it to "
                          "its host's cores divided by the ranks there (the program never sees "
                          "this variable)"),
    (ENV_WORLD, "set", "elastic jobs: the world's number (1, then +1 per re-form)"),
    (ENV_STORE, "set", "elastic jobs: host:port of hvlrun's commit store"),
    (ENV_KEY, "set", "elastic jobs: the commit store's secret"),
    (ENV_REASON, "set", "elastic jobs: why this world was formed, in words"),
    # hvlite/cluster/names.py's (the runner imports nothing of the cluster pieces)
    ("HVLRUN_CLUSTER_HOSTS", "set", "Ray and Spark jobs: the driver's table of each host's agent "
                               "addresses, read by the remote shell stand-in"),
    ("HVLRUN_CLUSTER_KEY", "set", "Ray and Spark jobs: the key every agent, remote shell and rank "
                             "process proves it knows"),
    ("HVLRUN_CLUSTER_SLOTS", "set", "Ray and Spark jobs: a host's agent addresses in slot order, "
                               "where each rank process finds its slot's"),
    ("HVLRUN_TEST_DELAY_START_RANK", "test",
     "R:S makes rank R's wrapper sleep S seconds before starting its program"),
)
