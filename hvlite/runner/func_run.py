"""``hvlite.runner.run(func, ...)`` (also ``hvlite.run``): Horovod's ``horovod.runner.run`` and
``horovod.run``, a Python function run as an hvlite job.

Import it as ``hvlite.run``. Each rank runs your script again as ``multiprocessing``'s spawn
method does, so keep the call under ``if __name__ == "__main__":``.

Contract:
  * ``run(func, args=(), kwargs=None, num_proc=1, ...)`` starts ``hvlrun`` with ``num_proc``
    ranks (Horovod's keyword names; its deprecated ``np``/``min_np``/``max_np`` too), each rank
    calls ``func(*args, **kwargs)`` (which calls ``hvd.init()`` itself, with its own settings,
    as under Horovod), and ``run`` returns the list of their return values, index = rank (of
    the last world, in an elastic job: a world that ends for a re-form returns nothing). A
    ``sys.exit(0)`` in ``func`` returns None; other exits (the elastic ones included) end the
    rank with that code, as in a script.
  * ``func``, ``args``, ``kwargs`` and the results travel pickled: by reference where the ranks
    can import the function (a module's, or the script's, which they run again), so it keeps
    its source (TensorFlow's autograph reads it); otherwise by value with ``cloudpickle`` where
    it is installed (lambdas, closures, a script read from stdin, a function defined in the
    main block), as Horovod always does. The ranks prepare their ``__main__`` as
    ``multiprocessing``'s spawn start method does: the caller's script is run again under the
    name ``__mp_main__``, so its top-level ``if __name__ == "__main__":`` block does not run
    there, and ``sys.argv``, ``sys.path`` and the working directory are the caller's.
  * The pickles and results go through a folder made in the working directory (removed at the
    end); on several hosts that directory must be the same on every host (a shared file system),
    as the script's own path must be for hvlrun. Where the working directory cannot be written,
    the folder goes to the system's temporary directory (enough for one host).
  * An interrupt of the caller (Ctrl-C) while the job runs gives hvlrun SIGINT and up to 30 s
    to end its job and remove what it made, then SIGKILL; the interrupt is raised again.
  * A call from inside a rank (a script whose top level calls ``run`` without a main guard
    runs again there) raises ``RuntimeError`` instead of starting a job per rank.
  * Raises ``RuntimeError`` when the job fails (hvlrun's exit code, and each failed rank's
    exception as it printed it), ``ValueError`` for a function that cannot be pickled or bad
    arguments. Gloo is not part of hvlite: ``use_gloo=True`` is refused; ``disable_cache`` holds
    always (hvlrun caches no host checks).
  * ``python -m hvlite.runner.func_run FOLDER`` is the rank's side; not for direct use.
  * Like the rest of ``hvlite.runner``, this module loads no engine: the ranks' ``func`` does.
"""
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback

__all__ = ["run"]

_PAYLOAD = "call.pkl"
_ENV_INSIDE = "HVLITE_RUN_RANK"      # set in the ranks: a nested run() is a missing main guard
_STOP_GRACE = 30.0                   # seconds hvlrun gets to end its job after an interrupt


def _dumps(call):
    """(by reference, by value): ``pickle``'s bytes where it can (the ranks then use the
    function itself, source and all: TensorFlow's autograph reads it), and ``cloudpickle``'s
    where it is installed (lambdas, closures, a function of a script the ranks cannot run
    again, or defined in its main block), as Horovod always does. Either may be None."""
    try:
        by_reference = pickle.dumps(call)
    except Exception:   # noqa: BLE001 - pickling raises many kinds
        by_reference = None
    try:
        import cloudpickle
    except ImportError:
        if by_reference is None:
            raise
        return by_reference, None
    return by_reference, cloudpickle.dumps(call)


def _loads(by_reference, by_value):
    """The call, by reference first; by value where the ranks cannot find it."""
    try:
        if by_reference is None:
            raise LookupError("not picklable by reference")
        return pickle.loads(by_reference)
    except Exception:   # noqa: BLE001 - e.g. AttributeError: not in the script the ranks ran
        if by_value is None:
            raise
        return pickle.loads(by_value)


