"""SPMD test support: these files run on every rank of an hvlrun job (see tests/test_spmd.py).

- Outside such a job (no HVLITE_SPMD=1) the files are not collected: a single-process pytest
  run of tests/ drives them through hvlrun instead.
- A failure on any rank aborts the whole job at once (the other ranks would otherwise wait in
  the next collective), so the failing rank's report is the one that is printed.
- Every test ends by checking that no request is left in flight on this rank.
"""
import os

import pytest

if os.environ.get("HVLITE_SPMD") != "1":
    collect_ignore_glob = ["test_*.py"]
else:
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
            print("\n[rank %d] FAILED %s\n%s" % (hvlite.rank(), item.nodeid, report.longreprtext),
                  flush=True)
            os._exit(1)

    def pytest_sessionfinish(session, exitstatus):
        hvlite.shutdown()
        assert not hvlite.is_initialized()
