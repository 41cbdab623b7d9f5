"""A simulated member: the threads of :mod:`rebalancer_spark.member` as generators.

Each member runs four actors, as the real member runs threads: the heartbeat
(:class:`~rebalancer_spark.member.lease.Heartbeat`), the member thread
(:class:`~rebalancer_spark.member.reconciler.Reconciler`), the coordinator thread
(:class:`~rebalancer_spark.member.coordinator.CoordinatorLoop`) and a worker that commits
progress for what it owns. An actor yields :class:`Call` (a store request: it reaches the store
after a delay and its answer comes back after another) or :class:`Wait` (sleep, woken early by
a watch notification when ``wakeable``). Decisions are the product's own pure functions:
:func:`core.protocols.plan` and the assignor; the lease keeps the product's arithmetic
(deadline = renewal start + ttl - margin, a lapse is final for the session).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeAlias

from rebalancer_spark.core.assignors import get_assignor
from rebalancer_spark.core.config import MemberConfig, ProtocolName
from rebalancer_spark.core.errors import (
    BackendError,
    FencedError,
    MemberIdInUse,
    RebalancerError,
    SessionExpired,
)
from rebalancer_spark.core.model import Phase
from rebalancer_spark.core.protocols import MemberView, plan
from rebalancer_spark.testing.sim.store import (
    HandleMemory,
    SimSession,
    SimStore,
    StateView,
    TargetRecord,
)

__all__ = ["MAX_WAIT", "Call", "Hooks", "MemberBugs", "SimMember", "Wait"]

MAX_WAIT = 1.0
"""As ``reconciler.MAX_WAIT`` and the coordinator's ``_IDLE_WAIT``."""


@dataclass(frozen=True, slots=True)
class Call:
    """A store request: ``apply(store, now)`` runs atomically when it reaches the store."""

    label: str
    apply: Callable[[SimStore, float], Any]


@dataclass(frozen=True, slots=True)
class Wait:
    timeout: float
    wakeable: bool


Effect: TypeAlias = Call | Wait
Actor: TypeAlias = Generator[Effect, Any, None]


@dataclass(frozen=True, slots=True)
class MemberBugs:
    """Deliberate defects of the member side."""

    deadline_from_reply: bool = False
    """Measure the lease from when the renewal's answer came, not from when it started."""
    no_fence: bool = False
    """Keep working after the lease ran out (no self-fencing)."""
    never_release: bool = False
    """Stop working on revoked resources but never give their claims back to the store."""


@dataclass(slots=True)
class Hooks:
    """How a member tells the checker what it does."""

    acquired: Callable[[SimMember, str, int], None]
    committed: Callable[[SimMember, str, int, str], None]
    published: Callable[[SimMember, TargetRecord, dict[str, set[str]], set[str]], None]


def _renew(sid: str, store: SimStore, now: float) -> None:
    store.renew(sid, now)


def _commit(sid: str, resource: str, epoch: int, value: int, store: SimStore, now: float) -> None:
    store.commit(sid, resource, epoch, value, now)


class Lease:
    """:class:`rebalancer_spark.member.lease.Lease`, single-threaded."""

    def __init__(self, now: Callable[[], float], margin: float) -> None:
        self._now = now
        self.margin = margin
        self.session: SimSession | None = None
        self.deadline = 0.0
        self.lapsed = True

    def start(self, session: SimSession, started_at: float) -> None:
        self.session = session
        self.deadline = started_at + session.ttl - self.margin
        self.lapsed = False

    def renewed(self, session: SimSession, started_at: float) -> bool:
        if self.session is not session or self.check():
            return False
        self.deadline = max(self.deadline, started_at + session.ttl - self.margin)
        return True

    def lapse(self, session: SimSession) -> None:
        if self.session is session and not self.lapsed:
            self.lapsed = True
            self.deadline = min(self.deadline, self._now())

    def end(self) -> None:
        self.session = None
        self.lapsed = True

    def check(self) -> bool:
        if not self.lapsed and self._now() >= self.deadline:
            self.lapsed = True
        return self.lapsed

    def valid_session(self) -> SimSession | None:
        return None if self.session is None or self.check() else self.session

    def valid_at(self, now: float) -> bool:
        """Whether the lease holds at ``now``, without changing anything (for the checker)."""
        return self.session is not None and not self.lapsed and now < self.deadline


