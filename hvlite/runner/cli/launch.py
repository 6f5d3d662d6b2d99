"""``hvlrun``: build and run the ``mpiexec`` command for an hvlite job.

Contract:
  * ``main(argv) -> int`` parses the flags, builds the command (see ``mpi_command.py``) and, unless
    ``--dry-run``/``--check-build``, runs it and returns the exit code of the first rank that
    failed (else ``mpiexec``'s own code; never 0 when ``mpiexec`` failed). It never imports the
    engine.
  * Knob flags become ``HVLITE_*`` variables for every rank through the one table :data:`KNOBS`.
    ``OMP_NUM_THREADS`` is set to cores / ranks on this host unless already set.
  * Running and supervising the job, and choosing the exit code, is ``job.py``'s part.
  * Other hosts (any host of ``-H``/``--hostfile`` that gets a rank and is not this machine)
    are reached through a remote shell: ``--ssh-command`` if given, else ``srun`` inside a Slurm
    allocation, else ``ssh`` (``--ssh-port``, ``--ssh-identity-file``); ``--remote-shell`` picks
    one explicitly. Before the job starts, every such host must pass ``host_check.py``'s check
    (else exit :data:`~job.HOST_LOST_CODE`, naming the host). ``--network-interface`` pins MPI's
    traffic and the control channel to an interface.
  * The control channel (``control.py``) gets a fresh secret per job, which reaches the ranks only
    through the environment (never a command line, never ``--dry-run``/``--verbose`` output).
    It is bound to 127.0.0.1 when every rank is local, to the interface's address with
    ``--network-interface``, else to every address (clients still authenticate).
  * ``--host-discovery-script``, ``--min-np`` or ``--max-np`` make the job elastic: it runs as a
    series of worlds (``elastic_driver.py``) that survive losing and gaining workers; the other
    elastic flags are refused without them. ``--dry-run`` then prints the first world's command.
  * Exit code 2 means a usage error, 127 that no ``mpiexec`` could be run.
"""

import argparse
import os
import shlex
import sys
from typing import List, Optional, Sequence, Tuple

from ..hosts import hostlist as hostlib
from .build_info import check_build_report, find_mpiexec, load_build_info
from ..control.server import ENV_CONTROL_ADDR, ENV_HEARTBEAT, ControlServer
from ..hosts.host_check import check_hosts
from ..world.supervise import HOST_LOST_CODE, START_TIMEOUT_CODE, run_job
from ..world.settings import (OPENMPI_PASSTHROUGH, control_address, interface_names,
                           job_settings, remote_hosts, rsh_template)
from .knobs import KNOBS, knob_env
from ..world.mpi_command import build_command, format_command, query_flavour
from ...protocol.wire import ENV_SECRET, new_secret

__all__ = ["KNOBS", "START_TIMEOUT_CODE", "HOST_LOST_CODE", "DEFAULT_HEARTBEAT_TIMEOUT",
           "build_parser", "knob_env", "main", "run"]

# Seconds of silence after which hvlrun ends the job (a cut link, a dead or frozen host), and
# after which the processes on a host that cannot hear hvlrun end themselves. Long enough for
# a loaded machine's scheduling hiccups and TCP's first retransmissions, short next to a job.
DEFAULT_HEARTBEAT_TIMEOUT = 30.0


