"""Runs the shared-memory data-plane tests (tests/shm) under hvlrun at 2, 3 and 4 ranks (4 is
oversubscribed on small machines: the futex waits must cope), each job with a hard timeout.
At 4 ranks, a sample of the dtypes (every config; the narrowest and the widest element, both
half floats): the dtype paths are the same at every size and run in full at 2 and 3; the
oversubscription is what 4 adds, and the full matrix there cost 48 s of the suite's 20 min."""
import pytest

from jobs import run_spmd

FOUR_RANK_SAMPLE = "uint8 or float16 or float64 or topology"


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_shm_backend(np_):
    run_spmd(np_, "tests/shm", timeout=240, select=FOUR_RANK_SAMPLE if np_ == 4 else None)
