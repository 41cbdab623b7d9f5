"""The coordinator's state machine (core.coordinator, core.coordinator_rules) on a manual clock:
no threads, no store, no sleeps. A small in-memory group plays the store; each step reads it
once, calls ``decide`` and carries out the actions as the coordinator thread does."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer_spark.core import control
from rebalancer_spark.core import coordinator_rules as rules
from rebalancer_spark.core.config import ProtocolName
from rebalancer_spark.core.control import Control
from rebalancer_spark.core.coordinator import (
    TRANSITIONS,
    Action,
    CoordinatorState,
    Discover,
    Elect,
    Emit,
    ForgetDrains,
    GroupView,
    IllegalTransition,
    Publish,
    Role,
    Settings,
    WakeAt,
)
from rebalancer_spark.core.model import (
    Claim,
    CoordinatorRecord,
    GroupState,
    MemberRecord,
    Phase,
    Resource,
    Target,
)

ME = "coord"
WINDOW = 0.1005
MAX_DELAY = 1.0005


@dataclass
class Group:
    """The store's side, in memory: one read is :meth:`read`."""

    members: dict[str, MemberRecord] = field(default_factory=dict)
    resources: dict[str, Resource] = field(default_factory=dict)
    resources_version: int = 1
    coordinator: CoordinatorRecord | None = None
    epoch: int = 0
    target: Target | None = None
    generation: int = 0
    control: Control = field(default_factory=Control)
    published: list[tuple[float, Target]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    def read(self) -> GroupState:
        claims = {}
        if self.target is not None and self.target.phase is Phase.RUNNING:
            claims = {
                r: Claim(r, m, f"s-{m}", 1)
                for m, rs in self.target.assignment.items()
                if m in self.members
                for r in rs
            }
        return GroupState(
            "g",
            dict(self.members),
            self.coordinator,
            dict(self.resources),
            self.resources_version,
            self.target,
            claims,
            self.control,
        )

    def join(self, member: str, *, static: bool = False) -> None:
        self.members[member] = MemberRecord(member, f"s-{member}", static=static)

    def elect(self, member: str) -> CoordinatorRecord:
        if self.coordinator is None:
            self.epoch += 1
            self.coordinator = CoordinatorRecord(member, f"s-{member}", self.epoch)
        return self.coordinator

    def ack_all(self, generation: int, members: set[str]) -> None:
        for m in members:
            self.members[m] = replace(self.members[m], acked_generation=generation)


@dataclass
class Coordinator:
    """The coordinator thread's executor, single-threaded, on a manual clock."""

    group: Group
    settings: Settings
    state: CoordinatorState = field(default_factory=CoordinatorState)
    plans: list[int] = field(default_factory=list)
    roles: list[Role] = field(default_factory=list)

    def step(self, now: float) -> float:
        """One step at ``now``; returns when to look again."""
        view = GroupView.of(ME, f"s-{ME}", self.group.read())
        state, actions = rules.decide(self.state, view, now, self.settings)
        for _ in range(4):
            *done, last = actions
            if not isinstance(last, Elect | Discover):
                wake = self._carry_out(actions, now)
                self._set(state)
                return wake
            self._carry_out(done, now)
            if isinstance(last, Elect):
                record = self.group.elect(ME)
                view = view.with_coordinator(record)
                state, actions = rules.elected(state, record, view, now)
            else:
                state, actions = rules.listed(state, now, changed=False)
            self._set(state)
            if actions and isinstance(actions[-1], WakeAt):
                return self._carry_out(actions, now)
            self._carry_out(actions, now)
            state, actions = rules.decide(state, view, now, self.settings)
        raise AssertionError(f"the step did not end: {actions}")

    def _set(self, state: CoordinatorState) -> None:
        self.state = state  # every move was checked against the table by CoordinatorState.to
        self.roles.append(state.role)

    def _carry_out(self, actions: Sequence[Action], now: float) -> float:
        wake = now + rules.IDLE_WAIT
        g = self.group
        for action in actions:
            if isinstance(action, WakeAt):
                wake = action.at
            elif isinstance(action, Publish):
                assert g.coordinator is not None and action.epoch == g.coordinator.epoch
                g.generation += 1
                g.target = Target(
                    g.generation,
                    action.epoch,
                    {m: frozenset(rs) for m, rs in action.assignment.items()},
                    action.phase,
                    action.resources_version,
                )
                g.published.append((now, g.target))
            elif isinstance(action, Emit):
                g.events.append(action.reason)
            elif isinstance(action, ForgetDrains):
                g.control = action.control.undrain_members(action.members)
        return wake


def _remove(group: Group, member: str) -> None:
    del group.members[member]


def _settings(**changes: object) -> Settings:
    base = Settings(stability_window=WINDOW, max_rebalance_delay=MAX_DELAY, session_timeout=2.0)
    return replace(base, **changes)  # type: ignore[arg-type]


def _run(
    coordinator: Coordinator,
    start: float,
    until: float,
    changes: dict[float, Callable[[], None]] | list[tuple[float, Callable[[], None]]],
) -> None:
    """Step at every change (changes first at equal times) and whenever the machine asks."""
    listed = list(changes.items()) if isinstance(changes, dict) else list(changes)
    pending = sorted(listed, key=lambda change: change[0])
    now, same = start, 0
    wake = coordinator.step(now)
    while True:
        nxt = min([wake, *(t for t, _ in pending[:1])])
        if nxt > until:
            return
        same = same + 1 if nxt <= now else 0
        assert same < 10, f"the machine asks to look again at t={nxt} for ever (now {now})"
        now = max(now, nxt)
        while pending and pending[0][0] <= now:
            pending.pop(0)[1]()
        wake = coordinator.step(now)


def _stable(members: list[str], resources: int = 6, **settings: object) -> Coordinator:
    group = Group()
    for m in members:
        group.join(m, static=m.startswith("static"))
    group.resources = {f"r{i}": Resource(f"r{i}") for i in range(resources)}
    coordinator = Coordinator(group, _settings(**settings))
    _run(coordinator, 0.0, 5.0, {})
    assert group.target is not None and set(group.target.assignment) == set(members)
    group.published.clear()
    return coordinator


@dataclass
class _Recording(Coordinator):
    """A :class:`Coordinator` that keeps the publications it carried out."""

    publications: list[Publish] = field(default_factory=list)

    def _carry_out(self, actions: Sequence[Action], now: float) -> float:
        self.publications.extend(a for a in actions if isinstance(a, Publish))
        return super()._carry_out(actions, now)


def test_a_publication_counts_the_resources_that_change_owner() -> None:
    """``moves``: every resource of the previous target that the new one gives to another
    member, a departed member's included; a new resource is not a move."""
    stable = _stable([ME, "b", "c"], resources=6)
    group = stable.group
    before = group.target
    assert before is not None
    _remove(group, "c")
    group.resources |= {r: Resource(r) for r in ("r6", "r7", "r8")}
    group.resources_version += 1
    coordinator = _Recording(group, stable.settings, stable.state)
    _run(coordinator, 5.0, 10.0, {})
    (publication,) = coordinator.publications
    owner = {r: m for m, rs in before.assignment.items() for r in rs}
    changed = {
        r for m, rs in publication.assignment.items() for r in rs if r in owner and owner[r] != m
    }
    assert changed == before.assignment["c"]  # sticky: only the departed member's two move
    assert publication.moves == 2
    joined = publication.assignment
    group.join("d")  # a join: present members give the newcomer some of theirs
    _run(coordinator, 10.0, 15.0, {})
    last = coordinator.publications[-1]
    given = last.assignment["d"]
    assert given and all(any(r in rs for rs in joined.values()) for r in given)
    assert last.moves == len(given)


# -- the transitions table -----------------------------------------------------------------------


def test_every_role_move_outside_the_table_is_refused() -> None:
    for old, new in itertools.product(Role, Role):
        state = CoordinatorState(role=old)
        if new in TRANSITIONS[old]:
            assert state.to(new).role is new
        else:
            with pytest.raises(IllegalTransition, match=f"from {old.value} to {new.value}"):
                state.to(new)


def test_a_new_coordinator_goes_through_candidate_idle_and_debouncing() -> None:
    group = Group()
    group.join(ME)
    view = GroupView.of(ME, f"s-{ME}", group.read())
    state, actions = rules.decide(CoordinatorState(), view, 0.0, _settings())
    assert state.role is Role.CANDIDATE and actions == [Elect()]
    record = group.elect(ME)
    view = view.with_coordinator(record)
    state, actions = rules.elected(state, record, view, 0.0)
    assert state.role is Role.IDLE and state.epoch == 1
    assert not any(isinstance(a, WakeAt) for a in actions), "won: decide again on the read"
    state, actions = rules.decide(state, view, 0.0, _settings())
    assert state.role is Role.DEBOUNCING and actions[-1] == WakeAt(WINDOW)
    state, actions = rules.decide(state, view, WINDOW, _settings())
    assert state.role is Role.IDLE
    assert [a.phase for a in actions if isinstance(a, Publish)] == [Phase.RUNNING]


def test_a_follower_stays_a_follower_and_plans_nothing() -> None:
    group = Group()
    group.join("other")
    group.join(ME)
    group.coordinator = CoordinatorRecord("other", "s-other", 7)
    view = GroupView.of(ME, f"s-{ME}", group.read())
    state, actions = rules.decide(CoordinatorState(), view, 10.0, _settings())
    assert state.role is Role.FOLLOWER and state.seen_epoch == 7
    assert actions == [WakeAt(10.0 + rules.IDLE_WAIT)]
    state, actions = rules.decide(state, None, 11.0, _settings())  # the session lapsed
    assert state.role is Role.FOLLOWER and state.epoch is None


# -- debounce and the maximum delay ---------------------------------------------------------------

gaps = st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(gaps=gaps)
def test_a_change_is_published_after_the_window_or_the_maximum_delay(gaps: list[int]) -> None:
    """Members join at times spaced by ``gaps`` (ms); the new target goes out once the group
    was quiet for the stability window, or the maximum delay after the first change."""
    coordinator = _stable([ME, "b"])
    group = coordinator.group
    first = 10.0
    times = list(itertools.accumulate([first] + [g / 1000 for g in gaps[1:]]))
    last, due = first, first + WINDOW
    for t in times[1:]:
        if t >= due:
            break
        last, due = t, min(t + WINDOW, first + MAX_DELAY)
    changes: list[tuple[float, Callable[[], None]]] = [
        (t, functools.partial(group.join, f"new{i}")) for i, t in enumerate(times)
    ]
    _run(coordinator, first - 1.0, due + 0.0001, changes)
    assert group.published, "nothing published"
    at, target = group.published[0]
    assert at == pytest.approx(due), (times, at, due)
    joined = {f"new{i}" for i, t in enumerate(times) if t <= last}
    assert joined <= set(target.assignment)


# -- static members: the rejoin grace -------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    grace=st.integers(min_value=1, max_value=3000),
    rejoin=st.one_of(st.none(), st.integers(min_value=1, max_value=6000)),
)
def test_a_static_member_keeps_its_part_for_its_rejoin_grace(
    grace: int, rejoin: int | None
) -> None:
    # Off the millisecond grid, also once WINDOW (x.xxx5 s) is added: the rejoin (whole
    # milliseconds) never ties with the publication, whose order at a tie is the harness's.
    grace_s = grace / 1000 + 0.00025
    coordinator = _stable([ME, "b", "static-s"], rejoin_grace=grace_s)
    group = coordinator.group
    assert group.target is not None
    before = group.target.assignment
    gone_at = 20.0
    changes: dict[float, Callable[[], None]] = {gone_at: lambda: _remove(group, "static-s")}
    back = None if rejoin is None else gone_at + rejoin / 1000
    if back is not None:
        changes[back] = lambda: group.join("static-s", static=True)
    _run(coordinator, gone_at - 1.0, gone_at + 10.0, changes)
    if back is not None and back < gone_at + grace_s + WINDOW:
        # back within its grace (or before the window after it ended): nothing moves
        assert group.published == [], "a static member back in time moved something"
        assert group.target is not None and group.target.assignment == before
        return
    assert group.published, "the departed static member's part was never reassigned"
    at, target = group.published[0]
    assert at == pytest.approx(gone_at + grace_s + WINDOW)
    assert "static-s" not in target.assignment


