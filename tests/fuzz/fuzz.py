"""The collective fuzzer: every rank of an hvlrun job runs the same seeded random sequences of
collectives (tests/fuzz/plan.py), with agreed mismatches and desyncs, and checks every outcome.

Usage: hvlrun -np N python tests/fuzz/fuzz.py [--seed S] [--sequences K] [--first I]
                                              [--step-timeout SECONDS]

Contract:
- Every rank plans sequences I .. I+K-1 from the seed alone and runs its part of each; the
  outcome of every call must be the plan's: a result equal to the NumPy reference
  (tests/fuzz/reference.py: integers, bool and data movement bit for bit, float reductions
  within reduction-order rounding) and the input left untouched, or the planned error class
  with the planned message (MismatchError: the tensor, the field and the rank groups, word for
  word; HvliteDeadlockError: every side, word for word; HvliteInvalidArgument: raised at
  submission, naming the tensor and this rank, or for a non-allreduce op on a set with joined
  members on every busy member, naming the tensor and the joined ranks); join returns a rank
  that joined last. After each sequence nothing may be left in flight, and every rank must
  have run the same plan (the sync allgather).
- The first difference ends the job: that rank prints "FUZZ FAILURE" with the seed, sequence,
  step and call (enough to replay it with --first) and exits 1, which hvlrun turns into the
  job's failure. A step that makes no progress for --step-timeout seconds (default 60, times
  HVLITE_TEST_TIMEOUT_MULTIPLIER) is a hang: "FUZZ HANG", every thread's stack, exit 3.
- On success rank 0 prints one line "FUZZ SUMMARY {json}": "plan" (sequences, steps by kind, as
  one rank ran them) and "outcomes (all ranks)" (calls, results checked, barriers, and every
  error seen by kind, summed over the ranks), and the seconds taken (in all, and by step kind
  on rank 0).
- HVLITE_DEADLOCK_SECONDS defaults to 1.5 here (it must stay above 1 s: a request agreed through
  the response cache reaches rank 0's table only after 1 s).
"""
import argparse
import faulthandler
import json
import os
import re
import sys
import threading
import time
import traceback
from collections import Counter

import numpy as np

os.environ.setdefault("HVLITE_DEADLOCK_SECONDS", "1.5")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hvlite  # noqa: E402
from plan import Planner, plural  # noqa: E402
from reference import Mismatch, check, expected, inputs  # noqa: E402

OPS = {"Sum": hvlite.Sum, "Average": hvlite.Average, "Min": hvlite.Min, "Max": hvlite.Max,
       "Product": hvlite.Product}
DEADLOCK_S = float(os.environ["HVLITE_DEADLOCK_SECONDS"])
SUFFIX = ("; none of them can go on (found after %g s of waiting: HVLITE_DEADLOCK_SECONDS)"
          % DEADLOCK_S)


class Failure(Exception):
    """An outcome that is not the plan's."""


class Watchdog(threading.Thread):
    """Ends the job when the main thread makes no progress for `limit` seconds (a hang)."""

    def __init__(self, limit, seed):
        super().__init__(daemon=True)
        self.limit, self.seed, self.where, self.last = limit, seed, "start", time.monotonic()
        self.index, self.done = None, threading.Event()

    def beat(self, where, index=None):
        self.where, self.index, self.last = where, index, time.monotonic()

    def stop(self):
        self.done.set()
        self.join()

    def run(self):
        while not self.done.wait(1.0):
            if time.monotonic() - self.last > self.limit:
                replay = "" if self.index is None else (
                    "\n  replay: --seed %d --first %d --sequences 1" % (self.seed, self.index))
                print("FUZZ HANG rank %d seed %d: no progress for %.0f s at %s%s"
                      % (hvlite.rank(), self.seed, self.limit, self.where, replay), flush=True)
                faulthandler.dump_traceback(all_threads=True)
                sys.stdout.flush()
                os._exit(3)


