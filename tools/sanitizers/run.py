#!/usr/bin/env python3
"""Runs test suites on a sanitizer build of the engine (`make test-asan`, `make test-tsan`).

Usage: ``python tools/sanitizers/run.py {address|thread} [--smoke] [PYTEST_ARGS...]``; without
pytest arguments it runs ``SUITES`` (the parallel, failure, deadlock and shared-memory suites and
the CI fuzz run); ``--smoke`` runs ``SMOKE`` instead, a few minutes' sample that CI runs after
``make test`` (``make sanitize-smoke``). ``address`` is AddressSanitizer +
UndefinedBehaviorSanitizer (LeakSanitizer on), ``thread`` is ThreadSanitizer.

Contract:
- The checkout is copied to ``build/sanitize-<mode>/tree`` (sources only: no .git, venv, build
  outputs) and the engine is built there with ``HVLITE_SANITIZE=<mode>`` (hvlite/_build.py),
  so the checkout's own ``hvlite/_core*.so`` (the normal build) is never touched. The tests
  find the copy through their own location (tests/jobs.py ROOT), so they exercise it.
- Python is not instrumented: the sanitizer runtime of the compiler that MPI's ``mpicc`` wraps
  is preloaded (``LD_PRELOAD``) into every process of the run.
- Every sanitizer writes its reports to ``build/sanitize-<mode>/reports/`` (one file per
  process that reported anything). Suppressions come from ``tools/sanitizers/*.supp``; each
  entry there names third-party code and says why.
- Exit status 0 only if pytest passed, no report file was written and no report line showed
  in pytest's output (a failed job's stderr: UBSan's reports under the ASan runtime go there,
  not to the log file); otherwise the reports are printed and the status is 1. The pytest run
  has a hard timeout (``--timeout`` seconds, default 3600; it ends pytest's whole session);
  every job inside keeps its own, stretched by ``HVLITE_TEST_TIMEOUT_MULTIPLIER``
  (default 4 for address, 6 for thread: the sanitizers slow the engine and Python down).
"""
import argparse
import glob
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "hvlite"))
import _mpi_find  # noqa: E402  (stdlib only; finds the mpicc the build uses)

SUITES = ["tests/test_spmd.py", "tests/test_failures.py", "tests/test_deadlock.py",
          "tests/test_shm.py", "tests/test_fuzz.py"]
# Every collective and its errors, in place and out of place, at 2 ranks; a deadlock and a
# stopped peer; the killed-rank cleanup; the fuzzer on shared memory; the GPU code that can run
# without a GPU (holding and admission, staging, the NCCL plane, batches left running and results
# sized on the GPU, the wait between cycles while tensors are held, the CUDA driver binding, the
# coordinator's device rule, through their unit probes).
SMOKE = ["tests/test_spmd.py::test_spmd_file[tests/parallel/test_collectives.py-2]",
         "tests/test_spmd.py::test_spmd_file[tests/parallel/test_errors.py-2]",
         "tests/test_spmd.py::test_spmd_file[tests/parallel/test_out_of_place.py-2]",
         "tests/test_deadlock.py::test_desync_ends_every_rank_naming_each_side[ops-sides0-2]",
         "tests/test_deadlock.py::test_stopped_peer_ends_the_others_naming_it[mpi-env1]",
         "tests/test_failures.py::test_signal_to_hvlrun_leaves_nothing_behind",
         "tests/test_fuzz.py::test_fuzz[shm-2]",
         "tests/unit/test_ready_single.py", "tests/unit/test_stage_single.py",
         "tests/unit/test_nccl_run_single.py", "tests/unit/test_execute_single.py",
         "tests/unit/test_gather_single.py", "tests/unit/test_wait_single.py",
         "tests/unit/test_cuda_driver_single.py", "tests/unit/test_coordinator_single.py"]
RUNTIME = {"address": "libasan.so", "thread": "libtsan.so"}
MULTIPLIER = {"address": "4", "thread": "6"}
# Not copied into the tree: version control, environments, build outputs, caches.
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                              ".pytest_cache", "*.so", "*.o", "_core.c", "_build_info.json")


