"""Scenario: rank 1 stops (SIGSTOP: every thread, the engine's too) inside a collective step of
add_process_set or of init, the step named by HVLITE_TEST_STOP_AT=1:POINT (the engine raises
the signal itself there): pset_split, before the new set's communicator is split off every
rank's; pset_shm_map, before the set's members on this host exchange the shared-memory
segment's name; pset_shm_ready, before they agree it is ready; init_shm_map, the same for the
global set inside init. Run with 3 ranks and a short HVLITE_PEER_TIMEOUT_SECONDS: the set is
ranks 0 and 1, so rank 0 waits on rank 1 inside add_process_set at every point, and rank 2
(not a member) does at pset_split and in its next collective otherwise. Rank 2 sets its own
HVLITE_PEER_TIMEOUT_SECONDS to 600: rank 0's value holds on every rank, so it gives up as soon.
Every survivor gets HvliteTimeoutError within seconds, naming rank 1, and exits 3; the last survivor to get it
wakes rank 1 (SIGCONT, so hvlrun's SIGTERM can end it): a rank woken earlier would no longer
look stopped to a survivor still timing out.

With HVLITE_MPI_THREADS_DISABLE=1 (MPI_THREAD_SERIALIZED) at pset_split, each survivor then
calls init() again: it must be refused at once, because its timed-out split is still inside MPI
(a new engine thread may not enter MPI beside it below MPI_THREAD_MULTIPLE).

Each survivor prints the names of its threads after the error (a split given up on stays inside
MPI on its own helper thread, named hvl-comm-split).

Usage: stopped_in_add_process_set.py DIR (an empty directory: each rank writes its pid there
before init, each survivor marks its timeout)."""
import os
import signal
import sys
import time

import numpy as np

import hvlite as hvd
import job_files

marks = sys.argv[1]
rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
with open(os.path.join(marks, "pid.%d" % rank), "w") as f:
    f.write(str(os.getpid()))
print("pid of rank %d: %d" % (rank, os.getpid()), flush=True)
if rank == 2:
    os.environ["HVLITE_PEER_TIMEOUT_SECONDS"] = "600"
start = time.monotonic()
try:
    hvd.init()
    job_files.report(rank)
    hvd.add_process_set([0, 1])
    hvd.allreduce(np.ones(4, np.float32), op=hvd.Sum, name="after_add")
    print("rank", rank, "UNEXPECTED: completed", flush=True)
except hvd.HvliteTimeoutError as e:
    print("rank %d timeout after %.1f s: %s" % (rank, time.monotonic() - start, e), flush=True)
    threads = set()
    for t in os.listdir("/proc/self/task"):
        try:
            threads.add(open("/proc/self/task/%s/comm" % t).read().strip())
        except OSError:             # ended meanwhile
            pass
    print("rank %d threads: %s" % (rank, " ".join(sorted(threads))), flush=True)
    if os.environ.get("HVLITE_MPI_THREADS_DISABLE") == "1":
        try:
            hvd.init()
            print("rank", rank, "UNEXPECTED: init again", flush=True)
        except hvd.HvliteError as again:
            print("rank %d init again: %s" % (rank, again), flush=True)
    job_files.report(rank)
    open(os.path.join(marks, "timed_out.%d" % rank), "w").close()
    deadline = time.monotonic() + 20
    while sum(n.startswith("timed_out.") for n in os.listdir(marks)) < size - 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(os.path.join(marks, "pid.1")) as f:
        os.kill(int(f.read()), signal.SIGCONT)
    sys.exit(3)
