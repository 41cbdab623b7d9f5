"""A seeded chaos schedule against real member processes and a real store.

:func:`run_chaos` starts ``members`` member processes (``tests/support/procs.py``
MemberProcesses, each committing a counter per owned resource every 20 ms, writing its
JSON-lines trail and the Delta audit table), waits for a stable group, then for ``seconds``
injects random faults at random (seeded) intervals:

* ``kill -9`` of a random member, restarted later under the same static id;
* ``kill -9`` of the coordinator (leader loss on our side), restarted the same way;
* ``SIGSTOP`` of a member for 1 to 2 s longer than the session timeout, then ``SIGCONT``;
* whatever the :class:`StoreFaults` of the backend offers: a ZooKeeper ensemble's leader
  killed and restarted later, a standalone ZooKeeper server restarted, Redis restarted without
  persistence (its data is lost) or paused past the lease. SQLite has no server; its documented
  limit (a member paused inside a write transaction stalls every writer until it resumes) is
  exercised by the SIGSTOP fault itself.

At most ``members - 1`` member faults and one store fault are in force at any time (so one
member is always running, and a ZooKeeper ensemble keeps its quorum). When the time is up
every fault is healed, and the driver measures how long the group takes to be stable again
with every resource owned and committed to by its owner. Then it checks the invariants from
the independent witnesses:

* double ownerships: overlapping ownership intervals in the member trails (``audit.overlaps``)
  and in the Delta audit table (``verify_table``), both must be 0; the table's verdict uses the
  epoch chain (a killed member's ownership ends at the lease expiry its successor's grant
  names, never bridged to the successor's start) and its broken links must be 0 too;
* lost commits: an acknowledged commit (``ok``) whose value a later owner was not handed, or
  that the store no longer holds at the end. A loss is *documented* (not counted as lost) only
  when the store lost its data (a Redis restart) between the commit and the evidence;
* the trail check of ``MemberProcesses.assert_trail_is_clean`` (values and epochs only go up,
  no stale commit accepted).

The same driver serves ``tests/test_chaos.py`` and ``benchmarks/bench_chaos.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import signal
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rebalancer_spark.backends import Backend, open_backend
from rebalancer_spark.core.errors import BackendError
from tests.support.chaos_invariants import check, every_resource_committed
from tests.support.helpers import wait_for
from tests.support.procs import MemberProcesses


class StoreFaults(Protocol):
    """The faults a backend's store can suffer, and how to heal them."""

    name: str
    kinds: tuple[str, ...]
    """Names of the faults :meth:`inject` knows; empty for a store without a server."""
    paused_member_stalls_writers: bool
    """True for SQLite: a member paused inside a write transaction holds the file's lock, so a
    member (re)started meanwhile waits on it (documented limit; ``member_process`` tries its
    join again for 25 s, which covers a paused Spark driver of ``--spark-jobs``)."""

    def inject(self, kind: str, rng: random.Random) -> float:
        """Inflict ``kind`` now; return after how many seconds :meth:`heal` should undo it
        (0 when the fault is instantaneous, like a restart)."""
        ...

    def heal(self) -> None:
        """Undo every fault in force (start what is down, resume what is paused) and return
        once the store serves again."""
        ...

    def data_lost(self) -> bool:
        """True if the last :meth:`inject` lost the store's data."""
        ...


@dataclass
class NoStoreFaults:
    """SQLite: there is no server to harm."""

    name: str = "sqlite"
    kinds: tuple[str, ...] = ()
    paused_member_stalls_writers: bool = True

    def inject(self, kind: str, rng: random.Random) -> float:
        raise AssertionError(f"sqlite has no store fault {kind!r}")

    def heal(self) -> None:
        return None

    def data_lost(self) -> bool:
        return False


@dataclass(frozen=True)
class Sample:
    at: float
    """Monotonic time the read started."""
    generation: int
    settled: bool
    """Stable, with every resource of the run claimed by its target owner."""
    members: frozenset[str]


