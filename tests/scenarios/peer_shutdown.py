"""Scenario: rank 1 calls shutdown(). Every other rank's engine stops in the same cycle:
is_initialized() turns False, a collective raises HvliteShutdownError saying why, and init()
refuses clearly (hvlite finalized the MPI it had initialised)."""
import time

import numpy as np

import hvlite as hvd

hvd.init()
hvd.allreduce(np.ones(2), name="warmup")
if hvd.rank() == 1:
    hvd.shutdown()
else:
    deadline = time.monotonic() + 10
    while hvd.is_initialized() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not hvd.is_initialized(), "engine still running after a peer's shutdown"
    try:
        hvd.allreduce(np.ones(2), name="after")
        raise AssertionError("collective after a peer's shutdown did not fail")
    except hvd.HvliteShutdownError as e:
        assert "a rank called shutdown()" in str(e), e
    try:
        hvd.init()
        raise AssertionError("re-init after finalize did not fail")
    except hvd.HvliteError as e:
        assert "finalized" in str(e), e
print("peer shutdown scenario OK on rank", hvd.rank() if hvd.is_initialized() else "-", flush=True)
