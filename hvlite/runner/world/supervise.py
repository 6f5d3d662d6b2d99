"""The one supervision loop: watch a running world, end it, say how it ended.

A plain job and every world of an elastic job run through :class:`Supervisor`; a
:class:`~.rules.Rules` object says what differs between them (``rules.py``).

Contract:
  * ``Supervisor(...).run()`` watches the launcher (``mpiexec``, in its own session) and the
    reports on the world's control server until the world is over, and returns its
    :class:`~.spec.WorldEnd`. Every 0.1 s it judges, in this order:
      - hvlrun got SIGINT/SIGTERM/SIGHUP: ``signal``, code 128+signum;
      - a host or rank was lost (``ControlServer.lost``: its connection closed before it
        reported an exit, or it was silent for the heartbeat timeout) before the first rank
        whose code the rules do not agree to failed (within one server round, a rank killed by
        a signal is taken as a consequence): ``lost``, charged to its host. Once a rank of an
        elastic world exited with an agreed code other than 0 (75/76), the launcher kills the
        rest: a rank wrapper whose connection closed from that server round on is not lost
        (a guard, or a client silent for the heartbeat timeout, still is);
      - a rank exited with a code the rules do not agree to: ``failed``, charged to the rank's
        host, or ``finished-failed`` once another rank had exited 0; code: the rank's;
      - (agreed codes of an elastic world) every rank exited ``HOSTS_UPDATED_CODE``, or
        :data:`REFORM_GRACE_SECONDS` passed since the first did: ``reform``; a rank exited
        ``PEER_LOST_CODE`` and no cause showed within :data:`PEER_LOST_WAIT_SECONDS`:
        ``peer-lost``;
      - not every rank reported ``start`` within the start timeout: ``start-timeout``, charged
        to the hosts of the ranks that did not.
  * Ending a world: ``stop`` to every wrapper and guard (they end their processes, also on hosts
    hvlrun cannot signal, and say why), :data:`STOP_WAIT_SECONDS` later SIGTERM to what is left
    of the launcher's process group, SIGKILL :data:`KILL_GRACE_SECONDS` after that
    (:data:`LOST_GRACE_SECONDS` when a host is lost: mpiexec cannot reach it and would wait).
  * When the launcher exits, by itself or after a failure ended the world, every client gets
    :data:`QUIET_SECONDS` to finish (after ``stop``, when the launcher's code is not 0: hosts it
    could not reach may still run), what is left of its process group is ended, and the world
    is judged by the reports: a signal; a host or rank lost before any failure (only when the
    launcher failed); the failure; an agreed end (at once: nothing more can come, so a world
    whose ranks agreed on a lost peer is ``peer-lost``, not a launcher failure); ``done`` when
    every rank exited 0; else ``launcher`` with the launcher's code (128+signum for a signal).
  * The job's files (``procs/job_files.py``) get a last look while its processes still hold
    them, just before they are ended.
"""
import os
import signal
import subprocess
import time
from typing import List, Optional, Sequence, Tuple

from ...protocol.elastic_env import HOSTS_UPDATED_CODE, PEER_LOST_CODE
from ..control.server import HOST_SETTLE_SECONDS, ControlServer, Lost
from ..hosts.hostlist import Host, is_local
from ..procs.job_files import FileWatcher
from .rules import Rules
from .spec import WorldEnd, WorldSpec, rank_hosts

__all__ = ["KILL_GRACE_SECONDS", "LOST_GRACE_SECONDS", "STOP_WAIT_SECONDS", "QUIET_SECONDS",
           "REFORM_GRACE_SECONDS", "PEER_LOST_WAIT_SECONDS", "Supervisor", "end_group",
           "terminate_group", "lost_first"]

KILL_GRACE_SECONDS = 5.0
LOST_GRACE_SECONDS = 1.0
STOP_WAIT_SECONDS = 1.0
QUIET_SECONDS = 2.0
REFORM_GRACE_SECONDS = 10.0
PEER_LOST_WAIT_SECONDS = 2.0
_POLL_SECONDS = 0.1