class SimMember:
    """One member process; ``alive`` turns False when it is killed."""

    def __init__(
        self,
        member_id: str,
        config: MemberConfig,
        memory: HandleMemory,
        now: Callable[[], float],
        hooks: Hooks,
        bugs: MemberBugs,
    ) -> None:
        self.member_id = member_id
        self.config = config
        self.memory = memory
        self.now = now
        self.hooks = hooks
        self.bugs = bugs
        margin = config.effective_safety_margin
        self.lease = Lease(now, margin)
        self.held: dict[str, int] = {}
        self.handled_generation = 0
        self.draining = False
        self.stopping = False
        self.alive = True
        self.left = False
        self.running = 0
        """Member and coordinator actors still running (``stop()`` waits for them)."""
        self.commits = 0
        # coordinator state, as CoordinatorLoop
        self.epoch: int | None = None
        self._assignor = get_assignor(config.assignor)
        self._pending: tuple[frozenset[str], int] | None = None
        self._first_change = 0.0
        self._last_change = 0.0
        self._stopping_since: float | None = None

    # -- what the checker reads -----------------------------------------------------------------

    def believes(self, now: float) -> dict[str, int]:
        """Resources this member believes it owns at ``now`` (what ``assigned()`` returns)."""
        if not self.alive or not (self.lease.valid_at(now) or self.bugs.no_fence):
            return {}
        return dict(self.held)

    # -- the heartbeat ----------------------------------------------------------------------------

    def heartbeat(self) -> Actor:
        while not self.stopping:
            session = self.lease.session
            interval = self.config.effective_heartbeat_interval
            if session is not None:
                interval = min(interval, session.ttl / 5)
            yield Wait(interval, wakeable=False)
            session = self.lease.valid_session()
            if session is None:
                continue
            started = self.now()
            sid = session.session_id
            try:
                yield Call("renew", functools.partial(_renew, sid))
            except SessionExpired:
                self.lease.lapse(session)
                continue
            except BackendError:
                continue
            if self.bugs.deadline_from_reply:
                started = self.now()
            self.lease.renewed(session, started)

    # -- the member thread ------------------------------------------------------------------------

    def reconciler(self) -> Actor:
        self.running += 1
        while not self.stopping:
            try:
                timeout = yield from self._step()
            except SessionExpired:
                if self.lease.session is not None:
                    self.lease.lapse(self.lease.session)
                timeout = 0.0
            except BackendError:
                timeout = min(self.config.effective_heartbeat_interval, MAX_WAIT)
            except MemberIdInUse:
                timeout = self.config.effective_heartbeat_interval
            if timeout > 0 and not self.stopping:
                yield Wait(timeout, wakeable=True)
        self.running -= 1

    def _step(self) -> Generator[Effect, Any, float]:
        lease = self.lease
        if lease.session is None or lease.check():
            if self.stopping:
                return 0.0
            yield from self._self_fence(lease.session)
            started = self.now()
            member, ttl, memory = self.member_id, self.config.session_timeout, self.memory
            session: SimSession = yield Call(
                "join", lambda s, now: s.join(member, ttl, now, memory)
            )
            lease.start(session, started)
            self.handled_generation = 0
            return 0.0
        session = lease.session
        sid = session.session_id
        view: MemberView = yield Call("member_view", lambda s, now: s.member_view(sid, now))
        step = plan(self.config.protocol, view, dict(self.held), self.handled_generation)
        for r in step.lost:
            self.held.pop(r, None)
        if step.revoke:
            yield from self._revoke(session, set(step.revoke))
        if step.ack is not None:
            if self.config.protocol is ProtocolName.GLOBAL_BARRIER:
                generation = step.ack
                yield Call("ack", lambda s, now: s.acknowledge(sid, generation, now))
            self.handled_generation = step.generation
        if step.claim and not self.draining:
            wanted, generation, memory = step.claim, view.generation, self.memory
            granted: dict[str, int] = yield Call(
                "claim", lambda s, now: s.claim(sid, wanted, generation, now, memory)
            )
            for r, e in sorted(granted.items()):
                if self.held.get(r) != e:
                    self.held[r] = e
                    self.hooks.acquired(self, r, e)
        return max(min(lease.deadline - self.now(), MAX_WAIT), 0.0)

    def _revoke(self, session: SimSession, resources: set[str]) -> Generator[Effect, Any, None]:
        owned = {r: self.held.pop(r) for r in sorted(resources) if r in self.held}
        if self.lease.valid_session() is not session:
            return
        sid = session.session_id
        view_only = resources - set(owned)
        if view_only:
            view: MemberView = yield Call("member_view", lambda s, now: s.member_view(sid, now))
            owned.update({r: e for r, e in view.owned.items() if r in view_only})
        if not self.bugs.never_release:
            yield Call("release", lambda s, now: s.release(sid, owned, now))

    def _self_fence(self, session: SimSession | None) -> Generator[Effect, Any, None]:
        self.held.clear()
        if session is not None:
            sid = session.session_id
            with contextlib.suppress(RebalancerError):
                yield Call("leave", lambda s, now: s.leave(sid, now))

    # -- graceful stop ----------------------------------------------------------------------------

    def stopper(self) -> Actor:
        """``Member.stop()``: drain, stop the threads, release what is left, leave."""
        session = self.lease.valid_session()
        if session is not None:
            sid = session.session_id
            try:
                yield Call("set_leaving", lambda s, now: s.set_leaving(sid, now))
                self.draining = True
                deadline = self.now() + self.config.drain_timeout
                while self.held and self.lease.valid_session() is not None:
                    if self.now() >= deadline:
                        break
                    yield Wait(min(deadline - self.now(), MAX_WAIT), wakeable=True)
            except RebalancerError:
                pass
        self.stopping = True
        while self.running:  # stop() joins the member and coordinator threads
            yield Wait(0.01, wakeable=False)
        session = self.lease.session
        if self.held and session is not None:
            try:
                yield from self._revoke(session, set(self.held))
            except RebalancerError:
                self.held.clear()
        self.held.clear()
        self.lease.end()
        if session is not None:
            sid = session.session_id
            with contextlib.suppress(RebalancerError):
                yield Call("leave", lambda s, now: s.leave(sid, now))
        self.left = True

    # -- the worker -------------------------------------------------------------------------------

    def worker(self, interval: float) -> Actor:
        """Commits a counter for every owned resource, as ``member_process`` does."""
        while not self.stopping:
            yield Wait(interval, wakeable=False)
            for r, e in sorted(self.held.items()):
                session = self.lease.session if self.bugs.no_fence else self.lease.valid_session()
                if session is None or self.held.get(r) != e:
                    continue
                sid, value = session.session_id, self.commits
                self.commits += 1
                try:
                    yield Call("commit", functools.partial(_commit, sid, r, e, value))
                except (FencedError, SessionExpired, BackendError):
                    continue
                self.hooks.committed(self, r, e, sid)

    # -- the coordinator thread -------------------------------------------------------------------

    def coordinator(self) -> Actor:
        self.running += 1
        while not self.stopping:
            timeout = MAX_WAIT
            try:
                timeout = yield from self._coordinator_step()
            except FencedError:
                self.epoch = None
                timeout = 0.0
            except BackendError:
                timeout = min(self.config.effective_heartbeat_interval, MAX_WAIT)
            except RebalancerError:
                pass
            timeout = min(timeout, MAX_WAIT)
            if timeout > 0:
                yield Wait(timeout, wakeable=True)
        self.running -= 1

    def _coordinator_step(self) -> Generator[Effect, Any, float]:
        session = self.lease.valid_session()
        if session is None:
            self.epoch = None
            return MAX_WAIT
        sid, memory = session.session_id, self.memory
        state: StateView = yield Call("state", lambda s, now: s.state(now, memory))
        coordinator = state.coordinator
        if coordinator is None or (coordinator[0] == sid and self.epoch != coordinator[1]):
            coordinator = yield Call("elect", lambda s, now: s.elect(sid, now, memory))
            if coordinator is not None and coordinator[0] == sid:
                self._pending = None
                self._stopping_since = None
                state = yield Call("state", lambda s, now: s.state(now, memory))
        if coordinator is None or coordinator[0] != sid:
            self.epoch = None
            return MAX_WAIT
        self.epoch = coordinator[1]
        return (yield from self._coordinate(session, coordinator[1], state))

    def _coordinate(
        self, session: SimSession, epoch: int, state: StateView
    ) -> Generator[Effect, Any, float]:
        now = self.now()
        present = {m for m, rec in state.members.items() if not rec.leaving}
        target = state.target
        if target is not None and target.phase is Phase.STOPPING:
            return (yield from self._finish_barrier(session, epoch, state, present, target))
        inputs = (frozenset(present), state.resources_version)
        if (
            target is not None
            and frozenset(target.assignment) == inputs[0]
            and target.resources_version == inputs[1]
        ):
            self._pending = None
            return MAX_WAIT
        if not present and target is None:
            return MAX_WAIT
        if inputs != self._pending:
            if self._pending is None:
                self._first_change = now
            self._pending = inputs
            self._last_change = now
        due = min(
            self._last_change + self.config.stability_window,
            self._first_change + self.config.max_rebalance_delay,
        )
        if now < due:
            return min(MAX_WAIT, due - now)
        sid, memory = session.session_id, self.memory
        if self.config.protocol is ProtocolName.GLOBAL_BARRIER and target is not None:
            assignment, version = target.assignment, target.resources_version
            yield Call(
                "publish",
                lambda s, now: s.publish(
                    sid, epoch, assignment, Phase.STOPPING, version, now, memory
                ),
            )
            self._stopping_since = now
            return 0.0
        yield from self._publish(session, epoch, state, present, target)
        return MAX_WAIT

    def _finish_barrier(
        self,
        session: SimSession,
        epoch: int,
        state: StateView,
        present: set[str],
        target: TargetRecord,
    ) -> Generator[Effect, Any, float]:
        now = self.now()
        if self._stopping_since is None:
            self._stopping_since = now
        waiting = [m for m, rec in state.members.items() if rec.acked < target.generation]
        overdue = now - self._stopping_since >= self.config.barrier_timeout
        if waiting and not overdue:
            return self._stopping_since + self.config.barrier_timeout - now
        self._stopping_since = None
        yield from self._publish(session, epoch, state, present, target)
        return MAX_WAIT

    def _publish(
        self,
        session: SimSession,
        epoch: int,
        state: StateView,
        present: set[str],
        target: TargetRecord | None,
    ) -> Generator[Effect, Any, None]:
        previous = {m: set(rs) for m, rs in target.assignment.items()} if target else {}
        assignment = self._assignor(present, state.resources, previous)
        sid, memory, version = session.session_id, self.memory, state.resources_version
        published: TargetRecord = yield Call(
            "publish",
            lambda s, now: s.publish(sid, epoch, assignment, Phase.RUNNING, version, now, memory),
        )
        self._pending = None
        self.hooks.published(self, published, previous, present)
