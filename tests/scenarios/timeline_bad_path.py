"""Scenario: HVLITE_TIMELINE names a file rank 0 cannot create. init() must fail on every rank
with the same clear message (the path and the reason), and nothing may hang."""
import hvlite as hvd

try:
    hvd.init()
    print("UNEXPECTED: init succeeded", flush=True)
except hvd.HvliteError as e:
    print("init failed: %s" % e, flush=True)