class Observer:
    """Reads the group's state every ``interval`` seconds on a thread of its own, through a
    handle it opens again after a store error (a store that is down reads as unsettled)."""

    def __init__(self, procs: MemberProcesses, resources: Sequence[str], interval: float) -> None:
        self.procs = procs
        self.resources = set(resources)
        self.interval = interval
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        """Failures other than the store being unavailable, for the report."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-observer", daemon=True)

    def __enter__(self) -> Observer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        handle: Backend | None = None
        while not self._stop.wait(self.interval):
            at = time.monotonic()
            try:
                if handle is None:
                    handle = open_backend(self.procs.observer_url)
                state = handle.state(self.procs.group)
            except Exception as exc:  # any failure reads as "down"; the observer must live on
                if not isinstance(exc, BackendError):
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                if handle is not None:
                    with contextlib.suppress(Exception):
                        handle.close()
                handle = None
                self.samples.append(Sample(at, -1, False, frozenset()))
                continue
            settled = state.is_stable() and set(state.claims) == self.resources
            holders = frozenset(c.member_id for c in state.claims.values())
            generation = state.target.generation if state.target else 0
            self.samples.append(Sample(at, generation, settled, holders))
        if handle is not None:
            with contextlib.suppress(BackendError):
                handle.close()

    def generations(self, since: float) -> int:
        """Distinct target generations seen since ``since`` (sampled: a lower bound)."""
        return len({s.generation for s in self.samples if s.at >= since and s.generation > 0})

    def settled_after(self, fault: Fault) -> float | None:
        """Seconds from the fault's injection to the first settled state without the victim
        holding anything (or, once the fault was healed, with it): None if never seen."""
        for s in self.samples:
            if s.at <= fault.injected or not s.settled:
                continue
            healed = fault.healed is not None and s.at > fault.healed
            if fault.victim is None and (healed or fault.instant):
                return s.at - fault.injected
            if fault.victim is not None and (healed or fault.victim not in s.members):
                return s.at - fault.injected
        return None


@dataclass
class Fault:
    kind: str
    victim: str | None
    """The member harmed; None for a store fault."""
    injected: float
    healed: float | None = None
    instant: bool = False


@dataclass(frozen=True)
class ChaosConfig:
    seconds: float = 15.0
    """How long faults are injected."""
    seed: int = 0
    members: int = 3
    resources: int = 24
    session_timeout: float = 2.0
    mean_gap: float = 1.0
    """Mean of the random (exponential) wait between two injections, in seconds."""
    store_fault_share: float = 0.3
    """Chance that an injection is a store fault (when the store has any)."""
    recovery_timeout: float = 60.0
    """Longest wait for the group to settle after the faults stop (generous under load)."""


@dataclass
class ChaosReport:
    backend: str
    seed: int
    seconds: float
    members: int
    resources: int
    session_timeout: float
    faults: Counter[str] = field(default_factory=Counter)
    schedule: list[str] = field(default_factory=list)
    rebalances: int = 0
    commits_acknowledged: int = 0
    double_ownerships_trail: int = 0
    double_ownerships_audit: int = 0
    audit_events: int = 0
    chain_checked: int = 0
    """Grants whose link of the epoch chain the audit's verifier checked (no bridging)."""
    chain_faults: int = 0
    chain_examples: list[str] = field(default_factory=list)
    chain_unrecorded: int = 0
    """Links whose rows a killed process never wrote (nothing later of its session either):
    listed by the verifier, not faults."""
    lost_commits: int = 0
    lost_examples: list[str] = field(default_factory=list)
    lost_with_store_data: int = 0
    """Acknowledged commits gone with the store's data (Redis restarted without persistence):
    documented, not counted in ``lost_commits``."""
    recovery_s: float = float("nan")
    """From the moment every fault was healed to a stable group with every resource owned."""
    working_again_s: float = float("nan")
    """From the same moment until every resource had a commit accepted again."""
    longest_gap_s: float = 0.0
    observer_errors: list[str] = field(default_factory=list)
    acquisitions: int = 0
    """Resources acquired (member trails) after the schedule started: hand-overs and
    re-acquisitions after a member lost its claims."""
    """The longest time a resource went without an owner in the trails, where a paused or
    killed member's ownership counts until it reports it lost or until its lease expired in
    the store, as its successor's grant names it (a kill's gap here is the time from that
    expiry to the successor's grant; the time to notice the kill shows in ``settled_after``)."""
    settled_after: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    """Fault kind -> seconds from each injection to the next settled state that no longer
    counts on the victim (or follows the heal)."""

    def lines(self) -> list[str]:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        return [
            f"chaos on {self.backend}: seed {self.seed}, {self.seconds:g} s of faults, "
            f"{self.members} members, {self.resources} resources, "
            f"session timeout {self.session_timeout:g} s",
            f"  faults injected      {sum(self.faults.values())} ({faults})",
            f"  rebalances           {self.rebalances} (distinct target generations seen), "
            f"{self.acquisitions} resources acquired after the first fault",
            f"  commits acknowledged {self.commits_acknowledged}",
            f"  double ownerships    {self.double_ownerships_trail} in the member trails, "
            f"{self.double_ownerships_audit} in the Delta audit table "
            f"({self.audit_events} events)",
            f"  epoch chain          {self.chain_checked} grants checked, "
            f"{self.chain_faults} broken links, {self.chain_unrecorded} unrecorded (rows of "
            "killed processes)",
            f"  lost commits         {self.lost_commits}"
            + (
                f" (+ {self.lost_with_store_data} gone with the store's data: documented)"
                if self.lost_with_store_data
                else ""
            ),
            f"  recovery             {self.recovery_s:.2f} s to a stable group owning every "
            f"resource, {self.working_again_s:.2f} s until each had a new commit",
            f"  longest trail gap    {self.longest_gap_s:.2f} s (a killed member owns until "
            "its lease expired in the store, as its successor's grant says)",
        ] + [
            f"  settled after {kind:<28} median {_median(times):.2f} s, max {max(times):.2f} s"
            f" (n={len(times)})"
            for kind, times in sorted(self.settled_after.items())
        ]

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["faults"] = dict(self.faults)
        out["settled_after"] = dict(self.settled_after)
        return out


