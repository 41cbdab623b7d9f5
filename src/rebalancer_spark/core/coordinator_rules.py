"""What the coordinator decides, as pure functions of (state, one read of the group, now).

:func:`decide` takes one step: from the :class:`~.coordinator.CoordinatorState`, the
:class:`~.coordinator.GroupView` read at the start of the step and ``now``, it returns the next
state and the actions to carry out, in order. Two actions need an answer before the step can
go on, and their answers come back through a function of their own, which decides again on the
same read (no second read, and at most one plan per step):

* :class:`~.coordinator.Elect` → :func:`elected` (the coordinator record the store returned);
* :class:`~.coordinator.Discover` → :func:`listed` (whether the resource set changed: if it
  did, the step ends and the next one reads the group anew).

The rule for the caller: an action list ending in ``Elect`` or ``Discover`` waits for that
answer; the feedback function's actions are carried out, and unless they end with a
:class:`~.coordinator.WakeAt` the caller calls :func:`decide` again with the same read.

The rules, for a member that coordinates:

1. **Debounce.** A change of the present members or of the resource set starts a stability
   window; further changes restart it; the target is published once the group has been quiet
   for ``stability_window`` or ``max_rebalance_delay`` after the first change.
2. **Rejoin grace.** A static member whose session ended keeps its part of the target (it counts
   as present) for ``rejoin_grace`` seconds from when the coordinator first missed it.
3. **Plan** with :func:`~.control.plan_target` under the group's control record; a change of the
   record is applied at once, without the window (and adopted without events by a new
   coordinator); one ``control`` event per transition, ``drain done`` once a drained member
   owns nothing; drained members absent for ``session_timeout + rejoin_grace`` are removed
   from the record.
4. **Barrier** (``global_barrier``): the current target goes out in phase ``stopping`` first;
   the new one follows once every member acknowledged or ``barrier_timeout`` passed.
5. **Discovery**: when the role is taken, every ``discovery_interval`` and after an operator's
   ``rebalance`` request.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet

from rebalancer_spark.core.assignors import get_assignor, moved
from rebalancer_spark.core.config import ProtocolName
from rebalancer_spark.core.control import Control, control_changes, plan_target
from rebalancer_spark.core.coordinator import (
    Action,
    CoordinatorState,
    Discover,
    Elect,
    Emit,
    ForgetDrains,
    GroupView,
    Note,
    Publish,
    Role,
    Settings,
    WakeAt,
)
from rebalancer_spark.core.events import Trigger
from rebalancer_spark.core.model import CoordinatorRecord, Phase, Target

__all__ = ["IDLE_WAIT", "decide", "elected", "fenced", "listed", "rediscover"]

IDLE_WAIT = 1.0
"""The longest the coordinator waits before it looks at the group again (seconds)."""

Step = tuple[CoordinatorState, list[Action]]


def decide(state: CoordinatorState, view: GroupView | None, now: float, settings: Settings) -> Step:
    """One step of the coordinator: ``view`` is what this step read (None: the member has no
    valid session, so it reads nothing and coordinates nothing)."""
    if view is None:
        return state.to(Role.FOLLOWER, epoch=None), [WakeAt(now + IDLE_WAIT)]
    group = view
    statics = {m for m, rec in group.members.items() if rec.static}
    if not statics <= state.static_seen:
        state = state.update(static_seen=state.static_seen | statics)
    coordinator = group.coordinator
    if coordinator is not None:
        state = state.update(seen_epoch=coordinator.epoch)
    ours = coordinator is not None and coordinator.session_id == view.session_id
    if coordinator is None or (ours and state.epoch != coordinator.epoch):
        return state.to(Role.CANDIDATE, epoch=None), [Elect()]
    if not ours:
        return state.to(Role.FOLLOWER, epoch=None), [WakeAt(now + IDLE_WAIT)]
    requests = group.control.rebalance_requests
    if state.listed_for_requests != requests:
        # An operator's `rebalance` also lists the source now (discovery on demand).
        due = 0.0 if state.listed_for_requests is not None else state.next_discovery
        state = state.update(listed_for_requests=requests, next_discovery=due)
    if settings.discovery_interval is not None and now >= state.next_discovery:
        return state.update(next_discovery=now + settings.discovery_interval), [Discover()]
    return _coordinate(state, view, coordinator.epoch, now, settings)


def elected(
    state: CoordinatorState, record: CoordinatorRecord | None, view: GroupView, now: float
) -> Step:
    """Go on after :class:`~.coordinator.Elect` answered ``record`` (the coordinator after
    the attempt; None if this member's session has lapsed). Won: the state of a new
    coordinator, and no :class:`~.coordinator.WakeAt`, so the caller decides again on the same
    read (with ``view.with_coordinator(record)``); lost: a follower's state and its wait."""
    if record is None or record.session_id != view.session_id:
        seen = state.seen_epoch if record is None else record.epoch
        return state.to(Role.FOLLOWER, epoch=None, seen_epoch=seen), [WakeAt(now + IDLE_WAIT)]
    state = state.to(
        Role.IDLE,
        epoch=record.epoch,
        seen_epoch=record.epoch,
        pending=None,
        stopping_since=None,
        control=None,
        forced=False,
        away_since={},
        drain_absent_since={},
        next_discovery=0.0,
    )
    return state, [Note(f"member {view.member_id} is now coordinator at epoch {record.epoch}")]


def listed(state: CoordinatorState, now: float, *, changed: bool) -> Step:
    """Go on after :class:`~.coordinator.Discover`: a changed resource set ends the step (the
    next one reads it); otherwise (unchanged, or a failed listing, which changes nothing) no
    :class:`~.coordinator.WakeAt`: the caller decides again on the same read."""
    return state, [WakeAt(now)] if changed else []


def fenced(state: CoordinatorState) -> CoordinatorState:
    """A write was refused for a stale coordinator epoch, or the thread stepped down."""
    return state.to(Role.FOLLOWER, epoch=None)


def rediscover(state: CoordinatorState) -> CoordinatorState:
    """List the source at the next step (if coordinating)."""
    return state.update(next_discovery=0.0)


# -- coordinating ------------------------------------------------------------------------------


def _coordinate(
    state: CoordinatorState, view: GroupView, epoch: int, now: float, settings: Settings
) -> Step:
    group = view
    present, grace_end, away = _present(state, group, now, settings)
    state = state.update(
        away_since=away, present_members=len(present), listed_resources=len(group.resources)
    )
    wake = now + IDLE_WAIT if grace_end is None else max(grace_end, now)
    if settings.discovery_interval is not None:
        wake = min(wake, state.next_discovery)
    state, gone = _departed_drains(state, group, now, settings)
    if gone:
        note = f"drained members {sorted(gone)} left the group: drain ended"
        return state, [ForgetDrains(group.control, gone), Note(note), WakeAt(now)]
    target = group.target
    if target is not None and target.phase is Phase.STOPPING:
        return _finish_barrier(state, group, epoch, present, target, now, settings)

    inputs = (frozenset(present), group.resources_version)
    unchanged = (
        target is not None
        and frozenset(target.assignment) == inputs[0]
        and target.resources_version == inputs[1]
    )
    state, actions, done = _control(state, group, epoch, present, now, settings, unchanged)
    if done is not None:
        return done
    state, drains = _report_drains(state, group, epoch)
    actions.extend(drains)
    if unchanged:
        return state.to(Role.IDLE, pending=None), [*actions, WakeAt(wake)]
    if not present and target is None:
        return state.to(_resting(state)), [*actions, WakeAt(wake)]
    return _debounce(state, group, epoch, present, inputs, now, settings, actions, wake)


def _control(
    state: CoordinatorState,
    group: GroupView,
    epoch: int,
    present: set[str],
    now: float,
    settings: Settings,
    unchanged: bool,
) -> tuple[CoordinatorState, list[Action], Step | None]:
    """Adopt a new control record: a rebalance at once when it changes the plan (the step is
    then done: third item), else only its events."""
    control, applied, target = group.control, state.control, group.target
    if applied is not None and applied.version == control.version:
        return state, [], None
    if applied is not None and applied.ownership() == control.ownership():
        # Only progress requests (and the history) changed: nothing to plan, no rebalance.
        state, actions = _adopt(state, control, epoch)
        return state, list(actions), None
    forced = applied is not None and control.rebalance_requests > applied.rebalance_requests
    current = {m: frozenset(rs) for m, rs in target.assignment.items()} if target else None
    desired = _plan(group, present, target, forced, settings)
    # A new coordinator facing other changes too lets the stability window run.
    now_due = applied is not None or unchanged
    if present and now_due and (forced or desired != current):
        cause = f"control v{control.version}" + (": rebalance requested" if forced else "")
        state = state.update(forced=forced, operator_cause=cause)
        state, publish = _rebalance_now(state, group, epoch, present, now, settings, desired)
        state, adopt = _adopt(state, control, epoch)
        return state, [], (state, [*publish, *adopt, WakeAt(now)])
    state, actions = _adopt(state, control, epoch)
    return state, list(actions), None


def _debounce(
    state: CoordinatorState,
    group: GroupView,
    epoch: int,
    present: set[str],
    inputs: tuple[frozenset[str], int],
    now: float,
    settings: Settings,
    actions: list[Action],
    wake: float,
) -> Step:
    """Members or resources changed: rebalance once the group has been quiet for the
    stability window, or the maximum delay since the first change has passed."""
    if inputs != state.pending:
        first = now if state.pending is None else state.first_change
        state = state.update(pending=inputs, first_change=first, last_change=now)
    due = min(
        state.last_change + settings.stability_window,
        state.first_change + settings.max_rebalance_delay,
    )
    if now < due:
        return state.to(Role.DEBOUNCING), [*actions, WakeAt(min(wake, due))]
    state, publish = _rebalance_now(state, group, epoch, present, now, settings, None)
    return state, [*actions, *publish, WakeAt(now if state.role is Role.BARRIER else wake)]


def _resting(state: CoordinatorState) -> Role:
    return Role.IDLE if state.pending is None else Role.DEBOUNCING


def _present(
    state: CoordinatorState, group: GroupView, now: float, settings: Settings
) -> tuple[set[str], float | None, dict[str, float]]:
    """Members the target must cover, when the next static member's grace ends, and the
    static members away (since when)."""
    present = {m for m, rec in group.members.items() if not rec.leaving}
    away = dict(state.away_since)
    next_expiry: float | None = None
    previous = group.target.assignment if group.target else {}
    grace = settings.rejoin_grace
    for member in previous:
        if member in group.members or member not in state.static_seen or grace <= 0:
            away.pop(member, None)
            continue
        end = away.setdefault(member, now) + grace
        if now < end:  # compared as the wake-up time is computed, so that it is exact
            present.add(member)
            next_expiry = end if next_expiry is None else min(next_expiry, end)
    return present, next_expiry, away


def _departed_drains(
    state: CoordinatorState, group: GroupView, now: float, settings: Settings
) -> tuple[CoordinatorState, frozenset[str]]:
    """Drained members gone from the group for a session timeout plus their rejoin grace (one
    whose lease merely lapsed rejoins sooner and stays drained)."""
    absent = {m for m in group.control.drain if m not in group.members}
    since = {m: t for m, t in state.drain_absent_since.items() if m in absent}
    wait = settings.session_timeout + settings.rejoin_grace
    gone = frozenset(
        m
        for m in sorted(absent)
        if m not in state.away_since and now >= since.setdefault(m, now) + wait
    )
    return state.update(drain_absent_since=since), gone


def _plan(
    group: GroupView,
    present: AbstractSet[str],
    target: Target | None,
    forced: bool,
    settings: Settings,
) -> dict[str, frozenset[str]]:
    previous: Mapping[str, frozenset[str]] = target.assignment if target else {}
    weights = {r.id: r.weight for r in group.resources.values()}
    assignor = get_assignor(settings.assignor)
    return plan_target(assignor, present, weights, previous, group.control, forced=forced)


def _rebalance_now(
    state: CoordinatorState,
    group: GroupView,
    epoch: int,
    present: set[str],
    now: float,
    settings: Settings,
    desired: Mapping[str, frozenset[str]] | None,
) -> Step:
    """Publish the new target, or under the global barrier its ``stopping`` phase first."""
    target = group.target
    if settings.protocol is ProtocolName.GLOBAL_BARRIER and target is not None:
        stopping = Publish(
            epoch=epoch,
            assignment=target.assignment,
            phase=Phase.STOPPING,
            resources_version=target.resources_version,
            members=frozenset(group.members),
            control=group.control,
        )
        return state.to(Role.BARRIER, stopping_since=now), [stopping]
    return _publish(state, group, epoch, present, now, settings, desired)


def _publish(
    state: CoordinatorState,
    group: GroupView,
    epoch: int,
    present: set[str],
    now: float,
    settings: Settings,
    desired: Mapping[str, frozenset[str]] | None,
) -> Step:
    target = group.target
    assignment = (
        _plan(group, present, target, state.forced, settings) if desired is None else desired
    )
    previous: Mapping[str, frozenset[str]] = target.assignment if target else {}
    started = state.first_change if state.pending is not None else now
    state, trigger, why = _cause(state, group, present, target)
    # Resources another member had before: set operations in C (a target is a partition).
    before: set[str] = set().union(*previous.values())
    changes = sum(
        len(before.intersection(rs).difference(previous.get(m, ()))) for m, rs in assignment.items()
    )
    publish = Publish(
        epoch=epoch,
        assignment=dict(assignment),
        phase=Phase.RUNNING,
        resources_version=group.resources_version,
        members=frozenset(present),
        control=group.control,
        resources=len(group.resources),
        started_at=started,
        moved=moved(previous, assignment),
        trigger=trigger,
        reason=why,
        moves=changes,
    )
    return state.to(Role.IDLE, forced=False, pending=None, stopping_since=None), [publish]


def _finish_barrier(
    state: CoordinatorState,
    group: GroupView,
    epoch: int,
    present: set[str],
    target: Target,
    now: float,
    settings: Settings,
) -> Step:
    since = now if state.stopping_since is None else state.stopping_since  # maybe inherited
    state = state.update(stopping_since=since)
    waiting = sorted(
        m for m, rec in group.members.items() if rec.acked_generation < target.generation
    )
    deadline = since + settings.barrier_timeout
    if waiting and now < deadline:
        return state.to(Role.BARRIER), [WakeAt(deadline)]
    notes: list[Action] = []
    if waiting:
        notes.append(
            Note(
                f"barrier timed out after {settings.barrier_timeout:.1f} s "
                f"without acknowledgements from {waiting}; their resources stay claimed until "
                "they release them or their leases expire",
                warn=True,
            )
        )
    state, publish = _publish(state, group, epoch, present, now, settings, None)
    return state, [*notes, *publish, WakeAt(now + IDLE_WAIT)]


# -- operator control ----------------------------------------------------------------------------


def _adopt(state: CoordinatorState, control: Control, epoch: int) -> Step:
    """Note ``control`` as applied; its transitions become events unless the role is new."""
    previous = state.control
    state = state.update(control=control)
    if previous is None:
        return state, [Note(f"control record adopted: {control.describe()}")]
    state = state.update(drain_done=state.drain_done & control.drain)
    return state, [
        Emit(epoch, resource, why) for resource, why in control_changes(previous, control)
    ]


def _report_drains(state: CoordinatorState, group: GroupView, epoch: int) -> Step:
    """``drain done`` once for each drained member that owns nothing any more."""
    target, control = group.target, group.control
    todo = sorted(control.drain - state.drain_done)
    if not todo:
        return state, []
    claimed = group.holders
    done: list[str] = []
    for member in todo:
        if member not in group.members or target is None or target.assignment.get(member):
            continue
        if member not in claimed:
            done.append(member)
    if not done:
        return state, []
    why = f"control v{control.version}: drain done"
    state = state.update(drain_done=state.drain_done | set(done))
    return state, [Emit(epoch, "", f"{why} {m}") for m in done]


def _cause(
    state: CoordinatorState, group: GroupView, present: set[str], target: Target | None
) -> tuple[CoordinatorState, Trigger, str]:
    """What caused the target about to be published, and the details for ``reason``: the first
    target; members that joined, left (drained) or vanished (crashed: their session ended
    without draining); a changed resource set; an operator's command."""
    operator = state.operator_cause
    seen_leaving = (state.seen_leaving & set(group.members)) | {
        m for m, rec in group.members.items() if rec.leaving
    }
    state = state.update(operator_cause=None, seen_leaving=frozenset(seen_leaving))
    if target is None:
        return state, Trigger.START, f"start: {len(present)} members"
    before = set(target.assignment)
    joined, gone = sorted(present - before), sorted(before - present)
    left = [m for m in gone if m in group.members or m in seen_leaving]
    crashed = [m for m in gone if m not in left]
    # Several causes at once: the trigger is the first of crash, leave, join; the reason names
    # them all.
    causes = [
        (trigger, f"{trigger.value}: {', '.join(who)}")
        for trigger, who in (
            (Trigger.CRASH, crashed),
            (Trigger.LEAVE, left),
            (Trigger.JOIN, joined),
        )
        if who
    ]
    if causes:
        return state, causes[0][0], "; ".join(why for _, why in causes)
    had = {r for rs in target.assignment.values() for r in rs}
    added, removed = len(set(group.resources) - had), len(had - set(group.resources))
    if operator is None and (added or removed):
        return state, Trigger.DISCOVERY, f"discovery: +{added} -{removed}"
    return state, Trigger.OPERATOR, f"operator: {operator or 'control'}"
