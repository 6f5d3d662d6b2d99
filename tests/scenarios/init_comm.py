"""Scenario: ``init(comm=...)`` runs hvlite on part of MPI_COMM_WORLD, two groups side by side
in one job, each checked against a NumPy reference on every rank; bad ``comm`` arguments fail on
every rank that passed them, at once (members whose lists differ in order after one exchange).

    hvlrun -np N python tests/scenarios/init_comm.py comm|ranks      (N >= 3)

``comm``: mpi4py initialises MPI; the groups come as mpi4py communicators (one in reversed rank
order), then as lists of ranks; between worlds hvlite shuts down and starts again (mpi4py keeps
MPI). ``ranks``: no mpi4py; hvlite initialises MPI (a failed init leaves it to the next), the
groups come as lists, and the last shutdown finalizes MPI, which waits for both groups.
Every rank prints ``init_comm OK`` at the end.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "parallel"))
from reference import DTYPES, assert_equal, inputs, reduce  # noqa: E402

import hvlite as hvl  # noqa: E402

MODE = sys.argv[1]
if MODE == "comm":
    from mpi4py import MPI
WORLD_RANK, WORLD_SIZE = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
OPS = {"Sum": hvl.Sum, "Min": hvl.Min, "Max": hvl.Max, "Average": hvl.Average}


def fails_at_once(comm, *words):
    """init(comm) raises ValueError naming ``words``, within a few seconds (no exchange)."""
    start = time.monotonic()
    try:
        hvl.init(comm=comm)
    except ValueError as e:
        message = str(e)
    else:
        raise AssertionError("init(comm=%r) did not fail on world rank %d" % (comm, WORLD_RANK))
    assert time.monotonic() - start < 10, "init(comm=%r) took %.1f s to fail" % (comm, time.monotonic() - start)
    for word in words:
        assert word in message, "init(comm=%r): %r not in %r" % (comm, word, message)
    assert not hvl.is_initialized()


def bad_arguments():
    others = [r for r in range(WORLD_SIZE) if r != WORLD_RANK]
    fails_at_once(others, "rank %d of MPI_COMM_WORLD, is not in the list" % WORLD_RANK, str(others))
    fails_at_once([WORLD_RANK, WORLD_RANK], "rank %d is listed twice" % WORLD_RANK)
    fails_at_once([WORLD_RANK, WORLD_SIZE + 5], "%d is not a rank of MPI_COMM_WORLD" % (WORLD_SIZE + 5))
    if WORLD_RANK < 2:      # two members whose lists differ in order only
        fails_at_once([WORLD_RANK, 1 - WORLD_RANK], "the listed ranks did not all pass this list")
    fails_at_once(["0"], "list of ranks of MPI_COMM_WORLD (ints) or an mpi4py communicator")
    fails_at_once(object(), "list of ranks of MPI_COMM_WORLD (ints) or an mpi4py communicator, not <object")
    if MODE == "comm":
        fails_at_once(MPI.COMM_NULL, "MPI.COMM_NULL")
        half = MPI.COMM_WORLD.Split(WORLD_RANK % 2, WORLD_RANK)
        inter = half.Create_intercomm(0, MPI.COMM_WORLD, 1 - WORLD_RANK % 2, 7)
        fails_at_once(inter, "intercommunicator")
        inter.Free()
        half.Free()


def check_topology(members):
    """This rank's world is ``members`` (ranks of MPI_COMM_WORLD in hvlite's order), on one host."""
    me = members.index(WORLD_RANK)
    got = (hvl.rank(), hvl.size(), hvl.local_rank(), hvl.local_size(), hvl.cross_rank(), hvl.cross_size())
    assert got == (me, len(members), me, len(members), 0, 1), (members, got)
    assert hvl.is_homogeneous()
    assert hvl.global_process_set.ranks == list(range(len(members)))


def check_collectives(seed):
    """Every collective on the world, against the reference from its members' inputs."""
    rank, size = hvl.rank(), hvl.size()
    for dtype in DTYPES:
        stack = np.stack([inputs(seed, r, dtype, (3, 4)) for r in range(size)])
        for name, op in OPS.items():
            if dtype == np.bool_ and name == "Average":
                continue
            got = hvl.allreduce(stack[rank], op=op, name="ar.%s.%s" % (dtype.name, name))
            assert_equal(got, reduce(stack, name, dtype, size), "allreduce %s %s" % (name, dtype),
                         dtype, exact=name != "Average")
        rows = [inputs(seed + 1, r, dtype, (r + 1, 2)) for r in range(size)]
        assert_equal(hvl.allgather(rows[rank], name="ag." + dtype.name), np.concatenate(rows),
                     "allgather %s" % dtype)
        for root in range(size):
            got = hvl.broadcast(stack[rank], root, name="bc.%s.%d" % (dtype.name, root))
            assert_equal(got, stack[root], "broadcast %s from %d" % (dtype, root))
    blocks = [np.arange(size * 2, dtype=np.int64) + 100 * r for r in range(size)]
    got, received = hvl.alltoall(blocks[rank], splits=[2] * size, name="a2a")
    assert list(received) == [2] * size, received
    assert_equal(got, np.concatenate([b[2 * rank:2 * rank + 2] for b in blocks]), "alltoall")
    stack = np.stack([inputs(seed + 2, r, np.dtype(np.int32), (size * 2, 3)) for r in range(size)])
    got = hvl.reducescatter(stack[rank], op=hvl.Sum, name="rs")
    assert_equal(got, stack.sum(axis=0, dtype=np.int32)[2 * rank:2 * rank + 2], "reducescatter")
    hvl.barrier()
    if size > 1:
        assert hvl.engine_counters()["shm_collectives"] > 0, "the shm plane ran nothing in this world"


