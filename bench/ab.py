"""A/B runner: one benchmark command run alternately against two hvlite checkouts (before and
after a change), interleaved over rounds, and its tables printed side by side with ratios.

    python bench/ab.py --a /work/base --b . bench              # make bench's command
    python bench/ab.py --a /work/base --b . bench-torch        # make bench-torch's command
    python bench/ab.py --a /work/base --b . --rounds 4 -- \
        hvlrun -np 2 python bench/step_overhead.py --models mlp --pairs 400

Contract:
- ``--a`` and ``--b`` are directories with hvlite built in place (``hvlite/_core*.so``, from
  ``setup.py build_ext --inplace``). Every run of side X gets ``PYTHONPATH=X`` (ahead of anything
  already there), so every process of the run (hvlrun, its ranks, torchrun workers) imports X's
  hvlite; before the first round each side is checked once (built, and ``import hvlite`` from a
  bench script resolves into X) and the file it loaded is printed.
- The command runs this checkout's benchmark scripts by default (``--cwd here``: against either
  engine; words naming a file of this checkout become absolute paths), or each side's own
  scripts (``--cwd side``: which must then take ``--json``). Either way the process runs in the
  side's directory: ``python -m`` puts the working directory ahead of PYTHONPATH, so a rank
  started with ``-m hvlite.runner...`` in this checkout would import this checkout's hvlite. In the command, the words ``python``/``python3`` mean this
  interpreter and ``hvlrun`` this interpreter's ``hvlrun`` (its runner comes from PYTHONPATH
  too). ``bench``, ``bench-torch`` and ``step-overhead`` stand for the Makefile's commands (and
  step_overhead's), further words are appended.
- Every run gets ``--json PATH`` appended and must write its tables there
  (``harness.write_json``); its output and JSON are kept in ``--out`` (default: a new temporary
  folder), as ``a1.txt``/``a1.json``, ``b1.txt``, .... A run that fails ends ab.py (exit 1) with
  its output; one that passes ``--timeout`` (or a Ctrl-C or SIGTERM to ab.py) is stopped
  (SIGTERM to its process group: hvlrun stops its job) and ends ab.py too.
- Rounds run both sides back to back; ``--order abba`` (default) alternates which goes first
  (AB, BA, AB, ...) so a steady drift favours neither, ``abab`` always runs A first, ``random``
  tosses a seeded coin per round.
- Printed per table of the command: A's and B's table (each number the median over the rounds),
  then, per row and numeric column, A, B and B/A: the median over rounds of the ratio of the two
  runs of one round (neighbours in time), with the range of those per-round ratios. Text cells
  that differ between runs (a confidence interval, say) read "(varies)" in A's and B's tables. Rows are
  matched by their key columns; a row missing from some run is left out of the comparison.
Nothing is asserted about times.
"""
import argparse
import glob
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from tables import print_table  # noqa: E402

VARIES = "(varies)"   # a text cell (e.g. a confidence interval) that differs between runs
PRESETS = {"bench": ["hvlrun", "-np", "2", "python", "bench/allreduce.py"],
           "bench-torch": ["python", "bench/torch_training.py"],
           "step-overhead": ["hvlrun", "-np", "2", "python", "bench/step_overhead.py"]}


def expand(command):
    """The command as run: presets expanded, python/hvlrun resolved to this interpreter's."""
    if command and command[0] in PRESETS:
        command = PRESETS[command[0]] + command[1:]
    hvlrun = os.path.join(os.path.dirname(sys.executable), "hvlrun")
    words = {"python": sys.executable, "python3": sys.executable,
             "hvlrun": hvlrun if os.path.exists(hvlrun) else None}
    out = []
    for word in command:
        if word == "hvlrun" and not words["hvlrun"]:
            out += [sys.executable, "-m", "hvlite.runner"]
        else:
            out.append(words.get(word) or word)
    return out


def with_paths_here(command):
    """The command with each word that names a file of this checkout (bench/allreduce.py) made
    absolute, so that it can run in another directory."""
    return [os.path.join(ROOT, w) if not os.path.isabs(w) and os.path.isfile(os.path.join(ROOT, w))
            else w for w in command]


