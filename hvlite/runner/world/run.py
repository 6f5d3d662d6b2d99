"""One world of an elastic job: start it on the chosen hosts, watch it, end it, say how it ended.

Contract:
  * :func:`run_world` gets the parsed flags, a :class:`WorldSpec` (the world's number, its
    placement: each host with its rank count, and the extra variables for its ranks) and
    returns a :class:`WorldEnd` once nothing of the world is left. It never raises for
    anything a world does; the elastic driver (``elastic_driver.py``) decides what comes next.
  * Each world has its own control server and secret (``control.py``), so a late report from a
    world that was ended can never count in the next. Remote hosts are checked first; hosts that
    cannot be reached end the world before it starts (kind ``unreachable``, naming them).
  * The world is watched as a plain job is (``job.py``), with three differences: an exit with
    :data:`~elastic_env.HOSTS_UPDATED_CODE` is the agreed end of a world whose hosts changed
    (its ranks get :data:`REFORM_GRACE_SECONDS` to exit on their own); an exit with
    :data:`~elastic_env.PEER_LOST_CODE` is a consequence, and the real cause (a failed rank, a
    lost host) gets :data:`PEER_LOST_WAIT_SECONDS` to show; a failing rank is charged to the
    host the placement put it on. Ending a world is ``job.py``'s: stop to every wrapper and
    guard, then signals to the launcher's process group; its shared-memory files are removed.
  * Kinds: ``done`` (every rank exited 0), ``reform``, ``failed`` (``hosts``: the failing rank's
    host), ``lost`` (a host or rank vanished), ``peer-lost``, ``unreachable``,
    ``start-timeout`` (the hosts of the ranks that did not start), ``signal`` (hvlrun got
    SIGINT/SIGTERM; ``code`` is 128+signum), ``finished-failed`` (a rank failed after another
    had finished: the job ends with ``code``), ``launcher`` (mpiexec ended without reports).
"""

import copy
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..control.server import (ENV_CONTROL_ADDR, ENV_HEARTBEAT, ENV_OUTPUT_DIR, HOST_SETTLE_SECONDS,
                      ControlServer)
from ...protocol.elastic_env import HOSTS_UPDATED_CODE, PEER_LOST_CODE
from ..hosts.host_check import check_hosts
from ..hosts.hostlist import Host, is_local
from .supervise import _LOST_GRACE_SECONDS, _end_group, _lost_first, _report_rejected, _terminate_group
from .settings import (OPENMPI_PASSTHROUGH, control_address, interface_names,
                           job_settings, remote_hosts, rsh_template)
from .mpi_command import build_command
from ..procs.shm_files import ShmWatcher, remove_unused
from ...protocol.wire import ENV_SECRET, new_secret

__all__ = ["REFORM_GRACE_SECONDS", "PEER_LOST_WAIT_SECONDS", "WorldSpec", "WorldEnd",
           "Launch", "run_world", "rank_hosts"]

REFORM_GRACE_SECONDS = 10.0
PEER_LOST_WAIT_SECONDS = 2.0


class Launch(NamedTuple):
    """What every world of the job is started with: the parsed flags, the MPI flavour, the
    ``mpiexec`` to run, the user's command, and variables for the launcher's environment only
    (never a command line: the commit key)."""
    args: object
    flavour: str
    mpiexec: str
    command: Sequence[str]
    hidden_env: Dict[str, str]


class WorldSpec(NamedTuple):
    """One world: its number, its placement (each host with its rank count as ``slots``), and
    more variables for its ranks."""
    number: int
    hosts: Sequence[Host]
    rank_env: Dict[str, str]

    @property
    def np(self) -> int:
        return sum(h.slots for h in self.hosts)


class WorldEnd(NamedTuple):
    """How a world ended (kinds in the module contract), in words, the hosts it is charged to,
    an exit code where the job ends with one, and when it was noticed (``time.monotonic()``)."""
    kind: str
    reason: str
    hosts: Tuple[str, ...] = ()
    code: int = 0
    at: float = 0.0


def rank_hosts(hosts: Sequence[Host]) -> List[str]:
    """Return each rank's host name, rank by rank, as the placement fills slots. Cannot fail."""
    return [h.name for h in hosts for _ in range(h.slots)]


def _say(message: str) -> None:
    sys.stderr.write("hvlrun: %s\n" % message)
    sys.stderr.flush()