def _hvlrun_flags(num_proc, min_num_proc, max_num_proc, slots, reset_limit, cooldown_range,
                  hosts, hostfile, host_discovery_script, start_timeout, ssh_port,
                  ssh_identity_file, output_filename, verbose, mpi_args, network_interfaces):
    flags = ["-np", str(num_proc)]
    pairs = [("-H", hosts), ("--hostfile", hostfile), ("--min-np", min_num_proc),
             ("--max-np", max_num_proc), ("--slots-per-host", slots), ("--reset-limit", reset_limit),
             ("--host-discovery-script", host_discovery_script), ("--start-timeout", start_timeout),
             ("-p", ssh_port), ("-i", ssh_identity_file), ("--output-filename", output_filename),
             ("--mpi-args", mpi_args), ("--network-interface", network_interfaces)]
    for flag, value in pairs:
        if value is not None:
            flags += [flag, ",".join(value) if isinstance(value, (list, tuple)) else str(value)]
    if cooldown_range is not None:
        flags += ["--blacklist-cooldown-range"] + [str(v) for v in cooldown_range]
    if verbose:
        flags.append("--verbose")
    return flags


def run(func, args=(), kwargs=None, num_proc=1, min_num_proc=None, max_num_proc=None,
        slots=None, reset_limit=None, cooldown_range=None, hosts=None, hostfile=None,
        host_discovery_script=None, start_timeout=None, ssh_port=None, ssh_identity_file=None,
        disable_cache=None, output_filename=None, verbose=None, use_gloo=None, use_mpi=None,
        mpi_args=None, network_interface=None, network_interfaces=None, executable=None,
        np=None, min_np=None, max_np=None):
    """Run ``func(*args, **kwargs)`` on every rank of a new hvlite job and return the results.

    ``func`` calls ``hvd.init()`` itself, as under Horovod. It travels by reference where the
    ranks can import it, else as a ``cloudpickle`` copy when cloudpickle is installed; arguments
    and results pass through a folder in the working directory, which must be shared between
    hosts.

    Args:
        func: the function every rank calls.
        args, kwargs: its arguments (picklable).
        num_proc: the number of ranks (``np`` is Horovod's older name).
        hosts: where the ranks run, as ``hvlrun -H`` (``hostfile``: as ``--hostfile``).
        min_num_proc: with ``max_num_proc``, ``host_discovery_script``, ``slots``,
            ``reset_limit``, ``elastic_timeout`` and ``cooldown_range``, makes the job elastic,
            as the ``hvlrun`` flags of the same names do.
        start_timeout: as ``hvlrun --start-timeout``; likewise ``ssh_port``,
            ``ssh_identity_file``, ``network_interface``, ``output_filename``, ``verbose``,
            ``mpi_args`` and the other keywords, each as the flag of its name.
        use_gloo: refused when true (hvlite runs on MPI); ``disable_cache`` and ``use_mpi`` are
            accepted.
    Returns:
        The list of ``func``'s return values, index = rank (the last world's, in an elastic
        job).
    Raises:
        RuntimeError: the job failed (with hvlrun's exit code and each failed rank's
            exception), or ``run`` was called inside a rank of ``run``.
        ValueError: bad arguments, ``use_gloo=True``, or a function that cannot be pickled.
    """
    if os.environ.get(_ENV_INSIDE):
        raise RuntimeError("hvlite.run was called inside a rank of the job it started: the ranks run the "
                           "calling script again (as multiprocessing's spawn does), so put the call "
                           "under `if __name__ == '__main__':`")
    if use_gloo:
        raise ValueError("hvlite.runner.run: hvlite runs on MPI only (no Gloo); leave use_gloo unset")
    num_proc = np if np is not None else num_proc
    min_num_proc = min_np if min_np is not None else min_num_proc
    max_num_proc = max_np if max_np is not None else max_num_proc
    import multiprocessing.spawn
    main = multiprocessing.spawn.get_preparation_data("hvlite-rank")
    main.pop("authkey", None)        # the ranks are not multiprocessing's children
    if not os.path.isfile(main.get("init_main_from_path", "")):
        main.pop("init_main_from_path", None)    # `python - < script`: nothing to run again
    try:
        call = _dumps((func, tuple(args), dict(kwargs or {})))
    except Exception as e:   # noqa: BLE001 - pickling raises many kinds
        raise ValueError("hvlite.runner.run: cannot pickle the function and its arguments (define it at "
                         "the top level of a module or the script, or install cloudpickle): %s: %s"
                         % (type(e).__name__, e)) from None
    try:
        folder = tempfile.mkdtemp(prefix=".hvlite-run-", dir=os.getcwd())
    except OSError:
        folder = tempfile.mkdtemp(prefix="hvlite-run-")
    try:
        with open(os.path.join(folder, _PAYLOAD), "wb") as f:
            pickle.dump((main, call), f)
        command = [sys.executable, "-m", "hvlite.runner"]
        command += _hvlrun_flags(num_proc, min_num_proc, max_num_proc, slots, reset_limit,
                                 cooldown_range, hosts, hostfile, host_discovery_script,
                                 start_timeout, ssh_port, ssh_identity_file, output_filename,
                                 verbose, mpi_args, network_interfaces or network_interface)
        command += [executable or sys.executable, "-m", "hvlite.runner.func_run", folder]
        return _results(folder, _run_hvlrun(command))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_hvlrun(command):
    """Run hvlrun; return its exit code. When the caller is interrupted (Ctrl-C), hvlrun gets
    SIGINT too and up to ``_STOP_GRACE`` seconds to end its job and remove what it made (an
    elastic job's commit folder), then SIGKILL; the interrupt is raised again."""
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    try:
        return proc.wait()
    except BaseException:       # KeyboardInterrupt, or anything that stops the caller here
        try:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=_STOP_GRACE)
        except BaseException:   # noqa: BLE001 - out of time, or interrupted again: kill
            proc.kill()
            proc.wait()
        raise