class Runner:
    """Runs plans on this rank and checks every outcome against them."""

    def __init__(self, planner, watchdog):
        self.planner, self.watchdog = planner, watchdog
        self.rank, self.size = hvlite.rank(), hvlite.size()
        self.counts = Counter()
        self.seconds = Counter()      # wall time by step kind (this rank): where a run's time goes

    # ---- names and messages, as the engine words them ----

    def ename(self, name, p):
        return name if p == 0 else "%s [process set %d]" % (name, self.ids[p])

    def value(self, v):
        return "process set %d" % self.ids[v[1]] if isinstance(v, tuple) else v

    def mismatch_text(self, name, field, groups):
        return "tensor '%s': ranks disagree on the %s: %s" % (name, field, "; ".join(
            "%s on %s" % (self.value(v), plural(ranks)) for v, ranks in groups))

    def side_text(self, ranks, waits):
        what = " and ".join("%s '%s' (submitted only by %s)"
                            % (op, self.ename(name, p), plural(have))
                            for op, name, p, have in waits)
        return "%s wait%s on %s" % (plural(ranks), "s" if len(ranks) == 1 else "", what)

    def check_deadlock(self, message, expect):
        """The message names every expected side word for word; other sides only for the
        plan's optional ranks (non-members that waited on the sync long enough)."""
        _, sides, optional = expect[:3]
        if not (message.startswith("collective deadlock: ") and message.endswith(SUFFIX)):
            raise Failure("deadlock message is not in the engine's form: %r" % message)
        items = message[len("collective deadlock: "):-len(SUFFIX)].split("; ")
        want = [self.side_text(ranks, waits) for ranks, waits in sides]
        seen = [i for i in items if i in want]
        if seen != want:
            raise Failure("deadlock message %r\n  does not name these sides in order: %r"
                          % (message, want))
        for item in items:
            if item in want:
                continue
            m = re.fullmatch(r"ranks? ([\d,]+) waits? on allgather 'sync' "
                             r"\(submitted only by ranks? ([\d,]+)\)", item)
            ranks = {int(r) for g in (m.groups() if m else ()) for r in g.split(",")}
            if not m or not ranks <= set(optional):
                raise Failure("deadlock message %r names an unexpected side %r" % (message, item))

    # ---- one outcome ----

    def expect_error(self, call, err):
        """An error from a collective's wait: it must be the planned one."""
        kind = call.expect[0]
        if kind == "mismatch" and isinstance(err, hvlite.MismatchError):
            want = self.mismatch_text(self.ename(call.name, call.pset), call.expect[1],
                                      call.expect[2])
            if str(err) != want:
                raise Failure("mismatch message\n  got  %r\n  want %r" % (str(err), want))
            self.counts["error mismatch (%s)" % call.expect[1]] += 1
            return
        if kind == "joined" and isinstance(err, hvlite.HvliteInvalidArgument):
            joined = call.expect[1]
            want = ("tensor '%s': %s while rank%s %s %s called join() (as in Horovod, only "
                    "allreduce and barrier run while ranks have joined)" % (
                        self.ename(call.name, call.pset), call.op, "s" if len(joined) > 1 else "",
                        ",".join(map(str, joined)), "have" if len(joined) > 1 else "has"))
            if str(err) != want:
                raise Failure("joined message\n  got  %r\n  want %r" % (str(err), want))
            self.counts["error invalid (%s while ranks have joined)" % call.op] += 1
            return
        if kind == "deadlock" and isinstance(err, hvlite.HvliteDeadlockError):
            self.check_deadlock(str(err), call.expect)
            self.counts["error deadlock"] += 1
            return
        raise Failure("%s: %s (expected %s)" % (type(err).__name__, err, call.expect[0]))

    def expect_result(self, call, got, x, slot_calls):
        if call.expect[0] != "ok":
            raise Failure("completed, expected %s" % (call.expect[:2],))
        members = self.sets_ranks[call.pset]
        want, bound, splits = expected(slot_calls, members, self.rank)
        if splits is not None:
            got, received = got
            if not np.array_equal(received, splits):
                raise Failure("alltoall received splits %r, expected %r" % (received, splits))
        if call.inplace and got is not x:
            raise Failure("in-place %s returned a new array" % call.op)
        try:
            check(call, got, want, bound)
            if not call.inplace:
                # the input is untouched
                check(call, np.array(x, order="C"), inputs(call, self.rank), None)
        except Mismatch as e:
            raise Failure("wrong result: %s" % e) from None
        self.counts["results checked"] += 1

    # ---- actions ----

    def make_input(self, call):
        x = inputs(call, self.rank)
        if call.strided:             # every other row of a buffer twice as long
            full = np.zeros((2 * x.shape[0],) + x.shape[1:], dtype=x.dtype)
            full[::2] = x
            x = full[::2]
        return x

    def submit(self, call):
        """Starts the call; returns (handle, input) or None when it was refused as planned."""
        x, ps, name = self.make_input(call), self.sets[call.pset], call.name
        self.counts["calls"] += 1
        try:
            if call.op == "allreduce":
                start = hvlite.allreduce_async_ if call.inplace else hvlite.allreduce_async
                h = start(x, name=name, op=OPS[call.reduce], prescale_factor=call.prescale,
                          postscale_factor=call.postscale, process_set=ps)
            elif call.op == "allgather":
                h = hvlite.allgather_async(x, name=name, process_set=ps)
            elif call.op == "broadcast":
                start = hvlite.broadcast_async_ if call.inplace else hvlite.broadcast_async
                h = start(x, call.root, name=name, process_set=ps)
            elif call.op == "alltoall":
                splits = list(call.splits) if call.splits is not None else None
                h = hvlite.alltoall_async(x, splits=splits, name=name, process_set=ps)
            else:
                h = hvlite.reducescatter_async(x, name=name, op=OPS[call.reduce], process_set=ps,
                                               prescale_factor=call.prescale,
                                               postscale_factor=call.postscale)
        except hvlite.HvliteInvalidArgument as e:
            self.expect_refusal(call, str(e))
            return None
        if call.expect[0] == "invalid":
            raise Failure("submission accepted, expected it refused (%s)" % call.expect[1])
        return h, x

    def expect_refusal(self, call, message):
        reason = call.expect[1] if call.expect[0] == "invalid" else None
        if reason == "in flight":
            want = "tensor name '%s' is already in flight on this rank (%d)" % (
                call.name, self.rank)
        elif reason == "not a member":
            want = "tensor '%s': this rank (%d) is not a member of process set %d" % (
                call.name, self.rank, self.ids[call.pset])
        else:
            raise Failure("refused at submission: %s" % message)
        if want not in message:
            raise Failure("refusal message %r does not say %r" % (message, want))
        self.counts["error invalid (%s)" % reason] += 1

    def finish(self, call, started, slot_calls):
        h, x = started
        try:
            got = hvlite.synchronize(h)
        except hvlite.HvliteError as e:
            self.expect_error(call, e)
            return False
        self.expect_result(call, got, x, slot_calls)
        return True

    def sync(self, seq, expect):
        """Every rank allgathers (sequence, digest, rank) under the fixed name 'sync'."""
        mine = np.array([[seq.index, seq.digest, self.rank]], dtype=np.int64)
        failed = 0
        while True:
            try:
                got = hvlite.allgather(mine, name="sync")
                break
            except hvlite.HvliteDeadlockError as e:
                if expect[0] not in ("deadlock", "deadlock_or_ok") or failed:
                    raise Failure("sync: %s" % e) from None
                self.check_deadlock(str(e), expect)
                self.counts["error deadlock (sync)"] += 1
                failed += 1
        if expect[0] == "deadlock" and not failed:
            raise Failure("sync completed at once, expected HvliteDeadlockError first")
        want = np.array([[seq.index, seq.digest, r] for r in range(self.size)], dtype=np.int64)
        if not np.array_equal(got, want):
            raise Failure("sync: the ranks ran different plans: %r" % got)

    def remove(self, target, expect):
        try:
            hvlite.remove_process_set(self.sets[target])
        except hvlite.MismatchError as e:
            pattern = re.escape(self.mismatch_text("@", expect[1], expect[2])).replace(
                "@", r"remove_process_set\.noname\.\d+")
            if not re.fullmatch(pattern, str(e)):
                raise Failure("remove mismatch message %r" % str(e)) from None
            self.counts["error mismatch (process set)"] += 1
            return
        raise Failure("remove_process_set succeeded, expected MismatchError")

    def add_sets(self, seq):
        self.sets, self.sets_ranks = [hvlite.global_process_set], [list(range(self.size))]
        for by_rank, expect in seq.adds:
            ranks = by_rank[self.rank]
            if expect[0] == "ok":
                self.sets.append(hvlite.add_process_set(ranks))
                self.sets_ranks.append(ranks)
                continue
            try:
                hvlite.add_process_set(ranks)
            except hvlite.HvliteInvalidArgument as e:
                if expect[1] == "duplicate set":
                    want = "add_process_set: process set %d already has these %d ranks" % (
                        self.sets[expect[2]].process_set_id, len(ranks))
                else:
                    groups = "; ".join("%s %s" % (plural(g), "another" if i else "one list")
                                       for i, g in enumerate(expect[2]))
                    want = ("add_process_set: the ranks passed different member lists: %s "
                            "(this rank, %d, passed %d member%s: %s); every rank must add the "
                            "same sets in the same order" % (
                                groups, self.rank, len(ranks), "" if len(ranks) == 1 else "s",
                                ",".join(map(str, ranks))))
                if str(e) != want:
                    raise Failure("add_process_set refused with\n  got  %r\n  want %r"
                                  % (str(e), want)) from None
                self.counts["error invalid (%s)" % expect[1]] += 1
                continue
            raise Failure("add_process_set(%r) succeeded, expected %s" % (ranks, expect[1]))
        self.ids = [s.process_set_id for s in self.sets]

    # ---- a step, a sequence ----

    def run_step(self, seq, step):
        slot_calls = {}               # slot -> {rank: that rank's call}, for the references
        for r, acts in step.actions.items():
            for act in acts:
                if act[0] in ("submit", "block") and act[1].expect[0] != "invalid":
                    slot_calls.setdefault(act[1].slot, {})[r] = act[1]
        started, gave_up = {}, False
        for act in step.actions[self.rank]:
            self.call = act[1] if act[0] in ("submit", "block") else None
            if gave_up and act[0] != "wait":
                continue                   # after a deadlock: only collect what was started
            if act[0] == "submit":
                s = self.submit(act[1])
                if s is not None:
                    started[act[1].slot] = (act[1], s)
            elif act[0] == "wait":
                call, s = started.pop(act[1])
                self.call = call
                self.finish(call, s, slot_calls[call.slot])
            elif act[0] == "block":
                if act[1].expect[0] == "unreached":
                    raise Failure("the plan runs on after a deadlock")
                s = self.submit(act[1])
                done = self.finish(act[1], s, slot_calls[act[1].slot])
                if not done and act[1].expect[0] == "deadlock":
                    gave_up = True         # this rank gives up the rest of a deadlocked step
            elif act[0] == "pause":
                time.sleep(act[1])
            elif act[0] == "join":
                last = hvlite.join()
                if last not in act[1]:
                    raise Failure("join returned %r, expected one of the busy ranks %r"
                                  % (last, act[1]))
                self.counts["joins"] += 1
            elif act[0] == "barrier":
                hvlite.barrier(process_set=self.sets[act[1]])
                self.counts["barriers"] += 1
            elif act[0] == "sync":
                self.sync(seq, act[1])
            elif act[0] == "remove":
                self.remove(act[1], act[2])
        if started:
            raise Failure("plan error: handles never waited on: %r" % sorted(started))

    def run_sequence(self, index):
        self.seq, self.step, self.call = None, None, None
        seq = self.planner.sequence(index)
        self.seq = seq
        self.watchdog.beat("sequence %d: adding sets" % index, index)
        self.add_sets(seq)
        for j, step in enumerate(seq.steps):
            self.step = (j, step)
            self.watchdog.beat("sequence %d step %d (%s %s)" % (index, j, step.kind, step.detail),
                               index)
            t0 = time.monotonic()
            self.run_step(seq, step)
            self.seconds[step.kind] += time.monotonic() - t0
            self.counts["steps " + step.kind] += 1
        self.watchdog.beat("sequence %d: removing sets" % index, index)
        for i in reversed(seq.removes_ok):
            if not hvlite.remove_process_set(self.sets[i]):
                raise Failure("remove_process_set(%r) returned False" % self.sets[i])
        c = hvlite.engine_counters()
        if c["tensors_submitted"] != c["tensors_done"]:
            raise Failure("requests left in flight after the sequence: %r" % c)
        self.counts["sequences"] += 1

    def where(self):
        if getattr(self, "seq", None) is None:
            return "(while planning the sequence)"
        text = "sequence %d" % self.seq.index
        if self.step:
            text += " step %d (%s: %s)" % (self.step[0], self.step[1].kind, self.step[1].detail)
        if self.call is not None:
            text += "\n  call %r" % (self.call,)
        return text