class Chaos:
    """The schedule: at most ``members - 1`` member faults and one store fault in force."""

    def __init__(
        self,
        procs: MemberProcesses,
        store: StoreFaults,
        config: ChaosConfig,
        report: ChaosReport,
        log: Callable[[str], None],
    ) -> None:
        self.procs = procs
        self.store = store
        self.config = config
        self.report = report
        self.rng = random.Random(config.seed)
        self.log = log
        self.started = time.monotonic()
        self.faults: list[Fault] = []
        self.member_faults: dict[str, tuple[Fault, float]] = {}
        """Member id -> the fault in force on it and the monotonic time to heal it."""
        self.store_fault: tuple[Fault, float] | None = None
        self.data_lost_at: list[float] = []
        """Wall-clock times at which the store lost its data."""

    def say(self, what: str) -> None:
        line = f"{time.monotonic() - self.started:7.2f} s  {what}"
        self.report.schedule.append(line)
        self.log(line)

    def add(self, kind: str, victim: str | None, what: str, *, instant: bool = False) -> Fault:
        fault = Fault(kind, victim, time.monotonic(), instant=instant)
        self.faults.append(fault)
        self.report.faults[kind] += 1
        self.say(what)
        return fault

    # -- member faults ----------------------------------------------------------------------

    def coordinator(self) -> str | None:
        with contextlib.suppress(BackendError):
            state = self.procs.state()
            if state.coordinator is not None:
                return state.coordinator.member_id
        return None

    def inject_member_fault(self) -> None:
        ttl = self.config.session_timeout
        kind = self.rng.choice(["kill-9", "kill-9-coordinator", "sigstop"])
        live = sorted(set(self.procs.procs) - set(self.member_faults))
        victim = self.rng.choice(live)
        if kind == "kill-9-coordinator":
            coordinator = self.coordinator()
            if coordinator not in live:
                kind = "kill-9"  # no coordinator known right now: an ordinary kill
            else:
                victim = coordinator
        if kind == "sigstop":
            # Past the lease for sure: ZooKeeper expires a session up to a tick (and the
            # client's last ping up to a third of the timeout) later than the timeout itself.
            pause = ttl + self.rng.uniform(1.0, 2.0)
            fault = self.add(kind, victim, f"SIGSTOP {victim} for {pause:.2f} s (lease {ttl:g} s)")
            self.procs.signal(victim, signal.SIGSTOP)
            self.member_faults[victim] = (fault, time.monotonic() + pause)
        else:
            down = self.rng.uniform(0.0, ttl)
            fault = self.add(
                kind, victim, f"kill -9 {victim}; restart after its lease + {down:.2f} s"
            )
            self.procs.kill(victim)
            self.member_faults[victim] = (fault, time.monotonic() + ttl + down)

    def heal_member(self, victim: str, *, final: bool = False) -> bool:
        """Undo the member fault; a killed member is restarted only once the store dropped its
        old session (a static id in use is refused). False if it must wait for that."""
        fault, _ = self.member_faults[victim]
        if fault.kind == "sigstop":
            self.procs.signal(victim, signal.SIGCONT)
            self.say(f"SIGCONT {victim}")
        else:
            if final:
                wait_for(
                    lambda: not self.session_alive(victim),
                    timeout=self.config.session_timeout + self.config.recovery_timeout,
                    what=f"the store to drop the session of {victim}, killed with -9",
                )
            elif self.session_alive(victim) or (
                self.store.paused_member_stalls_writers
                and any(f.kind == "sigstop" for f, _ in self.member_faults.values())
            ):
                return False  # the restart blocks the schedule: not while a pause may stall it
            end_log_line(self.procs.log_path(victim))
            self.procs.start(victim)
            self.say(f"restarted {victim} under its static id")
        fault.healed = time.monotonic()
        del self.member_faults[victim]
        return True

    def session_alive(self, member_id: str) -> bool:
        try:
            return member_id in self.procs.state().members
        except BackendError:
            return True  # the store is down: its sessions are not known to be gone

    # -- store faults -----------------------------------------------------------------------

    def inject_store_fault(self) -> None:
        kind = self.rng.choice(self.store.kinds)
        fault = self.add(kind, None, f"{kind} on {self.store.name}")
        hold = self.store.inject(kind, self.rng)
        if self.store.data_lost():
            self.data_lost_at.append(time.time())
        if hold > 0:
            self.say(f"  ({kind} held for {hold:.2f} s)")
            self.store_fault = (fault, time.monotonic() + hold)
        else:
            fault.instant = True
            fault.healed = time.monotonic()

    def heal_store(self) -> None:
        self.store.heal()
        if self.store_fault is not None:
            self.store_fault[0].healed = time.monotonic()
            self.say(f"{self.store.name} healed")
        self.store_fault = None

    def run(self) -> None:
        end = self.started + self.config.seconds
        next_fault = self.started + self.rng.expovariate(1 / self.config.mean_gap)
        while True:
            now = time.monotonic()
            for victim, (fault, due) in sorted(self.member_faults.items()):
                if now >= due and not self.heal_member(victim):
                    self.member_faults[victim] = (fault, now + 0.1)  # its old session lives
            if self.store_fault is not None and now >= self.store_fault[1]:
                self.heal_store()
            if now >= end:
                break
            if now >= next_fault:
                store_turn = bool(self.store.kinds) and (
                    self.rng.random() < self.config.store_fault_share
                )
                if store_turn and self.store_fault is None:
                    self.inject_store_fault()
                elif not store_turn and len(self.member_faults) < self.config.members - 1:
                    self.inject_member_fault()
                next_fault = time.monotonic() + self.rng.expovariate(1 / self.config.mean_gap)
            wake = [end, next_fault]
            wake += [due for _, due in self.member_faults.values()]
            if self.store_fault is not None:
                wake.append(self.store_fault[1])
            # The schedule's own virtual time between faults: the workload, not synchronisation.
            time.sleep(max(min(wake) - time.monotonic(), 0.0))
        self.heal_store()
        self.heal_members()

    def heal_members(self) -> None:
        """Undo every member fault at the end of a run: paused members first, since a member
        paused inside a SQLite write holds the file's lock, which a restart would wait on."""
        paused_first = sorted(
            self.member_faults, key=lambda v: self.member_faults[v][0].kind != "sigstop"
        )
        for victim in paused_first:
            self.heal_member(victim, final=True)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def end_log_line(path: Path) -> None:
    """A trail cut short by kill -9 gets its line ended, so the next process's first record
    starts a line of its own."""
    if path.exists() and path.stat().st_size:
        with path.open("rb+") as f:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                f.write(b"\n")