def check_process_sets(members, seed):
    """A set of the world's first two ranks: by ranks, and (members, mpi4py) by a communicator
    whose members are ranks of MPI_COMM_WORLD, which hvlite maps to the world's ranks."""
    if hvl.size() < 3:
        return
    pair = hvl.ProcessSet([0, 1])
    if MODE == "comm":   # the world's members make a communicator of its first two ranks
        group = MPI.COMM_WORLD.Get_group().Incl(members)
        world = MPI.COMM_WORLD.Create_group(group)
        sub = world.Split(0 if hvl.rank() < 2 else MPI.UNDEFINED, hvl.rank())
        if sub != MPI.COMM_NULL:
            pair = hvl.ProcessSet(sub)      # the others pass the same set as ranks
    hvl.add_process_set(pair)
    assert pair.ranks == [0, 1], pair
    if hvl.rank() < 2:
        stack = np.stack([inputs(seed, r, np.dtype(np.float64), (5,)) for r in range(2)])
        got = hvl.allreduce(stack[hvl.rank()], op=hvl.Sum, name="pair", process_set=pair)
        assert_equal(got, stack.sum(axis=0), "allreduce on the pair")
        assert pair.rank() == hvl.rank() and pair.size() == 2
    hvl.remove_process_set(pair)


def run_world(members, seed):
    """Init on ``members`` (a list, or an mpi4py communicator of them), check, shut down."""
    check_topology(members)
    check_collectives(seed)
    check_process_sets(members, seed)


def groups_by_lists():
    """Two groups: the first half of the world in reverse order, the rest in order."""
    half = WORLD_SIZE // 2
    first, second = list(range(half))[::-1], list(range(half, WORLD_SIZE))
    return (first, 10) if WORLD_RANK < half else (second, 20)


def main():
    bad_arguments()
    if MODE == "comm":
        # all but the last rank, in reverse order, and the last rank alone
        group = 0 if WORLD_RANK < WORLD_SIZE - 1 else 1
        comm = MPI.COMM_WORLD.Split(group, -WORLD_RANK)
        members = [int(r) for r in comm.allgather(WORLD_RANK)]
        hvl.init(comm=comm)
        assert hvl.global_process_set.mpi_comm is comm
        hvl.init(comm=comm)                       # a second init with the same world: no-op
        try:
            hvl.init(comm=list(range(WORLD_SIZE)))
        except ValueError as e:
            assert "called again with comm=" in str(e), e
        else:
            raise AssertionError("a second init on another world did not fail")
        try:
            hvl.add_process_set(hvl.ProcessSet(MPI.COMM_WORLD))
        except ValueError as e:
            assert "not in the job's world" in str(e), e
        else:
            raise AssertionError("a process set outside the world was accepted")
        run_world(members, 30 + group)
        hvl.shutdown()
        comm.Free()
    members, seed = groups_by_lists()
    hvl.init(comm=members)
    run_world(members, seed)
    hvl.shutdown()
    if MODE == "comm":
        assert MPI.COMM_WORLD.allreduce(1) == WORLD_SIZE    # mpi4py's MPI is still there
    print("init_comm OK on world rank %d" % WORLD_RANK, flush=True)


try:
    main()
except BaseException:       # noqa: BLE001 - end this rank now: MPI_Finalize at exit would wait
    import traceback        # for the ranks still running, and the job would not end
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)
