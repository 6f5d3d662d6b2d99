"""Reading and checking hvlite timeline files in tests (imported by the drivers and the SPMD
file; not a test module).

``load(path)`` parses the file with ``json.load`` (strict: no tolerance for a missing tail),
checks that every event is well formed and that each track's spans nest (B/E pairs and X spans
either disjoint or contained), and returns a :class:`Trace`. Any problem raises AssertionError
naming the event.
"""
import collections
import json

PHASES = {"M", "B", "E", "X", "i"}
EPS = 0.002      # us: timestamps are written with 3 decimals, so touching spans may overlap by this


class Trace:
    """A parsed timeline: ``tracks`` maps a tensor name to its tid, ``events[tid]`` lists that
    track's events (no metadata) in file order, ``cycles`` is ``events[0]``."""

    def __init__(self, events):
        self.raw = events
        self.tracks = {}
        self.events = collections.defaultdict(list)
        for e in events:
            if e["ph"] == "M":
                if e["name"] == "thread_name" and e["tid"] != 0:
                    assert e["args"]["name"] not in self.tracks, "two tracks for %r" % e["args"]["name"]
                    self.tracks[e["args"]["name"]] = e["tid"]
                continue
            self.events[e["tid"]].append(e)
        self.cycles = self.events[0]

    def of(self, name, ph=None, event=None):
        """Events of tensor ``name``'s track, optionally only phase ``ph`` / name ``event``."""
        assert name in self.tracks, "no track for tensor %r (tracks: %s)" % (name, sorted(self.tracks)[:20])
        return [e for e in self.events[self.tracks[name]]
                if (ph is None or e["ph"] == ph) and (event is None or e["name"] == event)]

    def open_negotiations(self, name):
        """Begins of ``name``'s track without their end (1 while a negotiation is unfinished)."""
        return len(self.of(name, "B")) - len(self.of(name, "E"))


def check_event(e):
    assert isinstance(e, dict) and e.get("ph") in PHASES, "bad event %r" % (e,)
    assert isinstance(e.get("pid"), int) and isinstance(e.get("name"), str), "bad event %r" % (e,)
    if e["ph"] == "M":
        assert isinstance(e.get("args"), dict), "metadata without args: %r" % (e,)
        return
    assert isinstance(e.get("tid"), int), "event without tid: %r" % (e,)
    assert isinstance(e.get("ts"), (int, float)) and e["ts"] >= 0, "bad ts: %r" % (e,)
    if e["ph"] == "X":
        assert isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, "bad dur: %r" % (e,)
    if e["ph"] == "i":
        assert e.get("s") in ("t", "g", "p"), "instant without scope: %r" % (e,)
    if "args" in e:
        assert isinstance(e["args"], dict), "args not an object: %r" % (e,)


def check_nesting(tid, events):
    """Spans of one track (B..E and X) must nest like a call stack, as trace viewers require."""
    spans, stack = [], []
    for e in sorted((e for e in events if e["ph"] in "BE"), key=lambda e: (e["ts"], e["ph"] == "B")):
        if e["ph"] == "B":
            stack.append(e)
        else:
            assert stack, "tid %d: end without begin at ts %s" % (tid, e["ts"])
            b = stack.pop()
            spans.append((b["ts"], e["ts"], b["name"]))
    spans += [(b["ts"], float("inf"), b["name"]) for b in stack]          # unfinished: open
    spans += [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e["ph"] == "X"]
    spans.sort(key=lambda s: (s[0], -s[1]))
    open_ = []
    for start, end, name in spans:
        while open_ and open_[-1][1] <= start + EPS:
            open_.pop()
        if open_:
            assert end <= open_[-1][1] + EPS, "tid %d: %s [%s, %s] overlaps %s [%s, %s]" % (
                tid, name, start, end, open_[-1][2], open_[-1][0], open_[-1][1])
        open_.append((start, end, name))


