"""The elastic driver: run a job as a series of worlds that survive losing and gaining workers.

MPI cannot shrink or grow a running communicator, so a change of workers re-forms the job: the
driver (inside hvlrun, which outlives every worker) ends the current world on every host, picks
hosts again, and starts a new world whose ranks restore the last commit from the driver's
commit store (``commit_store.py``) and check that every rank holds the same state
(``hvlite.elastic``).

Contract:
  * :func:`run_elastic` runs the job and returns hvlrun's exit code: 0 when every rank of a world
    finished; 128+signum after SIGINT/SIGTERM/SIGHUP; the failing rank's code when a rank fails
    after another finished; 1 when host discovery fails before it ever succeeded (Horovod's
    rule: the script's error is told at once) or when the ranks exit with
    ``PROGRAM_ERROR_CODE`` (an error in the program's elastic state that every world would
    meet: ``hvlite.elastic.run``); 127 when mpiexec cannot be run; :data:`ELASTIC_FAILED_CODE`
    when the job cannot go on: fewer than ``--min-np`` usable slots for ``--elastic-timeout``
    seconds, ``--reset-limit`` re-forms used up, or :data:`NO_PROGRESS_LIMIT` worlds in a row
    failed before storing a commit (a program that fails by itself, not a lost worker).
  * Hosts come from ``--host-discovery-script`` (run now and then every
    :data:`DISCOVERY_INTERVAL` seconds while a world runs; a run still going when hvlrun gets
    a signal or the job ends is cancelled: ``discovery.py``) or, without a script, from
    ``-H``/``--hostfile``/localhost. A world gets the usable slots (``host_pool.py``: not
    blacklisted) in discovery order, at most ``--max-np``; the first world at most ``-np``.
  * While a world runs, a change of the usable hosts that would give it more ranks (up to
    ``--max-np``) or that takes slots it uses makes the driver ask its workers to stop at their
    next commit (``HostsUpdatedInterrupt`` on every rank, then exit
    ``HOSTS_UPDATED_CODE``, ``hvlite/protocol/elastic_env.py``): nothing is lost, nothing is
    redone.
  * Each world runs through the one supervision loop a plain job runs through
    (``world/supervise.py``, with the elastic rules of ``world/rules.py``). A world that ends
    otherwise (a rank failed, a host lost, ranks that did not start) is ended on every host; the
    failure is charged to its host (``host_pool.py`` blacklists hosts that keep failing, or
    cannot be reached) and the job re-forms from the last commit.
  * Every world, its end and each re-form (reason, old and new world, seconds from the end of the
    last world that ran to the new world's first step; no duration when none ran yet, e.g. world
    1's hosts failed the check) are logged as ``hvlrun: elastic: ...`` lines on stderr and, with
    a timeline, drawn in hvlrun's own trace (``trace.py``).
  * The commit lives in a private temporary directory for the job's life, removed at the end.
"""

import math
import os
import shutil
import socket
import tempfile
import threading
import time
from typing import Callable, List, Optional, Tuple

from ...protocol.elastic_env import (ENV_KEY, ENV_REASON, ENV_STORE, ENV_WORLD,
                                     PROGRAM_ERROR_CODE)
from ...protocol.wire import new_secret
from ..hosts.hostlist import Host, interface_ipv4, is_local
from ..world.rules import ELASTIC
from ..world.run import catching_signals, run_world
from ..world.say import say
from ..world.settings import interface_names
from ..world.spec import Launch, WorldEnd, WorldSpec
from .commit_store import CommitStore
from .discovery import DiscoveryError, StaticHosts, discover
from .host_pool import HostPool, describe, place
from .trace import ElasticTrace, world_path

__all__ = ["ELASTIC_FAILED_CODE", "NO_PROGRESS_LIMIT", "DISCOVERY_INTERVAL", "run_elastic"]

ELASTIC_FAILED_CODE = 122
NO_PROGRESS_LIMIT = 3
DISCOVERY_INTERVAL = 1.0
_FAILURE_KINDS = ("failed", "lost", "peer-lost", "start-timeout", "unreachable", "launcher")


def _slots(hosts: List[Host]) -> int:
    return sum(h.slots for h in hosts)


