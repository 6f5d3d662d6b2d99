"""The launcher: ``hvlrun`` from Python (:func:`main`), and ``run(func, ...)``, which runs a
Python function on every rank of a new job and returns each rank's result (Horovod's
``horovod.runner.run``, also reachable as ``hvlite.run``; see ``hvlite.runner.func_run``).

It works before hvlite's engine is built, and ``hvlrun --check-build`` reports what was
built. The command line is in the :doc:`hvlrun reference </reference/hvlrun>`.

Contract: this package never imports the engine (``hvlite._core`` or any ``hvlite`` module outside
``hvlite.runner`` and ``hvlite.protocol``, the pure-Python module it shares with training code)
and uses only relative imports, so it works before the engine is built.
Importing the package loads nothing else: the programs run with ``python -m`` on every host
(``world.rank_exec``, ``hosts.remote_shell``, ``hosts.host_guard``) load only what they use.

Folders, each importing only those below it (``tests/unit/test_layers.py`` checks):
  * ``cli``: the command line (flags, ``main``, ``--check-build``); the top.
  * ``elastic``: elastic jobs (the driver, the commit store, host discovery, the blacklist).
  * ``world``: running a world (the launch command, the one supervision loop, the rank wrapper).
  * ``hosts``: host lists, reaching remote hosts, the host guard on each.
  * ``control``: the control channel (hvlrun's server, the wrappers' and guards' client).
  * ``procs``: a host's process trees, and the files the job's processes leave behind.
The authenticated lines, the commit store's client and what the elastic driver and its workers
agree on live in ``hvlite.protocol``, which ``hvlite.elastic`` imports too.
"""

__all__ = ["main", "run"]


def main(argv=None) -> int:
    """Run ``hvlrun`` in this process, as the ``hvlrun`` command does, and wait for the job.

    Args:
        argv: hvlrun's arguments (a list of strings); ``sys.argv[1:]`` when None.
    Returns:
        hvlrun's exit code, 0 when every rank succeeded, else the first failing rank's code or
        hvlrun's own (the :doc:`errors reference </reference/errors>` lists them).
    """
    from .cli.launch import main as launch_main
    return launch_main(argv)


def __getattr__(name):
    # run(func, args=(), kwargs=None, num_proc=1, ...): imported when first asked for, so that
    # importing the package loads nothing else
    if name == "run":
        from .func_run import run
        return run
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