def _host_of(name: str, placement: Sequence[Host]) -> str:
    """Map a host name a wrapper or guard reported to the placement's name for it."""
    names = [h.name for h in placement]
    if name in names:
        return name
    return next((n for n in names if is_local(n) and is_local(name)), name)


def _start_server(launch: Launch, spec: WorldSpec, secret: str
                  ) -> Tuple[Optional[ControlServer], str, Optional[WorldEnd]]:
    """Start the world's control server and check its remote hosts."""
    args = launch.args
    remote = remote_hosts(spec.hosts, spec.np)
    try:
        bind, advertise = control_address(remote, interface_names(args))
        server = ControlServer(secret, bind, args.heartbeat_timeout).start()
    except (OSError, ValueError) as e:
        return None, "", WorldEnd("launcher", "cannot open the control channel: %s" % e,
                                  code=1, at=time.monotonic())
    addr = "%s:%d" % (advertise, server.port)
    if remote:
        errors = check_hosts(remote, rsh_template(args), addr, secret, args.heartbeat_timeout,
                             sys.executable, os.environ.get("PYTHONPATH"), server.checked_hosts,
                             args.start_timeout or 30.0)
        bad = tuple(h for h in remote if h not in server.checked_hosts())
        if errors:
            server.close()
            return None, "", WorldEnd("unreachable", "; ".join(errors), bad or tuple(remote),
                                      at=time.monotonic())
    return server, addr, None


def _command(launch: Launch, spec: WorldSpec, addr: str, secret: str
             ) -> Tuple[List[str], Dict[str, str]]:
    """Return the world's launch command and the launcher's environment."""
    args = copy.copy(launch.args)
    args.np = spec.np
    options, rank_env, launcher_vars = job_settings(args, spec.hosts, launch.flavour)
    if args.output_filename:
        rank_env[ENV_OUTPUT_DIR] = os.path.join(os.path.abspath(args.output_filename),
                                                "world.%d" % spec.number)
    rank_env.update(spec.rank_env)
    rank_env[ENV_CONTROL_ADDR] = addr
    rank_env[ENV_HEARTBEAT] = "%g" % args.heartbeat_timeout
    passthrough = [n for n in os.environ
                   if n in OPENMPI_PASSTHROUGH or n.startswith(("HVLITE_", "HVLRUN_"))]
    hidden = dict(launch.hidden_env, **{ENV_SECRET: secret})
    cmd = build_command(launch.flavour, launch.mpiexec, spec.np, spec.hosts, rank_env,
                        args.mpi_args, launch.command, export_names=passthrough + sorted(hidden),
                        launch_options=options)
    env = dict(os.environ, **rank_env, **launcher_vars, **hidden)
    return cmd, env


