"""Process sets: collectives among subsets of ranks, each result checked on every rank against a
NumPy reference computed from the members' seeded inputs. Disjoint sets run at the same time
(one set keeps completing collectives while the other is held up); overlapping sets in any
interleaving; the response cache on sets; a set without the calling rank, a removed set, a
duplicate set, member lists that differ between ranks (errors on every rank); torch
DistributedOptimizer on a set equals one process on the set's combined batch.
SPMD: run by hvlrun at 2 and 3 ranks."""
import numpy as np
import pytest

import hvlite as hvd
from reference import DTYPES, assert_equal, inputs, reduce

RANK, SIZE = hvd.rank(), hvd.size()
LOW = list(range((SIZE + 1) // 2))          # {0} {1} at 2 ranks; {0,1} {2} at 3
HIGH = list(range((SIZE + 1) // 2, SIZE))
IN_LOW = RANK in LOW


@pytest.fixture
def halves():
    """The lower and the upper ranks as two disjoint sets; this rank's set first."""
    low, high = hvd.add_process_set(LOW), hvd.add_process_set(HIGH)
    yield (low, high) if IN_LOW else (high, low)
    assert hvd.remove_process_set(low) and hvd.remove_process_set(high)


def check_all_ops(ps, seed, tag):
    """Every op x dtype on set ps, against the reference over ps's members."""
    members, me = ps.ranks, ps.ranks.index(RANK)
    for dtype in DTYPES:
        shape = (len(members) * 2 + 1, 3)
        mine = inputs(seed, RANK, dtype, shape)
        stack = np.stack([inputs(seed, r, dtype, shape) for r in members])
        ops = ["Sum", "Min", "Max"] + ([] if dtype == np.bool_ else ["Average"])
        for op in ops:
            got = hvd.allreduce(mine, op=getattr(hvd, op), process_set=ps, name="%s.ar.%s.%s" % (tag, dtype, op))
            exact = op != "Average" or dtype.kind in "iub"
            assert_equal(got, reduce(stack, op, dtype, len(members)), "allreduce %s %s" % (op, dtype), dtype, exact)
        rows = [inputs(seed, r, dtype, (r + 1, 2)) for r in members]
        got = hvd.allgather(rows[me], process_set=ps, name="%s.ag.%s" % (tag, dtype))
        assert_equal(got, np.concatenate(rows), "allgather %s" % dtype)
        root = members[-1]
        got = hvd.broadcast(mine, root_rank=root, process_set=ps, name="%s.bc.%s" % (tag, dtype))
        assert_equal(got, inputs(seed, root, dtype, shape), "broadcast %s" % dtype)
        a2a_shape = (len(members) * 2, 3)
        got = hvd.alltoall(inputs(seed, RANK, dtype, a2a_shape), process_set=ps, name="%s.a2a.%s" % (tag, dtype))
        expect = np.concatenate([inputs(seed, r, dtype, a2a_shape)[me * 2:(me + 1) * 2] for r in members])
        assert_equal(got, expect, "alltoall %s" % dtype)
        if dtype != np.bool_:
            got = hvd.reducescatter(mine, op=hvd.Sum, process_set=ps, name="%s.rs.%s" % (tag, dtype))
            full = reduce(stack, "Sum", dtype, len(members))
            start = sum(int(hvd_rows(shape[0], k, len(members))) for k in range(me))
            assert_equal(got, full[start:start + hvd_rows(shape[0], me, len(members))], "reducescatter %s" % dtype)


def hvd_rows(dim0, rank, size):
    return dim0 // size + (1 if rank < dim0 % size else 0)


def test_global_process_set_is_every_rank():
    assert hvd.global_process_set.process_set_id == 0
    assert hvd.global_process_set.ranks == list(range(SIZE))
    assert (hvd.global_process_set.size(), hvd.global_process_set.rank()) == (SIZE, RANK)
    assert hvd.global_process_set.included()


def test_disjoint_sets_every_op_and_dtype(halves):
    mine, other = halves
    assert mine.included() and not other.included() and other.rank() == -1
    assert mine.size() == len(mine.ranks) and mine.rank() == mine.ranks.index(RANK)
    check_all_ops(mine, seed=11, tag="disjoint")
    got = hvd.allreduce(np.full(4, RANK, np.int64), op=hvd.Sum, name="disjoint.global")
    assert (got == SIZE * (SIZE - 1) // 2).all()      # the global set still works between them


def test_disjoint_sets_run_concurrently(halves):
    """The upper set is held up (its ranks wait in a global barrier) until the lower set has
    completed 30 collectives, which the lower set's ranks must do before they join that barrier:
    one negotiation for all sets must not make one set wait for another (it would end in the
    engine's deadlock error, or the job's timeout). Then the upper set runs its own 30."""
    mine, _ = halves
    if not IN_LOW:
        hvd.barrier()
    for i in range(30):
        got = hvd.allreduce(np.full(2, RANK, np.float64), op=hvd.Sum, process_set=mine, name="concurrent.%d" % i)
        assert (got == sum(mine.ranks)).all()
    if IN_LOW:
        hvd.barrier()
    hvd.barrier()


def test_overlapping_sets_in_any_interleaving():
    """Every pair of ranks is a set (plus the global set); each rank starts its async
    collectives on all its sets in a rank-dependent order, then waits for them all."""
    pairs = [hvd.add_process_set([a, b]) for a in range(SIZE) for b in range(a + 1, SIZE)
             if [a, b] != list(range(SIZE))]
    sets = [hvd.global_process_set] + pairs
    rng = np.random.default_rng(RANK)
    for rep in range(3):
        mine = [ps for ps in sets if RANK in ps.ranks]
        order = rng.permutation(len(mine))
        handles = []
        for k in order:
            ps = mine[k]
            x = np.full(3, RANK + 10 * rep, np.int32)
            handles.append((ps, hvd.allreduce_async(x, op=hvd.Sum, process_set=ps, name="overlap.%d" % rep)))
        for ps, h in handles:
            expect = sum(r + 10 * rep for r in ps.ranks)
            assert (hvd.synchronize(h) == expect).all(), (ps, rep)
    for ps in pairs:
        assert hvd.remove_process_set(ps)


def test_cached_responses_on_sets(halves):
    """The same named tensors again and again: after the first step responses come from the
    cache (non-members vote ready for the other set's cached slots; without that vote no set
    tensor could ever hit) and results stay correct. A request that waits over a second on a
    loaded machine is sent to rank 0 instead, so hits are counted over three steps."""
    mine, _ = halves
    names = ["cache.%d" % i for i in range(5)]
    hits = 0
    for step in range(4):
        before = hvd.engine_counters()["cache_hits"]
        handles = [hvd.allreduce_async(np.full(6, RANK + step, np.float32), op=hvd.Sum,
                                       process_set=mine, name=n) for n in names]
        for h in handles:
            assert (hvd.synchronize(h) == sum(r + step for r in mine.ranks)).all()
        hits += hvd.engine_counters()["cache_hits"] - before if step else 0
    assert hits >= len(names), hits


def test_collective_on_a_set_without_this_rank_fails_clearly(halves):
    _, other = halves
    with pytest.raises(hvd.HvliteInvalidArgument, match=r"this rank \(%d\) is not a member of process set %d"
                       % (RANK, other.process_set_id)):
        hvd.allreduce(np.ones(2), process_set=other, name="outsider")


def test_broadcast_root_outside_the_set_fails_clearly(halves):
    mine, other = halves
    with pytest.raises(hvd.HvliteInvalidArgument, match="root rank %d is not a member" % other.ranks[0]):
        hvd.broadcast(np.ones(2), root_rank=other.ranks[0], process_set=mine, name="bad.root")


def test_removed_and_unregistered_sets():
    ps = hvd.add_process_set([0])
    assert hvd.remove_process_set(ps) and ps.process_set_id is None and ps.size() is None
    assert not hvd.remove_process_set(ps)
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(np.ones(2), process_set=ps)
    with pytest.raises(ValueError, match="cannot be removed"):
        hvd.remove_process_set(hvd.global_process_set)


def test_duplicate_set_fails_on_every_rank():
    with pytest.raises(hvd.HvliteInvalidArgument, match="process set 0 already has these %d ranks" % SIZE):
        hvd.add_process_set(list(range(SIZE)))


def test_an_empty_set_is_every_rank_as_in_horovod():
    every = hvd.ProcessSet([])          # Horovod's global set is one
    assert every.ranks == [] and every.process_set_id is None and every.size() is None
    with pytest.raises(hvd.HvliteInvalidArgument, match="process set 0 already has these %d ranks" % SIZE):
        hvd.add_process_set(every)
    assert every.process_set_id is None


def test_member_lists_that_differ_between_ranks_fail_on_every_rank():
    with pytest.raises(hvd.HvliteInvalidArgument, match="different member lists"):
        hvd.add_process_set([0] if RANK == 0 else [1])
    hvd.barrier()


def test_torch_distributed_optimizer_on_a_set(halves):
    """Each half trains its own copy with DistributedOptimizer(process_set=...): the result
    equals one process on the half's combined batch, and differs between the halves."""
    import torch
    import hvlite.torch as thvd
    torch.set_num_threads(1)
    mine, _ = halves
    per = 3
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()
    reference = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()
    reference.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(7 + mine.ranks[0])          # each half sees its own data
    x = torch.randn(5, len(mine.ranks) * per, 5, generator=g, dtype=torch.float64)
    y = torch.randn(5, len(mine.ranks) * per, 2, generator=g, dtype=torch.float64)
    me = mine.ranks.index(RANK)
    opt = thvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                    named_parameters=model.named_parameters(), process_set=mine)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.MSELoss()
    for b in range(5):
        opt.zero_grad()
        loss_fn(model(x[b, me * per:(me + 1) * per]), y[b, me * per:(me + 1) * per]).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(reference(x[b]), y[b]).backward()
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.allclose(p, q, rtol=1e-10, atol=1e-12), name
    rows = thvd.allgather(model[0].weight.detach().reshape(1, -1), name="halves.weights")
    for r in range(SIZE):
        same_half = (r in LOW) == IN_LOW
        assert torch.equal(rows[r], rows[RANK]) == same_half, (r, same_half)


def test_tensorflow_ops_on_a_set(halves):
    """hvlite.tensorflow on a set, eagerly and in a tf.function: sums, gathers, scatters and the
    gradient of allgather use the set's members, sizes and ranks."""
    import tensorflow as tf
    import hvlite.tensorflow as tfhvd
    mine, _ = halves
    n, me = len(mine.ranks), mine.ranks.index(RANK)
    x = tf.constant(np.full((n * 2, 3), RANK + 1.0, np.float32))

    def run():
        total = tfhvd.allreduce(x, op=tfhvd.Sum, process_set=mine)
        rows = tfhvd.allgather(x[:1], process_set=mine)
        part = tfhvd.reducescatter(x, op=tfhvd.Sum, process_set=mine)
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(tfhvd.allgather(x, process_set=mine))
        return total, rows, part, tape.gradient(loss, x), tfhvd.size_op(mine.process_set_id)
    expect_sum = sum(r + 1.0 for r in mine.ranks)
    for fn in (run, tf.function(run)):
        total, rows, part, grad, size = fn()
        assert np.all(total.numpy() == expect_sum) and int(size) == n
        assert rows.numpy()[:, 0].tolist() == [r + 1.0 for r in mine.ranks]
        assert part.shape[0] == 2 and np.all(part.numpy() == expect_sum)
        # Horovod's allgather gradient: the members' average of d(loss)/d(gathered) = 1
        assert np.all(grad.numpy() == 1)
    assert me >= 0
