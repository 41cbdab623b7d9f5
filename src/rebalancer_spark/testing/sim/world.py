"""The simulated world: a seeded scheduler on a virtual clock, its faults, and the checker.

:func:`simulate` runs one seed: members join a group, the scheduler injects faults for
``fault_time`` virtual seconds (crashes, pauses past the lease, partitions, slow and lost
replies, late watch notifications, store restarts with and without data loss, joins, graceful
leaves, changes of the resource set), then lets the group settle. Every outcome depends on the
seed only: the same seed replays the same run, event by event.

Invariants, checked as the run goes (the first broken one ends the run):

* **single belief**: when a member starts believing it owns a resource, no other live member
  believes it owns it (belief = held and the member's *own* lease deadline not passed);
* **monotonic epochs**: each grant of a resource carries a higher epoch than every earlier
  grant of it; coordinator epochs and target generations only grow, even across data loss;
* **fenced commits**: every commit the store accepts comes from the session of the latest
  grant of that resource, at that grant's epoch;
* **minimal moves**: every running target is count-balanced and moves exactly
  :func:`~rebalancer_spark.core.assignors.minimum_moves` resources;
* **liveness**: once faults stop, within ``settle_bound`` virtual seconds the group is stable:
  every resource claimed by its target owner, every live member in the target, each member
  believing exactly what the store says it holds.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rebalancer_spark.core.assignors import minimum_moves, moved
from rebalancer_spark.core.clock import ManualClock
from rebalancer_spark.core.config import MemberConfig, ProtocolName
from rebalancer_spark.core.coordinator import Publish
from rebalancer_spark.core.errors import BackendUnavailable, RebalancerError
from rebalancer_spark.core.model import Phase, Target
from rebalancer_spark.testing.sim.member import (
    Actor,
    Call,
    Hooks,
    MemberBugs,
    SimMember,
    Wait,
)
from rebalancer_spark.testing.sim.operator import control_breach, operator_fault, shapes
from rebalancer_spark.testing.sim.store import HandleMemory, SimStore, StoreBugs

__all__ = ["FAULTS", "SimConfig", "SimResult", "Violation", "replay_command", "simulate"]


FAULTS = (
    "crash",
    "pause",
    "partition",
    "slow",
    "restart",
    "join",
    "leave",
    "resources",
    "control",
)


@dataclass(frozen=True, slots=True)
class SimConfig:
    protocol: ProtocolName = ProtocolName.COOPERATIVE
    members: int = 3
    resources: int = 6
    ttl: float = 2.0
    fault_time: float = 6.0
    settle_bound: float = 10.0
    faults: tuple[str, ...] = FAULTS
    """The kinds of fault the scheduler draws from (each equally likely)."""
    static_members: bool = True
    """Each first member is static (rejoins under its id, ``rejoin_grace`` = ttl) with
    probability 0.3, drawn by the seed."""
    discovery: bool = True
    """Half the seeds list the resource set from a source (the coordinator's discovery, every
    second) instead of an operator writing it to the store."""
    store_bugs: StoreBugs = field(default_factory=StoreBugs)
    member_bugs: MemberBugs = field(default_factory=MemberBugs)


@dataclass(frozen=True, slots=True)
class Violation:
    seed: int
    protocol: ProtocolName
    at: float
    invariant: str
    detail: str

    def __str__(self) -> str:
        return (
            f"seed {self.seed} ({self.protocol}): {self.invariant} violated at virtual "
            f"t={self.at:.3f}: {self.detail}\n  replay: {replay_command(self.seed, self.protocol)}"
        )


@dataclass(slots=True)
class SimResult:
    seed: int
    violation: Violation | None
    events: int
    settled_after: float | None
    """Virtual seconds from the end of faults to a stable group."""
    faults: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)


def replay_command(seed: int, protocol: ProtocolName) -> str:
    return f"python -m rebalancer_spark.testing.sim --seed {seed} --protocol {protocol} -v"


class _Broken(Exception):
    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


@dataclass(slots=True)
class _Proc:
    """A member process: the member and the bookkeeping of its actors."""

    member: SimMember
    paused_until: float = 0.0
    partitioned_until: float = 0.0
    hold_requests: bool = False
    """Frozen while sending: requests not yet at the store leave only after the pause."""
    deferred: list[Callable[[], None]] = field(default_factory=list)
    waiting: dict[int, tuple[Actor, int]] = field(default_factory=dict)
    """Actor index → (actor, token) for actors in a wakeable wait."""


START = 1000.0

_READS = frozenset({"renew", "member_head", "member_view", "state", "commit"})
"""Calls that wake no watcher (renewals and commits change nothing a member waits for)."""


class World:
    def __init__(self, seed: int, config: SimConfig, *, trace: bool) -> None:
        self.seed = seed
        self.config = config
        self.rng = random.Random(seed)
        self.clock = ManualClock(start=START)
        self._t = START
        self.store = SimStore(config.store_bugs)
        self.store.on_grant = self._on_grant
        self.store.on_commit = self._on_commit
        self.store.on_number = self._on_number
        self._queue: list[tuple[float, int, Callable[[], object]]] = []
        self._seq = itertools.count()
        self._tokens = itertools.count()
        self.procs: list[_Proc] = []
        self.memories: dict[str, HandleMemory] = {}
        self.operator = HandleMemory()
        self.grants: dict[str, tuple[str, str, int]] = {}
        self.numbers: dict[str, int] = {}
        self.events = 0
        self.slow_until = 0.0
        self.faults_end = START + config.fault_time
        self.calm_at = self.faults_end
        """When the last fault's effect ends (a pause, a partition, a slow spell, a store
        restart, a crashed member's restart): liveness is measured from here."""
        self.trace: list[str] | None = [] if trace else None
        self.fault_log: list[str] = []
        self.hooks = Hooks(
            self._on_acquired, self._on_committed, self._on_published, self._on_emitted
        )
        # Drawn apart from the fault schedule, so that seeds keep their faults.
        features = random.Random(f"features {seed}")
        self.static_slots = {
            f"m{i}"
            for i in range(1, config.members + 1)
            if config.static_members and features.random() < 0.3
        }
        self.discovery = config.discovery and features.random() < 0.5
        self.source: dict[str, float] = {}
        """What discovery lists (the resource set as the source has it)."""
        self.control_events: list[str] = []
        self.member_config = MemberConfig(
            group="sim",
            backend="sqlite:///simulated.db",
            protocol=config.protocol,
            session_timeout=config.ttl,
            stability_window=0.1,
            max_rebalance_delay=1.0,
            barrier_timeout=config.ttl,
            drain_timeout=config.ttl * 2,
        )
        self._names = itertools.count(1)

    # -- scheduling -------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self._t

    def at(self, when: float, fn: Callable[[], object]) -> None:
        heapq.heappush(self._queue, (when, next(self._seq), fn))

    def log(self, text: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.now - START:9.4f} {text}")

    def lasts_until(self, when: float) -> None:
        self.calm_at = max(self.calm_at, when)

    def _delay(self) -> float:
        if self.now < self.slow_until and self.rng.random() < 0.3:
            return self.rng.uniform(0.05, self.config.ttl * 1.2)
        return self.rng.uniform(0.0005, 0.01)

    # -- actors ---------------------------------------------------------------------------------

    def spawn(self, proc: _Proc, actor: Actor) -> None:
        index = next(self._tokens)
        self.at(self.now, lambda: self._resume(proc, index, actor, None, None))

    def _resume(
        self,
        proc: _Proc,
        index: int,
        actor: Actor,
        value: Any,
        error: BaseException | None,
    ) -> None:
        member = proc.member
        if not member.alive:
            return
        if self.now < proc.paused_until:
            proc.deferred.append(lambda: self._resume(proc, index, actor, value, error))
            return
        self.events += 1
        try:
            effect = actor.throw(error) if error is not None else actor.send(value)
        except StopIteration:
            return
        if isinstance(effect, Wait):
            token = next(self._tokens)
            if effect.wakeable:
                proc.waiting[index] = (actor, token)

            def timed_out() -> None:
                entry = proc.waiting.get(index)
                if effect.wakeable:
                    if entry is None or entry[1] != token:
                        return
                    del proc.waiting[index]
                self._resume(proc, index, actor, None, None)

            self.at(self.now + effect.timeout, timed_out)
        else:
            self.at(self.now + self._delay(), lambda: self._apply(proc, index, actor, effect))

    def _apply(self, proc: _Proc, index: int, actor: Actor, call: Call) -> None:
        if proc.hold_requests and self.now < proc.paused_until:
            proc.deferred.append(lambda: self._apply(proc, index, actor, call))
            return
        result: Any = None
        error: BaseException | None = None
        if self.now < proc.partitioned_until:
            error = BackendUnavailable(f"{call.label}: the store is unreachable (partition)")
        else:
            try:
                result = call.apply(self.store, self.now)
            except RebalancerError as exc:  # a checker's _Broken ends the run right here
                error = exc
            if call.label not in _READS and error is None:
                self.notify()
            if call.label in ("join", "renew") and error is None:
                self._watch_expiry()
            if error is None and self.now < self.slow_until and self.rng.random() < 0.05:
                error = BackendUnavailable(f"{call.label}: timed out waiting for the reply")
        if self.trace is not None:
            self.log(f"{proc.member.member_id} {call.label} -> {error or result!r}")
        self.at(self.now + self._delay(), lambda: self._resume(proc, index, actor, result, error))

    def notify(self) -> None:
        for proc in self.procs:
            self.at(self.now + self._delay(), functools.partial(self._wake, proc))

    def _wake(self, proc: _Proc) -> None:
        if not proc.member.alive:
            return
        if self.now < proc.paused_until:
            proc.deferred.append(lambda: self._wake(proc))
            return
        waiting, proc.waiting = proc.waiting, {}
        for index, (actor, _token) in sorted(waiting.items()):
            self._resume(proc, index, actor, None, None)

    def _watch_expiry(self) -> None:
        expiry = min((s.expires for s in self.store.sessions.values()), default=None)
        if expiry is not None:
            self.at(expiry, self.notify)

    # -- members ----------------------------------------------------------------------------------

    def start_member(self, slot: str) -> _Proc:
        memory = self.memories.setdefault(slot, HandleMemory())
        static = slot in self.static_slots
        name = slot if static else f"{slot}.{next(self._names)}"
        member = SimMember(
            name,
            self.member_config,
            memory,
            lambda: self.now,
            self.hooks,
            self.config.member_bugs,
            static=static,
            discover=(lambda: dict(self.source)) if self.discovery else None,
            rejoin_grace=self.config.ttl,  # applies to static members only
        )
        proc = _Proc(member)
        self.procs.append(proc)
        for actor in (member.heartbeat(), member.reconciler(), member.coordinator()):
            self.spawn(proc, actor)
        self.spawn(proc, member.worker(0.5))
        self.log(f"start {name}")
        return proc

    def _unpause(self, proc: _Proc) -> None:
        if self.now < proc.paused_until:
            return
        deferred, proc.deferred = proc.deferred, []
        for fn in deferred:
            fn()

    # -- checker hooks ---------------------------------------------------------------------------

    def _on_acquired(self, member: SimMember, resource: str, epoch: int) -> None:
        if self.trace is not None:
            self.log(f"{member.member_id} acquired {resource}@{epoch}")
        if resource not in member.believes(self.now):
            return  # a late answer after the lease ran out: held, but not believed (assigned())
        for proc in self.procs:
            other = proc.member
            if other is not member and resource in other.believes(self.now):
                raise _Broken(
                    "single belief",
                    f"{member.member_id} acquired {resource!r} at epoch {epoch} while "
                    f"{other.member_id} still believes it owns it at epoch "
                    f"{other.held[resource]} (its lease runs until "
                    f"t={other.lease.deadline - START:.3f})",
                )

    def _on_grant(self, resource: str, member: str, session: str, epoch: int) -> None:
        last = self.grants.get(resource)
        if last is not None and epoch <= last[2]:
            raise _Broken(
                "monotonic epochs",
                f"{resource!r} granted to {member} ({session}) at epoch {epoch}, not above "
                f"the earlier grant to {last[0]} ({last[1]}) at epoch {last[2]}",
            )
        self.grants[resource] = (member, session, epoch)

    def _on_number(self, kind: str, value: int) -> None:
        last = self.numbers.get(kind, 0)
        if value <= last:
            raise _Broken("monotonic epochs", f"{kind} went from {last} to {value}")
        self.numbers[kind] = value

    def _on_commit(self, resource: str, session: str, epoch: int) -> None:
        last = self.grants.get(resource)
        if last is None or last[1:] != (session, epoch):
            raise _Broken(
                "fenced commits",
                f"the store accepted a commit of {resource!r} from session {session} at epoch "
                f"{epoch}, but the latest grant is {last!r}",
            )

    def _on_committed(self, member: SimMember, resource: str, epoch: int, session: str) -> None:
        pass

    def _on_emitted(self, member: SimMember, reason: str) -> None:
        self.control_events.append(reason)
        if self.trace is not None:
            self.log(f"{member.member_id} event {reason}")

    def _on_published(
        self,
        member: SimMember,
        target: Target,
        previous: dict[str, set[str]],
        action: Publish,
    ) -> None:
        assignment = target.assignment
        present, control = set(action.members), action.control
        if self.trace is not None:
            self.log(f"{member.member_id} published g{target.generation} {dict(assignment)}")
        if shapes(control, present, {r for rs in assignment.values() for r in rs}):
            breach = control_breach(target, previous, present, control)
            if breach is not None:
                raise _Broken("control", breach)
            return
        counts = [len(rs) for rs in assignment.values()]
        if counts and max(counts) - min(counts) > 1:
            raise _Broken("minimal moves", f"unbalanced target {dict(assignment)}")
        resources = {r: 1.0 for rs in assignment.values() for r in rs}
        need = minimum_moves(present, resources, previous)
        did = moved(previous, assignment)
        if did != need:
            raise _Broken(
                "minimal moves",
                f"generation {target.generation} moved {did} resources where {need} suffice "
                f"(previous {previous}, now {dict(assignment)})",
            )

    # -- the end state ----------------------------------------------------------------------------

    def stable(self) -> str | None:
        """None when the group is stable, else why not."""
        if not self.store.up:
            return "the store is down"
        alive = [p.member for p in self.procs if p.member.alive and not p.member.left]
        if not alive:
            return None  # everyone left or crashed for good: nothing to settle
        return self._target_problem(alive) or self._claims_problem(alive)

    def _target_problem(self, alive: list[SimMember]) -> str | None:
        """Why the target does not cover the live members and the resource set, if it does
        not."""
        store, target = self.store, self.store.target
        # A lost set is restored by a live handle that remembers it (as with Redis without
        # persistence: if every process that knew it is gone, so is the set, until a member or
        # discovery declares it again: docs/backends/redis.md).
        remembered = any(m.memory.resources for m in alive)
        if self.operator.resources and not store.resources and remembered:
            return "the resource set was lost and never restored"
        if target is None:
            return "no target"
        if target.phase is not Phase.RUNNING:
            return f"target phase {target.phase}"
        names = {m.member_id for m in alive}
        if set(target.assignment) != names:
            return f"target members {sorted(target.assignment)} != live {sorted(names)}"
        if {r for rs in target.assignment.values() for r in rs} != set(store.resources):
            return "target does not cover the resource set"
        return None

    def _claims_problem(self, alive: list[SimMember]) -> str | None:
        """Why the claims (and the members' beliefs) differ from the target, if they do."""
        target, now = self.store.target, self.now
        assert target is not None
        claims = self.store.live_claims(now)
        for m, rs in target.assignment.items():
            for r in rs:
                if r not in claims or claims[r].member_id != m:
                    return f"{r!r} is not held by its target owner {m}"
        for member in alive:
            mine = {r: c.epoch for r, c in claims.items() if c.member_id == member.member_id}
            if member.believes(now) != mine:
                return f"{member.member_id} believes {member.believes(now)}, store says {mine}"
        return None


