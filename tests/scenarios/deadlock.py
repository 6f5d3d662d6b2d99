"""Scenario: collective deadlocks and the waits that are not deadlocks, through one framework.

Usage: deadlock.py CASE [numpy|torch|tensorflow|tf.function]. Every rank prints one line per outcome
("rank R deadlock after S s: <message>", "rank R completed"), then every rank runs one more
allreduce to show the engine is still usable, and prints "rank R usable". Cases:
  ops      rank 0 allreduce 'a', the others allgather 'b'                       -> deadlock
  order    rank 0 waits on 'x' then 'y', the others on 'y' then 'x'            -> deadlock
  barrier  rank 0 barrier, the others allreduce 'z'                            -> deadlock
  join     rank 0 join, the others add a process set (needs rank 0 itself)     -> deadlock
  joined   rank 0 join, the others allreduce 'w' then join (0 stands in)        -> completes
  sets     set {0,1}: rank 0 allreduce 'a', rank 1 allgather 'b'; the last rank
           (not a member) computes meanwhile                                    -> deadlock on 0,1
  slow     the last rank sleeps 20 s before its allreduce                      -> completes
  busy     the last rank computes 8 s (not in hvlite) before its allreduce     -> completes
  thread   the last rank waits on 'b' in one thread while another submits 'a'
           after 3 s; rank 0 runs 'a' then 'b'                                  -> completes
"""
import sys
import threading
import time

import numpy as np

case = sys.argv[1]
framework = sys.argv[2] if len(sys.argv) > 2 else "numpy"
if framework == "torch":
    import torch
    import hvlite.torch as hvd
    tensor = lambda: torch.ones(4)            # noqa: E731
elif framework in ("tensorflow", "tf.function"):
    import tensorflow as tf
    import hvlite.tensorflow as hvd
    tensor = lambda: tf.ones(4)               # noqa: E731
else:
    import hvlite as hvd
    tensor = lambda: np.ones(4, np.float32)   # noqa: E731

hvd.init()
rank, size, last = hvd.rank(), hvd.size(), hvd.size() - 1


def busy(seconds):
    """Compute without touching hvlite (a rank that is slow, not stuck)."""
    end, x = time.monotonic() + seconds, np.random.rand(200, 200)
    while time.monotonic() < end:
        x = x @ x.T / 200.0


def run_case():
    if case == "ops" and framework == "tf.function":   # inside a graph: errors come as OpError
        step = tf.function(lambda x: hvd.allreduce(x, name="a") if rank == 0 else hvd.allgather(x, name="b"))
        step(tensor())
    elif case == "ops":
        hvd.allreduce(tensor(), name="a") if rank == 0 else hvd.allgather(tensor(), name="b")
    elif case == "order":
        names = ["x", "y"] if rank == 0 else ["y", "x"]
        for name in names:
            hvd.allreduce(tensor(), name=name)
    elif case == "barrier":
        hvd.barrier() if rank == 0 else hvd.allreduce(tensor(), name="z")
    elif case == "join":
        hvd.join() if rank == 0 else hvd.add_process_set([0, 1])
    elif case == "joined":
        if rank != 0:
            hvd.allreduce(tensor(), name="w")
        hvd.join()
    elif case == "sets":
        pair = hvd.add_process_set([0, 1])
        if rank == 0:
            hvd.allreduce(tensor(), name="a", process_set=pair)
        elif rank == 1:
            hvd.allgather(tensor(), name="b", process_set=pair)
        else:
            busy(8)
    elif case == "slow":
        if rank == last:
            time.sleep(20)
        hvd.allreduce(tensor(), name="late")
    elif case == "busy":
        if rank == last:
            busy(8)
        hvd.allreduce(tensor(), name="late")
    elif case == "thread":
        if rank == last:
            waiter = threading.Thread(target=lambda: hvd.allreduce(tensor(), name="b"))
            waiter.start()
            time.sleep(3)
            hvd.allreduce(tensor(), name="a")
            waiter.join()
        else:
            hvd.allreduce(tensor(), name="a")
            hvd.allreduce(tensor(), name="b")
    else:
        raise SystemExit("unknown case " + case)


start = time.monotonic()
try:
    run_case()
    print("rank %d completed" % rank, flush=True)
except Exception as e:                     # HvliteDeadlockError; tf.errors.OpError in a graph
    lines = [line for line in str(e).splitlines() if "collective deadlock" in line]
    if not lines:
        raise
    print("rank %d deadlock after %.1f s (%s): %s" % (rank, time.monotonic() - start, type(e).__name__,
                                                      lines[0]), flush=True)
total = hvd.allreduce(tensor(), name="after", op=hvd.Sum)
assert np.allclose(np.asarray(total), size), total
# decided in negotiation, before any data moved: nothing is kept back from the failed requests
from hvlite import handles  # noqa: E402
assert not handles._stranded, handles._stranded
print("rank %d usable" % rank, flush=True)
