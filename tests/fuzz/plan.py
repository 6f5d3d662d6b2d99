"""Seeded plans for the collective fuzzer (tests/fuzz/fuzz.py): what every rank calls, and what
each call must end in.

Contract: ``Planner(seed, size).sequence(index)`` is a pure function of its arguments (one
``random.Random`` seeded with seed and index, no global state, no hvlite import): every rank
computes the same plan, so the ranks agree on every call and every expected outcome without
talking, and one sequence can be replayed alone (``fuzz.py --first I --sequences 1``). A plan is
global: it lists, for each rank, the actions of that rank in each step; a deviation (a rank with
another dtype, a rank that waits on another collective) is written out per rank.

A sequence: add 0-2 process sets (sometimes a faulty add) -> 1-6 steps -> maybe a desync (always
last) -> the sync (an allgather every rank checks) -> the added sets removed. Step kinds:
  group      1-5 async collectives on random sets, sometimes a barrier: every result exact
  mismatch   a group in which the members of one collective's set disagree on one field (op,
             dtype, shape, reduce op, root rank, prescale, postscale): MismatchError on every
             member naming the tensor, the field and the rank groups; the rest of the group exact
  reuse      some members submit a name in flight on them again: HvliteInvalidArgument at once
             on those ranks (a global fence keeps the first one in flight); the first exact
  nonmember  a rank submits on a set it is not in: HvliteInvalidArgument at once, naming it
  remove     the ranks remove different sets: MismatchError on the process set, every rank
  join       uneven work: some ranks run 1-3 more collectives (global or on sets), then every
             rank joins; joined ranks stand in with zeros for an allreduce, so results are exact
             against that; any other op on a set with a joined member fails with
             HvliteInvalidArgument on its busy members, naming the joined ones (as in Horovod);
             join returns a busy rank (the last to join)
  desync     ranks wait on different collectives (ops), on the same two in another order (order),
             or some skip one and go on to the sync (skip): HvliteDeadlockError on every waiting
             rank naming what each side waits on, while a collective that all submitted before
             completes; in a set, its non-members may see the sync fail with the same error (when
             they waited long enough) and then sync again
Ranks sometimes pause a few milliseconds between actions, so the interleavings vary.
Every call carries ``expect``: ("ok",), ("mismatch", field, groups), ("invalid", reason),
("joined", joined ranks of its set), ("deadlock", sides, optional_ranks). Rank groups and
deadlock sides are computed here exactly as the engine must word them; process-set ids are
only known at run time, so names and values that contain them stay symbolic (a set index)
until fuzz.py formats them.
"""
import random
import zlib
from dataclasses import dataclass, field, replace

DTYPES = ("uint8", "int8", "uint16", "int16", "int32", "int64", "float16", "bfloat16",
          "float32", "float64", "bool")
FLOATS = ("float16", "bfloat16", "float32", "float64")
REDUCE_OPS = ("Sum", "Average", "Min", "Max", "Product")
DATA_OPS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
FACTORS = (0.5, 2.0, 0.25, 3.0, -1.0, 1.5, 0.1)
# The fields the engine compares, in its order (coordinator.c field_names).
REDUCTION_FIELDS = ("op", "dtype", "shape", "reduce op", "prescale factor", "postscale factor")
FIELDS = {"allreduce": REDUCTION_FIELDS, "reducescatter": REDUCTION_FIELDS,
          "allgather": ("op", "dtype", "shape"), "alltoall": ("op", "dtype", "shape"),
          "broadcast": ("op", "dtype", "shape", "root rank")}
FREE_DIM0 = ("allgather", "alltoall")
NAME_POOL = 8          # names t0..t7 per set: reused across steps, so the response cache works


@dataclass
class Call:
    """One collective as one rank submits it. Calls of the same collective on different ranks
    share `slot`; `data` seeds the input values (reference.inputs)."""
    op: str
    name: str
    slot: int
    pset: int = 0                 # index into Sequence.sets; 0 is the global set
    dtype: str = "float32"
    shape: tuple = ()
    reduce: str = "Sum"
    prescale: float = 1.0
    postscale: float = 1.0
    root: int = 0                 # a global rank (broadcast)
    splits: tuple = None          # alltoall: rows to each member, or None (equal parts)
    inplace: bool = False         # allreduce_/broadcast_ into the input
    strided: bool = False         # the input is a non-contiguous view
    data: int = 0
    expect: tuple = ("ok",)


