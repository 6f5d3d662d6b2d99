"""One job spread over simulated hosts (run by tests/hosts on every rank under hvlrun).

``HVLT_LAYOUT`` gives the ranks per host in host order (e.g. ``2,1``: ranks 0,1 on h1, rank 2 on
h2). Every rank checks, against NumPy references from every rank's seeded inputs:
  * topology: local_rank/local_size/cross_rank/cross_size as the layout implies;
  * an 8 MiB float32 allreduce over everyone (the bytes the test sees on the links);
  * a few collectives per dtype over everyone (allreduce sum/max, allgather, broadcast from the
    last rank, alltoall);
  * one process set per host (the shared-memory data plane runs it when the host has more than
    one rank) and one spanning hosts (the first rank of each host, or the last two hosts' when
    that is everyone): MPI, across the links;
  * with HVLITE_HIERARCHICAL_ALLREDUCE=1, that a global allreduce ran hierarchically.
It prints ``spread OK rank R host H`` and its counters at the end; any failure raises.
"""
import json
import os
import socket
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "parallel"))
import hvlite as hvd  # noqa: E402
from reference import DTYPES, assert_equal, inputs, reduce  # noqa: E402

LAYOUT = [int(n) for n in os.environ["HVLT_LAYOUT"].split(",")]
HOST_OF = [h for h, n in enumerate(LAYOUT) for _ in range(n)]
LOCAL_OF = [i for n in LAYOUT for i in range(n)]
FIRSTS = [sum(LAYOUT[:h]) for h in range(len(LAYOUT))]

hvd.init()
R, N = hvd.rank(), hvd.size()
assert N == sum(LAYOUT), (N, LAYOUT)


def check_topology():
    h, l = HOST_OF[R], LOCAL_OF[R]
    expected = (l, LAYOUT[h], sum(1 for n in LAYOUT[:h] if n > l), sum(1 for n in LAYOUT if n > l))
    got = (hvd.local_rank(), hvd.local_size(), hvd.cross_rank(), hvd.cross_size())
    assert got == expected, "rank %d: (local_rank, local_size, cross_rank, cross_size) = %s, " \
                            "expected %s for layout %s" % (R, got, expected, LAYOUT)


def check_big_allreduce():
    x = np.arange(2 << 20, dtype=np.float32) % 1000 + R
    got = hvd.allreduce(x, op=hvd.Sum, name="spread.big")
    expected = (np.arange(2 << 20, dtype=np.float32) % 1000) * N + N * (N - 1) / 2
    assert np.array_equal(got, expected.astype(np.float32)), "big allreduce differs on rank %d" % R


def check_dtypes(process_set=None, members=None):
    members = list(range(N)) if members is None else members
    me = members.index(R)
    tag = "all" if process_set is None else "set%s" % "-".join(map(str, members))
    for dtype in DTYPES:
        xs = [inputs(7, r, dtype, (5, 3)) for r in members]
        for opname, op in (("Sum", hvd.Sum), ("Max", hvd.Max)):
            got = hvd.allreduce(xs[me], op=op, name="%s.ar.%s.%s" % (tag, opname, dtype),
                                process_set=process_set)
            assert_equal(got, reduce(np.stack(xs), opname, dtype, len(members)),
                         "%s allreduce %s %s" % (tag, opname, dtype))
        rows = [inputs(8, r, dtype, (r % 3 + 1, 2)) for r in members]
        got = hvd.allgather(rows[me], name="%s.ag.%s" % (tag, dtype), process_set=process_set)
        assert_equal(got, np.concatenate(rows), "%s allgather %s" % (tag, dtype))
        root = members[-1]
        got = hvd.broadcast(xs[me], root, name="%s.bc.%s" % (tag, dtype), process_set=process_set)
        assert_equal(got, xs[-1], "%s broadcast from %d %s" % (tag, root, dtype))
        parts = [inputs(9, r, dtype, (len(members), 2)) for r in members]
        got = hvd.alltoall(parts[me], name="%s.a2a.%s" % (tag, dtype), process_set=process_set)
        assert_equal(got, np.stack([p[me] for p in parts]), "%s alltoall %s" % (tag, dtype))


def check_process_sets():
    """One set per host, then one across hosts; every rank adds them all, in the same order."""
    per_host = [hvd.add_process_set(list(range(f, f + n))) if n < N else hvd.global_process_set
                for f, n in zip(FIRSTS, LAYOUT)]
    # the first rank of each host; when that is everyone, the last two hosts' (not rank 0)
    spanning = FIRSTS if len(FIRSTS) < N else FIRSTS[-2:]
    across = hvd.add_process_set(spanning) if len(FIRSTS) > 1 else None
    h = HOST_OF[R]
    before = hvd.engine_counters()["shm_collectives"]
    check_dtypes(per_host[h], list(range(FIRSTS[h], FIRSTS[h] + LAYOUT[h])))
    on_host = hvd.engine_counters()["shm_collectives"] - before
    assert (on_host > 0) == (LAYOUT[h] > 1), \
        "rank %d: %d shm collectives for its host's set of %d ranks" % (R, on_host, LAYOUT[h])
    if across is not None and R in spanning:
        before = hvd.engine_counters()
        check_dtypes(across, spanning)
        after = hvd.engine_counters()
        assert after["shm_collectives"] == before["shm_collectives"], \
            "rank %d: a set spanning hosts ran on the shared-memory plane" % R
        assert after["mpi_collectives"] > before["mpi_collectives"], \
            "rank %d: a set spanning hosts did not run on the MPI plane" % R
    hvd.barrier()


def check_hierarchical():
    if os.environ.get("HVLITE_HIERARCHICAL_ALLREDUCE") != "1":
        return
    before = hvd.engine_counters()["hierarchical_collectives"]
    xs = [inputs(11, r, np.dtype(np.float64), (100003,)) for r in range(N)]
    got = hvd.allreduce(xs[R], op=hvd.Sum, name="spread.hier")
    assert_equal(got, reduce(np.stack(xs), "Sum", np.dtype(np.float64), N), "hierarchical allreduce")
    ran = hvd.engine_counters()["hierarchical_collectives"] - before
    assert ran == 1, "rank %d: %d hierarchical allreduces, expected 1" % (R, ran)


check_topology()
check_big_allreduce()
check_dtypes()
check_process_sets()
check_hierarchical()
counters = hvd.engine_counters()
print("spread OK rank %d host %s %s" % (R, socket.gethostname(), json.dumps(
    {k: counters[k] for k in ("collectives", "shm_collectives", "hierarchical_collectives",
                              "mpi_collectives")})),
    flush=True)
hvd.shutdown()