def build_parser() -> argparse.ArgumentParser:
    """Return the ``hvlrun`` argument parser. Cannot fail."""
    parser = argparse.ArgumentParser(
        prog="hvlrun", allow_abbrev=False,
        description="Run an hvlite job with the MPI the engine was built with.",
        epilog="Everything from the command on is passed to it unchanged.")
    parser.add_argument("-np", "--num-proc", dest="np", type=int,
                        help="number of ranks (default: all slots of -H/--hostfile)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", help="hosts as host:slots,... (default: localhost)")
    where.add_argument("--hostfile", help="file of 'host slots=N', 'host:N' or 'host' lines")
    knobs = parser.add_argument_group("engine settings (HVLITE_* variables)")
    for option, variable, kind, help_text in KNOBS:
        if kind is None:
            knobs.add_argument(option, action="store_true", help="%s [%s]" % (help_text, variable))
        else:
            knobs.add_argument(option, type=kind, help="%s [%s]" % (help_text, variable))
    remote = parser.add_argument_group("other hosts")
    remote.add_argument("-p", "--ssh-port", type=int, help="ssh port on the other hosts")
    remote.add_argument("-i", "--ssh-identity-file", metavar="FILE", help="ssh private key")
    remote.add_argument("--ssh-command", metavar="CMD",
                        help="run `CMD HOST COMMAND` instead of `ssh HOST COMMAND` (a site "
                             "wrapper; {host} in CMD puts the host there instead)")
    remote.add_argument("--remote-shell", choices=("auto", "ssh", "srun"), default="auto",
                        help="how to reach other hosts when --ssh-command is not given "
                             "(auto: srun inside a Slurm allocation, else ssh)")
    remote.add_argument("--network-interface", "--network-interfaces", metavar="NICS",
                        help="interface(s) for MPI and the control channel, e.g. eth0 or eth0,ib0")
    remote.add_argument("--heartbeat-timeout", type=float, metavar="SECONDS",
                        help="end the job when a host or rank is silent this long; 0: never "
                             "(default: $%s or %g)" % (ENV_HEARTBEAT, DEFAULT_HEARTBEAT_TIMEOUT))
    _add_elastic_flags(parser)
    parser.add_argument("--mpi-args", default="", help="extra mpiexec arguments, one string")
    parser.add_argument("--mpi-flavour", choices=("auto", "mpich", "openmpi"), default="auto",
                        help="command syntax to use (default: ask mpiexec --version)")
    parser.add_argument("--output-filename", metavar="DIR",
                        help="also write each rank's output to DIR/rank.<N>/{stdout,stderr}")
    parser.add_argument("--start-timeout", type=float, metavar="SECONDS",
                        help="seconds for every rank to start; 0 waits forever "
                             "(default: $HVLRUN_START_TIMEOUT or 30)")
    parser.add_argument("--verbose", action="store_true", help="print the command before running")
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    parser.add_argument("--check-build", action="store_true",
                        help="report what the engine was built with, then exit")
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE ...",
                        help="run `<hvlrun's python> -m MODULE ...` on every rank")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs")
    return parser


def _add_elastic_flags(parser: argparse.ArgumentParser) -> None:
    """Horovod's elastic flags; any of the first three makes the job elastic."""
    elastic = parser.add_argument_group(
        "elastic jobs (survive losing and gaining workers; see hvlite.elastic)")
    elastic.add_argument("--host-discovery-script", metavar="SCRIPT",
                         help="command printing the usable hosts, one 'host:slots' per line; "
                              "run now and every second")
    elastic.add_argument("--min-np", type=int, metavar="N",
                         help="fewest ranks the job runs with (default: -np, else 1)")
    elastic.add_argument("--max-np", type=int, metavar="N",
                         help="most ranks the job grows to (default: every usable slot)")
    elastic.add_argument("--slots-per-host", type=int, metavar="N",
                         help="slots of a discovered host given without a count (default 1)")
    elastic.add_argument("--elastic-timeout", type=float, metavar="SECONDS",
                         help="end the job after this long below --min-np (default 600)")
    elastic.add_argument("--reset-limit", type=int, metavar="N",
                         help="end the job instead of re-forming it more than N times")
    elastic.add_argument("--blacklist-cooldown-range", type=float, nargs=2,
                         metavar=("MIN", "MAX"),
                         help="seconds a failing host stays blacklisted, doubling from MIN up to "
                              "MAX per blacklisting (default: for the rest of the job)")


def _elastic(args: argparse.Namespace) -> bool:
    return bool(args.host_discovery_script) or args.min_np is not None or args.max_np is not None


_ELASTIC_ONLY = ("slots_per_host", "elastic_timeout", "reset_limit", "blacklist_cooldown_range")


