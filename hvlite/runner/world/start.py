"""Starting a world: its control channel, the check of its remote hosts, its launch command.

Contract:
  * :func:`open_control` starts a :class:`~..control.server.ControlServer` with the world's
    secret, bound to 127.0.0.1 when every rank is local, to the interface's address with
    ``--network-interface``, else to every address (clients still authenticate), and checks
    that every remote host of the world can be reached and can reach back (``host_check.py``,
    within ``rules.check_timeout``). It returns the started server and the address the ranks
    use, or a :class:`~.spec.WorldEnd`: ``launcher`` with code 1 when the channel cannot be
    opened, ``unreachable`` (charged to the hosts whose check did not arrive; ``details``: one
    line per failing host and a summary) when a host fails its check, ``signal`` (code
    128+signum) when hvlrun gets a signal while the hosts are checked (the checks
    are ended at once).
  * :func:`command` returns the world's launch command (``mpi_command.build_command``), the
    launcher's whole environment and the variables hvlrun adds that may be shown
    (``--dry-run``, ``--verbose``). The secret and ``Launch.hidden_env`` reach the launcher
    through its environment only, never a command line nor what is shown. Without an address
    (a dry run) the ranks get no control channel.
"""
import copy
import os
import signal
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from ...protocol.wire import ENV_SECRET
from ..control.names import ENV_CONTROL_ADDR, ENV_HEARTBEAT, ENV_OUTPUT_DIR
from ..control.server import ControlServer
from ..hosts.host_check import CANCELLED, check_hosts
from .mpi_command import build_command
from .rules import Rules
from .settings import (control_address, interface_names, job_settings, openmpi_exports,
                       remote_hosts, rsh_template)
from .spec import Launch, WorldEnd, WorldSpec

__all__ = ["open_control", "command"]


def open_control(launch: Launch, spec: WorldSpec, secret: str, rules: Rules,
                 caught: Sequence[int] = ()
                 ) -> Tuple[Optional[ControlServer], str, Optional[WorldEnd]]:
    """Start the world's control server and check its remote hosts (ended at once when a
    signal is noted in ``caught``).

    Returns:
        ``(server, address, None)``, or ``(None, "", end)`` when the world cannot start.
    """
    args = launch.args
    remote = remote_hosts(spec.hosts, spec.np)
    try:
        bind, advertise = control_address(remote, interface_names(args))
        server = ControlServer(secret, bind, args.heartbeat_timeout).start()
    except (OSError, ValueError) as e:
        return None, "", WorldEnd("launcher", "cannot open the control channel: %s" % e,
                                  code=1, at=time.monotonic())
    addr = "%s:%d" % (advertise, server.port)
    if not remote:
        return server, addr, None
    errors = check_hosts(remote, rsh_template(args), addr, secret, args.heartbeat_timeout,
                         sys.executable, os.environ.get("PYTHONPATH"), server.checked_hosts,
                         rules.check_timeout(args.start_timeout), cancel=lambda: bool(caught))
    if not errors:
        return server, addr, None
    if errors == [CANCELLED]:
        server.close()
        return None, "", WorldEnd("signal", "hvlrun got %s" % signal.Signals(caught[0]).name,
                                  code=128 + caught[0], at=time.monotonic())
    bad = tuple(h for h in remote if h not in server.checked_hosts())
    server.close()
    summary = "not starting the job: %d of %d host%s cannot be reached" % (
        len(errors), len(remote), "" if len(remote) == 1 else "s")
    return None, "", WorldEnd("unreachable", "; ".join(errors), bad or tuple(remote),
                              at=time.monotonic(), details=tuple(errors) + (summary,))


def command(launch: Launch, spec: WorldSpec, addr: Optional[str], secret: str
            ) -> Tuple[List[str], Dict[str, str], Dict[str, str]]:
    """Return the world's launch command, the launcher's environment, and what may be shown."""
    args = copy.copy(launch.args)
    args.np = spec.np
    options, rank_env, launcher_vars = job_settings(args, spec.hosts, launch.flavour,
                                                    launch.knobs)
    if spec.number and args.output_filename:
        rank_env[ENV_OUTPUT_DIR] = os.path.join(os.path.abspath(args.output_filename),
                                                "world.%d" % spec.number)
    rank_env.update(spec.rank_env)
    if addr:
        rank_env[ENV_CONTROL_ADDR] = addr
        rank_env[ENV_HEARTBEAT] = "%g" % args.heartbeat_timeout
    # The secret travels in the environment only: hydra forwards it to every rank.
    hidden = dict(launch.hidden_env, **{ENV_SECRET: secret})
    passthrough = openmpi_exports(os.environ) if launch.flavour == "openmpi" else []
    argv = build_command(launch.flavour, launch.mpiexec, spec.np, spec.hosts, rank_env,
                         args.mpi_args, launch.command, export_names=passthrough + sorted(hidden),
                         launch_options=options)
    added = dict(rank_env, **launcher_vars)
    return argv, dict(os.environ, **added, **hidden), added
