"""``hvlrun``: from the command line to a job.

Contract:
  * ``main(argv) -> int`` parses and checks the flags (``flags.py``), then either reports the
    build (``--check-build``), prints the launch command (``--dry-run``: with its variables,
    never the job secret; for an elastic job, its first world's), or runs the job and returns
    its exit code. It never imports the engine.
  * A plain job runs as one world (``world/run.py``: the exit code of the first rank that
    failed, else ``mpiexec``'s own code, never 0 when ``mpiexec`` failed;
    :data:`HOST_LOST_CODE` when a host cannot be reached or is lost, :data:`START_TIMEOUT_CODE`
    after a start timeout); ``--host-discovery-script``, ``--min-np`` or ``--max-np`` make it
    an elastic job, a series of worlds (``elastic/driver.py``), each run the same way.
  * Knob flags become ``HVLITE_*`` variables for every rank through the one table :data:`KNOBS`.
    horovodrun's flags and ``--config-file`` are folded in first (``horovod_flags.py``).
    ``OMP_NUM_THREADS`` is set to cores / ranks on each rank's host unless already set (the
    rank wrapper works it out on its host).
  * Other hosts (any host of ``-H``/``--hostfile`` that gets a rank and is not this machine)
    are reached through a remote shell: ``--ssh-command`` if given, else ``srun`` inside a Slurm
    allocation, else ``ssh`` (``--ssh-port``, ``--ssh-identity-file``); ``--remote-shell`` picks
    one explicitly. Before a world starts, every such host must pass ``host_check.py``'s check.
    ``--network-interface`` pins MPI's traffic and the control channel to an interface.
  * The control channel gets a fresh secret per world, which reaches the ranks only through the
    environment (never a command line, never ``--dry-run``/``--verbose`` output).
  * Exit code 2 means a usage error, 127 that no ``mpiexec`` could be run.
"""

import os
import sys
from typing import List, Optional, Sequence

from ..hosts.hostlist import Host
from ..world.mpi_command import format_command, query_flavour
from ..world.run import HOST_LOST_CODE, START_TIMEOUT_CODE, run_job
from ..world.say import say
from ..world.spec import Launch, WorldSpec
from ..world.start import command as launch_command
from .build_info import ask_engine, check_build_report, find_mpiexec, load_build_info
from .flags import (DEFAULT_HEARTBEAT_TIMEOUT, build_parser, check_usage, first_discovered,
                    is_elastic)
from .horovod_flags import apply_horovod_flags
from .knobs import KNOBS, knob_env

__all__ = ["KNOBS", "START_TIMEOUT_CODE", "HOST_LOST_CODE", "DEFAULT_HEARTBEAT_TIMEOUT",
           "build_parser", "knob_env", "main", "run"]


def _build_info() -> Optional[dict]:
    """The engine's build info, or None (not built, or unreadable: said once)."""
    try:
        return load_build_info()
    except ValueError as e:
        say("warning: ignoring build info: %s" % e)
        return None


def _dry_run(launch: Launch, hosts: List[Host]) -> int:
    """Print the command a plain job, or an elastic job's first world, would run."""
    if not hosts:   # a job with a discovery script: its first world
        try:
            hosts = first_discovered(launch.args)
        except ValueError as e:
            say("error: %s" % e)
            return 2
    argv, _, added = launch_command(launch, WorldSpec(0, hosts, {}, launch.args.np), None, "")
    sys.stdout.write(format_command(argv, added))
    sys.stdout.flush()
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``hvlrun``.

    Args:
        argv: the arguments; ``sys.argv[1:]`` when omitted.

    Returns:
        The exit code (see the module contract).
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    try:
        apply_horovod_flags(args, say)
    except ValueError as e:
        parser.print_usage(sys.stderr)
        say("error: %s" % e)
        return 2
    info = _build_info()
    mpiexec, how = find_mpiexec(info)
    if args.check_build:
        engine = ask_engine() if info is not None else None
        sys.stdout.write(check_build_report(info, mpiexec, how, dict(os.environ, **knob_env(args)),
                                            engine))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.module:
        command = [sys.executable, "-m"] + args.module
    try:
        hosts = check_usage(args, command)
    except ValueError as e:
        parser.print_usage(sys.stderr)
        say("error: %s" % e)
        return 2
    if mpiexec is None and not args.dry_run:
        say("no mpiexec found; set HVLITE_MPIEXEC or put it on PATH")
        return 127
    mpiexec = mpiexec or "mpiexec"
    flavour = args.mpi_flavour if args.mpi_flavour != "auto" else query_flavour(mpiexec)
    launch = Launch(args, flavour, mpiexec, command, knob_env(args), {})
    if args.dry_run:
        return _dry_run(launch, hosts)
    if is_elastic(args):
        from ..elastic.driver import run_elastic
        return run_elastic(launch, hosts)
    return run_job(launch, hosts)


def run() -> None:
    """Console-script entry point: ``sys.exit(main())``."""
    sys.exit(main())
