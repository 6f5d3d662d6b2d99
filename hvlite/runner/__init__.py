"""``hvlrun``, the hvlite job launcher.

Contract: this package never imports the engine (``hvlite._core`` or any ``hvlite`` module outside
``hvlite.runner`` and ``hvlite.protocol``, the pure-Python module it shares with training code)
and uses only relative imports, so it works before the engine is built.
Importing the package loads nothing else: the programs run with ``python -m`` on every host
(``rank_exec``, ``remote_shell``, ``host_guard``) load only what they use.
Modules: ``launch`` (flags, ``main``), ``job`` (running the job, exit code), ``hosts`` (host
lists), ``mpi_command`` (the mpiexec command per MPI flavour), ``build_info`` (build info, which
mpiexec), ``control`` (hvlrun's end of the control channel),
``control_client`` (the other end), ``remote_shell`` (reaching other hosts), ``host_check``
(can every host be reached), ``host_guard`` (per remote host: owns the job's processes there),
``proctree`` (finding and ending process trees), ``rank_exec`` (per-rank wrapper); elastic jobs:
``elastic_driver`` (worlds and re-forms), ``elastic_world`` (one world), ``elastic_trace`` (the job's own timeline), ``discovery``
(the host discovery script), ``host_pool`` (blacklist, placement), ``commit_store`` (the last
commit, in hvlrun). The authenticated lines, the commit store's other end and what the elastic
driver and its workers agree on live in ``hvlite.protocol``, which ``hvlite.elastic`` imports too.
"""

__all__ = ["main", "run"]


def main(argv=None) -> int:
    """Run ``hvlrun`` with ``argv`` (``sys.argv[1:]`` when None); see ``launch.main``."""
    from .launch import main as launch_main
    return launch_main(argv)


def run() -> None:
    """Console-script entry point: ``sys.exit(main())``."""
    from .launch import run as launch_run
    launch_run()