class _Watch:
    """The state of one world's wait loop."""

    def __init__(self, proc: subprocess.Popen, server: ControlServer, spec: WorldSpec,
                 start_timeout: float, caught: List[int], shm: ShmWatcher) -> None:
        self.proc, self.server, self.spec, self.caught, self.shm = proc, server, spec, caught, shm
        self.hosts = rank_hosts(spec.hosts)
        self.deadline = time.monotonic() + start_timeout if start_timeout > 0 else None
        self.reform_since: Optional[float] = None
        self.peer_lost_since: Optional[float] = None

    def end(self, kind: str, reason: str, hosts: Sequence[str] = (), code: int = 0,
            grace: Optional[float] = None, at: Optional[float] = None) -> WorldEnd:
        """End what is left of the world and describe how it ended."""
        at = at or time.monotonic()
        if self.proc.poll() is None:
            if grace is None:
                _terminate_group(self.proc, self.server, reason, shm=self.shm)
            else:
                _terminate_group(self.proc, self.server, reason, grace, self.shm)
        return WorldEnd(kind, reason, tuple(hosts), code, at)

    def rank_host(self, rank: int) -> str:
        return self.hosts[rank] if 0 <= rank < len(self.hosts) else "?"

    def failure(self) -> Optional[Tuple[int, int]]:
        """The first exit that is neither 0 nor one of the elastic codes."""
        return next(((r, c) for r, c in self.server.exits()
                     if c not in (0, HOSTS_UPDATED_CODE, PEER_LOST_CODE)), None)

    def describe_rank(self, rank: int, code: int) -> str:
        if code > 128:
            return "rank %d on %s was killed by signal %d" % (rank, self.rank_host(rank),
                                                               code - 128)
        return "rank %d on %s exited with code %d" % (rank, self.rank_host(rank), code)

    def step(self, settle: float = HOST_SETTLE_SECONDS) -> Optional[WorldEnd]:
        """Look once; return how the world ended, or None while it goes on. ``settle`` is
        passed to ``ControlServer.lost`` (0 once the launcher has ended)."""
        now = time.monotonic()
        if self.caught:
            name = signal.Signals(self.caught[0]).name
            return self.end("signal", "hvlrun got %s" % name, code=128 + self.caught[0])
        exits = self.server.exits()
        codes = [c for _, c in exits]
        failure, gone = self.failure(), self.server.lost(settle)
        if gone is not None and self.reform_since is None and (
                failure is None
                or _lost_first(gone.since, self.server.first_failure_round(), failure)):
            host = _host_of(gone.host, self.spec.hosts) if gone.host else "?"
            return self.end("lost", gone.message, (host,), grace=_LOST_GRACE_SECONDS)
        if failure is not None:
            reason = self.describe_rank(*failure)
            if 0 in codes:
                return self.end("finished-failed", reason + " after other ranks had finished",
                                code=failure[1])
            return self.end("failed", reason, (self.rank_host(failure[0]),))
        if HOSTS_UPDATED_CODE in codes:
            self.reform_since = self.reform_since or now
            if len(exits) >= self.spec.np or now - self.reform_since > REFORM_GRACE_SECONDS:
                return self.end("reform", "the hosts changed", at=self.reform_since)
        elif PEER_LOST_CODE in codes:
            self.peer_lost_since = self.peer_lost_since or now
            if now - self.peer_lost_since > PEER_LOST_WAIT_SECONDS:
                rank = next(r for r, c in exits if c == PEER_LOST_CODE)
                return self.end("peer-lost", "rank %d on %s lost a peer (HorovodInternalError)"
                                % (rank, self.rank_host(rank)), at=self.peer_lost_since)
        return self.check_start(now)

    def check_start(self, now: float) -> Optional[WorldEnd]:
        if self.deadline is None:
            return None
        missing = sorted(set(range(self.spec.np)) - set(self.server.started_ranks()))
        if not missing:
            self.deadline = None
        elif now > self.deadline:
            hosts = sorted({self.rank_host(r) for r in missing})
            return self.end("start-timeout", "rank%s %s did not start in time" % (
                "s" if len(missing) > 1 else "", ",".join(map(str, missing))), hosts)
        return None

    def launcher_ended(self, rc: int) -> WorldEnd:
        """The launcher exited: classify by the reports that came."""
        self.server.wait_quiet(timeout=2.0)
        end = self.step(settle=0)
        if end is not None:
            return end
        exits = self.server.exits()
        if len(exits) >= self.spec.np and all(c == 0 for _, c in exits):
            return WorldEnd("done", "every rank finished", code=0, at=time.monotonic())
        rc = 128 - rc if rc < 0 else rc
        return WorldEnd("launcher", "%s exited with code %d (%d of %d ranks reported an exit)"
                        % (os.path.basename(self.proc.args[0]), rc, len(exits), self.spec.np),
                        code=rc or 1, at=time.monotonic())


def run_world(launch: Launch, spec: WorldSpec, caught: List[int]) -> WorldEnd:
    """Run one world to its end (see the module contract).

    Args:
        launch: how every world is started.
        spec: this world.
        caught: signal numbers hvlrun received (its handlers append to it).

    Returns:
        How the world ended.
    """
    secret = new_secret()
    server, addr, early = _start_server(launch, spec, secret)
    if server is None:
        return early
    try:
        cmd, env = _command(launch, spec, addr, secret)
        if launch.args.verbose:
            _say("world %d: %s" % (spec.number, " ".join(cmd)))
        try:
            proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        except OSError as e:
            return WorldEnd("launcher", "cannot run %s: %s" % (cmd[0], e), code=127,
                            at=time.monotonic())
        shm = ShmWatcher(os.getpid())
        try:
            watch = _Watch(proc, server, spec, launch.args.start_timeout, caught, shm)
            end = None
            while end is None:
                try:
                    end = watch.launcher_ended(proc.wait(timeout=0.1))
                except subprocess.TimeoutExpired:
                    end = watch.step()
            server.wait_quiet(timeout=2.0)
            _end_group(proc, _LOST_GRACE_SECONDS)   # remote shells the launcher left
        finally:
            remove_unused(shm.stop())
        return end
    finally:
        server.close()
        _report_rejected(server)