def copy_tree(dest):
    """A fresh copy of the checkout's sources at dest."""
    if os.path.exists(dest):
        shutil.rmtree(dest)
    shutil.copytree(ROOT, dest, ignore=SKIP, symlinks=True)


def build(tree, mode, env):
    """Builds the instrumented engine in place in the copy (a normal setup.py build_ext)."""
    cmd = [sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--force"]
    out = subprocess.run(cmd, cwd=tree, env=dict(env, HVLITE_SANITIZE=mode), capture_output=True,
                         text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit("sanitizer build failed (%s):\n%s\n%s"
                 % (" ".join(cmd), out.stdout[-4000:], out.stderr[-4000:]))


def compiler_library(mpicc, name):
    """The absolute path of library `name` as the compiler behind mpicc finds it."""
    out = subprocess.run([mpicc, "-print-file-name=" + name], capture_output=True, text=True,
                         timeout=60)
    path = os.path.realpath(out.stdout.strip())
    if out.returncode != 0 or not os.path.isfile(path):
        sys.exit("%s: no %s (install the compiler's sanitizer libraries, e.g. apt-get install "
                 "libasan8 libubsan1 libtsan2)" % (mpicc, name))
    return path


def preload(mode):
    """LD_PRELOAD for the run: the sanitizer runtime first (it must be the first library), then
    libstdc++, so the runtime's C++ exception interceptors (__cxa_throw) find the real functions
    when a C++ library (TensorFlow, torch) throws; without it ASan stops with "CHECK failed:
    real___cxa_throw != 0", as Python itself does not link libstdc++."""
    mpicc = _mpi_find.find_mpi().mpicc
    return " ".join(compiler_library(mpicc, name) for name in (RUNTIME[mode], "libstdc++.so.6"))


def sanitizer_env(mode, reports):
    """The environment of the test run: runtime preloaded, reports to files, suppressions."""
    supp = lambda name: os.path.join(HERE, name)   # noqa: E731
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)       # the tests put the tree first themselves
    env["LD_PRELOAD"] = preload(mode)
    env["HVLITE_SANITIZE"] = mode     # C the tests compile beside the engine (unit probes) alike
    env.setdefault("HVLITE_TEST_TIMEOUT_MULTIPLIER", MULTIPLIER[mode])
    if mode == "address":
        # Python objects from malloc, not from pymalloc's mmap'ed arenas, which LeakSanitizer
        # does not scan: a result buffer of the engine's held by a Python object still alive at
        # exit (a module global) is then seen as reachable instead of as a leak of hvlite's, and
        # AddressSanitizer checks Python objects' memory too.
        env["PYTHONMALLOC"] = "malloc"
        # intercept_tls_get_addr=0: GCC 12's LeakSanitizer learns each thread's dynamic-TLS
        # blocks through its __tls_get_addr interceptor, and at exit it was seen to die scanning
        # threads of dlopen'ed libraries ("Tracer caught signal 11": UCX's progress thread,
        # libfabric's, TensorFlow's) that are still alive when a rank exits without
        # MPI_Finalize (an engine stopped on an error). Without the interceptor those blocks
        # are scanned as the heap blocks glibc allocates them as; nothing of hvlite's is hidden.
        env["ASAN_OPTIONS"] = ":".join([
            "log_path=" + os.path.join(reports, "asan"), "detect_leaks=1", "halt_on_error=1",
            "detect_stack_use_after_return=0", "check_initialization_order=1",
            "intercept_tls_get_addr=0"])
        env["LSAN_OPTIONS"] = "suppressions=%s:print_suppressions=0" % supp("lsan.supp")
        # UCX's cross-memory-attach transport (cma) probes a peer with process_vm_readv; the
        # sanitizer's interceptor of that call checks the shadow of the local iovec and was seen
        # to fault inside itself (SEGV in AddressIsPoisoned, in MPI_Init_thread, once in a
        # fresh-clone run). Third-party: CMA off in these runs only (MPI uses its other paths).
        env["UCX_TLS"] = "^cma"
        env["UBSAN_OPTIONS"] = ":".join([
            "log_path=" + os.path.join(reports, "ubsan"), "print_stacktrace=1", "halt_on_error=1",
            "suppressions=" + supp("ubsan.supp")])
    else:
        env["TSAN_OPTIONS"] = ":".join([
            "log_path=" + os.path.join(reports, "tsan"), "halt_on_error=0",
            "second_deadlock_stack=1",
            "suppressions=" + supp("tsan.supp"), "print_suppressions=0"])
        # The MPICH wheel's UCX patches mmap/madvise to track memory (libucm); TSan intercepts
        # the same calls, and a thread exiting through UCX's madvise hook after TSan has torn
        # down its thread state crashes (SIGSEGV in __tsan::MutexPreReadLock). Third-party:
        # switch UCX's hooks off (hvlite does not use UCX's memory registration cache).
        env["UCX_MEM_MMAP_HOOK_MODE"] = "none"
    return env


def check_core(tree, env):
    """The tests must load the instrumented engine from the copy, not the checkout's."""
    probe = "import hvlite._core as c, os; print(os.path.realpath(c.__file__))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tree, env=dict(env, PYTHONPATH=tree),
                         capture_output=True, text=True, timeout=300)
    path = out.stdout.strip()
    if out.returncode != 0 or not path.startswith(os.path.realpath(tree) + os.sep):
        sys.exit("the sanitizer run would not load the engine from %s: %r\n%s"
                 % (tree, path, out.stderr[-3000:]))