# -- the global barrier ---------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    acks=st.lists(st.integers(min_value=1, max_value=5000), min_size=2, max_size=2),
    timeout=st.integers(min_value=100, max_value=4000),
)
def test_the_barrier_ends_when_all_acknowledged_or_at_its_timeout(
    acks: list[int], timeout: int
) -> None:
    timeout_s = timeout / 1000 + 0.0005
    coordinator = _stable(
        [ME, "b"], protocol=ProtocolName.GLOBAL_BARRIER, barrier_timeout=timeout_s
    )
    group = coordinator.group
    assert group.target is not None
    group.ack_all(group.target.generation, {ME, "b"})
    joined_at = 30.0
    stopping_at = joined_at + WINDOW
    # ME acknowledges first, "b" and "c" together later (never, if after the timeout)
    ack_times = sorted(stopping_at + a / 1000 for a in acks)
    changes: list[tuple[float, Callable[[], None]]] = [
        (joined_at, lambda: group.join("c")),
        (ack_times[0] + 0.0001, lambda: group.ack_all(group.generation, {ME})),
        (ack_times[1] + 0.0001, lambda: group.ack_all(group.generation, {"b", "c"})),
    ]
    _run(coordinator, joined_at - 1.0, stopping_at + timeout_s + 1.0, changes)
    (t_stop, stop), (t_run, run), *_ = group.published
    assert stop.phase is Phase.STOPPING and t_stop == pytest.approx(stopping_at)
    assert run.phase is Phase.RUNNING and "c" in run.assignment
    expected = min(ack_times[1] + 0.0001, stopping_at + timeout_s)
    assert t_run == pytest.approx(expected)
    assert Role.BARRIER in coordinator.roles


