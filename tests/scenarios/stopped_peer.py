"""Scenario: rank 1 stops itself (SIGSTOP: every thread, the engine's too) while rank 0 waits.

Usage: stopped_peer.py WHERE. WHERE = "negotiation": rank 1 stops before it submits, so rank 0's
negotiation gets no answer; "mpi": rank 1 stops inside a large allreduce on the MPI data plane
(run with HVLITE_SHM_DISABLE=1), so rank 0's collective makes no progress; "shm": inside one on
the shared-memory plane, so rank 0 waits on its futex word for an arrival that never comes.
Inside a data plane, rank 1 stops at the engine's own stop point (HVLITE_TEST_STOP_AT, set here)
in the 4th allreduce, with the collective under way: after a sleep it could stop between two
collectives instead, where rank 0 waits in negotiation. With a short HVLITE_PEER_TIMEOUT_SECONDS
rank 0 gets HvliteTimeoutError within seconds, naming rank 1; it wakes rank 1 (SIGCONT, so
hvlrun's SIGTERM can end it) and exits 3.

With a second argument "shutdown" (WHERE "mpi" or "shm"), rank 0 also calls shutdown() from
another thread half a second after it saw rank 1 stopped (its /proc state): the wait on rank 1
looks at the shutdown flag and gives up once it is a second old, whatever the peer timeout, so
rank 0's allreduce fails with HvliteShutdownError and its shutdown() returns within seconds. After the error rank 0 says
what rank() gives: its rank after the timeout, ValueError after its own shutdown()."""
import os
import signal
import sys
import threading
import time

import numpy as np

import hvlite as hvd
import job_files

where = sys.argv[1]
if where in ("mpi", "shm"):
    os.environ["HVLITE_TEST_STOP_AT"] = "1:%s_allreduce:4" % where
hvd.init()
rank = hvd.rank()
pids = hvd.allgather_object(os.getpid())
job_files.report(rank)
big = np.ones(16 << 20, np.float32)            # 64 MiB: many progress steps per allreduce
if rank == 1 and where == "negotiation":
    def stop():
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGSTOP)
    threading.Thread(target=stop, daemon=True).start()
    time.sleep(3600)                           # stopped long before this ends


def stopped(pid):
    """Whether process `pid` (on this host) is stopped: state T in /proc/PID/stat."""
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


if rank == 0 and sys.argv[2:] == ["shutdown"]:
    def shut_down():
        while not stopped(pids[1]):
            time.sleep(0.001)
        time.sleep(0.5)
        began = time.monotonic()
        hvd.shutdown()
        # one write: the main thread prints at about the same time
        sys.stdout.write("rank 0 shutdown() returned after %.1f s\n" % (time.monotonic() - began))
        sys.stdout.flush()
    closer = threading.Thread(target=shut_down, daemon=True)
    closer.start()
start = time.monotonic()
try:
    for _ in range(1000):
        hvd.allreduce_(big, op=hvd.Sum, name="big")
    print("rank", rank, "UNEXPECTED: completed", flush=True)
except (hvd.HvliteTimeoutError, hvd.HvliteShutdownError) as e:
    kind = "timeout" if isinstance(e, hvd.HvliteTimeoutError) else "shut down"
    from hvlite import handles
    # the collective was given up on mid-way: its buffer is kept, never let go
    kept = len(handles._stranded)
    sys.stdout.write("rank %d %s after %.1f s: %s\n" % (rank, kind, time.monotonic() - start, e))
    sys.stdout.write("rank %d keeps the buffers of %d failed request(s)\n" % (rank, kept))
    if kind == "shut down":
        closer.join(30)                        # shutdown() returns, and forgets the rank
    try:    # as in Horovod, an error handler may still ask for its place, until shutdown()
        place = "rank() = %d of size() = %d" % (hvd.rank(), hvd.size())
    except ValueError as no_place:
        place = "rank() raises: %s" % no_place
    sys.stdout.write("rank %d after the error: %s\n" % (rank, place))
    sys.stdout.flush()
    os.kill(pids[1], signal.SIGCONT)
    sys.exit(3)
