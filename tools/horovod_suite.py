"""Run Horovod's own test files (``test/parallel/test_torch.py`` and the TensorFlow/Keras ones)
against hvlite and count the results.

Contract:
    python tools/horovod_suite.py TEST_FILE [--np 2] [--out DIR] [--one-gpu] [--hostid-per-rank]
                                  [--per-test [--jobs K]] [--only TEST ...] [--timeout SECONDS]
    TEST_FILE is one of Horovod's ``test_torch.py``, ``test_tensorflow.py``,
    ``test_tensorflow_keras.py``, ``test_keras.py``, ``test_tensorflow2_keras.py``, read from
    outside this tree (``fetch github:horovod/horovod``; on the GPU machine, a git-ignored copy
    carried along); its sibling ``base_test_tensorflow.py`` is read from the same folder where
    the file imports it. Nothing of them is kept in the project: the runnable copies are written
    under DIR (default ``horovod-suite/``, git-ignored) with these edits only: the imports
    (``horovod.X`` -> ``hvlite.X``), the path of the helpers the file takes from Horovod's test
    utils (``common``), which this script writes as our own stand-ins, and the two Horovod
    utility imports the TensorFlow files use (``_executing_eagerly``,
    ``is_version_greater_equal_than``), which the stand-ins provide. With ``--one-gpu``
    (``test_torch.py`` only) every rank's CUDA device is 0 (``.cuda(hvd.local_rank())``,
    ``.cuda(local_rank)`` and ``hvd.join(hvd.local_rank())``), for ranks sharing one GPU;
    ``--hostid-per-rank`` also gives each rank its own ``NCCL_HOSTID`` (NCCL then runs them over
    sockets on loopback).
    Runs the file as one ``hvlrun -np N`` job (or, with ``--per-test``, one job per test, K jobs
    at a time, slower but immune to a test that spoils the ones after it), each under a hard
    timeout. ``--only`` runs the named tests alone.
    Prints, and writes to DIR/summary.txt, the counts (a test passes when it passed on every rank,
    fails when it or one of its subtests failed on any, is "not run" when the job ended before
    reporting it) and the
    names of the tests that failed or did not run (skipped ones are counted only; a file that
    fails to collect counts each of its tests as ERROR). Exit status 0
    when the run completed, whatever the counts; 1 when no result could be read.
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys

STAND_INS = '''"""Stand-ins, written by hvlite's tools/horovod_suite.py, for the helpers Horovod's test
files import from its test/utils/common.py, horovod.tensorflow.util and horovod.common.util."""
import contextlib
import os
import tempfile


def mpi_env_rank_and_size():
    for rank, size in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                       ("HOROVOD_RANK", "HOROVOD_SIZE")):
        if rank in os.environ and size in os.environ:
            return int(os.environ[rank]), int(os.environ[size])
    return 0, 1


def skip_or_fail_gpu_test(test, message):
    test.skipTest(message)


@contextlib.contextmanager
def temppath():
    fd, path = tempfile.mkstemp()
    os.close(fd)
    try:
        yield path
    finally:
        if os.path.exists(path):
            os.remove(path)


def _executing_eagerly():
    import tensorflow as tf
    return tf.executing_eagerly()


def is_version_greater_equal_than(ver, target):
    from packaging import version
    return version.parse(ver) >= version.parse(target)


if os.environ.get("HVLITE_SUITE_NCCL_HOSTID") == "per-rank":   # ranks sharing a GPU, on NCCL
    os.environ["NCCL_HOSTID"] = "hvlite-suite-rank-%d" % mpi_env_rank_and_size()[0]
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
'''

# (pattern, replacement, needed): needed edits must match, or the file is not the one expected
TORCH_EDITS = [(r"^import horovod\.torch as hvd$", "import hvlite.torch as hvd", True)]
UTILS_PATH = (r"^sys\.path\.append\(.*'utils'\)\)$",
              "sys.path.append(os.path.dirname(os.path.abspath(__file__)))", True)
TF_EDITS = [(r"^(\s*)import horovod\.((?:tensorflow\.)?keras|tensorflow) as (\w+)$",
             r"\1import hvlite.\2 as \3", True),
            (r"^from horovod\.(?:tensorflow|common)\.util\s+import ", "from common import ", False)]
# Horovod's file name -> (its TestCase class, its edits, the sibling files it imports)
FILES = {"test_torch.py": ("TorchTests", TORCH_EDITS + [UTILS_PATH], []),
         "test_tensorflow.py": ("TensorFlowTests", TF_EDITS + [UTILS_PATH],
                                ["base_test_tensorflow.py"]),
         "test_tensorflow_keras.py": ("TfKerasTests", TF_EDITS + [UTILS_PATH], []),
         "test_keras.py": ("KerasTests", TF_EDITS + [UTILS_PATH], []),
         "test_tensorflow2_keras.py": ("Tf2KerasTests", TF_EDITS, [])}
SIBLING_EDITS = [(r"^from horovod\.tensorflow\.util import ", "from common import ", True)]
ONE_GPU_EDITS = [(r"\.cuda\(hvd\.local_rank\(\)\)", ".cuda(0)", True),
                 (r"\.cuda\(local_rank\)", ".cuda(0)", False),
                 (r"hvd\.join\(hvd\.local_rank\(\)\)", "hvd.join(0)", False)]
# pytest -v: "test_torch.py::TorchTests::test_x PASSED" (subtests and xfail count as their word)
RESULT = r"%s::\w+::(\w+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)"
# a subtest's failure (Horovod's TensorFlow tests run each test in graph and eager mode as
# subtests): "SUBFAILED[graph_mode] test_tensorflow.py::TensorFlowTests::test_x"; the test's
# own line still says PASSED
SUBFAILED = r"^SUBFAILED\[[^\]]*\] %s::\w+::(\w+)"
WORST = {"PASSED": 0, "XPASS": 0, "XFAIL": 1, "SKIPPED": 1, "FAILED": 2, "ERROR": 2}


def edited(path, edits):
    """The text of ``path`` with ``edits`` made; exits when a needed one does not match."""
    text = open(path).read()
    for pattern, replacement, needed in edits:
        text, n = re.subn(pattern, replacement, text, flags=re.M)
        if needed and n == 0:
            sys.exit("horovod_suite: %s has no line matching %r: not Horovod's %s?"
                     % (path, pattern, os.path.basename(path)))
    return text


def prepare(test_file, work, one_gpu):
    """The runnable copy of ``test_file``, its siblings and the stand-ins, in ``work``;
    returns its file name, TestCase class and test names."""
    base = os.path.basename(test_file)
    if base not in FILES:
        sys.exit("horovod_suite: %s is none of Horovod's %s" % (test_file, ", ".join(FILES)))
    cls, edits, siblings = FILES[base]
    if one_gpu and base != "test_torch.py":
        sys.exit("horovod_suite: --one-gpu is for test_torch.py")
    text = edited(test_file, edits + (ONE_GPU_EDITS if one_gpu else []))
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, base), "w") as f:
        f.write(text)
    for sibling in siblings:
        with open(os.path.join(work, sibling), "w") as f:
            f.write(edited(os.path.join(os.path.dirname(test_file), sibling), SIBLING_EDITS))
    with open(os.path.join(work, "common.py"), "w") as f:
        f.write(STAND_INS)
    names = re.findall(r"^    def (test_\w+)\(self", text, flags=re.M)
    if "@parameterized.expand" in text:     # one test per parameter set: pytest names them
        names = collected(work, base) or names
    return base, cls, names


def collected(work, base):
    """The test names pytest collects from ``work/base`` (one process, nothing run)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", base], cwd=work, capture_output=True,
                         text=True, timeout=300).stdout
    return re.findall(r"^%s::\w+::(\w+)$" % re.escape(base), out, flags=re.M)


