"""Runs the shared-memory data-plane tests (tests/shm) under hvlrun at 2, 3 and 4 ranks (4 is
oversubscribed on small machines: the futex waits must cope), each job with a hard timeout."""
import pytest

from jobs import run_spmd


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_shm_backend(np_):
    run_spmd(np_, "tests/shm", timeout=240)
