"""SPMD test support for the GPU suite: these files run on every rank of an hvlrun job
(tests/test_gpu.py, ``make test-gpu``), on CUDA tensors. The plugin is tests/spmd_plugin.py
(shared with tests/parallel and tests/shm; see there)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "parallel"))   # reference.py, adasum_reference.py
from spmd_plugin import *  # noqa: E402,F401,F403  (its hooks, fixture and collect_ignore_glob)
