"""SPMD support for the shared-memory data-plane tests (run by tests/test_shm.py under hvlrun at
2, 3 and 4 ranks). As in tests/parallel, a failure on any rank aborts the job at once and every
test ends with no request in flight; unlike there, mpi4py initialises MPI first, so a test can
stop the engine and start it again with other settings (hvlite finalizes only an MPI it
initialised). Outside such a job (no HVLITE_SPMD=1) nothing here is collected."""
import os
import sys

import pytest

if os.environ.get("HVLITE_SPMD") != "1":
    collect_ignore_glob = ["test_*.py"]
else:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parallel"))
    from mpi4py import MPI  # noqa: F401  (MPI belongs to mpi4py, not to hvlite)

    import hvlite

    hvlite.init()

    @pytest.fixture(autouse=True)
    def _nothing_left_in_flight():
        yield
        c = hvlite.engine_counters()
        assert c["tensors_submitted"] == c["tensors_done"], "requests left in flight: %r" % c

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        outcome = yield
        report = outcome.get_result()
        if report.failed:
            print("\n[rank %d] FAILED %s\n%s" % (MPI.COMM_WORLD.rank, item.nodeid, report.longreprtext),
                  flush=True)
            os._exit(1)

    def pytest_sessionfinish(session, exitstatus):
        hvlite.shutdown()
        assert not hvlite.is_initialized()