def gather_counts(counts):
    """The counters summed over every rank: each rank's as JSON text in a fixed-size row."""
    text = json.dumps(counts).encode()
    if len(text) > 8192:
        raise Failure("counters too long to gather")
    row = np.frombuffer(text.ljust(8192), dtype=np.uint8).reshape(1, -1).copy()
    rows = hvlite.allgather(row, name="fuzz.counts")
    total = Counter()
    for row in rows:
        total.update(json.loads(bytes(row).decode()))
    return dict(sorted(total.items()))


def main(argv=None):
    ap = argparse.ArgumentParser(description="hvlite collective fuzzer (run under hvlrun)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sequences", type=int, default=100)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--step-timeout", type=float, default=60.0)
    args = ap.parse_args(argv)
    if DEADLOCK_S <= 1.0:
        sys.exit("fuzz.py: HVLITE_DEADLOCK_SECONDS must be above 1 (it is %g)" % DEADLOCK_S)
    hvlite.init()
    multiplier = float(os.environ.get("HVLITE_TEST_TIMEOUT_MULTIPLIER", "1"))
    watchdog = Watchdog(args.step_timeout * multiplier, args.seed)
    watchdog.start()
    runner = Runner(Planner(args.seed, hvlite.size()), watchdog)
    start = time.monotonic()
    for index in range(args.first, args.first + args.sequences):
        try:
            runner.run_sequence(index)
        except Exception as e:      # a Failure, or anything the plan did not expect (a crash)
            what = str(e) if isinstance(e, Failure) else traceback.format_exc().rstrip()
            print("FUZZ FAILURE rank %d seed %d %s\n  %s\n  replay: --seed %d --first %d "
                  "--sequences 1" % (runner.rank, args.seed, runner.where(), what, args.seed,
                                     index), flush=True)
            os._exit(1)
    watchdog.beat("summary")
    plan = {k: v for k, v in runner.counts.items() if k.startswith(("sequences", "steps"))}
    outcomes = gather_counts({k: v for k, v in runner.counts.items() if k not in plan})
    if runner.rank == 0:
        summary = {"seed": args.seed, "ranks": runner.size, "first": args.first,
                   "seconds": round(time.monotonic() - start, 1),
                   "plan": dict(sorted(plan.items())),
                   "outcomes (all ranks)": outcomes,
                   "seconds by step kind (rank 0)": {k: round(v, 1)
                                                     for k, v in sorted(runner.seconds.items())}}
        print("FUZZ SUMMARY " + json.dumps(summary, sort_keys=True), flush=True)
    hvlite.shutdown()
    watchdog.stop()


if __name__ == "__main__":
    main()
