"""``hvlrun``'s flags: the parser, and the checks argparse cannot make.

Contract:
  * :func:`build_parser` returns the parser (the knob flags come from ``knobs.py``'s one table;
    horovodrun's other spellings from ``horovod_flags.py``, which ``launch.main`` applies).
  * :func:`check_usage` checks what needs more than argparse and fills in the defaults that
    depend on other flags or the environment (``--start-timeout``: ``$HVLRUN_START_TIMEOUT``,
    Horovod's ``$HOROVOD_START_TIMEOUT`` or 30; ``--heartbeat-timeout``:
    ``$HVLRUN_HEARTBEAT_TIMEOUT`` or :data:`DEFAULT_HEARTBEAT_TIMEOUT`; ``--min-np``;
    ``--elastic-timeout``: Horovod's ``$HOROVOD_ELASTIC_TIMEOUT`` or 600; ``-np`` from the host
    list); it returns the host list, empty for an elastic job with a discovery script, and raises
    ``ValueError`` saying what is wrong.
  * ``--host-discovery-script``, ``--min-np`` or ``--max-np`` make the job elastic
    (:func:`is_elastic`); the other elastic flags are refused without them.
    :func:`first_discovered` gives a dry run the hosts of an elastic job's first world.
"""

import argparse
import os
import shlex
from typing import List, Sequence

from ..control.names import ENV_HEARTBEAT
from ..hosts import hostlist as hostlib
from ..world.settings import interface_names
from .horovod_flags import add_horovod_flags
from .knobs import KNOBS

__all__ = ["DEFAULT_HEARTBEAT_TIMEOUT", "build_parser", "is_elastic", "check_usage",
           "first_discovered"]

# Seconds of silence after which hvlrun ends the job (a cut link, a dead or frozen host), and
# after which the processes on a host that cannot hear hvlrun end themselves. Long enough for
# a loaded machine's scheduling hiccups and TCP's first retransmissions, short next to a job.
DEFAULT_HEARTBEAT_TIMEOUT = 30.0


def build_parser() -> argparse.ArgumentParser:
    """Return the ``hvlrun`` argument parser. Cannot fail."""
    parser = argparse.ArgumentParser(
        prog="hvlrun", allow_abbrev=False,
        # argparse's own usage lists every flag (30 lines); the options below carry them all
        usage="hvlrun [-np N] [-H HOSTS | --hostfile FILE] [options] [--] command ...",
        description="Run an hvlite job with the MPI the engine was built with.",
        epilog="Everything from the command on is passed to it unchanged.")
    parser.add_argument("-np", "--num-proc", dest="np", type=int,
                        help="number of ranks (default: all slots of -H/--hostfile)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", help="hosts as host:slots,... (default: localhost)")
    where.add_argument("--hostfile", "-hostfile", help="file of 'host slots=N', 'host:N' or 'host' lines")
    knobs = parser.add_argument_group("engine settings (HVLITE_* variables)")
    for option, variable, kind, help_text in KNOBS:
        if kind is None:
            knobs.add_argument(option, action="store_true", default=None,
                               help="%s [%s]" % (help_text, variable))
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
                        action="append",
                        help="interface(s) for MPI and the control channel, e.g. eth0 or eth0,ib0 "
                             "(may be given more than once)")
    remote.add_argument("--heartbeat-timeout", type=float, metavar="SECONDS",
                        help="end the job when a host or rank is silent this long; 0: never "
                             "(default: $%s or %g)" % (ENV_HEARTBEAT, DEFAULT_HEARTBEAT_TIMEOUT))
    _add_elastic_flags(parser)
    parser.add_argument("--mpi-args", default="", help="extra mpiexec arguments, one string")
    parser.add_argument("--mpi-flavour", choices=("auto", "mpich", "openmpi"), default="auto",
                        help="command syntax to use (default: ask mpiexec --version)")
    parser.add_argument("--output-filename", metavar="DIR",
                        help="also write each rank's output to DIR/rank.<N>/{stdout,stderr}")
    parser.add_argument("--prefix-output-with-timestamp", "-prefix-timestamp",
                        action="store_true",
                        help="start each forwarded output line with the local time")
    parser.add_argument("--start-timeout", type=float, metavar="SECONDS",
                        help="seconds for every rank to start; 0 waits forever "
                             "(default: $HVLRUN_START_TIMEOUT, $HOROVOD_START_TIMEOUT or 30)")
    parser.add_argument("--verbose", action="store_true", help="print the command before running")
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    parser.add_argument("--check-build", "-cb", action="store_true",
                        help="report what the engine was built with, then exit")
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE ...",
                        help="run `<hvlrun's python> -m MODULE ...` on every rank")
    parser.add_argument("-v", "--version", action="version", version="hvlrun (hvlite) " + _version())
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command each rank runs")
    add_horovod_flags(parser)
    return parser


def _version() -> str:
    """hvlite's installed version ("unknown" when run from a tree pip never installed)."""
    try:
        from importlib.metadata import version
        return version("hvlite")
    except Exception:      # PackageNotFoundError, or a broken installation: never fail --help
        return "unknown"