def run_job(work, np_, selector, ranks_dir, timeout):
    """One hvlrun job of pytest over ``selector``; each rank's output lands in ``ranks_dir``."""
    shutil.rmtree(ranks_dir, ignore_errors=True)
    os.makedirs(os.path.dirname(ranks_dir), exist_ok=True)
    cmd = ["timeout", "-k", "10", str(timeout), sys.executable, "-m", "hvlite.runner", "-np", str(np_), "--output-filename",
           ranks_dir, sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", selector]
    with open(ranks_dir + ".log", "w") as log:
        return subprocess.call(cmd, cwd=work, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL)


def read_results(ranks_dir, np_, base, names):
    """{test: worst word over the ranks}, for tests some rank reported; ``names`` (the tests
    the job ran) are ERROR where the file failed to collect (pytest reports no test then)."""
    results = {}
    for rank in range(np_):
        path = os.path.join(ranks_dir, "rank.%d" % rank, "stdout")
        if not os.path.exists(path):
            continue
        text = open(path, errors="replace").read()
        found = re.findall(RESULT % re.escape(base), text)
        found += [(name, "FAILED") for name in re.findall(SUBFAILED % re.escape(base), text,
                                                          flags=re.M)]
        for name, word in found:
            if WORST[word] >= WORST.get(results.get(name), -1):
                results[name] = word
        if "ERROR collecting %s" % base in text:
            results.update({name: "ERROR" for name in names if name not in results})
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("test_file")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--out", default="horovod-suite", help="work folder (many files: not $OUT)")
    ap.add_argument("--one-gpu", action="store_true", help="every rank on CUDA device 0")
    ap.add_argument("--hostid-per-rank", action="store_true", help="an NCCL_HOSTID per rank")
    ap.add_argument("--per-test", action="store_true", help="one job per test")
    ap.add_argument("--jobs", type=int, default=1, help="per-test jobs at a time")
    ap.add_argument("--only", nargs="+", metavar="TEST", help="run these tests only")
    ap.add_argument("--timeout", type=int, default=None,
                    help="seconds per job (default: 180 per test, 900 for the whole file)")
    args = ap.parse_args()
    work = os.path.abspath(args.out)
    if args.hostid_per_rank:
        os.environ["HVLITE_SUITE_NCCL_HOSTID"] = "per-rank"
    base, cls, tests = prepare(args.test_file, work, args.one_gpu)
    if args.only:
        tests = [name for name in tests if name in args.only]
    results = {}
    if args.per_test or args.only:
        def one(name):
            ranks = os.path.join(work, "ranks", name)
            run_job(work, args.np, "%s::%s::%s" % (base, cls, name), ranks, args.timeout or 180)
            return read_results(ranks, args.np, base, [name])
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for found in pool.map(one, tests):
                results.update(found)
    else:
        ranks = os.path.join(work, "ranks", "all")
        run_job(work, args.np, base, ranks, args.timeout or 900)
        results = read_results(ranks, args.np, base, tests)
    if not results:
        print("horovod_suite: no result could be read; see", os.path.join(work, "ranks"))
        return 1
    words = [results.get(name, "NOT RUN") for name in tests]
    counts = {w: words.count(w) for w in sorted(set(words))}
    lines = ["%s %s" % (w, name) for name, w in zip(tests, words) if WORST.get(w, 2) > 1]
    lines.append("%d tests, %d ranks%s%s: %s" % (
        len(tests), args.np, ", one GPU" if args.one_gpu else "",
        ", NCCL_HOSTID per rank" if args.hostid_per_rank else "",
        ", ".join("%s %d" % kv for kv in counts.items())))      # last: the line a log tail shows
    with open(os.path.join(work, "summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
