"""SPMD test support for the GPU suite: these files run on every rank of an hvlrun job
(tests/test_gpu.py, ``make test-gpu``), on CUDA tensors. The plugin is tests/spmd_plugin.py
(shared with tests/parallel and tests/shm; see there)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "parallel"))   # reference.py, adasum_reference.py
from spmd_plugin import *  # noqa: E402,F401,F403  (its hooks, fixture and collect_ignore_glob)
from spmd_plugin import SPMD  # noqa: E402



def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Run as ``pytest tests/gpu`` outside a job, this folder collects nothing: say how it
    runs."""
    if not SPMD and exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        terminalreporter.write_line(
            "tests/gpu: these files run on every rank of an hvlrun job and are not collected "
            "outside one. Run `make test-gpu`, `tools/gpu_check.sh 1`, or "
            "`hvlrun -np 2 python3 -m pytest tests/gpu`")