class _Driver:
    """The state of one elastic job (see the module contract)."""

    def __init__(self, launch: Launch, source: Callable[[], List[Host]], store: CommitStore,
                 store_host: str, caught: List[int], stop: threading.Event) -> None:
        args = launch.args
        self.launch, self.source, self.store, self.caught = launch, source, store, caught
        self.store_host = store_host
        self.min_np, self.max_np = args.min_np, args.max_np or math.inf
        cooldown = tuple(args.blacklist_cooldown_range) if args.blacklist_cooldown_range else None
        self.pool = HostPool(cooldown)
        self.lock = threading.Lock()          # the pool, the current world, discovery's result
        self.world: Optional[WorldSpec] = None
        self.world_start = 0.0
        self.usable_seen: List[Host] = []
        self.asked_reform = False
        self.last_error = ""
        self.known: List[Host] = []           # discovery's last answer
        self.discovered = False               # discovery succeeded once
        self.timeline = launch.knobs.get("HVLITE_TIMELINE") or os.environ.get("HVLITE_TIMELINE")
        self.trace = ElasticTrace(self.timeline, time.monotonic()) if self.timeline else None
        # for the ready log: (the last world that ran, its end, its ranks, the new world)
        self.pending_reform: Optional[Tuple[int, WorldEnd, int, WorldSpec]] = None
        self.stop = stop                      # set when the job ends (cancels discovery)
        self.exit_code = ELASTIC_FAILED_CODE  # when no world can be chosen

    # --- hosts ---------------------------------------------------------------------------------
    def discover(self) -> List[Host]:
        """Run discovery now. When it fails, say why (once per distinct error) and keep its
        last answer (no host before the first): a failing script is no news about the hosts."""
        try:
            hosts = self.source()
        except DiscoveryError as e:
            if (str(e) != self.last_error and self.discovered
                    and not (self.caught or self.stop.is_set())):
                say("elastic: warning: %s" % e)
            self.last_error = str(e)
            return list(self.known)
        self.last_error, self.known, self.discovered = "", hosts, True
        return hosts

    def choose(self, first: bool) -> Optional[List[Host]]:
        """Wait until at least --min-np slots are usable; return the placement, or None after
        --elastic-timeout seconds or a signal."""
        deadline = time.monotonic() + self.launch.args.elastic_timeout
        waiting = False
        while True:
            hosts = self.discover()
            if not self.discovered:         # Horovod's rule: a script failing at first ends the job
                if not self.caught:
                    say("elastic: error: %s; ending the job (host discovery never succeeded)"
                        % self.last_error)
                    self.exit_code = 1
                return None
            with self.lock:
                usable = self.pool.usable(hosts, time.monotonic())
                blacklisted = self.pool.blacklisted(time.monotonic())
            want = min(_slots(usable), self.max_np)
            if first and self.launch.args.np:
                want = min(want, self.launch.args.np)
            if want >= self.min_np:
                self.usable_seen = usable
                return place(usable, int(want))
            state = "%d slot%s usable (%s; blacklisted: %s)" % (
                _slots(usable), "" if _slots(usable) == 1 else "s", describe(usable),
                ",".join(blacklisted) or "none")
            if time.monotonic() > deadline or self.caught:
                if not self.caught:
                    say("elastic: error: only %s for %g s, below --min-np %d "
                        "(--elastic-timeout): ending the job%s%s"
                        % (state, self.launch.args.elastic_timeout, self.min_np,
                           self._commit_note(), "; host discovery's last run failed: %s"
                           % self.last_error if self.last_error else ""))
                return None
            if not waiting:
                waiting = True
                say("elastic: waiting for hosts: %s, --min-np is %d; the job ends if that lasts "
                    "%g s (--elastic-timeout)"
                    % (state, self.min_np, self.launch.args.elastic_timeout))
            self.stop.wait(min(DISCOVERY_INTERVAL, max(0.0, deadline - time.monotonic()) + 0.01))

    def watch_hosts(self) -> None:
        """While a world runs: ask it to stop at its next commit when the usable hosts would
        give it more ranks, or take slots it uses."""
        hosts = self.discover()
        with self.lock:
            usable = self.pool.usable(hosts, time.monotonic())
            world = self.world
            if world is None or usable == self.usable_seen or self.asked_reform:
                return
            self.usable_seen = usable
            slots = {h.name: h.slots for h in usable}
            grow = min(_slots(usable), self.max_np) > world.np
            shrink = [h.name for h in world.hosts if slots.get(h.name, 0) < h.slots]
            if not (grow or shrink):
                return
            self.asked_reform = True
        self.store.request_reform()
        say("elastic: hosts changed (usable now: %s); world %d (%s) stops at its next commit"
            % (describe(usable), world.number, describe(world.hosts)))

    def blacklisted_out(self) -> bool:
        """True when the discovered hosts have --min-np slots but, blacklisted, no longer do."""
        hosts = self.discover()
        with self.lock:
            usable = self.pool.usable(hosts, time.monotonic())
        return _slots(usable) < self.min_np <= _slots(hosts)

    # --- worlds --------------------------------------------------------------------------------
    def _commit_note(self) -> str:
        info = self.store.latest()
        if info is None:
            return "; no commit yet"
        return "; last commit #%d (world %d)" % (info.seq, info.world)

    def store_address(self, hosts: List[Host]) -> str:
        """The commit store's ``host:port`` for a world on ``hosts``: loopback when they are
        all local and the store listens there, else its advertised address (with
        --network-interface the store listens only on that interface's address)."""
        local = all(is_local(h.name) for h in hosts)
        loopback = local and self.store.bind_host in ("0.0.0.0", "127.0.0.1")
        return "%s:%d" % ("127.0.0.1" if loopback else self.store_host, self.store.port)

    def spec(self, number: int, hosts: List[Host], reason: str) -> WorldSpec:
        env = {ENV_WORLD: str(number), ENV_REASON: reason[:300],
               ENV_STORE: self.store_address(hosts)}
        if self.timeline:
            env["HVLITE_TIMELINE"] = world_path(self.timeline, number)
        return WorldSpec(number, hosts, env)

    def check_ready(self) -> None:
        """Log a re-formed world's first step (once), with the re-form's duration."""
        with self.lock:
            pending = self.pending_reform
            if pending is None:
                return
            old, end, old_np, spec = pending
            ready = self.store.ready(spec.number)
            if ready is None:
                return
            self.pending_reform = None
        seq, at = ready
        say("elastic: world %d ready: %d ranks on %s restored %s, identical on every rank; the "
            "re-form took %.2f s (from the end of world %d to the first step of world %d)"
            % (spec.number, spec.np, describe(spec.hosts),
               "commit #%d" % seq if seq else "the initial state (no commit yet)",
               at - end.at, old, spec.number))
        if self.trace:
            self.trace.span("re-forms", "REFORM world %d -> %d" % (old, spec.number),
                            end.at, at, {"reason": end.reason, "old_world": old,
                                         "old_ranks": old_np, "new_world": spec.number,
                                         "new_ranks": spec.np, "hosts": describe(spec.hosts),
                                         "commit": seq, "seconds": round(at - end.at, 3)})

    def monitor(self) -> None:
        """The driver's thread: ready reports often, discovery every DISCOVERY_INTERVAL."""
        next_discovery = time.monotonic() + DISCOVERY_INTERVAL
        while not self.stop.wait(0.05):
            self.check_ready()
            if time.monotonic() >= next_discovery:
                next_discovery = time.monotonic() + DISCOVERY_INTERVAL
                if self.world is not None:
                    self.watch_hosts()

    def run_one(self, spec: WorldSpec) -> WorldEnd:
        with self.lock:
            self.world, self.asked_reform = spec, False
            self.world_start = time.monotonic()
        self.store.open_world(spec.number)
        try:
            return run_world(self.launch, spec, self.caught, ELASTIC)
        finally:
            self.store.close_world()
            with self.lock:
                self.world = None

    def account(self, spec: WorldSpec, end: WorldEnd) -> None:
        """Charge a world's end to its hosts; log blacklistings."""
        info = self.store.latest()
        now = time.monotonic()
        messages = []
        with self.lock:
            if info is not None and info.world == spec.number:
                self.pool.record_progress([h.name for h in spec.hosts])
            for host in end.hosts:
                if end.kind == "unreachable":
                    messages.append(self.pool.blacklist(host, now, "it cannot be reached"))
                elif end.kind in ("failed", "lost", "start-timeout"):
                    message = self.pool.record_failure(host, now)
                    if message:
                        messages.append(message)
        for message in messages:
            say("elastic: " + message)
            if self.trace:
                self.trace.mark("hosts", "BLACKLIST", now, {"detail": message})
        if self.trace:
            self.trace.span("worlds", "world %d (%d ranks)" % (spec.number, spec.np),
                            self.world_start, end.at or now,
                            {"hosts": describe(spec.hosts), "end": end.kind,
                             "reason": end.reason,
                             "timeline": spec.rank_env.get("HVLITE_TIMELINE", "")})

    def run(self) -> int:
        """Run worlds until the job ends; return hvlrun's exit code."""
        args = self.launch.args
        number, resets, no_progress, reason = 0, 0, 0, "start"
        last: Optional[Tuple[WorldSpec, WorldEnd]] = None
        ran: Optional[Tuple[WorldSpec, WorldEnd]] = None     # the last world that started
        while True:
            hosts = self.choose(first=number == 0)
            if hosts is None:
                return 128 + self.caught[0] if self.caught else self.exit_code
            if number > 0:
                if args.reset_limit is not None and resets >= args.reset_limit:
                    say("elastic: error: the job re-formed %d times (--reset-limit %d); not "
                        "again after: %s%s"
                        % (resets, args.reset_limit, reason, self._commit_note()))
                    return ELASTIC_FAILED_CODE
                resets += 1
            number += 1
            spec = self.spec(number, hosts, reason)
            if last is None:
                say("elastic: world 1: %d ranks on %s (--min-np %d, --max-np %s)"
                    % (spec.np, describe(hosts), self.min_np,
                       "none" if self.max_np == math.inf else "%d" % self.max_np))
            else:
                old, end = last
                say("elastic: re-forming: world %d (%d ranks on %s) -> world %d (%d ranks on "
                    "%s); reason: %s%s" % (old.number, old.np, describe(old.hosts), number,
                                           spec.np, describe(hosts), end.reason,
                                           self._commit_note()))
                if ran is not None:     # else no world ran yet (world 1 was unreachable)
                    with self.lock:
                        self.pending_reform = (ran[0].number, ran[1], ran[0].np, spec)
            end = self.run_one(spec)
            self.account(spec, end)
            info = self.store.latest()
            progressed = info is not None and info.world == number
            say("elastic: world %d ended after %.1f s: %s%s"
                % (number, end.at - self.world_start, end.reason, self._commit_note()))
            if end.kind in ("done", "signal", "finished-failed") or (
                    end.kind == "launcher" and end.code == 127):
                return end.code
            if end.kind == "failed" and end.code == PROGRAM_ERROR_CODE:
                say("elastic: error: the program's state cannot go on (its error is above, on "
                    "every rank); not re-forming: a new world would fail the same way")
                return 1
            if end.kind in _FAILURE_KINDS:
                no_progress = 0 if progressed else no_progress + 1
                if no_progress >= NO_PROGRESS_LIMIT or (no_progress and self.blacklisted_out()):
                    say("elastic: error: %d world%s in a row failed before storing a commit "
                        "(last: %s), leaving %s; not re-forming again: the program fails by "
                        "itself?" % (no_progress, "s" if no_progress > 1 else "", end.reason,
                                     "too few hosts that did not fail"
                                     if no_progress < NO_PROGRESS_LIMIT
                                     else "no sign of progress"))
                    return ELASTIC_FAILED_CODE
            else:
                no_progress = 0
            reason = end.reason
            last = (spec, end)
            if end.kind != "unreachable":
                ran = last


