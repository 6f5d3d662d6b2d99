"""Scenario: a job recording a timeline (HVLITE_TIMELINE, set by hvlrun --timeline-filename)
runs the known workload of tests/timeline_trace.py (every op, fused and lone, cached and not, a
mismatch), every result checked against NumPy; rank 0 prints the names it submitted. The driver
(tests/test_timeline.py) then checks the file."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import timeline_trace  # noqa: E402

import hvlite as hvd  # noqa: E402

hvd.init()
names = timeline_trace.run_workload(hvd, int(os.environ.get("STEPS", "3")))
if hvd.rank() == 0:
    print("SUBMITTED " + json.dumps(names), flush=True)
hvd.shutdown()
print("timeline scenario done on rank", hvd.rank() if hvd.is_initialized() else "-", flush=True)