def _results(folder, code):
    """The last world's results in rank order; RuntimeError naming what failed."""
    worlds = {}
    for name in os.listdir(folder):
        if name.startswith("rank.") and not name.endswith(".part"):
            _, world, rank = name.split(".")
            worlds.setdefault(int(world), {})[int(rank)] = name
    by_rank = worlds[max(worlds)] if worlds else {}
    failures = []
    results = []
    for r in range(len(by_rank)):
        if r not in by_rank:
            failures.append("rank %d left no result" % r)
            continue
        with open(os.path.join(folder, by_rank[r]), "rb") as f:
            ok, value = pickle.load(f)
        if ok:
            results.append(value)
        else:
            failures.append("rank %d raised:\n%s" % (r, value))
    if code != 0 or failures or not by_rank:
        raise RuntimeError("hvlite.runner.run: the job failed (hvlrun exited with code %d)%s"
                           % (code, "".join("; " + f for f in failures)))
    return results


def _store(folder, outcome):
    """Write this rank's (ok, value) where run() looks, named by world and rank (from the
    launcher's environment: the function may have shut the engine down); 1 if it failed."""
    from ..protocol.elastic_env import ENV_WORLD
    from .world.rank_exec import rank_from_env
    path = os.path.join(folder, "rank.%d.%d" % (int(os.environ.get(ENV_WORLD) or 0),
                                               rank_from_env(os.environ)))
    code = 0 if outcome[0] else 1
    with open(path + ".part", "wb") as f:
        try:
            pickle.dump(outcome, f)
        except Exception as e:   # noqa: BLE001 - an unpicklable result
            f.seek(0)
            f.truncate()
            pickle.dump((False, "its result cannot be pickled: %s: %s" % (type(e).__name__, e)), f)
            code = 1
    os.replace(path + ".part", path)
    return code


def _rank_main(folder):
    """A rank: prepare __main__ as the caller's, call, store (ok, result or traceback)."""
    import multiprocessing.spawn
    os.environ[_ENV_INSIDE] = "1"
    with open(os.path.join(folder, _PAYLOAD), "rb") as f:
        main, call = pickle.load(f)
    multiprocessing.spawn.prepare(main)
    try:
        func, args, kwargs = _loads(*call)
        outcome = (True, func(*args, **kwargs))
    except SystemExit as e:
        if e.code not in (None, 0):
            raise                 # the script's own exit (elastic re-forms too): no result
        outcome = (True, None)
    except BaseException:    # noqa: BLE001 - any failure goes back to the caller, then exits 1
        traceback.print_exc()
        outcome = (False, traceback.format_exc())
    return _store(folder, outcome)


if __name__ == "__main__":
    sys.exit(_rank_main(sys.argv[1]))