@dataclass
class Step:
    """kind, and per rank its actions: ("submit", Call) async, ("wait", slot), ("block", Call)
    submit-and-wait, ("barrier", set index), ("pause", seconds), ("join", busy ranks),
    ("remove", set index, expect), ("sync", expect). joined: the ranks that stand in (join)."""
    kind: str
    actions: dict
    detail: str = ""
    joined: tuple = ()


@dataclass
class Sequence:
    index: int
    sets: list                    # sets[i] = sorted global ranks; sets[0] is every rank
    adds: list                    # per add: (ranks by rank, expect) in order; ranks[r] for rank r
    steps: list
    removes_ok: list = field(default_factory=list)   # set indexes removed at the end
    digest: int = 0


def plural(ranks):
    return "rank%s %s" % ("s" if len(ranks) > 1 else "", ",".join(str(r) for r in ranks))


class Planner:
    """Plans for a job of `size` ranks (2 or more), reproducible from `seed`."""

    def __init__(self, seed, size):
        if size < 2:
            raise ValueError("the fuzzer needs at least 2 ranks")
        self.seed, self.size = seed, size

    # ---- the sequence ----

    def sequence(self, index):
        rng = random.Random("hvlite-fuzz:%d:%d" % (self.seed, index))
        seq = Sequence(index=index, sets=[list(range(self.size))], adds=[], steps=[])
        self._plan_sets(rng, seq)
        slots = iter(range(10 ** 6))
        for s in range(rng.randint(1, 6)):
            seq.steps.append(self._step(rng, seq, s, slots))
        desync = None
        if rng.random() < 0.12:
            desync = self._desync(rng, seq, len(seq.steps), slots)
            seq.steps.append(desync)
        seq.steps.append(self._sync_step(seq, desync))
        seq.removes_ok = list(range(1, len(seq.sets)))
        seq.digest = zlib.crc32(repr((seq.sets, seq.adds, seq.steps)).encode())
        return seq

    def _plan_sets(self, rng, seq):
        """0-2 sets of 1 to size-1 ranks; sometimes an add that must fail on every rank."""
        for _ in range(rng.choice((0, 1, 1, 2, 2))):
            ranks = sorted(rng.sample(range(self.size), rng.randint(1, self.size - 1)))
            if ranks in seq.sets:
                continue
            seq.adds.append(({r: ranks for r in range(self.size)}, ("ok", len(seq.sets))))
            seq.sets.append(ranks)
        if rng.random() < 0.08:       # every rank passes the ranks of a registered set
            existing = rng.randrange(len(seq.sets))
            seq.adds.append(({r: seq.sets[existing] for r in range(self.size)},
                             ("invalid", "duplicate set", existing)))
        if rng.random() < 0.08:       # the ranks pass different lists
            lists = [sorted(rng.sample(range(self.size), rng.randint(1, self.size)))
                     for _ in range(2)]
            if lists[0] != lists[1]:
                by_rank = {r: lists[rng.randrange(2)] for r in range(self.size)}
                by_rank[0], by_rank[self.size - 1] = lists[0], lists[1]
                groups = [tuple(r for r in range(self.size) if by_rank[r] == lst) for lst in lists]
                seq.adds.append((by_rank, ("invalid", "different member lists", groups)))

    def _step(self, rng, seq, s, slots):
        kinds = ["group"] * 9 + ["mismatch"] * 5 + ["reuse"] * 2 + ["join"] * 2
        if any(len(m) < self.size for m in seq.sets[1:]):
            kinds += ["nonmember"] * 2
        if len(seq.sets) >= 3:
            kinds += ["remove"]
        kind = rng.choice(kinds)
        if kind == "remove":
            return self._remove_mismatch(rng, seq, s)
        if kind == "reuse":
            return self._reuse(rng, seq, s, slots)
        if kind == "join":
            return self._join(rng, seq, s, slots)
        calls = self._group_calls(rng, seq, s, slots, rng.randint(1, 5))
        detail = ""
        if kind == "mismatch":
            calls, detail = self._mismatch(rng, seq, s, calls, next(slots))
        actions = self._async_actions(calls)
        if kind == "nonmember":
            detail = self._nonmember(rng, seq, s, actions, next(slots))
        if rng.random() < 0.2:
            p = rng.randrange(len(seq.sets))
            for r in seq.sets[p]:
                actions[r].append(("barrier", p))
        self._pauses(rng, actions)
        return Step(kind, actions, detail)

    def _pauses(self, rng, actions):
        """Sometimes a rank sleeps 1-30 ms before one of its actions (a slow rank)."""
        for r in actions:
            if actions[r] and rng.random() < 0.25:
                actions[r].insert(rng.randrange(len(actions[r]) + 1),
                                  ("pause", rng.uniform(0.001, 0.03)))

    def _async_actions(self, calls):
        """Every rank submits its calls, then waits on them in the same order."""
        actions = {r: [] for r in range(self.size)}
        for by_rank in calls:
            for r, call in by_rank.items():
                actions[r].append(("submit", call))
        for by_rank in calls:
            for r, call in by_rank.items():
                actions[r].append(("wait", call.slot))
        return actions

    # ---- collectives ----

    def _group_calls(self, rng, seq, s, slots, count):
        """`count` collectives on random sets with distinct names per set; each a dict rank ->
        Call for the members of its set."""
        used, calls = set(), []
        for _ in range(count):
            p = rng.randrange(len(seq.sets))
            name = "t%d" % rng.randrange(NAME_POOL)
            if (p, name) in used:
                continue
            used.add((p, name))
            calls.append(self._collective(rng, seq.sets[p], p, name, next(slots)))
        return calls

    def _collective(self, rng, members, p, name, slot, op=None):
        op = op or rng.choice(DATA_OPS)
        base = Call(op=op, name=name, slot=slot, pset=p, data=rng.getrandbits(31))
        base.dtype = rng.choice(DTYPES)
        ndim = rng.choice((0, 1, 1, 2, 2, 3))
        if op in ("alltoall", "reducescatter"):
            ndim = max(ndim, 1)
        base.shape = self._shape(rng, ndim)
        if op in ("allreduce", "reducescatter"):
            self._reduction(rng, base)
        if op == "broadcast":
            base.root = rng.choice(members)
        base.inplace = op in ("allreduce", "broadcast") and rng.random() < 0.3
        base.strided = base.shape != () and rng.random() < 0.2
        by_rank = {}
        for r in members:
            call = replace(base)
            if op == "allgather" and ndim > 0:
                call.shape = (rng.randint(0, 4),) + base.shape[1:]
            if op == "alltoall":
                self._alltoall_shape(rng, call, len(members))
            by_rank[r] = call
        return by_rank

    def _shape(self, rng, ndim):
        if ndim == 1 and rng.random() < 0.1:
            return (rng.randint(1000, 20000),)   # long enough for many shm chunks and pieces
        return tuple(rng.choice((0, 1, 1, 2, 3, 4, 5, 7)) for _ in range(ndim))

    def _reduction(self, rng, call):
        ops = REDUCE_OPS if call.dtype != "bool" else ("Sum", "Min", "Max", "Product")
        call.reduce = rng.choice(ops)
        if call.op == "reducescatter" and rng.random() < 0.3:
            call.reduce = "Average" if call.dtype != "bool" else "Sum"
        if call.dtype != "bool":
            call.prescale = rng.choice(FACTORS) if rng.random() < 0.3 else 1.0
            call.postscale = rng.choice(FACTORS) if rng.random() < 0.3 else 1.0

    def _alltoall_shape(self, rng, call, n):
        if rng.random() < 0.4:                   # equal parts: dim 0 divisible by the set size
            call.splits = None
            call.shape = (n * rng.randint(0, 3),) + call.shape[1:]
        else:
            call.splits = tuple(rng.randint(0, 3) for _ in range(n))
            call.shape = (sum(call.splits),) + call.shape[1:]

    # ---- mismatches ----

    def _mismatch(self, rng, seq, s, calls, slot):
        """Adds one collective whose members disagree on one field; returns (calls, detail)."""
        for _ in range(20):
            p = rng.randrange(len(seq.sets))
            members = seq.sets[p]
            if len(members) >= 2:
                break
        else:
            return calls, ""
        name = "t%d" % rng.randrange(NAME_POOL) if rng.random() < 0.3 else "m%d.%d" % (seq.index, s)
        firsts = [next(iter(c.values())) for c in calls if c]
        if any(c.pset == p and c.name == name for c in firsts):
            name = "m%d.%d" % (seq.index, s)
        base = self._collective(rng, members, p, name, slot)
        op = next(iter(base.values())).op
        f = rng.choice(FIELDS[op])
        values = self._field_values(rng, f, base[members[0]], members, rng.choice((1, 1, 2)))
        if values is None:
            return calls, ""
        # every member takes one of the values; at least two different values are used
        choice = {r: rng.randrange(len(values)) for r in members}
        choice[members[0]], choice[members[-1]] = 0, rng.randrange(1, len(values))
        by_rank = {}
        for r in members:
            by_rank[r] = values[choice[r]](base[r])
        groups = []                        # (value text, ranks) in order of first appearance
        for r in members:
            text = describe(f, by_rank[r])
            for g in groups:
                if g[0] == text:
                    g[1].append(r)
                    break
            else:
                groups.append((text, [r]))
        if len(groups) < 2:
            return calls, ""
        expect = ("mismatch", f, [(t, tuple(rs)) for t, rs in groups])
        for r in members:
            by_rank[r].expect = expect
        pos = rng.randint(0, len(calls))
        return calls[:pos] + [by_rank] + calls[pos:], "%s of %s %r on set %d" % (f, op, name, p)

    def _field_values(self, rng, f, call, members, alternatives):
        """Functions call -> call with the base value (first) and 1-2 other values of field f,
        each valid on its own (no local error before negotiation); None if there is none."""
        def keep(c):
            return replace(c)
        makers = []
        for _ in range(alternatives):
            maker = self._deviation(rng, f, call, members)
            if maker is not None:
                makers.append(maker)
        return [keep] + makers if makers else None

    def _deviation(self, rng, f, call, members):
        if f == "dtype":
            scaled = call.prescale != 1.0 or call.postscale != 1.0 or call.reduce == "Average"
            reduces = call.op in ("allreduce", "reducescatter")
            choices = [d for d in DTYPES
                       if d != call.dtype and not (d == "bool" and reduces and scaled)]
            dtype = rng.choice(choices)
            return lambda c: replace(c, dtype=dtype)
        if f == "shape":
            shape = self._other_shape(rng, call)
            if call.op in FREE_DIM0:      # each rank keeps its own dim 0 (alltoall: its splits)
                return lambda c: replace(
                    c, shape=((c.shape[0] if c.shape else 1),) + shape[1:] if shape else (),
                    strided=c.strided and shape != ())
            return lambda c: replace(c, shape=shape, strided=c.strided and shape != ())
        if f == "reduce op":
            ops = [o for o in REDUCE_OPS
                   if o != call.reduce and not (call.dtype == "bool" and o == "Average")]
            reduce = rng.choice(ops)
            return lambda c: replace(c, reduce=reduce)
        if f == "root rank":
            others = [m for m in members if m != call.root]
            root = rng.choice(others)
            return lambda c: replace(c, root=root)
        if f in ("prescale factor", "postscale factor"):
            if call.dtype == "bool":
                return None
            attr = "prescale" if f.startswith("pre") else "postscale"
            value = rng.choice([x for x in FACTORS + (1.0,) if x != getattr(call, attr)])
            return lambda c: replace(c, **{attr: value})
        if f == "op":
            ops = [o for o in DATA_OPS if o != call.op
                   and not (o in ("alltoall", "reducescatter") and call.shape == ())]
            op = rng.choice(ops)
            root = rng.choice(members)
            return lambda c: self._as_op(c, op, root, len(members))
        return None

    def _other_shape(self, rng, call):
        """A shape that differs from call.shape in a compared dimension (not dim 0 of allgather
        or alltoall), keeping at least one dimension where the op needs it."""
        for _ in range(50):
            ndim = rng.choice((0, 1, 2, 3))
            if call.op in ("alltoall", "reducescatter"):
                ndim = max(ndim, 1)
            shape = self._shape(rng, ndim)
            if call.op in FREE_DIM0:
                if len(shape) != len(call.shape) or shape[1:] != call.shape[1:]:
                    return shape
            elif shape != call.shape:
                return shape
        return call.shape + (2,)

    def _as_op(self, call, op, root, n):
        c = replace(call, op=op, inplace=False, root=root, splits=None)
        if op in ("allreduce", "reducescatter"):
            if c.dtype == "bool":
                c.reduce = "Sum"
                c.prescale = c.postscale = 1.0
        if op == "alltoall":
            c.splits = tuple([c.shape[0]] + [0] * (n - 1))
        return c

    # ---- the other faults ----

    def _reuse(self, rng, seq, s, slots):
        """Deviants submit X, then X's name again (refused at once), then a global fence;
        the other members fence first and submit X after, so X is in flight at the repeat."""
        for _ in range(20):
            p = rng.randrange(len(seq.sets))
            if len(seq.sets[p]) >= 2:
                break
        else:
            return Step("group", {r: [] for r in range(self.size)})
        members = seq.sets[p]
        x = self._collective(rng, members, p, "t%d" % rng.randrange(NAME_POOL), next(slots))
        deviants = sorted(rng.sample(members, rng.randint(1, len(members) - 1)))
        fence = self._collective(rng, seq.sets[0], 0, "fence", next(slots), op="allreduce")
        actions = {}
        for r in range(self.size):
            if r in deviants:
                again = self._collective(rng, members, p, x[r].name, next(slots))[r]
                again.expect = ("invalid", "in flight")
                actions[r] = [("submit", x[r]), ("submit", again), ("block", fence[r]),
                              ("wait", x[r].slot)]
            elif r in members:
                actions[r] = [("block", fence[r]), ("submit", x[r]), ("wait", x[r].slot)]
            else:
                actions[r] = [("block", fence[r])]
        return Step("reuse", actions,
                    "%r on set %d by %s" % (x[members[0]].name, p, plural(deviants)))

    def _join(self, rng, seq, s, slots):
        """Busy ranks run 1-3 more collectives on sets with a busy member, then join; the others
        join at once. Joined members stand in for an allreduce; any other op on a set with a
        joined member fails on its busy members (as in Horovod)."""
        busy = sorted(rng.sample(range(self.size), rng.randint(1, self.size)))
        joined = tuple(r for r in range(self.size) if r not in busy)
        calls = []
        for i in range(rng.randint(1, 3)):
            p = rng.choice([q for q in range(len(seq.sets)) if set(seq.sets[q]) & set(busy)])
            members = seq.sets[p]
            by_rank = self._collective(rng, members, p, "j%d" % i, next(slots))
            call = by_rank[members[0]]
            if call.op == "broadcast":
                root = rng.choice(members)
                for c in by_rank.values():
                    c.root = root
            stand_ins = tuple(m for m in members if m in joined)
            if stand_ins and call.op != "allreduce":
                for c in by_rank.values():
                    c.expect = ("joined", stand_ins)
            calls.append({r: c for r, c in by_rank.items() if r in busy})
        actions = {r: [] for r in range(self.size)}
        if rng.random() < 0.5:
            actions = self._async_actions(calls)
        else:
            for by_rank in calls:
                for r, c in by_rank.items():
                    actions[r].append(("block", c))
        for r in range(self.size):
            actions[r].append(("join", tuple(busy)))
        self._pauses(rng, actions)
        return Step("join", actions, "busy %s" % plural(busy), joined)

    def _nonmember(self, rng, seq, s, actions, slot):
        p = rng.choice([i for i in range(1, len(seq.sets)) if len(seq.sets[i]) < self.size])
        outsider = rng.choice([r for r in range(self.size) if r not in seq.sets[p]])
        by_rank = self._collective(rng, seq.sets[p], p, "x%d" % rng.randrange(NAME_POOL), slot)
        call = by_rank[seq.sets[p][0]]
        call.expect = ("invalid", "not a member")
        actions[outsider].insert(rng.randint(0, len(actions[outsider])), ("submit", call))
        return "rank %d on set %d" % (outsider, p)

    def _remove_mismatch(self, rng, seq, s):
        """Every rank removes one of two sets: MismatchError on the process set, every rank;
        no set is removed."""
        a, b = rng.sample(range(1, len(seq.sets)), 2)
        target = {r: rng.choice((a, b)) for r in range(self.size)}
        target[0], target[self.size - 1] = a, b
        groups = []
        for r in range(self.size):
            for g in groups:
                if g[0] == target[r]:
                    g[1].append(r)
                    break
            else:
                groups.append((target[r], [r]))
        expect = ("mismatch", "process set", [(("set", t), tuple(rs)) for t, rs in groups])
        return Step("remove", {r: [("remove", target[r], expect)] for r in range(self.size)},
                    "sets %d/%d" % (a, b))

    # ---- desyncs and the sync ----

    def _desync(self, rng, seq, s, slots):
        """Members of one set split into two sides that block on different collectives."""
        candidates = [p for p in range(len(seq.sets)) if len(seq.sets[p]) >= 2]
        p = rng.choice(candidates)
        members = seq.sets[p]
        kind = rng.choice(("ops", "order", "skip") if p == 0 else ("ops", "order"))
        side_a = sorted(rng.sample(members, rng.randint(1, len(members) - 1)))
        side_b = [m for m in members if m not in side_a]
        if kind == "ops":
            ops = rng.sample(DATA_OPS, 2)
            a = self._collective(rng, members, p, "a%d" % s, next(slots), op=ops[0])
            b = self._collective(rng, members, p, "b%d" % s, next(slots), op=ops[1])
        else:
            op = rng.choice(DATA_OPS)
            a = self._collective(rng, members, p, "x%d" % s, next(slots), op=op)
            b = self._collective(rng, members, p, "y%d" % s, next(slots), op=op)
        waits = {r: [(a[r].op, a[r].name, p, tuple(side_a))] for r in side_a}
        if kind == "skip":       # side b goes straight to the sync, which side a never reaches
            waits.update({r: [("allgather", "sync", 0, tuple(side_b))] for r in side_b})
        else:
            waits.update({r: [(b[r].op, b[r].name, p, tuple(side_b))] for r in side_b})
        optional = tuple(r for r in range(self.size) if r not in members)
        expect = ("deadlock", deadlock_sides(waits), optional)
        actions = {r: [] for r in range(self.size)}
        for r in side_a:
            actions[r] = [("block", replace(a[r], expect=expect))]
            if kind == "order":
                actions[r].append(("block", replace(b[r], expect=("unreached",))))
        for r in side_b:
            if kind != "skip":
                actions[r] = [("block", replace(b[r], expect=expect))]
                if kind == "order":
                    actions[r].append(("block", replace(a[r], expect=("unreached",))))
        # a collective every member of its set submits first completes all the same
        if rng.random() < 0.5:
            q = rng.randrange(len(seq.sets))
            common = self._collective(rng, seq.sets[q], q, "c%d" % s, next(slots))
            for r, call in common.items():
                actions[r] = [("submit", call)] + actions[r] + [("wait", call.slot)]
        return Step("desync", actions,
                    "%s on set %d: %s vs %s" % (kind, p, plural(side_a), plural(side_b)))

    def _sync_step(self, seq, desync):
        """Every rank allgathers (sequence, digest). After a skip desync its first try fails on
        the side that skipped; after a desync in a set it may fail on the non-members."""
        expect = {r: ("ok",) for r in range(self.size)}
        if desync is not None:
            first = next(c for acts in desync.actions.values() for kind, c in acts
                         if kind == "block")
            sides, optional = first.expect[1], first.expect[2]
            for ranks, waits in sides:
                if waits[0][1] == "sync":
                    for r in ranks:
                        expect[r] = first.expect
            for r in optional:
                expect[r] = ("deadlock_or_ok",) + first.expect[1:]
        return Step("sync", {r: [("sync", expect[r])] for r in range(self.size)})


def deadlock_sides(waits):
    """[(ranks, waits)] grouped as the engine groups them: ranks with the same waits together, in
    order of their first rank. waits[r] = [(op, name, set index, submitted by)]."""
    sides = []
    for r in sorted(waits):
        for ranks, w in sides:
            if w == waits[r]:
                ranks.append(r)
                break
        else:
            sides.append(([r], waits[r]))
    return [(tuple(ranks), w) for ranks, w in sides]


def describe(f, call):
    """The engine's text for field f of a call (coordinator.c describe()), set ids symbolic."""
    if f == "op":
        return call.op
    if f == "dtype":
        return call.dtype
    if f == "reduce op":
        return call.reduce
    if f == "root rank":
        return "root %d" % call.root
    if f == "prescale factor":
        return "%.17g" % call.prescale
    if f == "postscale factor":
        return "%.17g" % call.postscale
    if f == "shape":
        dims = ["*" if i == 0 and call.op in FREE_DIM0 else str(d)
                for i, d in enumerate(call.shape)]
        return "[" + ", ".join(dims) + "]"
    raise ValueError(f)