def _add_elastic_flags(parser: argparse.ArgumentParser) -> None:
    """Horovod's elastic flags; any of the first three makes the job elastic."""
    elastic = parser.add_argument_group(
        "elastic jobs (survive losing and gaining workers; see hvlite.elastic)")
    elastic.add_argument("--host-discovery-script", metavar="SCRIPT",
                         help="command printing the usable hosts, one 'host:slots' per line; "
                              "run now and every second")
    elastic.add_argument("--min-np", "--min-num-proc", type=int, metavar="N",
                         help="fewest ranks the job runs with (default: -np, else 1)")
    elastic.add_argument("--max-np", "--max-num-proc", type=int, metavar="N",
                         help="most ranks the job grows to (default: every usable slot)")
    elastic.add_argument("--slots-per-host", type=int, metavar="N",
                         help="slots of a discovered host given without a count (default 1; "
                              "--host-discovery-script only)")
    elastic.add_argument("--elastic-timeout", type=float, metavar="SECONDS",
                         help="end the job after this long below --min-np "
                              "(default: $HOROVOD_ELASTIC_TIMEOUT or 600)")
    elastic.add_argument("--reset-limit", type=int, metavar="N",
                         help="end the job instead of re-forming it more than N times")
    elastic.add_argument("--blacklist-cooldown-range", type=float, nargs=2,
                         metavar=("MIN", "MAX"),
                         help="seconds a failing host stays blacklisted, doubling from MIN up to "
                              "MAX per blacklisting (default: for the rest of the job)")


def is_elastic(args: argparse.Namespace) -> bool:
    """True when the flags make the job elastic."""
    return bool(args.host_discovery_script) or args.min_np is not None or args.max_np is not None


_ELASTIC_ONLY = ("slots_per_host", "elastic_timeout", "reset_limit", "blacklist_cooldown_range")


def _env_seconds(names: Sequence[str], default: float) -> float:
    """The first of the variables ``names`` that is set and not empty, as seconds, else
    ``default`` (ValueError naming the variable when it is not a number)."""
    for name in names:
        text = os.environ.get(name)
        if text:
            try:
                return float(text)
            except ValueError:
                raise ValueError("$%s=%r is not a number of seconds" % (name, text)) from None
    return float(default)


def _check_elastic(args: argparse.Namespace) -> None:
    """Check the elastic flags; fill in --min-np and --elastic-timeout (ValueError if they do
    not fit together, or if an elastic-only flag is given to a job that is not elastic)."""
    if not is_elastic(args):
        given = [n for n in _ELASTIC_ONLY if getattr(args, n) is not None]
        if given:
            raise ValueError("--%s only applies to elastic jobs (--host-discovery-script, "
                             "--min-np or --max-np)" % given[0].replace("_", "-"))
        return
    if args.host_discovery_script and (args.hosts or args.hostfile):
        raise ValueError("--host-discovery-script names the hosts: give no -H/--hostfile")
    if args.slots_per_host is not None and not args.host_discovery_script:
        # as horovodrun: the default count of a discovery script's bare host lines only
        raise ValueError("--slots-per-host applies to the lines of --host-discovery-script; "
                         "give fixed hosts their slots as -H host:N or 'host slots=N' in "
                         "--hostfile")
    if args.elastic_timeout is None:
        args.elastic_timeout = _env_seconds(("HOROVOD_ELASTIC_TIMEOUT",), 600)
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


def check_usage(args: argparse.Namespace, command: Sequence[str]) -> List[hostlib.Host]:
    """Validate what needs more than argparse; return the host list (ValueError if bad).
    An elastic job with a discovery script has no host list yet (empty list)."""
    if not command:
        raise ValueError("no command given")
    _check_elastic(args)
    hosts = [] if args.host_discovery_script else _resolve_hosts(args)
    if is_elastic(args) and not args.host_discovery_script and (
            hostlib.total_slots(hosts) < args.min_np):
        raise ValueError("--min-np %d is above the %d slots of the fixed hosts (%s): the job "
                         "could never start; without --host-discovery-script the hosts never "
                         "change" % (args.min_np, hostlib.total_slots(hosts),
                                     ",".join("%s:%d" % (h.name, h.slots) for h in hosts)))
    shlex.split(args.mpi_args)
    if args.ssh_command is not None:
        shlex.split(args.ssh_command)
    interface_names(args)
    if args.start_timeout is None:
        args.start_timeout = _env_seconds(("HVLRUN_START_TIMEOUT", "HOROVOD_START_TIMEOUT"), 30)
    if args.heartbeat_timeout is None:
        args.heartbeat_timeout = _env_seconds((ENV_HEARTBEAT,), DEFAULT_HEARTBEAT_TIMEOUT)
    if not args.heartbeat_timeout >= 0:
        raise ValueError("--heartbeat-timeout must be >= 0")
    return hosts


def first_discovered(args: argparse.Namespace) -> List[hostlib.Host]:
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