def end_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM what is left of ``proc``'s process group (the launcher, remote shells it
    started), SIGKILL it ``grace`` seconds later. Returns at once when the group is empty."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def terminate_group(proc: subprocess.Popen, server: ControlServer, reason: str,
                    grace: float = KILL_GRACE_SECONDS, files: Optional[FileWatcher] = None) -> int:
    """Ask every wrapper and guard to stop; :data:`STOP_WAIT_SECONDS` later, end what is left of
    ``proc``'s process group; return the launcher's code. Asking first lets every rank's wrapper
    say why its rank ends. ``files`` takes a last look at the job's files first."""
    if files is not None:
        files.look()
    server.stop_all(reason)
    try:
        proc.wait(timeout=STOP_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    end_group(proc, grace)
    return proc.wait()


def lost_first(lost_round: int, failed_round: Optional[int],
               failure: Optional[Tuple[int, int]]) -> bool:
    """Did a client vanish before the first rank reported a failure? Within one server round
    the order is unknown: a rank ended by a signal (code > 128) is then taken as a consequence
    (the launcher killing the rest), an exit with its own code as the cause."""
    if failed_round is None or failure is None:
        return True
    return lost_round < failed_round or (lost_round == failed_round and failure[1] > 128)


def _host_of(name: str, placement: Sequence[Host]) -> str:
    """Map a host name a wrapper or guard reported to the host list's name for it."""
    names = [h.name for h in placement]
    if name in names:
        return name
    return next((n for n in names if is_local(n) and is_local(name)), name)


class Supervisor:
    """One world's supervision (see the module contract)."""

    def __init__(self, proc: subprocess.Popen, server: ControlServer, spec: WorldSpec,
                 rules: Rules, start_timeout: float, caught: List[int],
                 files: Optional[FileWatcher] = None) -> None:
        """Args:
            proc: the running launcher.
            server: the world's started control server.
            spec: the world.
            rules: a plain job's or an elastic world's (``rules.py``).
            start_timeout: seconds for every rank to report ``start``; 0 waits forever.
            caught: signal numbers hvlrun received (its handlers append to it).
            files: the watcher of the job's files on this host, if any.
        """
        self.proc, self.server, self.spec, self.rules = proc, server, spec, rules
        self.caught, self.files, self.start_timeout = caught, files, start_timeout
        self.hosts = rank_hosts(spec.hosts)
        self.deadline = time.monotonic() + start_timeout if start_timeout > 0 else None
        self.reform_since: Optional[float] = None
        self.peer_lost_since: Optional[float] = None

    def run(self) -> WorldEnd:
        """Watch the world until it is over; return how it ended."""
        while True:
            try:
                rc = self.proc.wait(timeout=_POLL_SECONDS)
            except subprocess.TimeoutExpired:
                rc = None
            if rc is not None:
                return self.launcher_ended(rc)
            end = self.judge()
            if end is None:
                continue
            self.rules.announce(end, stopping=True)
            grace = LOST_GRACE_SECONDS if end.kind == "lost" else KILL_GRACE_SECONDS
            rc = terminate_group(self.proc, self.server, self.rules.stop_reason(end), grace,
                                 self.files)
            if end.kind in ("failed", "finished-failed"):
                return self.launcher_ended(rc, end)     # a host lost before it is the cause
            if self.rules.linger:
                self.server.wait_quiet(timeout=self.rules.linger)
                end_group(self.proc, LOST_GRACE_SECONDS)    # remote shells the launcher left
            return end

    def judge(self, settle: float = HOST_SETTLE_SECONDS) -> Optional[WorldEnd]:
        """Judge the world while it runs: how it must end, or None while it goes on. ``settle``
        is passed to ``ControlServer.lost``."""
        now = time.monotonic()
        exits = self.server.exits()
        return (self.cause(exits, self.lost(settle), now)
                or self.agreed_end(exits, now) or self.start_end(now))

    def lost(self, settle: float) -> Optional[Lost]:
        """The server's first lost client, leaving out rank wrappers the launcher killed after
        a rank exited with an agreed code other than 0 (an elastic world's 75/76)."""
        return self.server.lost(settle, ended_round=self.exit_round(agreed=True))

    def exit_round(self, agreed: bool) -> Optional[int]:
        """The server round of the first exit whose code the rules agree to, 0 aside
        (``agreed``), or do not agree to (a failure); None before there is one."""
        def wanted(code: int) -> bool:
            return code != 0 and code in self.rules.agreed if agreed \
                else code not in self.rules.agreed
        return next((t for _, c, t in self.server.exit_rounds() if wanted(c)), None)

    def launcher_ended(self, rc: int, judged: Optional[WorldEnd] = None) -> WorldEnd:
        """The launcher exited with ``rc``, by itself or after ``judged`` ended the world: judge
        by the reports once every client had time to finish, and tell it."""
        if rc != 0:   # hosts the launcher could not reach may still run: they must stop too
            self.server.stop_all("the launcher %s exited with code %d"
                                 % (os.path.basename(self.proc.args[0]), rc))
        self.server.wait_quiet(timeout=QUIET_SECONDS)
        end_group(self.proc, LOST_GRACE_SECONDS)       # remote shells the launcher left
        now, exits = time.monotonic(), self.server.exits()
        end = (self.cause(exits, self.lost(settle=0) if rc != 0 else None, now, judged)
               or self.agreed_end(exits, now, final=True))
        if end is None and len(exits) >= self.spec.np and all(c == 0 for _, c in exits):
            end = WorldEnd("done", "every rank finished", at=now)
        if end is None:
            rc = 128 - rc if rc < 0 else rc
            end = WorldEnd("launcher", self.rules.launcher_reason(
                self.proc.args[0], rc, len(exits), self.spec.np), code=rc, at=now)
        self.rules.announce(end, stopping=False)
        return end

    def cause(self, exits: List[Tuple[int, int]], gone: Optional[Lost], now: float,
              judged: Optional[WorldEnd] = None) -> Optional[WorldEnd]:
        """A signal, a lost host or rank (if before any failure), or a failed rank (``judged``,
        when a failure already ended the world)."""
        if self.caught:
            name = signal.Signals(self.caught[0]).name
            return WorldEnd("signal", "hvlrun got %s" % name, code=128 + self.caught[0], at=now)
        failure = next(((r, c) for r, c in exits if c not in self.rules.agreed), None)
        if gone is not None and self.reform_since is None and (
                failure is None
                or lost_first(gone.since, self.exit_round(agreed=False), failure)):
            host = _host_of(gone.host, self.spec.hosts) if gone.host else "?"
            return WorldEnd("lost", gone.message, (host,), at=now, who=gone.who)
        if judged is not None or failure is None:
            return judged
        rank, code = failure
        reason = self.describe_rank(rank, code)
        if any(c == 0 for _, c in exits):
            return WorldEnd("finished-failed", reason + " after other ranks had finished",
                            code=code, at=now, rank=rank)
        return WorldEnd("failed", reason, (self.rank_host(rank),), code, now, rank=rank)

    def agreed_end(self, exits: List[Tuple[int, int]], now: float,
                   final: bool = False) -> Optional[WorldEnd]:
        """An elastic world's agreed end: the hosts changed, or a peer was lost. ``final``:
        the launcher is over, no report can come any more, so do not wait for one."""
        codes = [c for _, c in exits if c in self.rules.agreed]
        if HOSTS_UPDATED_CODE in codes:
            self.reform_since = self.reform_since or now
            if (final or len(exits) >= self.spec.np
                    or now - self.reform_since > REFORM_GRACE_SECONDS):
                return WorldEnd("reform", "the hosts changed", at=self.reform_since)
        elif PEER_LOST_CODE in codes:
            self.peer_lost_since = self.peer_lost_since or now
            if final or now - self.peer_lost_since > PEER_LOST_WAIT_SECONDS:
                rank = next(r for r, c in exits if c == PEER_LOST_CODE)
                return WorldEnd("peer-lost", "rank %d on %s lost a peer (HorovodInternalError)"
                                % (rank, self.rank_host(rank)), at=self.peer_lost_since)
        return None

    def start_end(self, now: float) -> Optional[WorldEnd]:
        """Ranks that did not report ``start`` within the start timeout."""
        if self.deadline is None:
            return None
        missing = sorted(set(range(self.spec.np)) - set(self.server.started_ranks()))
        if not missing:
            self.deadline = None
        elif now > self.deadline:
            return WorldEnd("start-timeout",
                            self.rules.start_timeout_reason(missing, self.start_timeout),
                            tuple(sorted({self.rank_host(r) for r in missing})), at=now)
        return None

    def rank_host(self, rank: int) -> str:
        """The host a rank was placed on ("?" for a rank the world does not have)."""
        return self.hosts[rank] if 0 <= rank < len(self.hosts) else "?"

    def describe_rank(self, rank: int, code: int) -> str:
        """``rank 2 on b exited with code 3`` (or ``was killed by signal 9``)."""
        if code > 128:
            return "rank %d on %s was killed by signal %d" % (rank, self.rank_host(rank),
                                                               code - 128)
        return "rank %d on %s exited with code %d" % (rank, self.rank_host(rank), code)
