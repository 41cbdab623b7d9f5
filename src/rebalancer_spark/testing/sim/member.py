"""A simulated member: the threads of :mod:`rebalancer_spark.member` as generators.

Each member runs four actors, as the real member runs threads: the heartbeat
(:class:`~rebalancer_spark.member.lease.Heartbeat`), the member thread
(:class:`~rebalancer_spark.member.reconciler.Reconciler`), the coordinator thread
(:class:`~rebalancer_spark.member.coordinator.CoordinatorLoop`) and a worker that commits
progress for what it owns. An actor yields :class:`Call` (a store request: it reaches the store
after a delay and its answer comes back after another) or :class:`Wait` (sleep, woken early by
a watch notification when ``wakeable``). Decisions are the product's own pure functions:
:func:`core.protocols.plan` for the member thread and :func:`core.coordinator_rules.decide`
(with the assignor and the operator's control record) for the coordinator thread; the lease
keeps the product's arithmetic (deadline = renewal start + ttl - margin, a lapse is final for
the session).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeAlias

from rebalancer_spark.core import coordinator_rules as rules
from rebalancer_spark.core.config import MemberConfig, ProtocolName
from rebalancer_spark.core.control import Control
from rebalancer_spark.core.coordinator import (
    Action,
    CoordinatorState,
    Discover,
    Elect,
    Emit,
    ForgetDrains,
    GroupView,
    IllegalTransition,
    Publish,
    Settings,
    WakeAt,
)
from rebalancer_spark.core.errors import (
    BackendError,
    ControlConflict,
    FencedError,
    MemberIdInUse,
    RebalancerError,
    SessionExpired,
)
from rebalancer_spark.core.model import CoordinatorRecord, GroupState, Phase, Target
from rebalancer_spark.core.protocols import MemberHead, MemberView, head_of, idle, plan
from rebalancer_spark.testing.sim.store import HandleMemory, SimSession, SimStore

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
    published: Callable[[SimMember, Target, dict[str, set[str]], Publish], None]
    emitted: Callable[[SimMember, str], None]


def _renew(sid: str, store: SimStore, now: float) -> None:
    store.renew(sid, now)


def _elect(sid: str, memory: HandleMemory, store: SimStore, now: float) -> CoordinatorRecord | None:
    return store.elect(sid, now, memory)


def _update_control(expected: int, control: Control, store: SimStore, now: float) -> Control:
    return store.update_control(expected, control, now)


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
        *,
        static: bool = False,
        discover: Callable[[], dict[str, float]] | None = None,
        discovery_interval: float = 1.0,
        rejoin_grace: float = 0.0,
    ) -> None:
        self.member_id = member_id
        self.static = static
        self.config = config
        self.memory = memory
        self.now = now
        self.hooks = hooks
        self.bugs = bugs
        margin = config.effective_safety_margin
        self.lease = Lease(now, margin)
        self.held: dict[str, int] = {}
        self.handled_generation = 0
        self.last_view: tuple[str, MemberView] | None = None
        """The session and view of the last step (the reconciler's skip of an idle member)."""
        self.draining = False
        self.stopping = False
        self.alive = True
        self.left = False
        self.running = 0
        """Member and coordinator actors still running (``stop()`` waits for them)."""
        self.commits = 0
        self.discover = discover
        # the coordinator thread's state machine, as CoordinatorLoop
        self.coordination = CoordinatorState()
        settings = Settings.of(config, None if discover is None else discovery_interval)
        self.settings = dataclasses.replace(settings, rejoin_grace=rejoin_grace)

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
            static = self.static
            session: SimSession = yield Call(
                "join", lambda s, now: s.join(member, ttl, now, memory, static=static)
            )
            lease.start(session, started)
            self.handled_generation = 0
            return 0.0
        session = lease.session
        sid = session.session_id
        wait = max(min(lease.deadline - self.now(), MAX_WAIT), 0.0)
        last = self.last_view
        if (
            last is not None
            and last[0] == sid
            and idle(self.config.protocol, last[1], dict(self.held), self.handled_generation)
        ):
            # As the reconciler: an idle member reads its view again only if its head moved.
            head: MemberHead = yield Call("member_head", lambda s, now: s.member_head(sid, now))
            if head == head_of(last[1]):
                return wait
        self.last_view = None
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
        self.last_view = (sid, view)
        return wait

    def _revoke(self, session: SimSession, resources: set[str]) -> Generator[Effect, Any, None]:
        owned = {r: self.held.pop(r) for r in sorted(resources) if r in self.held}
        if self.lease.valid_session() is not session:
            return
        sid = session.session_id
        view_only = resources - set(owned)
        if view_only:
            view: MemberView = yield Call("member_view", lambda s, now: s.member_view(sid, now))
            owned.update({r: e for r, e in (view.owned or {}).items() if r in view_only})
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
        """``CoordinatorLoop``: one read per step, the product's ``decide``, its actions."""
        self.running += 1
        while not self.stopping:
            timeout = MAX_WAIT
            try:
                timeout = yield from self._coordinator_step()
            except IllegalTransition:
                raise  # a bug in the rules: end the run loudly
            except FencedError:
                self.coordination = rules.fenced(self.coordination)
                timeout = 0.0
            except BackendError:
                timeout = min(self.config.effective_heartbeat_interval, MAX_WAIT)
            except RebalancerError:
                pass
            timeout = min(timeout, MAX_WAIT)
            if timeout > 0:
                yield Wait(timeout, wakeable=True)
        self.running -= 1

    @property
    def epoch(self) -> int | None:
        return self.coordination.epoch

    def _coordinator_step(self) -> Generator[Effect, Any, float]:
        session = self.lease.valid_session()
        view = None
        if session is not None:
            sid, memory = session.session_id, self.memory
            group: GroupState = yield Call("state", lambda s, now: s.state(now, memory))
            view = GroupView.of(self.member_id, sid, group)
        now = self.now()
        state, actions = rules.decide(self.coordination, view, now, self.settings)
        for _ in range(4):
            *done, last = actions
            if not isinstance(last, Elect | Discover):
                wake = yield from self._carry_out(actions, session, view)
                self.coordination = state
                return max(wake - self.now(), 0.0)
            yield from self._carry_out(done, session, view)
            assert session is not None and view is not None
            sid, memory = session.session_id, self.memory
            if isinstance(last, Elect):
                record = yield Call("elect", functools.partial(_elect, sid, memory))
                view = view.with_coordinator(record)
                state, actions = rules.elected(state, record, view, now)
            else:
                changed = yield from self._list(session, view.resources_version)
                state, actions = rules.listed(state, now, changed=changed)
            self.coordination = state
            if actions and isinstance(actions[-1], WakeAt):
                wake = yield from self._carry_out(actions, session, view)
                return max(wake - self.now(), 0.0)
            yield from self._carry_out(actions, session, view)
            state, actions = rules.decide(state, view, now, self.settings)
        raise RebalancerError(f"the coordinator's decision did not end: {actions}")

    def _list(self, session: SimSession, version: int) -> Generator[Effect, Any, bool]:
        assert self.discover is not None
        listing, memory = self.discover(), self.memory
        if self.lease.valid_session() is not session:
            return False
        after: int = yield Call(
            "update_resources", lambda s, now: s.update_resources(listing, now, memory)
        )
        return after != version

    def _carry_out(
        self, actions: list[Action], session: SimSession | None, view: GroupView | None
    ) -> Generator[Effect, Any, float]:
        wake = self.now() + MAX_WAIT
        for action in actions:
            if isinstance(action, WakeAt):
                wake = action.at
            elif session is None or view is None:
                continue
            elif isinstance(action, Publish):
                yield from self._publish(session, action, view)
            elif isinstance(action, Emit):
                self.hooks.emitted(self, action.reason)
            elif isinstance(action, ForgetDrains) and self.lease.valid_session() is session:
                control = action.control.undrain_members(action.members)
                expected = action.control.version
                with contextlib.suppress(ControlConflict):
                    yield Call(
                        "update_control", functools.partial(_update_control, expected, control)
                    )
        return wake

    def _publish(
        self, session: SimSession, action: Publish, view: GroupView
    ) -> Generator[Effect, Any, None]:
        sid, memory = session.session_id, self.memory
        target = view.target
        previous = {m: set(rs) for m, rs in target.assignment.items()} if target else {}
        published: Target = yield Call(
            "publish",
            lambda s, now: s.publish(
                sid,
                action.epoch,
                action.assignment,
                action.phase,
                action.resources_version,
                now,
                memory,
            ),
        )
        if action.phase is Phase.RUNNING:
            self.hooks.published(self, published, previous, action)