def report_files(reports):
    return sorted(glob.glob(os.path.join(reports, "*")))


# Report lines that can reach a job's stderr instead of a report file (UBSan's "runtime error"
# under the ASan runtime does), and so pytest's output when that job fails.
MARKERS = ("runtime error:", "ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
           "WARNING: ThreadSanitizer")


def run_pytest(cmd, tree, env, timeout):
    """pytest in a session of its own (a timeout ends it and every job it started), its output
    echoed as it comes and scanned for MARKERS. Returns (status, report lines)."""
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True)
    seen = []

    def pump():
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if any(m in line for m in MARKERS):
                seen.append(line.rstrip())
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = "timed out after %.0f s" % timeout
    reader.join(60)
    return rc, seen


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=sorted(RUNTIME))
    ap.add_argument("--timeout", type=float, default=3600, help="seconds for the whole pytest run")
    ap.add_argument("--smoke", action="store_true", help="run the short SMOKE sample (CI)")
    # Everything this parser does not know goes to pytest (files, -k, -x ...), before or after
    # --timeout.
    args, args.pytest_args = ap.parse_known_args(argv)
    base = os.path.join(ROOT, "build", "sanitize-" + args.mode)
    tree, reports = os.path.join(base, "tree"), os.path.join(base, "reports")
    start = time.monotonic()
    copy_tree(tree)
    build(tree, args.mode, dict(os.environ))
    shutil.rmtree(reports, ignore_errors=True)
    os.makedirs(reports)
    env = sanitizer_env(args.mode, reports)
    check_core(tree, env)
    built = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=10"]
    cmd += args.pytest_args or (SMOKE if args.smoke else SUITES)
    print("sanitizer %s: %s (in %s)" % (args.mode, " ".join(cmd[3:]), tree), flush=True)
    rc, printed = run_pytest(cmd, tree, env, args.timeout)
    found = report_files(reports)
    for path in found:
        with open(path, errors="replace") as f:
            text = f.read()
        print("\n===== %s (%d bytes)\n%s" % (os.path.relpath(path, ROOT), len(text), text[:20000]))
    if printed:
        print("\n===== sanitizer reports in the tests' output\n" + "\n".join(printed))
    print("sanitizer %s: pytest %s, %d report file(s) in %s, %d report line(s) in the output; "
          "build %.0f s, tests %.0f s"
          % (args.mode, "passed" if rc == 0 else "FAILED (%s)" % rc, len(found),
             os.path.relpath(reports, ROOT), len(printed), built - start, time.monotonic() - built))
    return 0 if rc == 0 and not found and not printed else 1


if __name__ == "__main__":
    sys.exit(main())