def _check_elastic(args: argparse.Namespace) -> None:
    """Check the elastic flags; fill in --min-np and --elastic-timeout (ValueError if they do
    not fit together, or if an elastic-only flag is given to a job that is not elastic)."""
    if not _elastic(args):
        given = [n for n in _ELASTIC_ONLY if getattr(args, n) is not None]
        if given:
            raise ValueError("--%s only applies to elastic jobs (--host-discovery-script, "
                             "--min-np or --max-np)" % given[0].replace("_", "-"))
        return
    if args.host_discovery_script and (args.hosts or args.hostfile):
        raise ValueError("--host-discovery-script names the hosts: give no -H/--hostfile")
    if args.elastic_timeout is None:
        args.elastic_timeout = 600.0
    for name in ("np", "min_np", "max_np", "slots_per_host"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError("--%s must be at least 1" % name.replace("_", "-"))
    if args.min_np is None:
        args.min_np = args.np or 1
    if args.max_np is not None and args.max_np < args.min_np:
        raise ValueError("--max-np %d is below --min-np %d" % (args.max_np, args.min_np))
    if args.np is not None and not args.min_np <= args.np <= (args.max_np or args.np):
        raise ValueError("-np %d is not between --min-np and --max-np" % args.np)
    if not args.elastic_timeout >= 0 or (args.reset_limit is not None and args.reset_limit < 0):
        raise ValueError("--elastic-timeout and --reset-limit must be >= 0")
    low_high = args.blacklist_cooldown_range
    if low_high is not None and not 0 <= low_high[0] <= low_high[1]:
        raise ValueError("--blacklist-cooldown-range needs 0 <= MIN <= MAX")


def _resolve_hosts(args: argparse.Namespace) -> List[hostlib.Host]:
    """Return the host list and set ``args.np`` (ValueError on bad hosts or -np)."""
    if args.hosts is not None:
        hosts = hostlib.parse_hosts(args.hosts)
    elif args.hostfile is not None:
        hosts = hostlib.parse_hostfile(args.hostfile)
    else:
        if args.np is None:
            raise ValueError("-np is required unless -H or --hostfile is given")
        hosts = hostlib.localhost_only(max(args.np, 1))
    if args.np is None:
        args.np = hostlib.total_slots(hosts)
    hostlib.check_np(hosts, args.np)
    return hosts


def _start_control(args: argparse.Namespace, hosts: Sequence[hostlib.Host], secret: str
                   ) -> Tuple[Optional[ControlServer], str, int]:
    """Start the control server and check the remote hosts.

    Returns:
        ``(server, address, code)``: the server and the address the ranks use, or
        ``(None, "", code)`` with the exit code after printing why.
    """
    remote = remote_hosts(hosts, args.np)
    try:
        bind, advertise = control_address(remote, interface_names(args))
        server = ControlServer(secret, bind, args.heartbeat_timeout).start()
    except (OSError, ValueError) as e:
        sys.stderr.write("hvlrun: cannot open the control channel: %s\n" % e)
        return None, "", 1
    addr = "%s:%d" % (advertise, server.port)
    if not remote:
        return server, addr, 0
    errors = check_hosts(remote, rsh_template(args), addr, secret, args.heartbeat_timeout,
                         sys.executable, os.environ.get("PYTHONPATH"), server.checked_hosts,
                         args.start_timeout or None)
    if not errors:
        return server, addr, 0
    for message in errors:
        sys.stderr.write("hvlrun: %s\n" % message)
    sys.stderr.write("hvlrun: not starting the job: %d of %d host%s cannot be reached\n"
                     % (len(errors), len(remote), "" if len(remote) == 1 else "s"))
    server.close()
    return None, "", HOST_LOST_CODE


def _check_usage(args: argparse.Namespace, command: Sequence[str]) -> List[hostlib.Host]:
    """Validate what needs more than argparse; return the host list (ValueError if bad).
    An elastic job with a discovery script has no host list yet (empty list)."""
    if not command:
        raise ValueError("no command given")
    _check_elastic(args)
    hosts = [] if args.host_discovery_script else _resolve_hosts(args)
    shlex.split(args.mpi_args)
    if args.ssh_command is not None:
        shlex.split(args.ssh_command)
    interface_names(args)
    if args.start_timeout is None:
        args.start_timeout = float(os.environ.get("HVLRUN_START_TIMEOUT", "30"))
    if args.heartbeat_timeout is None:
        args.heartbeat_timeout = float(os.environ.get(ENV_HEARTBEAT, DEFAULT_HEARTBEAT_TIMEOUT))
    if not args.heartbeat_timeout >= 0:
        raise ValueError("--heartbeat-timeout must be >= 0")
    return hosts


def _first_discovered(args: argparse.Namespace) -> List[hostlib.Host]:
    """The hosts of an elastic job's first world, for ``--dry-run`` (ValueError if none)."""
    from ..elastic.discovery import DiscoveryError, discover
    from ..elastic.host_pool import place
    try:
        found = discover(args.host_discovery_script, args.slots_per_host or 1)
    except DiscoveryError as e:
        raise ValueError(str(e)) from None
    want = min(hostlib.total_slots(found), args.max_np or args.np or 1 << 30, args.np or 1 << 30)
    if want < args.min_np:
        raise ValueError("the discovery script names %d slots, below --min-np %d"
                         % (hostlib.total_slots(found), args.min_np))
    args.np = want
    return place(found, want)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``hvlrun``.

    Args:
        argv: the arguments; ``sys.argv[1:]`` when omitted.

    Returns:
        The exit code: 0, the first failing rank's code, mpiexec's code, 2 for usage errors,
        127 when mpiexec cannot be run, :data:`START_TIMEOUT_CODE` after a start timeout,
        :data:`HOST_LOST_CODE` when a host cannot be reached or stops answering.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    try:
        info = load_build_info()
    except ValueError as e:
        sys.stderr.write("hvlrun: warning: ignoring build info: %s\n" % e)
        info = None
    mpiexec, how = find_mpiexec(info)
    if args.check_build:
        sys.stdout.write(check_build_report(info, mpiexec, how, dict(os.environ, **knob_env(args))))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.module:
        command = [sys.executable, "-m"] + args.module
    try:
        hosts = _check_usage(args, command)
    except ValueError as e:
        parser.print_usage(sys.stderr)
        sys.stderr.write("hvlrun: error: %s\n" % e)
        return 2
    if mpiexec is None and not args.dry_run:
        sys.stderr.write("hvlrun: no mpiexec found; set HVLITE_MPIEXEC or put it on PATH\n")
        return 127
    mpiexec = mpiexec or "mpiexec"
    flavour = args.mpi_flavour if args.mpi_flavour != "auto" else query_flavour(mpiexec)
    if _elastic(args) and not args.dry_run:
        from ..elastic.driver import run_elastic
        from ..world.run import Launch
        return run_elastic(Launch(args, flavour, mpiexec, command, {}), hosts)
    if not hosts:   # --dry-run of a job with a discovery script: its first world
        try:
            hosts = _first_discovered(args)
        except ValueError as e:
            sys.stderr.write("hvlrun: error: %s\n" % e)
            return 2
    options, rank_env, launcher_vars = job_settings(args, hosts, flavour)
    server, secret = None, new_secret()
    if not args.dry_run:
        server, rank_env[ENV_CONTROL_ADDR], code = _start_control(args, hosts, secret)
        if server is None:
            return code
        rank_env[ENV_HEARTBEAT] = "%g" % args.heartbeat_timeout
    passthrough = [n for n in os.environ
                   if n in OPENMPI_PASSTHROUGH or n.startswith(("HVLITE_", "HVLRUN_"))]
    cmd = build_command(flavour, mpiexec, args.np, hosts, rank_env, args.mpi_args, command,
                        export_names=passthrough + [ENV_SECRET], launch_options=options)
    added = dict(rank_env, **launcher_vars)
    if args.dry_run or args.verbose:
        stream = sys.stdout if args.dry_run else sys.stderr
        stream.write(format_command(cmd, added))
        stream.flush()
    if server is None:
        return 0
    try:
        # The secret travels in the environment only: hydra forwards it to every rank.
        env = dict(os.environ, **added, **{ENV_SECRET: secret})
        return run_job(cmd, env, server, args.np, args.start_timeout)
    finally:
        server.close()


def run() -> None:
    """Console-script entry point: ``sys.exit(main())``."""
    sys.exit(main())
