"""Scenario: the last rank submits tensor 'lonely' late, twice. The first time the tensor is new
(it waits in rank 0's table); the second time it is in the response cache (it waits on the
bit-vector path, then moves to rank 0 after a second). With HVLITE_STALL_CHECK_TIME_SECONDS=1,
rank 0 must warn both times, naming the tensor and the missing rank; then it completes.

The late rank waits 3 s, and then (with the stall check on) until rank 0 has warned: a thread of
rank 0 leaves a file per warning, so a slow machine cannot make the late rank arrive before the
warning it is meant to cause."""
import os
import shutil
import tempfile
import threading
import time

import numpy as np

import hvlite as hvd

hvd.init()
late = hvd.size() - 1
# rank 0's: where it leaves its marks, and whether it checks for stalls at all (hvlrun
# --no-stall-check sets HVLITE_STALL_CHECK_DISABLE=1)
marks, warns = hvd.broadcast_object(
    (tempfile.mkdtemp(prefix="hvlite-stall-"), os.environ.get("HVLITE_STALL_CHECK_DISABLE", "0") == "0")
    if hvd.rank() == 0 else None, 0)
if hvd.rank() == 0 and warns:
    def mark_warnings():      # one file per stall warning of this engine
        seen = 0
        while seen < 2:
            now = hvd.engine_counters()["stall_warnings"]
            for n in range(seen + 1, now + 1):
                open(os.path.join(marks, "warned.%d" % n), "w").close()
            seen = max(seen, now)
            time.sleep(0.01)
    threading.Thread(target=mark_warnings, daemon=True).start()
for round_ in range(2):
    if hvd.rank() == late:
        time.sleep(3.0)
        deadline = time.monotonic() + 30
        while warns and not os.path.exists(os.path.join(marks, "warned.%d" % (round_ + 1))):
            assert time.monotonic() < deadline, "rank 0 did not warn of round %d's stall" % round_
            time.sleep(0.01)
    result = hvd.allreduce(np.ones(4, np.float32), name="lonely", op=hvd.Sum)
    assert (result == hvd.size()).all()
if hvd.rank() == 0:
    shutil.rmtree(marks, ignore_errors=True)
print("stall scenario done on rank", hvd.rank(), flush=True)
