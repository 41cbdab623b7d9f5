"""The coordinator thread: it carries out what :func:`core.coordinator_rules.decide` says.

Every member runs one. A step reads the group once (a :class:`~.backends.base.GroupReader`:
the group's head, and the resource set or target only when they changed), hands that read to the
pure state machine (:mod:`rebalancer_spark.core.coordinator`: the roles follower, candidate,
idle, debouncing and barrier, with their transitions table) and carries out the actions it
returns, in order: elect, list the source (discovery), publish a target (fenced by the
coordinator epoch), remove departed members from the drain set, write ``control`` and
``rebalance`` events, and wait until the time it names or the next change of the group.
The rules themselves (stability window, maximum delay, rejoin grace of static members,
operator control, the global barrier, discovery) are written down in
:mod:`rebalancer_spark.core.coordinator_rules`; nothing here decides.

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

from rebalancer_spark.backends.base import Backend, GroupReader, Interest, Session, Watch
from rebalancer_spark.core import coordinator_rules as rules
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.config import MemberConfig
from rebalancer_spark.core.coordinator import (
    Action,
    CoordinatorState,
    Discover,
    Elect,
    Emit,
    ForgetDrains,
    Note,
    Publish,
    Role,
    Settings,
    WakeAt,
)
from rebalancer_spark.core.errors import (
    BackendError,
    ControlConflict,
    FencedError,
    RebalancerError,
)
from rebalancer_spark.core.events import EventKind, EventSink, OwnershipEvent, Trigger
from rebalancer_spark.core.model import Phase, Resource

__all__ = ["CoordinatorLoop", "RebalanceRecord"]

log = logging.getLogger("rebalancer_spark.coordinator")

_IDLE_WAIT = rules.IDLE_WAIT
_MAX_FEEDBACK = 4
"""Decisions per step at most: decide, elected, listed (and one to spare)."""


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
        self._settings = Settings.of(config, None if discover is None else discovery_interval)
        self._state = CoordinatorState()
        """The state machine's state: replaced, never changed, by the thread alone."""
        self._following = Interest.SUCCESSION if config.rejoin_grace > 0 else Interest.COORDINATOR
        """What a follower watches: the static members it sees matter only to a coordinator
        that gives them a rejoin grace (:attr:`Interest.COORDINATOR`)."""
        self._rediscover = threading.Event()
        self.discovery_error: str | None = None
        """Why the last listing of the source failed, or None after a good one."""
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="rebalancer-coordinator", daemon=True
        )
        self._sinks = list(event_sinks)
        self._info = dict(info or {})
        self._reader = GroupReader(backend, config.group, clock=clock)
        """The group as this thread last read it: re-read in proportion to what changed."""

    # -- what the member reads -------------------------------------------------------------------

    @property
    def role(self) -> Role:
        """The coordinator role this member is in (:class:`~.core.coordinator.Role`)."""
        return self._state.role

    @property
    def epoch(self) -> int | None:
        """The coordinator epoch while this member coordinates, else None."""
        return self._state.epoch

    @property
    def seen_epoch(self) -> int | None:
        """The latest coordinator epoch this member saw, coordinator or not (logs, metrics)."""
        return self._state.seen_epoch

    @property
    def present_members(self) -> int:
        """Members the latest target covers, as this member last computed it coordinating."""
        return self._state.present_members

    @property
    def listed_resources(self) -> int:
        """Resources in the group's set, as this member last read it coordinating."""
        return self._state.listed_resources

    @property
    def reads(self) -> dict[str, int]:
        """How many reads of each kind (head, resources, target, holders) this thread made:
        the cost of coordinating, for benchmarks and tests."""
        return dict(self._reader.reads)

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
        self._rediscover.set()
        self._wake.set()

    # -- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        watch: Watch | None = None
        retry = min(self._config.effective_heartbeat_interval, _IDLE_WAIT)
        quiet = False
        try:
            while not self._stop.is_set():
                watch, timeout = self._act(watch, quiet, retry)
                if timeout is not None:
                    watch, quiet = self._pause(watch, timeout, retry)
        except Exception:
            log.exception("coordinator thread of group %s died", self._config.group)
        finally:
            if watch is not None:
                watch.close()

    def _act(
        self, watch: Watch | None, quiet: bool, retry: float
    ) -> tuple[Watch | None, float | None]:
        """One pass of the loop: a step, or, for a follower whose watch reported nothing
        (``quiet``), the set whose turn to be remembered came (GroupReader.remember). Nothing
        but the coordinator's going (or a member's coming, for its static members, when it
        gives a rejoin grace) moves a follower's decision, and a new resource set its memory
        of the set; its watch covers what does (``self._following``): a follower that read the
        group's head every second cost 100 reads a second in an idle group of 100. Returns the
        watch and how long to wait, or None to act again at once (woken meanwhile)."""
        following = self._state.role is Role.FOLLOWER
        if (
            quiet
            and following
            and watch is not None
            and not self._wake.is_set()
            and not self._reader.needs_read  # after an error: a step, though nothing moved
        ):
            try:
                self._reader.remember()
            except Exception as exc:
                return watch, self._failed_step(exc, retry)
            return watch, _IDLE_WAIT
        try:
            if watch is None:
                watch = self._backend.watch(self._config.group)
            timeout = self.step()
        except Exception as exc:
            timeout = self._failed_step(exc, retry)
        if self._wake.is_set():
            self._wake.clear()
            return watch, None
        return watch, timeout

    def _pause(
        self, watch: Watch | None, timeout: float, retry: float
    ) -> tuple[Watch | None, bool]:
        """Wait until ``timeout`` (at most a second, so that stop(), wake() and rediscover()
        act within one; at most until the turn to remember a new set), a change the watch
        reports, or a wake(). Returns the watch (None if it failed) and whether the wait
        ended with nothing reported."""
        wanted = timeout = min(timeout, _IDLE_WAIT)
        due = self._reader.remember_due
        if due is not None:
            timeout = min(wanted, max(due - self._clock.monotonic(), 0.0))
        if watch is not None:
            # A follower acts only when the coordinator goes away; on becoming the
            # coordinator, the wider interest reports what was held back meanwhile.
            following = self._state.role is Role.FOLLOWER
            watch.focus(self._following if following else Interest.ALL)
        if timeout <= 0:
            # No wait. If only the turn to remember a set cut it short, nothing calls for a
            # step but the set (the watch reports at the next wait what happened meanwhile).
            return watch, wanted > 0
        woke = self._wait(watch, timeout, retry)
        if woke is None and watch is not None:
            watch.close()
            watch = None
        return watch, woke is False

    def _failed_step(self, exc: Exception, retry: float) -> float:
        """What a step's error means: how long to wait before the next step."""
        self._reader.forget()
        if isinstance(exc, FencedError):
            log.info("coordinator step fenced, stepping down: %s", exc)
            self._state = rules.fenced(self._state)
            return 0.0
        if isinstance(exc, BackendError):
            log.warning("coordinator step failed, retrying: %s", exc)
        elif isinstance(exc, RebalancerError):
            log.error("coordinator step failed", exc_info=exc)
        else:  # a bug must not leave the group with a silent coordinator
            log.error("coordinator step failed unexpectedly; stepping down", exc_info=exc)
            self._step_down()
        return retry

    def _wait(self, watch: Watch | None, timeout: float, retry: float) -> bool | None:
        """Wait for a change: True if the watch reported one (or there is no watch), False
        if the time ran out without one, None (after a pause) when the watch failed."""
        try:
            if watch is None:
                self._stop.wait(timeout)
                return True
            return watch.wait(timeout)
        except BackendError as exc:
            log.warning("coordinator watch failed, watching anew: %s", exc)
            self._stop.wait(retry)
            return None

    def _step_down(self) -> None:
        """Give up the coordinator role, if held, so that another member can take it."""
        session, epoch = self._session(), self._state.epoch
        self._state = rules.fenced(self._state)
        if session is not None and epoch is not None:
            with contextlib.suppress(Exception):
                self._backend.resign(session, epoch)

    def step(self) -> float:
        """One step of the thread (public for tests): one read of the group, one decision
        (with the answers of an election or a listing fed back), its actions carried out;
        returns how long to wait before the next unless the group changes."""
        if self._rediscover.is_set():
            self._rediscover.clear()
            self._state = rules.rediscover(self._state)
        session = self._session()
        view = None
        if session is not None:
            view = self._reader.read(session.member_id, session.session_id)
        now = self._clock.monotonic()
        state, actions = rules.decide(self._state, view, now, self._settings)
        for _ in range(_MAX_FEEDBACK):
            *done, last = actions
            if not isinstance(last, Elect | Discover):
                wake = self._carry_out(actions, session)
                self._state = state
                return max(wake - self._clock.monotonic(), 0.0)
            self._carry_out(done, session)
            assert session is not None and view is not None, "decided on a read"
            if isinstance(last, Elect):
                record = self._backend.elect(session)
                if record is not None and record.session_id == session.session_id:
                    # Won: read what a coordinator decides on (the set, the target), which a
                    # candidate's read left out.
                    view = self._reader.won(view, record)
                else:
                    view = view.with_coordinator(record)
                state, actions = rules.elected(state, record, view, now)
            else:
                changed = self._list(session, view.resources_version)
                state, actions = rules.listed(state, now, changed=changed)
            self._state = state  # what was asked for happened: keep what it led to
            if actions and isinstance(actions[-1], WakeAt):
                return max(self._carry_out(actions, session) - self._clock.monotonic(), 0.0)
            self._carry_out(actions, session)
            state, actions = rules.decide(state, view, now, self._settings)
        raise RebalancerError(  # a bug in the rules: a step asks for two answers at most
            f"the coordinator's decision did not end after {_MAX_FEEDBACK} answers: {actions}"
        )

    def _carry_out(self, actions: Sequence[Action], session: Session | None) -> float:
        """Carry out ``actions`` in order; return the monotonic time to look again at."""
        wake = self._clock.monotonic() + _IDLE_WAIT
        for action in actions:
            if isinstance(action, WakeAt):
                wake = action.at
            elif isinstance(action, Note):
                (log.warning if action.warn else log.info)(
                    "group %s: %s", self._config.group, action.text
                )
            elif session is None:
                continue  # nothing is written without a session (decide asks for none)
            elif isinstance(action, Publish):
                self._publish(session, action)
            elif isinstance(action, Emit):
                log.info("group %s: %s %s", session.group, action.reason, action.resource)
                self._emit(session, action.epoch, action.resource, action.reason)
            elif isinstance(action, ForgetDrains):
                self._forget_drains(session, action)
        return wake

    def _list(self, session: Session, version: int) -> bool:
        """List the source and replace the group's resource set; whether it changed."""
        assert self._discover is not None, "decide asks for discovery only when configured"
        try:
            resources = list(self._discover())
            if self._session() != session:
                # The lease lapsed during a slow listing: this member may no longer coordinate
                # and must not write (the resource-set write is not epoch-fenced).
                return False
        except Exception as exc:  # a source's failure must never stop the coordinator
            self.discovery_error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "group %s: listing the source failed, keeping the current resource set: %s",
                session.group,
                exc,
            )
            return False
        self.discovery_error = None
        kept = self._reader.resources
        known = kept if kept is not None and kept[0] == version else None
        after = self._backend.update_resources(session.group, replace=resources, known=known)
        return after != version

    def _forget_drains(self, session: Session, action: ForgetDrains) -> None:
        if self._session() != session:  # a lapsed coordinator writes nothing
            return
        # On a conflict someone else changed it: the next look sees the new record.
        with contextlib.suppress(ControlConflict):
            gone = ", ".join(sorted(action.members))
            note = f"undrain {gone}: left the group (by coordinator)"
            control = action.control.undrain_members(action.members)
            changed = control.noted(self._clock.wall(), note)
            self._backend.update_control(session.group, action.control.version, changed)

    def _publish(self, session: Session, action: Publish) -> None:
        published = self._backend.publish(
            session,
            action.epoch,
            action.assignment,
            phase=action.phase,
            resources_version=action.resources_version,
            previous=self._reader.target,
        )
        self._reader.published(published)
        if action.phase is Phase.STOPPING:
            log.info(
                "group %s: barrier generation %d published, waiting for %d members",
                session.group,
                published.generation,
                len(action.members),
            )
            return
        record = RebalanceRecord(
            generation=published.generation,
            epoch=action.epoch,
            started_at=action.started_at,
            published_at=self._clock.monotonic(),
            members=len(action.members),
            resources=action.resources,
            moved=action.moved,
        )
        log.info(
            "group %s: generation %d published at epoch %d (%d members, %d resources, %d moved)",
            session.group,
            record.generation,
            action.epoch,
            record.members,
            record.resources,
            record.moved,
        )
        self._emit(
            session,
            action.epoch,
            "",
            action.reason,
            kind=EventKind.REBALANCE,
            generation=record.generation,
            trigger=action.trigger,
            moves=action.moves,
        )
        if self._on_rebalance is not None:
            self._on_rebalance(record)

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
