"""SPMD test support: these files run on every rank of an hvlrun job, with hvlite initialising
MPI itself. The plugin is tests/spmd_plugin.py (shared with tests/shm; see there)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from spmd_plugin import *  # noqa: E402,F401,F403  (its hooks, fixture and collect_ignore_glob)