def load(path):
    """Parse and check a timeline file; return its :class:`Trace`."""
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    assert isinstance(events, list) and events, "not a non-empty JSON array"
    for e in events:
        check_event(e)
    trace = Trace(events)
    for tid, evs in trace.events.items():
        check_nesting(tid, evs)
    return trace


# ---- a known workload and what its timeline must show ----

FUSED = ["tl.fused.%d" % i for i in range(6)]          # one grouped submission: fused
BIG = "tl.big"                                          # 2.5 MiB alone: 3 pieces of 1 MiB
BIG_ELEMS = 655360
OTHERS = {"tl.gather": "ALLGATHER", "tl.bcast": "BROADCAST", "tl.a2a": "ALLTOALL",
          "tl.rs": "REDUCESCATTER"}
MISMATCH = "tl.mismatch"                                # ranks disagree on the dtype (step 0)


def run_workload(hvd, steps, tag=""):
    """Every rank: ``steps`` times a fused group, a large lone allreduce, allgather, broadcast,
    alltoall and reducescatter (the same names every step: the first step goes through rank 0,
    later ones through the response cache, except the broadcast, whose root changes every step),
    plus, on more than one rank, a mismatched tensor in step 0. Every result
    is checked against NumPy. Returns the names submitted, as ``{name: instances}``."""
    import numpy as np
    rank, size = hvd.rank(), hvd.size()
    for step in range(steps):
        parts = [np.full(1000 + 100 * i, rank + i + step, np.float32) for i in range(len(FUSED))]
        for i, got in enumerate(hvd.grouped_allreduce(parts, name=tag + "tl.fused", op=hvd.Sum)):
            assert (got == sum(r + i + step for r in range(size))).all(), FUSED[i]
        big = hvd.allreduce(np.full(BIG_ELEMS, rank + 1, np.float32), name=tag + BIG, op=hvd.Average,
                            prescale_factor=2.0)
        assert np.allclose(big, 2.0 * sum(range(1, size + 1)) / size), BIG
        rows = hvd.allgather(np.full((rank + 1, 3), rank, np.float64), name=tag + "tl.gather")
        assert (rows == np.concatenate([np.full((r + 1, 3), r, np.float64) for r in range(size)])).all()
        root = step % size
        got = hvd.broadcast(np.full(5, rank, np.int64), root_rank=root, name=tag + "tl.bcast")
        assert (got == root).all()
        sent = np.arange(2 * size, dtype=np.int32) + 100 * rank
        got = hvd.alltoall(sent, name=tag + "tl.a2a")
        assert (got == np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * r for r in range(size)])).all()
        got = hvd.reducescatter(np.full((3 * size, 2), rank, np.float32), name=tag + "tl.rs", op=hvd.Sum)
        assert got.shape == (3, 2) and (got == sum(range(size))).all()
        if step == 0 and size > 1:
            dtype = np.float32 if rank == 0 else np.float64
            try:
                hvd.allreduce(np.ones(2, dtype), name=tag + MISMATCH)
                raise AssertionError("mismatch not detected")
            except hvd.MismatchError as e:
                assert MISMATCH in str(e)
    names = {tag + n: steps for n in FUSED + [BIG] + list(OTHERS)}
    if size > 1:
        names[tag + MISMATCH] = 1
    return names