# -- operator control and one plan per step --------------------------------------------------


def test_a_control_change_applies_at_once_and_is_written_as_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    coordinator = _stable([ME, "b"])
    group = coordinator.group
    calls: list[int] = []
    plan = control.plan_target

    def counting(*args: object, **kwargs: object) -> dict[str, frozenset[str]]:
        calls.append(1)
        return plan(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(rules, "plan_target", counting)
    group.control = group.control.drain_member("b")
    before = len(calls)
    coordinator.step(50.0)
    assert len(calls) - before == 1, "one step planned more than once"
    at, target = group.published[0]
    assert at == 50.0 and target.assignment["b"] == frozenset()
    assert group.events == [f"control v{group.control.version}: drain b"]
    # b owns nothing now: "drain done" once
    coordinator.step(50.5)
    coordinator.step(51.0)
    assert group.events[1:] == [f"control v{group.control.version}: drain done b"]


def test_a_progress_request_lets_the_stability_window_run_and_moves_nothing() -> None:
    """A request for an owner (or its removal) raises the record's version without touching
    the plan: a join 10 ms earlier still waits its window, and the request is an event."""
    coordinator = _stable([ME, "b"])
    group = coordinator.group
    joined_at = 70.0
    changes = [
        (joined_at, lambda: group.join("c")),
        (joined_at + 0.01, lambda: setattr(group, "control", group.control.with_request("r", "q"))),
    ]
    _run(coordinator, joined_at - 1.0, joined_at + 1.0, changes)
    at, target = group.published[0]
    assert at == pytest.approx(joined_at + WINDOW), "the request cut the stability window"
    assert "c" in target.assignment and len(group.published) == 1
    assert f"control v{group.control.version}: progress request for its owner" in group.events


def test_a_drained_member_gone_for_its_timeout_leaves_the_drain_set() -> None:
    coordinator = _stable([ME, "b"])
    group = coordinator.group
    group.control = group.control.drain_member("b")
    coordinator.step(60.0)
    group.members.pop("b")
    _run(coordinator, 60.0, 60.0 + 2.0 + 0.5, {})
    assert group.control.drain == frozenset()


def _ops() -> st.SearchStrategy[list[tuple[str, int]]]:
    kinds = st.sampled_from(
        ["join", "leave", "leaving", "static", "wait", "drain", "pause", "rebalance", "lose"]
    )
    return st.lists(st.tuples(kinds, st.integers(min_value=0, max_value=2000)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(ops=_ops(), protocol=st.sampled_from(list(ProtocolName)))
def test_any_history_keeps_to_the_table_and_plans_at_most_once_per_step(
    ops: list[tuple[str, int]], protocol: ProtocolName
) -> None:
    calls: list[int] = []
    plan = control.plan_target

    def counting(*args: object, **kwargs: object) -> dict[str, frozenset[str]]:
        calls.append(1)
        return plan(*args, **kwargs)  # type: ignore[arg-type]

    with mock.patch.object(rules, "plan_target", counting):
        _any_history(ops, protocol, calls)


def _any_history(ops: list[tuple[str, int]], protocol: ProtocolName, calls: list[int]) -> None:
    group = Group()
    group.join(ME)
    group.resources = {f"r{i}": Resource(f"r{i}") for i in range(5)}
    coordinator = Coordinator(group, _settings(protocol=protocol, rejoin_grace=0.5))
    now, names = 0.0, itertools.count()
    for kind, n in ops:
        others = sorted(m for m in group.members if m != ME)
        pick = others[n % len(others)] if others else None
        if kind == "join":
            group.join(f"m{next(names)}")
        elif kind == "static":
            group.join(f"static{next(names)}", static=True)
        elif kind == "leave" and pick:
            group.members.pop(pick)
        elif kind == "leaving" and pick:
            group.members[pick] = replace(group.members[pick], leaving=True)
        elif kind == "drain" and pick:
            group.control = group.control.drain_member(pick)
        elif kind == "pause":
            group.control = group.control.pause() if n % 2 else group.control.resume()
        elif kind == "rebalance":
            group.control = group.control.request_rebalance()
        elif kind == "lose":  # another member took the role; later it is vacant again
            group.coordinator = None if n % 2 else CoordinatorRecord("x", "s-x", group.epoch + 1)
            group.epoch += 1
        if group.generation:
            group.ack_all(group.generation, set(group.members))
        now += n / 1000
        before = len(calls)
        coordinator.step(now)
        assert len(calls) - before <= 1
        ours = group.coordinator is not None and group.coordinator.member_id == ME
        assert coordinator.state.coordinating == ours
        if not ours:
            assert coordinator.state.role is Role.FOLLOWER and coordinator.state.epoch is None