def _store_address(args, static_hosts: Optional[List[Host]]) -> Tuple[str, str]:
    """Return ``(bind, advertise)`` for the commit store: 127.0.0.1 when the hosts are fixed and
    all local, the interface's address with --network-interface, else every address (the hosts
    of later worlds are not known yet; clients authenticate)."""
    interfaces = interface_names(args)
    if interfaces:
        address = interface_ipv4(interfaces[0])
        return address, address
    if not args.host_discovery_script and all(is_local(h.name) for h in static_hosts or []):
        return "127.0.0.1", "127.0.0.1"
    return "0.0.0.0", socket.gethostname()


def run_elastic(launch: Launch, static_hosts: Optional[List[Host]]) -> int:
    """Run an elastic job (see the module contract).

    Args:
        launch: how worlds are started (``launch.args`` holds the parsed, checked flags).
        static_hosts: the hosts when there is no discovery script.

    Returns:
        hvlrun's exit code.
    """
    args = launch.args
    directory = tempfile.mkdtemp(prefix="hvlrun-elastic-")
    store = None
    stop = threading.Event()
    with catching_signals() as caught:
        if args.host_discovery_script:     # a running script ends with the job, or on a signal
            script, slots = args.host_discovery_script, args.slots_per_host or 1
            source: Callable[[], List[Host]] = lambda: discover(
                script, slots, cancel=lambda: bool(caught) or stop.is_set())
        else:
            source = StaticHosts(static_hosts or [])
        try:
            bind, advertise = _store_address(args, static_hosts)
            key = new_secret()
            store = CommitStore(key, directory, bind).start()
            launch = launch._replace(hidden_env=dict(launch.hidden_env, **{ENV_KEY: key}))
            return _drive(_Driver(launch, source, store, advertise, caught, stop))
        except (OSError, ValueError) as e:
            say("elastic: error: cannot start the commit store: %s" % e)
            return 1
        finally:
            if store is not None:
                _close_store(store)
            shutil.rmtree(directory, ignore_errors=True)


def _drive(driver: _Driver) -> int:
    """Run the driver, with its monitor thread beside it; return hvlrun's exit code."""
    thread = threading.Thread(target=driver.monitor, name="hvlrun-elastic", daemon=True)
    thread.start()
    try:
        return driver.run()
    finally:
        driver.stop.set()
        thread.join(timeout=5)


def _close_store(store: CommitStore) -> None:
    """Close the commit store; warn once about connections that failed authentication."""
    rejected = store.rejected()
    if rejected:
        say("elastic: warning: dropped %d commit store connection%s that failed "
            "authentication, from: %s" % (len(rejected), "" if len(rejected) == 1 else "s",
                                           "; ".join(rejected[:5])))
    store.close()
