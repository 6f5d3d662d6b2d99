"""The pytest plugin of the SPMD suites (tests/parallel, tests/shm): their files run on every
rank of an hvlrun job (tests/test_spmd.py, tests/test_shm.py, tests/test_adasum_jobs.py, the
multi-host tests). Each folder's conftest.py puts tests/ on sys.path and star-imports this
module, whose names are then that conftest's:

- A job is HVLITE_SPMD=1, or, where HVLITE_SPMD is unset, a process an MPI launcher started
  (PMI_RANK, PMIX_RANK or OMPI_COMM_WORLD_RANK set), so that ``hvlrun -np 2 python -m pytest
  tests/gpu`` runs as it reads. HVLITE_SPMD=0 turns it off.
- Outside such a job the folder's test files are not collected
  (``collect_ignore_glob``, relative to the conftest): a single-process pytest run of tests/
  drives them through hvlrun instead. Nothing else is defined then.
- In a job, hvlite is initialised at session start, after every conftest has been imported, so
  a folder whose conftest imports mpi4py first (tests/shm) has MPI owned by mpi4py; the session
  ends with hvlite shut down.
- A failure on any rank, or a test file that fails to import there, aborts the whole job at
  once (the other ranks would otherwise wait in the next collective), so the failing rank's
  report is the one that is printed.
- Every test ends by checking that no request is left in flight on this rank.
"""
import os

import pytest

_LAUNCHED_RANK = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")
SPMD = os.environ.get("HVLITE_SPMD",
                      "1" if any(v in os.environ for v in _LAUNCHED_RANK) else "0") == "1"

if not SPMD:
    collect_ignore_glob = ["test_*.py"]
    __all__ = ["collect_ignore_glob"]
else:
    import hvlite

    _rank = []   # this process's rank, kept for failure reports (a test may stop the engine)

    def pytest_sessionstart(session):
        hvlite.init()
        _rank.append(hvlite.rank())
        if os.environ.get("HVLITE_TEST_NCCL_HOSTID") == "per-rank":
            # ranks sharing one GPU look like hosts of their own to NCCL (and to hvlite's NCCL
            # plane), which then runs them over its socket transport on loopback; read at the
            # first CUDA batch, so setting it after init is in time
            os.environ["NCCL_HOSTID"] = "hvlite-test-rank-%d" % hvlite.rank()
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")

    @pytest.fixture(autouse=True)
    def _nothing_left_in_flight():
        yield
        c = hvlite.engine_counters()
        assert c["tensors_submitted"] == c["tensors_done"], "requests left in flight: %r" % c

    def _abort(what, report):
        print("\n[rank %s] %s %s\n%s" % (_rank[0] if _rank else "?", what, report.nodeid,
                                         report.longreprtext), flush=True)
        os._exit(1)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        outcome = yield
        report = outcome.get_result()
        if report.failed:
            _abort("FAILED", report)

    def pytest_collectreport(report):
        if report.failed:          # a file that fails to import on one rank only
            _abort("ERROR collecting", report)

    def pytest_sessionfinish(session, exitstatus):
        hvlite.shutdown()
        assert not hvlite.is_initialized()

    __all__ = ["pytest_sessionstart", "_nothing_left_in_flight", "pytest_runtest_makereport",
               "pytest_collectreport", "pytest_sessionfinish"]