def side_env(side):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (side, env.get("PYTHONPATH")) if p)
    return env


def check_side(side):
    """The hvlite a bench script of this side imports (as a path); exits if not built there."""
    if not glob.glob(os.path.join(side, "hvlite", "_core*.so")):
        sys.exit("ab.py: %s has no in-place build (hvlite/_core*.so); build it there with "
                 "`python setup.py build_ext --inplace`" % side)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--where"], env=side_env(side),
                         capture_output=True, text=True, timeout=120, cwd=side)
    where = out.stdout.strip()
    if out.returncode or not os.path.realpath(where).startswith(os.path.realpath(side) + os.sep):
        sys.exit("ab.py: with PYTHONPATH=%s a bench script imports hvlite from %r\n%s"
                 % (side, where, out.stderr[-2000:]))
    return where


def stop(proc, grace=30):
    """Stop a run: SIGTERM to its process group (hvlrun then stops its job: mpiexec and the
    ranks), reading its pipes meanwhile so that nothing it still writes breaks it; SIGKILL to
    the group if it has not ended after `grace` seconds."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def run_once(label, side, command, cwd, out_dir, timeout):
    """Run the command for one side; returns (tables, seconds). Exits on failure."""
    json_path = os.path.join(out_dir, label + ".json")
    t0 = time.perf_counter()
    proc = subprocess.Popen(command + ["--json", json_path], env=side_env(side), cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        sys.exit("ab.py: run %s took more than --timeout %g s; stopped" % (label, timeout))
    except KeyboardInterrupt:             # the run is in its own session: it did not get it
        stop(proc)
        sys.exit("ab.py: interrupted; run %s stopped" % label)
    seconds = time.perf_counter() - t0
    with open(os.path.join(out_dir, label + ".txt"), "w") as f:
        f.write(stdout + stderr)
    if proc.returncode or not os.path.exists(json_path):
        sys.exit("ab.py: run %s failed (exit %d; no JSON: %s)\n%s\n%s"
                 % (label, proc.returncode, not os.path.exists(json_path), stdout[-3000:],
                    stderr[-3000:]))
    with open(json_path) as f:
        return json.load(f)["tables"], seconds


def orders(rounds, order, seed):
    rng = random.Random(seed)
    for r in range(rounds):
        a_first = {"abab": True, "abba": r % 2 == 0, "random": rng.random() < 0.5}[order]
        yield "ab" if a_first else "ba"


def number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def fmt(v):
    return "-" if v is None else ("%.4g" % v if number(v) else str(v))


def by_key(table):
    k = table["key_columns"]
    return {tuple(r[:k]): r for r in table["rows"]}


def median_table(tables):
    """One table from the same table of several runs (rows of the first run): each number the
    median over the runs; text the same in every run as it is, else VARIES."""
    k = tables[0]["key_columns"]
    out = []
    for row in tables[0]["rows"]:
        same = [by_key(t).get(tuple(row[:k])) for t in tables]
        cells = zip(*[r for r in same if r])
        out.append([statistics.median(c) if all(number(v) for v in c) else
                    c[0] if len(set(map(str, c))) == 1 else VARIES for c in cells])
    return out


def compare_rows(a_tables, b_tables, columns):
    """Rows (key..., column, A, B, B/A, range): per row and numeric column, the medians of A and
    B over rounds, the median of the per-round ratios B/A and their range."""
    first, k = a_tables[0], a_tables[0]["key_columns"]
    rounds = [(by_key(ta), by_key(tb)) for ta, tb in zip(a_tables, b_tables)]
    out = []
    for row in first["rows"]:
        key = tuple(row[:k])
        for i, name in enumerate(first["columns"][k:], start=k):
            if columns and name not in columns:
                continue
            pairs = [(a[key][i], b[key][i]) for a, b in rounds if key in a and key in b
                     and number(a[key][i]) and number(b[key][i])]
            if not pairs:
                continue
            ratios = [vb / va for va, vb in pairs if va]
            out.append([*map(fmt, key), name, fmt(statistics.median(va for va, _ in pairs)),
                        fmt(statistics.median(vb for _, vb in pairs)),
                        "%.3f" % statistics.median(ratios) if ratios else "-",
                        "%.3f-%.3f" % (min(ratios), max(ratios)) if ratios else "-"])
    return out


def report(runs, columns):
    for index, a_first in enumerate(runs["a"][0]):
        a_tables = [r[index] for r in runs["a"]]
        b_tables = [r[index] for r in runs["b"]]
        n, k = len(a_tables), a_first["key_columns"]
        print("\n=== " + a_first["title"])
        for label, tables in (("A", a_tables), ("B", b_tables)):
            print_table("%s: median of %d runs; %s: text that differs between runs (each run's "
                        "table is in its .txt)" % (label, n, VARIES), tables[0]["columns"],
                        [[fmt(v) for v in r] for r in median_table(tables)], k)
        rows = compare_rows(a_tables, b_tables, columns)
        if rows:
            print_table("B vs A: B/A = median over rounds of (B / A within one round), range = "
                        "min-max of those per-round ratios", a_first["columns"][:k] +
                        ["column", "A", "B", "B/A", "range"], rows, k)


def main():
    p = argparse.ArgumentParser(description="run a benchmark alternately against two hvlite "
                                "checkouts and compare its tables",
                                usage="%(prog)s --a DIR --b DIR [options] [--] command ...")
    p.add_argument("--a", help="checkout A (before), hvlite built in place")
    p.add_argument("--b", help="checkout B (after), hvlite built in place")
    p.add_argument("--rounds", type=int, default=3, help="runs of each side, interleaved")
    p.add_argument("--order", choices=["abba", "abab", "random"], default="abba")
    p.add_argument("--seed", type=int, default=0, help="for --order random")
    p.add_argument("--cwd", choices=["here", "side"], default="here",
                   help="run in this checkout (default) or in each side's directory")
    p.add_argument("--out", help="keep each run's output and JSON here (default: a temp folder)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per run")
    p.add_argument("--columns", nargs="+", help="compare only these columns")
    p.add_argument("--where", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    if args.where:                      # check_side: which hvlite a bench script imports
        import hvlite
        return print(hvlite.__file__)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not (args.a and args.b and command):
        p.error("--a, --b and a command are needed")
    sides = {"a": os.path.abspath(args.a), "b": os.path.abspath(args.b)}
    where = {s: check_side(d) for s, d in sides.items()}
    out_dir = args.out or tempfile.mkdtemp(prefix="hvlite-ab-")
    os.makedirs(out_dir, exist_ok=True)
    command = expand(command)
    print("A: %s (hvlite: %s)\nB: %s (hvlite: %s)\ncommand: %s\nruns kept in %s"
          % (sides["a"], where["a"], sides["b"], where["b"], " ".join(command), out_dir))
    runs, seconds, sequence = {"a": [], "b": []}, {"a": [], "b": []}, ""
    for r, order in enumerate(orders(args.rounds, args.order, args.seed), start=1):
        for s in order:
            load = os.getloadavg()[0]
            run_command = command if args.cwd == "side" else with_paths_here(command)
            tables, took = run_once("%s%d" % (s, r), sides[s], run_command, sides[s], out_dir,
                                    args.timeout)
            runs[s].append(tables)
            seconds[s].append(took)
            sequence += s.upper()
            print("round %d: %s took %.1f s (load average before: %.1f, after: %.1f)"
                  % (r, s.upper(), took, load, os.getloadavg()[0]), flush=True)
    print("\n%d rounds, order %s; wall time per run (median): A %.1f s, B %.1f s"
          % (args.rounds, sequence, statistics.median(seconds["a"]),
             statistics.median(seconds["b"])))
    report(runs, args.columns)


def interrupted(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, interrupted)    # stopped from outside: stop the run as Ctrl-C does
    main()