def _schedule_faults(world: World) -> None:
    rng, cfg = world.rng, world.config
    faults = _Faults(world)
    for slot in faults.slots:
        world.at(START + rng.uniform(0, 0.3), functools.partial(world.start_member, slot))
    resources = faults.resources
    world.source = resources  # what discovery lists: the same set the faults change
    world.at(START, lambda: world.store.update_resources(resources, world.now, world.operator))
    for _ in range(rng.randint(1, 6)):
        when = START + 0.5 + rng.uniform(0, cfg.fault_time - 0.5)
        kind = rng.choice(cfg.faults)
        world.fault_log.append(f"t={when - START:.3f} {kind}")
        world.at(when, functools.partial(faults.inject, kind))


class _Faults:
    """The faults of one run, each drawn from the world's random source when it strikes."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.rng = world.rng
        self.ttl = world.config.ttl
        self.slots = [f"m{i}" for i in range(1, world.config.members + 1)]
        self.resources = {f"r{i}": 1.0 for i in range(world.config.resources)}
        self.extra = itertools.count(world.config.resources)
        self.data_loss_at: list[float] = []

    def inject(self, kind: str) -> None:
        world = self.world
        live = [p for p in world.procs if p.member.alive and not p.member.stopping]
        handlers: dict[str, Callable[[list[_Proc]], None]] = {
            "crash": self.crash,
            "pause": self.pause,
            "partition": self.partition,
            "slow": self.slow,
            "restart": self.restart,
            "join": self.join,
            "leave": self.leave,
            "control": self.control,
            "resources": self.resources_change,
        }
        handlers[kind](live)

    def crash(self, live: list[_Proc]) -> None:
        world, rng = self.world, self.rng
        if len(live) <= 1:
            return
        proc = rng.choice(live)
        proc.member.alive = False
        world.log(f"FAULT crash {proc.member.member_id}")
        slot = proc.member.member_id.split(".")[0]
        if rng.random() < 0.7:
            again = world.now + rng.uniform(0.1, 2 * self.ttl)
            world.lasts_until(again)
            world.at(again, lambda: world.start_member(slot))

    def pause(self, live: list[_Proc]) -> None:
        world, rng = self.world, self.rng
        if not live:
            return
        proc = rng.choice(live)
        proc.paused_until = world.now + rng.uniform(0.1, 2 * self.ttl)
        proc.hold_requests = rng.random() < 0.5
        world.log(f"FAULT pause {proc.member.member_id} until {proc.paused_until - START}")
        world.at(proc.paused_until, lambda: world._unpause(proc))
        world.lasts_until(proc.paused_until)

    def partition(self, live: list[_Proc]) -> None:
        world = self.world
        if not live:
            return
        proc = self.rng.choice(live)
        proc.partitioned_until = world.now + self.rng.uniform(0.1, 2 * self.ttl)
        world.lasts_until(proc.partitioned_until)
        world.log(f"FAULT partition {proc.member.member_id}")

    def slow(self, live: list[_Proc]) -> None:
        world = self.world
        world.slow_until = max(world.slow_until, world.now + self.rng.uniform(0.5, 2 * self.ttl))
        # a reply sent just before the spell ends may take up to 1.2 ttl
        world.lasts_until(world.slow_until + 1.2 * self.ttl)
        world.log("FAULT slow network")

    def restart(self, live: list[_Proc]) -> None:
        world, rng = self.world, self.rng
        if not world.store.up:
            return
        lose = rng.random() < 0.4
        down = rng.uniform(0.05, 1.5 * self.ttl)
        # The documented limit of the Redis backend (docs/backends/redis.md): a process that
        # never saw the group and is the first to touch it after a total loss restarts the
        # epochs. Not simulated: no data is lost while a member (live, or to be restarted) has
        # not yet reached the group (its first join may still be on the way).
        if any(m.incarnation == -1 for m in world.memories.values()):
            lose = False
        world.store.crash()
        if lose:
            self.data_loss_at.append(world.now)
        world.log(f"FAULT store restart for {down:.3f}s, data lost: {lose}")

        def back() -> None:
            world.store.recover(world.now, lose_data=lose)
            world.notify()

        world.at(world.now + down, back)
        world.lasts_until(world.now + down)

    def join(self, live: list[_Proc]) -> None:
        world = self.world
        if not any(world.now - t < 3 * self.ttl for t in self.data_loss_at):
            slot = f"m{len(self.slots) + 1}"
            self.slots.append(slot)
            world.start_member(slot)

    def leave(self, live: list[_Proc]) -> None:
        if len(live) <= 1:
            return
        proc = self.rng.choice(live)
        self.world.log(f"FAULT graceful stop of {proc.member.member_id}")
        self.world.spawn(proc, proc.member.stopper())

    def control(self, live: list[_Proc]) -> None:
        operator_fault(self.world, [p.member.member_id for p in live], sorted(self.resources))

    def resources_change(self, live: list[_Proc]) -> None:
        world, rng, resources = self.world, self.rng, self.resources
        if rng.random() < 0.5 and len(resources) > 1:
            del resources[rng.choice(sorted(resources))]
        else:
            resources[f"r{next(self.extra)}"] = 1.0
        if world.discovery:
            world.log(f"FAULT the source now lists {sorted(resources)}")
            return  # the coordinator's next listing finds it
        try:
            world.store.update_resources(resources, world.now, world.operator)
            world.notify()
        except BackendUnavailable:
            pass


def simulate(seed: int, config: SimConfig = SimConfig(), *, trace: bool = False) -> SimResult:
    """Run one seed; see the module docstring."""
    world = World(seed, config, trace=trace)
    _schedule_faults(world)
    give_up = 0.0
    result = SimResult(seed, None, 0, None, world.fault_log)
    settled: list[float] = []

    def check() -> None:
        nonlocal give_up
        if world.now < world.calm_at:  # a fault scheduled before the end still has effect
            world.at(world.calm_at, check)
            return
        if not give_up:
            give_up = world.now + config.settle_bound
        if world.stable() is None:
            settled.append(world.now)
            return
        if world.now >= give_up:
            raise _Broken(
                "liveness",
                f"not stable {config.settle_bound:g} s after faults ended: {world.stable()}",
            )
        world.at(world.now + 0.05, check)

    world.at(world.faults_end, check)
    queue, clock = world._queue, world.clock
    try:
        while queue and not settled:
            when, _, fn = heapq.heappop(queue)
            if when > world._t:
                clock.advance(when - world._t)
                world._t = when
            fn()
    except _Broken as broken:
        result.violation = Violation(
            seed, config.protocol, world.now - START, broken.invariant, broken.detail
        )
    result.events = world.events
    result.settled_after = settled[0] - world.calm_at if settled else None
    result.trace = world.trace or []
    return result