def check_workload(trace, size, steps, tag=""):
    """The timeline of ``run_workload(steps)`` on ``size`` ranks covers every tensor with its
    phases. Returns nothing; raises AssertionError naming what is missing."""
    for name in FUSED + [BIG] + list(OTHERS) + ([MISMATCH] if size > 1 else []):
        instances = 1 if name == MISMATCH else steps
        name = tag + name
        begins, ends = trace.of(name, "B"), trace.of(name, "E")
        assert len(begins) == len(ends) == instances, (name, len(begins), len(ends))
        assert all(b["name"].startswith("NEGOTIATE_") for b in begins), name
        first_end = ends[0]["ts"]
        marks = {e["name"] for e in trace.of(name, "i") if e["ts"] <= first_end + EPS}
        assert marks == {"rank %d" % r for r in range(size)}, (name, marks)   # every arrival
        assert ends[0]["args"]["cache_hit"] is False and "late_ranks" in ends[0]["args"], ends[0]
        if name == tag + MISMATCH:
            assert "disagree on the dtype" in ends[0]["args"]["error"], ends[0]
            assert not trace.of(name, "X"), "a failed negotiation has no batch: %r" % trace.of(name, "X")
            continue
        rerooted = name == tag + "tl.bcast" and size > 1      # its root changes every step
        if steps > 1 and not rerooted:
            assert any(e["args"]["cache_hit"] for e in ends[1:]), (name, [e["args"] for e in ends])
        if rerooted:
            assert not any(e["args"]["cache_hit"] for e in ends), (name, [e["args"] for e in ends])
        assert len(trace.of(name, "X", "QUEUE")) == instances, name
        op = "ALLREDUCE" if name.startswith(tag + "tl.fused") or name == tag + BIG else OTHERS[name[len(tag):]]
        spans = trace.of(name, "X", op)
        assert len(spans) == instances, (name, op, len(spans))
        collectives = trace.of(name, "X", "MPI_" + op)
        assert len(collectives) >= instances, (name, len(collectives))
        for s in spans:
            assert s["args"]["backend"] == "mpi" and s["args"]["batch_tensors"] >= 1, s
    check_pieces(trace, tag, steps)
    check_cycles(trace)


def check_pieces(trace, tag, steps):
    """The fused group, submitted in one burst, fuses at every step: each member's op span is
    a batch of the whole group holding the copies into and out of the fusion buffer and the
    MPI_ALLREDUCE; the lone 2.5 MiB allreduce in three 1 MiB pieces, each with its input and
    output scaling."""
    for n in FUSED:
        ops = trace.of(tag + n, "X", "ALLREDUCE")
        assert len(ops) == steps, (n, len(ops))
        for op in ops:
            assert op["args"]["batch_tensors"] >= len(FUSED), (n, op["args"])
            inside = {e["name"] for e in trace.of(tag + n, "X") if e is not op and
                      op["ts"] - EPS <= e["ts"] and e["ts"] + e["dur"] <= op["ts"] + op["dur"] + EPS}
            want = {"MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"}
            assert want <= inside, (n, op["args"], sorted(inside))
    pieces = trace.of(tag + BIG, "X", "MPI_ALLREDUCE")
    assert len(pieces) == 3 * steps, len(pieces)
    assert sum(p["args"]["bytes"] for p in pieces) == 4 * BIG_ELEMS * steps
    assert len(trace.of(tag + BIG, "X", "SCALE_INPUT")) == 3 * steps
    assert len(trace.of(tag + BIG, "X", "SCALE_OUTPUT")) == 3 * steps


def check_cycles(trace):
    """The cycle track: a CYCLE span per working cycle, holding its batches; the batches
    account for every op span on the tensor tracks, and each cycle's bytes are its batches'."""
    cycles = [e for e in trace.cycles if e["ph"] == "X" and e["name"] == "CYCLE"]
    batches = [e for e in trace.cycles if e["ph"] == "X" and e["name"] != "CYCLE" and "tensors" in e.get("args", {})]
    assert cycles and batches, "no cycle track"
    op_spans = sum(1 for tid, evs in trace.events.items() if tid
                   for e in evs if e["ph"] == "X" and "batch_tensors" in e.get("args", {}))
    assert sum(b["args"]["tensors"] for b in batches) == op_spans
    for c in cycles:
        inside = [b for b in batches if c["ts"] - EPS <= b["ts"] and b["ts"] + b["dur"] <= c["ts"] + c["dur"] + EPS]
        assert c["args"]["bytes"] == sum(b["args"]["bytes"] for b in inside), (c, inside)
        assert c["args"]["tensors"] == sum(b["args"]["tensors"] for b in inside), (c, inside)
