"""SPMD support for the shared-memory data-plane tests (run by tests/test_shm.py under hvlrun at
2, 3 and 4 ranks): the plugin of tests/parallel (tests/spmd_plugin.py, see there), but mpi4py
initialises MPI first, so a test can stop the engine and start it again with other settings
(hvlite finalizes only an MPI it initialised). The tests use tests/parallel/reference.py."""
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [TESTS, os.path.join(TESTS, "parallel")]
import spmd_plugin  # noqa: E402
from spmd_plugin import *  # noqa: E402,F401,F403  (its hooks, fixture and collect_ignore_glob)

if spmd_plugin.SPMD:
    from mpi4py import MPI  # noqa: F401  (before the plugin starts hvlite: MPI belongs to mpi4py)
