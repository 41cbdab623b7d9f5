"""Coordinator duties, run by every member on its own thread and acted on by the elected one.

Every member's coordinator thread watches the group. When the role is vacant (its holder left
or its session expired) it tries to take it; the store raises the coordinator epoch by one for
the winner. The coordinator then turns each change of members or resources into a new target:

1. **Debounce.** A change starts a stability window; further changes restart it, and a
   rebalance happens once the group has been quiet for ``stability_window`` seconds or
   ``max_rebalance_delay`` after the first change, whichever comes first. A rolling restart
   thus becomes one rebalance.
2. **Delayed rebalance for static members.** A static member whose session ends keeps its
   part of the target for ``rejoin_grace`` seconds; if it rejoins under the same id meanwhile,
   nothing moves at all.
3. **Assign.** The assignor (sticky by default) computes the new target from the present
   members, the resource set and the previous target; draining members get nothing.
4. **Publish**, fenced by the coordinator epoch. Under the global barrier protocol the
   coordinator first publishes a ``stopping`` phase and waits for every member's
   acknowledgement (or ``barrier_timeout``) before publishing the new target.

5. **Operator control** (:mod:`rebalancer_spark.core.control`). The group's control record
   comes with every snapshot; targets are computed by :func:`plan_target` under it (pause,
   drains, pins, imbalance threshold). A change of the record is applied at once, without the
   stability window: if it changes the target (or is a ``rebalance`` request, which forces a
   full balance) a new target is published. Once applied, one ``control`` event per
   transition goes to the event sinks (the audit table), and ``drain done`` once a drained
   member owns nothing. Drain entries of members that left the group are removed from the
   record. A coordinator that takes over adopts the record without writing events for it.

A coordinator whose lease lapses, or whose write is fenced, simply stops acting: nothing it
could still write would be accepted.

**Discovery.** Given a ``discover`` callable (a source's listing), the coordinator runs it when
it takes the role, every ``discovery_interval`` seconds and on :meth:`rediscover`, and replaces
the group's resource set with the result. A listing that fails changes nothing (resources still
listed are never revoked because a listing failed); the error is kept in
:attr:`CoordinatorLoop.discovery_error` for the group's status and retried at the next interval.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from rebalancer_spark.backends.base import Backend, Session, Watch
from rebalancer_spark.core.assignors import get_assignor, moved
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.config import MemberConfig, ProtocolName
from rebalancer_spark.core.control import Control, control_changes, plan_target
from rebalancer_spark.core.errors import (
    BackendError,
    ControlConflict,
    FencedError,
    RebalancerError,
)
from rebalancer_spark.core.events import EventKind, EventSink, OwnershipEvent, Trigger
from rebalancer_spark.core.model import GroupState, Phase, Resource, Target

__all__ = ["CoordinatorLoop", "RebalanceRecord"]

log = logging.getLogger("rebalancer_spark.coordinator")

_IDLE_WAIT = 1.0


@dataclass(frozen=True, slots=True)
class RebalanceRecord:
    """One rebalance this coordinator made: when, how long from first change, what moved."""

    generation: int
    epoch: int
    started_at: float
    published_at: float
    members: int
    resources: int
    moved: int


class CoordinatorLoop:
    """The coordinator thread of one member; see the module docstring."""

    def __init__(
        self,
        config: MemberConfig,
        backend: Backend,
        clock: Clock,
        session: Callable[[], Session | None],
        on_rebalance: Callable[[RebalanceRecord], None] | None = None,
        discover: Callable[[], Collection[Resource]] | None = None,
        discovery_interval: float = 30.0,
        event_sinks: Sequence[EventSink] = (),
        info: Mapping[str, str] | None = None,
    ) -> None:
        self._config = config
        self._backend = backend
        self._clock = clock
        self._session = session
        self._on_rebalance = on_rebalance
        self._discover = discover
        self._discovery_interval = discovery_interval
        self._next_discovery = 0.0
        self._listed_for_requests: int | None = None
        """The group's rebalance-request count when the source was last listed on demand."""
        self.discovery_error: str | None = None
        """Why the last listing of the source failed, or None after a good one."""
        self._assignor = get_assignor(config.assignor)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="rebalancer-coordinator", daemon=True
        )
        self.epoch: int | None = None
        """The coordinator epoch while this member coordinates, else None."""
        self.seen_epoch: int | None = None
        """The latest coordinator epoch this member saw, coordinator or not (logs, metrics)."""
        self.present_members = 0
        """Members the latest target covers, as this member last computed it coordinating."""
        self.listed_resources = 0
        """Resources in the group's set, as this member last read it coordinating."""
        self._pending: tuple[frozenset[str], int] | None = None
        self._first_change = 0.0
        self._last_change = 0.0
        self._away_since: dict[str, float] = {}
        self._drain_absent_since: dict[str, float] = {}
        self._static_seen: set[str] = set()
        self._stopping_since: float | None = None
        self._sinks = list(event_sinks)
        self._info = dict(info or {})
        self._control: Control | None = None
        """The control record this coordinator last applied (None: not yet, or new role)."""
        self._forced = False
        self._drain_done: set[str] = set()
        self._operator_cause: str | None = None
        """Why the next target is published, when an operator's control change caused it."""
        self._seen_leaving: set[str] = set()
        """Members seen draining: their departure from the target is a leave, not a crash."""

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def wake(self) -> None:
        """Look at the group again now (a rebalance was requested, the session changed)."""
        self._wake.set()

    def rediscover(self) -> None:
        """List the source again now (if this member coordinates)."""
        self._next_discovery = 0.0
        self._wake.set()

    # -- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        watch: Watch | None = None
        retry = min(self._config.effective_heartbeat_interval, _IDLE_WAIT)
        try:
            while not self._stop.is_set():
                timeout = _IDLE_WAIT
                try:
                    if watch is None:
                        watch = self._backend.watch(self._config.group)
                    timeout = self._step()
                except FencedError as exc:
                    log.info("coordinator step fenced, stepping down: %s", exc)
                    self.epoch = None
                    timeout = 0.0
                except BackendError as exc:
                    log.warning("coordinator step failed, retrying: %s", exc)
                    timeout = retry
                except RebalancerError:
                    log.exception("coordinator step failed")
                    timeout = retry
                except Exception:  # a bug must not leave the group with a silent coordinator
                    log.exception("coordinator step failed unexpectedly; stepping down")
                    self._step_down()
                    timeout = retry
                if self._wake.is_set():
                    self._wake.clear()
                    continue
                # Waits are capped so that stop(), wake() and rediscover() act within a second.
                timeout = min(timeout, _IDLE_WAIT)
                if timeout <= 0:
                    continue
                try:
                    if watch is None:
                        self._stop.wait(timeout)
                    else:
                        watch.wait(timeout)
                except BackendError as exc:
                    log.warning("coordinator watch failed, watching anew: %s", exc)
                    if watch is not None:
                        watch.close()
                    watch = None
                    self._stop.wait(retry)
        except Exception:
            log.exception("coordinator thread of group %s died", self._config.group)
        finally:
            if watch is not None:
                watch.close()

    def _step_down(self) -> None:
        """Give up the coordinator role, if held, so that another member can take it."""
        session, epoch = self._session(), self.epoch
        self.epoch = None
        if session is not None and epoch is not None:
            with contextlib.suppress(Exception):
                self._backend.resign(session, epoch)

    def _step(self) -> float:
        """One look at the group; returns how long to wait before the next if nothing changes."""
        session = self._session()
        if session is None:
            self.epoch = None
            return _IDLE_WAIT
        state = self._backend.state(self._config.group)
        # Remember static members on every step, coordinator or not: a member that takes over
        # after a static coordinator crashed must still give that member its rejoin grace.
        self._static_seen.update(m for m, rec in state.members.items() if rec.static)
        coordinator = state.coordinator
        if coordinator is None or (
            coordinator.session_id == session.session_id and self.epoch != coordinator.epoch
        ):
            coordinator = self._backend.elect(session)
            if coordinator is not None and coordinator.session_id == session.session_id:
                log.info(
                    "member %s is now coordinator of group %s at epoch %d",
                    session.member_id,
                    session.group,
                    coordinator.epoch,
                )
                self._pending = None
                self._stopping_since = None
                self._control = None
                self._forced = False
                self._away_since.clear()
                self._drain_absent_since.clear()
                self._next_discovery = 0.0
                state = self._backend.state(self._config.group)
        if coordinator is not None:
            self.seen_epoch = coordinator.epoch
        if coordinator is None or coordinator.session_id != session.session_id:
            self.epoch = None
            return _IDLE_WAIT
        self.epoch = coordinator.epoch
        requests = state.control.rebalance_requests
        if self._listed_for_requests != requests:
            # An operator's `rebalance` also lists the source now (discovery on demand).
            if self._listed_for_requests is not None:
                self._next_discovery = 0.0
            self._listed_for_requests = requests
        discovery_wait = self._run_discovery(session, state.resources_version)
        if discovery_wait is None:  # the resource set changed: look again
            state = self._backend.state(self._config.group)
            discovery_wait = self._discovery_interval
        return min(self._coordinate(session, coordinator.epoch, state), discovery_wait)

    def _run_discovery(self, session: Session, version: int) -> float | None:
        """List the source if due; return seconds until the next listing, or None if the
        group's resource set changed."""
        if self._discover is None:
            return _IDLE_WAIT
        now = self._clock.monotonic()
        if now < self._next_discovery:
            return self._next_discovery - now
        self._next_discovery = now + self._discovery_interval
        try:
            resources = list(self._discover())
            if self._session() != session:
                # The lease lapsed during a slow listing: this member may no longer coordinate
                # and must not write (the resource-set write is not epoch-fenced).
                return self._discovery_interval
        except Exception as exc:  # a source's failure must never stop the coordinator
            self.discovery_error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "group %s: listing the source failed, keeping the current resource set: %s",
                session.group,
                exc,
            )
            return self._discovery_interval
        self.discovery_error = None
        after = self._backend.update_resources(session.group, replace=resources)
        return None if after != version else self._discovery_interval

    def _present_members(self, state: GroupState, now: float) -> tuple[set[str], float | None]:
        """Members the target must cover, and when the next static member's grace ends."""
        present = {m for m, rec in state.members.items() if not rec.leaving}
        next_expiry: float | None = None
        previous = state.target.assignment if state.target else {}
        grace = self._config.rejoin_grace
        for member in previous:
            if member in state.members or member not in self._static_seen or grace <= 0:
                self._away_since.pop(member, None)
                continue
            since = self._away_since.setdefault(member, now)
            if now - since < grace:
                present.add(member)
                end = since + grace
                next_expiry = end if next_expiry is None else min(next_expiry, end)
        return present, next_expiry

    def _coordinate(self, session: Session, epoch: int, state: GroupState) -> float:
        now = self._clock.monotonic()
        present, grace_end = self._present_members(state, now)
        self.present_members, self.listed_resources = len(present), len(state.resources)
        target = state.target
        wait = _IDLE_WAIT if grace_end is None else max(grace_end - now, 0.0)
        if self._forget_departed_drains(session, state):
            return 0.0  # the record changed: look again

        if target is not None and target.phase is Phase.STOPPING:
            return self._finish_barrier(session, epoch, state, present, target, now)

        inputs = (frozenset(present), state.resources_version)
        unchanged = (
            target is not None
            and frozenset(target.assignment) == inputs[0]
            and target.resources_version == inputs[1]
        )
        control, applied = state.control, self._control
        if applied is None or applied.version != control.version:
            forced = applied is not None and control.rebalance_requests > applied.rebalance_requests
            current = {m: frozenset(rs) for m, rs in target.assignment.items()} if target else None
            desired = self._plan(state, present, target, forced=forced)
            # A new coordinator facing other changes too lets the stability window run.
            now_due = applied is not None or unchanged
            if present and now_due and (forced or desired != current):
                self._forced = forced
                self._operator_cause = f"control v{control.version}" + (
                    ": rebalance requested" if forced else ""
                )
                self._rebalance_now(session, epoch, state, present, target, now)
                self._adopt(session, epoch, control)
                return 0.0
            self._adopt(session, epoch, control)
        self._report_drains(session, epoch, state)

        if unchanged:
            self._pending = None
            return wait
        if not present and target is None:
            return wait
        if inputs != self._pending:
            if self._pending is None:
                self._first_change = now
            self._pending = inputs
            self._last_change = now
        due = min(
            self._last_change + self._config.stability_window,
            self._first_change + self._config.max_rebalance_delay,
        )
        if now < due:
            return min(wait, due - now)
        if self._rebalance_now(session, epoch, state, present, target, now):
            return 0.0
        return wait

    def _rebalance_now(
        self,
        session: Session,
        epoch: int,
        state: GroupState,
        present: set[str],
        target: Target | None,
        now: float,
    ) -> bool:
        """Publish a new target (under the global barrier, its ``stopping`` phase first);
        True if a barrier was started."""
        if self._config.protocol is ProtocolName.GLOBAL_BARRIER and target is not None:
            stop_target = self._backend.publish(
                session,
                epoch,
                target.assignment,
                phase=Phase.STOPPING,
                resources_version=target.resources_version,
            )
            self._stopping_since = now
            log.info(
                "group %s: barrier generation %d published, waiting for %d members",
                session.group,
                stop_target.generation,
                len(state.members),
            )
            return True
        self._publish(session, epoch, state, present, target, now)
        return False

    # -- operator control ---------------------------------------------------------------------

    def _plan(
        self, state: GroupState, present: set[str], target: Target | None, *, forced: bool
    ) -> dict[str, frozenset[str]]:
        previous = {m: set(rs) for m, rs in target.assignment.items()} if target else {}
        weights = {r.id: r.weight for r in state.resources.values()}
        return plan_target(self._assignor, present, weights, previous, state.control, forced=forced)

    def _adopt(self, session: Session, epoch: int, control: Control) -> None:
        """Note ``control`` as applied; write its transitions unless the role is new."""
        previous, self._control = self._control, control
        if previous is None:
            log.info("group %s: control record adopted: %s", session.group, control.describe())
            return
        self._drain_done &= control.drain
        for resource, reason in control_changes(previous, control):
            log.info("group %s: %s %s", session.group, reason, resource)
            self._emit(session, epoch, resource, reason)

    def _report_drains(self, session: Session, epoch: int, state: GroupState) -> None:
        """Write ``drain done`` once for each drained member that owns nothing any more."""
        target = state.target
        for member in sorted(state.control.drain - self._drain_done):
            if member not in state.members or target is None or target.assignment.get(member):
                continue
            if any(c.member_id == member for c in state.claims.values()):
                continue
            self._drain_done.add(member)
            self._emit(session, epoch, "", f"control v{state.control.version}: drain done {member}")

    def _forget_departed_drains(self, session: Session, state: GroupState) -> bool:
        """Remove drained members that left the group from the record; True if it changed.

        A member counts as gone once it has been absent for a session timeout (plus its rejoin
        grace): one whose lease merely lapsed (a pause, a blip) rejoins sooner and stays
        drained."""
        control = state.control
        now = self._clock.monotonic()
        absent = {m for m in control.drain if m not in state.members}
        for member in list(self._drain_absent_since):
            if member not in absent:
                del self._drain_absent_since[member]
        wait = self._config.session_timeout + self._config.rejoin_grace
        gone = {
            m
            for m in absent
            if m not in self._away_since
            and now - self._drain_absent_since.setdefault(m, now) >= wait
        }
        if not gone or self._session() != session:  # a lapsed coordinator writes nothing
            return False
        # On a conflict someone else changed it: the next look sees the new record.
        with contextlib.suppress(ControlConflict):
            note = f"undrain {', '.join(sorted(gone))}: left the group (by coordinator)"
            changed = control.undrain_members(gone).noted(self._clock.wall(), note)
            self._backend.update_control(session.group, control.version, changed)
        log.info(
            "group %s: drained members %s left the group: drain ended", session.group, sorted(gone)
        )
        return True

    def _emit(
        self,
        session: Session,
        epoch: int,
        resource: str,
        reason: str,
        *,
        kind: EventKind = EventKind.CONTROL,
        generation: int | None = None,
        trigger: Trigger | None = None,
        moves: int | None = None,
    ) -> None:
        now = self._clock.wall()
        event = OwnershipEvent(
            kind=kind,
            group=session.group,
            resource=resource,
            member_id=session.member_id,
            session_id=session.session_id,
            epoch=epoch,
            at=now,
            observed_at=now,
            reason=reason,
            info=self._info,
            generation=generation,
            coordinator_epoch=epoch,
            trigger=None if trigger is None else trigger.value,
            moves=moves,
        )
        for sink in self._sinks:
            try:
                sink(event)
            except Exception:
                log.exception("event sink failed for %s", event)

    def _finish_barrier(
        self,
        session: Session,
        epoch: int,
        state: GroupState,
        present: set[str],
        target: Target,
        now: float,
    ) -> float:
        if self._stopping_since is None:
            self._stopping_since = now  # inherited from a previous coordinator
        waiting = [
            m for m, rec in state.members.items() if rec.acked_generation < target.generation
        ]
        overdue = now - self._stopping_since >= self._config.barrier_timeout
        if waiting and not overdue:
            return self._stopping_since + self._config.barrier_timeout - now
        if waiting:
            log.warning(
                "group %s: barrier timed out after %.1f s without acknowledgements from %s; "
                "their resources stay claimed until they release them or their leases expire",
                session.group,
                self._config.barrier_timeout,
                sorted(waiting),
            )
        self._stopping_since = None
        self._publish(session, epoch, state, present, target, now)
        return _IDLE_WAIT

    def _publish(
        self,
        session: Session,
        epoch: int,
        state: GroupState,
        present: set[str],
        target: Target | None,
        now: float,
    ) -> None:
        previous = {m: set(rs) for m, rs in target.assignment.items()} if target else {}
        weights = {r.id: r.weight for r in state.resources.values()}
        assignment = self._plan(state, present, target, forced=self._forced)
        self._forced = False
        published = self._backend.publish(
            session,
            epoch,
            assignment,
            phase=Phase.RUNNING,
            resources_version=state.resources_version,
        )
        started = self._first_change if self._pending is not None else now
        self._pending = None
        trigger, why = self._cause(state, present, target)
        record = RebalanceRecord(
            generation=published.generation,
            epoch=epoch,
            started_at=started,
            published_at=self._clock.monotonic(),
            members=len(present),
            resources=len(weights),
            moved=moved(previous, assignment),
        )
        log.info(
            "group %s: generation %d published at epoch %d (%d members, %d resources, %d moved)",
            session.group,
            record.generation,
            epoch,
            record.members,
            record.resources,
            record.moved,
        )
        before = {r: m for m, rs in previous.items() for r in rs}
        changes = sum(
            1 for m, rs in assignment.items() for r in rs if r in before and before[r] != m
        )
        self._emit(
            session,
            epoch,
            "",
            why,
            kind=EventKind.REBALANCE,
            generation=record.generation,
            trigger=trigger,
            moves=changes,
        )
        if self._on_rebalance is not None:
            self._on_rebalance(record)

    def _cause(
        self, state: GroupState, present: set[str], target: Target | None
    ) -> tuple[Trigger, str]:
        """What caused the target about to be published, and the details for ``reason``:
        the first target; members that joined, left (drained) or vanished (crashed: their
        session ended without draining); a changed resource set; an operator's command."""
        operator, self._operator_cause = self._operator_cause, None
        self._seen_leaving = (self._seen_leaving & set(state.members)) | {
            m for m, rec in state.members.items() if rec.leaving
        }
        if target is None:
            return Trigger.START, f"start: {len(present)} members"
        before = set(target.assignment)
        joined, gone = sorted(present - before), sorted(before - present)
        left = [m for m in gone if m in state.members or m in self._seen_leaving]
        crashed = [m for m in gone if m not in left]
        # Several causes at once: the trigger is the first of crash, leave, join; the reason
        # names them all.
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
            return causes[0][0], "; ".join(why for _, why in causes)
        had = {r for rs in target.assignment.values() for r in rs}
        added, removed = len(set(state.resources) - had), len(had - set(state.resources))
        if operator is None and (added or removed):
            return Trigger.DISCOVERY, f"discovery: +{added} -{removed}"
        return Trigger.OPERATOR, f"operator: {operator or 'control'}"