def run_chaos(
    procs: MemberProcesses,
    store: StoreFaults,
    config: ChaosConfig,
    *,
    log: Callable[[str], None] = print,
) -> ChaosReport:
    """Run the schedule on ``procs`` (no member started yet) and measure; assert nothing (the
    caller asserts on the report, the benchmark prints it), except that the group settles."""
    report = ChaosReport(
        store.name,
        config.seed,
        config.seconds,
        config.members,
        config.resources,
        config.session_timeout,
    )
    log(f"chaos seed {config.seed} on {store.name}")
    resources = [f"res-{i:03d}" for i in range(config.resources)]
    procs.start("m0", resources)
    for i in range(1, config.members):
        procs.start(f"m{i}")
    procs.wait_stable(config.members, timeout=config.recovery_timeout, resources=resources)
    with Observer(procs, resources, interval=0.02) as observer:
        chaos, chaos_wall = Chaos(procs, store, config, report, log), time.time()
        chaos.run()
        healed, healed_wall = time.monotonic(), time.time()
        procs.wait_stable(
            config.members,
            timeout=config.session_timeout + config.recovery_timeout,
            resources=resources,
        )
        report.recovery_s = time.monotonic() - healed
        wait_for(
            lambda: every_resource_committed(procs, resources, since=healed_wall),
            timeout=config.recovery_timeout,
            what="a commit accepted for every resource after the faults stopped",
        )
        report.working_again_s = time.monotonic() - healed
    report.rebalances = observer.generations(chaos.started) - 1
    report.observer_errors = observer.errors[:5]
    if observer.errors:
        log(f"observer errors (read as the store being down): {observer.errors[:3]}")
    for fault in chaos.faults:
        took = observer.settled_after(fault)
        report.settled_after[fault.kind].append(float("nan") if took is None else took)
    check(procs, report, resources, chaos.data_lost_at, chaos_wall)
    return report
