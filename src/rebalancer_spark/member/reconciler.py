"""The member thread, which reconciles what a member holds with its part of the target, and
the member's side of joining and leaving its group.

Each step reads the member's view from the store and lets :func:`core.protocols.plan` say what
to do: forget what the store no longer holds for it, release what the target moved away
(``on_revoked`` first), acknowledge the generation, claim what it is given (``on_assigned``
after). A step runs on every change the store's watch reports, when the heartbeat finds the
lease lapsed or rejoined, and at least every second. A member whose claim found part of what
it was given still held claims the rest again on each wake-up without reading its view (a
holder's release: one round trip less to the grant), until a claim grants nothing.

When the lease lapses the member *self-fences*: everything it held is lost as of the lease
deadline (``on_lost``), the lapsed session is given up, and the member joins again with a new
session (state ``REJOINING``, then ``RUNNING``). Store errors are retried; an unexpected error
ends the thread, is kept in :attr:`Reconciler.error`, and everything held is reported lost; the
session ends, and :meth:`~rebalancer_spark.member.Member.assigned` raises ``MemberFailed``.

Leaving: :meth:`Reconciler.drain` marks the member as leaving, so the coordinator moves its
resources away while it claims nothing more; :meth:`Reconciler.leave` then releases whatever
is still held and ends the session.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from rebalancer_spark.backends.base import Backend, Interest, Session, Watch
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.config import MemberConfig, ProtocolName
from rebalancer_spark.core.errors import (
    BackendError,
    MemberIdInUse,
    RebalancerError,
    SessionExpired,
)
from rebalancer_spark.core.events import EventKind
from rebalancer_spark.core.model import Grant
from rebalancer_spark.core.protocols import MemberHead, MemberView, head_of, plan
from rebalancer_spark.member.coordinator import CoordinatorLoop
from rebalancer_spark.member.lease import Lease, LeaseSnapshot
from rebalancer_spark.member.ownership import OwnedResource, Ownership
from rebalancer_spark.member.state import Lifecycle, MemberState

__all__ = ["CLAIM_CHAIN", "MAX_WAIT", "Reconciler"]

log = logging.getLogger("rebalancer_spark.member")

MAX_WAIT = 1.0
"""The longest a member's loops wait at once before they look again (seconds)."""

CLAIM_CHAIN = 0.2
"""How long (seconds) a member claims again, at once, what a claim that granted something
left out, before it holds what it was granted (see :meth:`Reconciler._acquire`): the longest
the first of a rebalance's grants waits for its hold (``on_assigned``) on that account,
besides one claim."""


@dataclass(frozen=True, slots=True)
class _Rest:
    """What a step claimed and the store did not grant (other sessions held it still): the
    session, the ownership's version at the end of the step, what is still wanted, and the
    view the claim was planned on."""

    session_id: str
    version: int
    wanted: frozenset[str]
    view: MemberView


class Reconciler:
    """The member thread of member ``member_id``; see the module docstring."""

    def __init__(
        self,
        config: MemberConfig,
        member_id: str,
        *,
        static: bool,
        info: Mapping[str, str],
        clock: Clock,
        lease: Lease,
        ownership: Ownership,
        lifecycle: Lifecycle,
    ) -> None:
        self._config = config
        self._group = config.group
        self._member_id = member_id
        self._static = static
        self._info = info
        self._clock = clock
        self._lease = lease
        self._ownership = ownership
        self._lifecycle = lifecycle
        self._handled_generation = 0
        self._target: tuple[int, int] | None = None
        """(generation, coordinator epoch) of the latest target read: what ``lost`` rows name."""
        self._idle: tuple[str, MemberHead, int] | None = None
        """Set when a step found nothing to do (:func:`~.protocols.idle`): the session, the
        view's head and the ownership's version. While the session lives only this member's
        own calls change its claims, so until the head or what is held moves, a wake-up reads
        the head (O(1)) and neither the view nor the held set (O(owned))."""
        self._known: tuple[str, int] | None = None
        """Set at the end of a step after which the store's claims for the session are what
        the member holds: the session and the ownership's version then. While both stay the
        same the next view is read without the claims (``member_view(claims=False)``): a
        view's claims agreed with what was held, and every call since returned (a call that
        raised may have been carried out with its answer lost: the mark is taken at the
        start of each step and set again only at its end)."""
        self._rest: _Rest | None = None
        """Set at the end of a step that claimed and was not granted everything: until the
        member holds it all, a wake-up (a holder's release) claims the rest again on the same
        view without reading it: the claim itself is fenced on the target's generation and
        phase and on the session, and while the session lives only this member's calls
        change its claims, so the view could only say the same. A claim that grants nothing
        (the wake-up was a new target, a timer, a store that lost the group) ends it: that
        step reads the view as any other."""
        self._backend: Backend | None = None
        self._coordinator: CoordinatorLoop | None = None
        self._stop = threading.Event()
        self._draining = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rebalancer-member", daemon=True)
        self.error: BaseException | None = None
        """Why the member thread ended on its own, if it did."""

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    # -- control, from the member's façade ---------------------------------------------------

    def join(self, backend: Backend) -> None:
        """Join the group with a new session and start its lease."""
        started = self._clock.monotonic()
        session = backend.join(
            self._group,
            self._member_id,
            info=self._info,
            ttl=self._config.session_timeout,
            static=self._static,
        )
        self._lease.start(session, started)
        self._handled_generation = 0
        log.info("member %s joined group %s", self._member_id, self._group)

    def start(self, backend: Backend, coordinator: CoordinatorLoop) -> None:
        """Start the thread; ``coordinator`` is woken after every rejoin."""
        self._backend = backend
        self._coordinator = coordinator
        self._thread.start()

    def drain(self, backend: Backend, timeout: float) -> None:
        """Announce that the member leaves, claim nothing more, and wait (at most ``timeout``
        seconds) until the coordinator has moved everything it holds away."""
        session = self._lease.valid_session()
        if session is None:
            return
        try:
            backend.set_leaving(session)
        except RebalancerError as exc:
            log.warning(
                "could not announce the drain of %s (%s); leaving now", self._member_id, exc
            )
            return
        self._draining.set()
        for state in (MemberState.RUNNING, MemberState.REJOINING):
            if self._lifecycle.move_from(state, MemberState.DRAINING):
                break
        self._lease.changed.set()
        if not self._ownership.wait_until(
            lambda: len(self._ownership) == 0 or self._lease.valid_session() is None,
            timeout,
            MAX_WAIT,
        ):
            log.warning(
                "member %s: drain timed out after %.1f s with %d resources; releasing",
                self._member_id,
                timeout,
                len(self._ownership),
            )

    def stop(self, timeout: float | None = None) -> bool:
        """End the thread and wait for it (unless called on it), at most ``timeout`` seconds
        if given; return whether it ended (False while a user callback still runs on it)."""
        self._stop.set()
        self._lease.changed.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def leave(self, backend: Backend | None) -> None:
        """Release what is still held (calling on_revoked) and end the session."""
        session = self._lease.snapshot().session
        held = {o.resource for o in self._ownership.all()}
        if held and session is not None and backend is not None:
            try:
                self.revoke(backend, session, held, "member stopped")
            except RebalancerError as exc:
                log.warning(
                    "member %s could not release %d resources (%s); they become free when its "
                    "lease expires",
                    self._member_id,
                    len(held),
                    exc,
                )
        self._lease.end()
        if session is not None and backend is not None:
            try:
                backend.leave(session)
            except RebalancerError as exc:
                log.warning("member %s left without telling the store: %s", self._member_id, exc)

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        backend = self._backend
        assert backend is not None, "start() sets the backend before the thread starts"
        watch: Watch | None = None
        try:
            while not self._stop.is_set():
                if watch is None:
                    watch = self._watch(backend)
                    continue
                self._lease.changed.clear()
                timeout = self._guarded_step(backend)
                if (
                    timeout > 0
                    and not self._lease.changed.is_set()
                    and not self._wait(watch, timeout)
                ):
                    watch.close()
                    watch = None
        except Exception as exc:
            log.exception("member thread of %s died; it leaves the group", self._member_id)
            self._died(backend, exc)
        finally:
            if watch is not None:
                watch.close()

    def _watch(self, backend: Backend) -> Watch | None:
        """A watch of the group, or None (after a pause) when the store refuses one now. It
        wakes for what a member acts on (:attr:`Interest.MEMBER`): claims and acknowledgements
        of the other members concern the coordinator only."""
        try:
            watch = backend.watch(self._group)
        except BackendError as exc:
            log.warning("member %s: cannot watch, retrying: %s", self._member_id, exc)
            self._stop.wait(self._config.effective_heartbeat_interval)
            return None
        watch.focus(Interest.MEMBER, self._member_id)
        return watch

    def _wait(self, watch: Watch, timeout: float) -> bool:
        """Wait for a change; False (after a pause) when the watch failed and must be renewed."""
        try:
            watch.wait(timeout)
        except BackendError as exc:
            log.warning("member %s: watch failed, watching anew: %s", self._member_id, exc)
            self._stop.wait(self._config.effective_heartbeat_interval)
            return False
        return True

    def _guarded_step(self, backend: Backend) -> float:
        """One step; store errors and refusals become a retry after the returned delay."""
        try:
            return self._step(backend)
        except SessionExpired:
            # The store says the session is gone: lapse it now (the next step fences and
            # rejoins) rather than spin until the heartbeat finds out.
            session = self._lease.snapshot().session
            if session is not None:
                self._lease.lapse(session)
            return 0.0
        except BackendError as exc:
            log.warning("member %s: store error, retrying: %s", self._member_id, exc)
            return min(self._config.effective_heartbeat_interval, MAX_WAIT)
        except MemberIdInUse as exc:
            log.warning("member %s: rejoin refused, retrying: %s", self._member_id, exc)
            return self._config.effective_heartbeat_interval

    def _died(self, backend: Backend, exc: Exception) -> None:
        """The thread met an unexpected error: report everything lost and leave; then keep
        the error (:attr:`error`), once the session has ended."""
        try:
            self._give_up(backend)
        finally:
            self.error = exc

    def _give_up(self, backend: Backend) -> None:
        """Report everything held lost and end the session (see :meth:`_died`)."""
        session = self._lease.snapshot().session
        self._ownership.lost(
            session,
            self._ownership.forget(),
            "member thread failed",
            EventKind.LOST,
            at=None if session is None else self._ended_at(session),
            target=self._target,
        )
        # Nobody reconciles for this member any more: stop renewing and end the session, so
        # that its resources go to the others instead of staying claimed for ever.
        if session is not None:
            self._lease.lapse(session)
            try:
                backend.leave(session)
            except RebalancerError as leave_error:
                log.warning("member %s could not leave: %s", self._member_id, leave_error)

    def _step(self, backend: Backend) -> float:
        snap = self._lease.snapshot()
        if snap.lapsed:
            if not self._stop.is_set():
                self._rejoin(backend, snap)
            return 0.0
        session = snap.session
        assert session is not None
        wait = max(min(snap.deadline - self._clock.monotonic(), MAX_WAIT), 0.0)
        if self._claim_rest(backend, session):
            return wait
        mark = self._idle
        if (
            mark is not None
            and mark[0] == session.session_id
            and mark[2] == self._ownership.version
            and backend.member_head(session) == mark[1]
        ):
            return wait  # nothing to do, and nothing that could give us any has changed
        self._idle = None
        version, epochs = self._ownership.version, self._ownership.epochs()
        known, self._known = self._known == (session.session_id, version), None
        view = backend.member_view(session, claims=not known)
        self._target = (view.generation, view.coordinator_epoch)
        agree = view.owned is None or epochs == view.owned
        step = plan(self._config.protocol, view, epochs, self._handled_generation)
        if step.settled:  # nothing to do (protocols.idle), planned once per step
            self._idle = (session.session_id, head_of(view), version)
            self._known = (session.session_id, version)
            return wait
        if step.lost:
            self._ownership.lost(
                session,
                self._ownership.forget(step.lost),
                "the store no longer holds this member's claim",
                EventKind.LOST,
                at=self._ended_at(session),
                target=self._target,
            )
        released = True
        if step.revoke:
            released = self.revoke(
                backend,
                session,
                set(step.revoke),
                "the target moved it away",
                target=(view.generation, view.coordinator_epoch),
            )
        if step.ack is not None:
            if self._config.protocol is ProtocolName.GLOBAL_BARRIER:
                backend.acknowledge(session, step.ack)
            self._handled_generation = step.generation
        if step.claim and not self._draining.is_set():
            agree = self._acquire(backend, session, step.claim, view) and agree
        elif not step.claim and not step.lost and released and agree:
            # The store held what this member believed, and gave back exactly what it was
            # told to: what it holds and what the store holds agree again, so the same view,
            # read again, would plan nothing. Until the head moves, a wake-up reads the head
            # alone; an old owner does not read its whole part once more after each release.
            self._idle = (session.session_id, head_of(view), self._ownership.version)
        if agree and released:
            # Every call of this step returned: the store holds what the member holds now.
            self._known = (session.session_id, self._ownership.version)
        return wait

    def _rejoin(self, backend: Backend, snap: LeaseSnapshot) -> None:
        """The lease lapsed: fence, then join again with a new session."""
        self._self_fence(backend, snap)
        self._lifecycle.move_from(MemberState.RUNNING, MemberState.REJOINING)
        self.join(backend)
        # stop() may have begun meanwhile; it then ends this new session itself.
        self._lifecycle.move_from(MemberState.REJOINING, MemberState.RUNNING)
        if self._coordinator is not None:
            self._coordinator.wake()

    def _claim_rest(self, backend: Backend, session: Session) -> bool:
        """Claim what the last step was not granted, on its view (see :attr:`_rest`); whether
        that was the step (False: read the view)."""
        rest, self._rest = self._rest, None
        if (
            rest is None
            or rest.session_id != session.session_id
            or rest.version != self._ownership.version
            or self._draining.is_set()
        ):
            return False
        known = self._known == (session.session_id, rest.version)
        self._known = None
        agree = self._acquire(backend, session, rest.wanted, rest.view)
        if known and agree:
            self._known = (session.session_id, self._ownership.version)
        if self._ownership.version == rest.version:
            self._rest = None
            return False  # nothing granted: the target may have moved on
        return True

    def _acquire(
        self, backend: Backend, session: Session, wanted: Collection[str], view: MemberView
    ) -> bool:
        """Claim ``wanted`` and hold what is granted; whether the member holds every grant
        (False: held after the lease lapsed, and not taken). What is not granted is kept for
        the next wake-up (:attr:`_rest`).

        A claim that grants something is followed at once by a claim of what is still
        missing, until one grants nothing, everything is granted, the lease lapsed, or
        :data:`CLAIM_CHAIN` seconds passed since the first grant came back; then every grant
        is held, each as of the time its claim returned. The releases of one rebalance land
        in the store while the claims run: a resource released meanwhile waits for the next
        claim only, not also for the hold of those granted before (their events and
        ``on_assigned``: about 10 µs a resource, 60 ms for 6,000 on two busy cores, while a
        claim of them takes 20 to 40). A claim that fails ends the chain: what the claims
        before it granted is held first (or recorded as not taken when the session is
        gone), then the error goes on to the step."""
        left = set(wanted)
        batches: list[tuple[float, Mapping[str, Grant]]] = []
        first: float | None = None  # when the first grant came back (monotonic)
        try:
            while left:
                granted = backend.claim(session, left, view.generation)
                if granted.keys().isdisjoint(left):
                    break  # nothing granted (nothing asked for, from a store that errs)
                batches.append((self._clock.wall(), granted))
                now = self._clock.monotonic()
                first = now if first is None else first
                left.difference_update(granted)
                if (
                    self._draining.is_set()
                    or self._stop.is_set()
                    or now - first >= CLAIM_CHAIN
                    or self._lapsed_at(session) is not None
                ):
                    break
        except Exception as exc:
            if batches:
                # What the chain's earlier claims granted is this member's all the same: held
                # now, or, if the store says the session is gone, recorded as granted and
                # lost at once (the audit's chain names every epoch handed out). The step
                # fails as before; its next one reads the view with the claims.
                if isinstance(exc, SessionExpired):
                    self._lease.lapse(session)
                self._hold(backend, session, batches, view)
            raise
        agree = self._hold(backend, session, batches, view)
        rest = self._ownership.missing(wanted)
        if rest and agree and not self._draining.is_set():
            self._rest = _Rest(session.session_id, self._ownership.version, rest, view)
        return agree

    def _hold(
        self,
        backend: Backend,
        session: Session,
        batches: Sequence[tuple[float, Mapping[str, Grant]]],
        view: MemberView,
    ) -> bool:
        """Hold what ``batches`` (the wall time a claim returned, what it granted) give that
        is not held yet; see :meth:`_acquire`."""
        owned = [
            OwnedResource(
                r,
                g.epoch,
                None if g.progress is None else g.progress.value,  # handed over with the grant
                at,
                grant=g,
                generation=view.generation,
                coordinator_epoch=view.coordinator_epoch,
            )
            for at, granted in batches
            for r, g in self._ownership.not_held(granted).items()
        ]
        owned.sort(key=lambda o: o.resource)  # on_assigned gets them in order, as before
        if not owned:
            return True
        ended = self._lapsed_at(session)
        if ended is not None:
            # The answers came back after the lease ran out (a slow store, a pause): this
            # member never held them; the store frees the claims with the session, and the
            # next step fences and rejoins. Holding them now would start work after the time
            # anyone else may own them. The grants are recorded all the same, as held for no
            # time at all (acquired and lost at once), so that the audit's epoch chain names
            # every epoch the store handed out.
            log.info(
                "member %s: %d resources granted, their hold after its lease lapsed; not "
                "taking them",
                session.member_id,
                len(owned),
            )
            why = "granted after the lease lapsed; not taken"
            for o in owned:
                # Dated when the store freed the resource for this grant (after the previous
                # owner's rows, before the next owner's), else at the lapse.
                g = o.grant
                at = g.freed_at if g is not None and g.freed_at is not None else ended
                self._ownership.emit_acquired(session, o, why, at=at)
                self._ownership.emit(
                    self._ownership.event(EventKind.LOST, session, o.resource, o.epoch, why, at=at)
                )
            return False
        given_up = self._ownership.add(session, owned)
        if given_up:
            # on_assigned hangs: give the claims back so that they move, and take no more
            # work while the user's code does not answer (the member drains).
            backend.release(session, {o.resource: o.epoch for o in given_up})
            if not self._draining.is_set():
                log.error(
                    "member %s drains: its on_assigned callback hangs (see above); restart "
                    "it once the callback is fixed",
                    self._member_id,
                )
                backend.set_leaving(session)
                self._draining.set()
        return True

    def revoke(
        self,
        backend: Backend,
        session: Session,
        resources: set[str],
        why: str,
        *,
        target: tuple[int, int] | None = None,
    ) -> bool:
        """Stop holding ``resources`` (``on_revoked`` first) and release their claims, also
        those the store holds for this member that it never knew of (recorded as acquired
        and released at once, so that the audit's epoch chain names them); whether the
        claims were released (False: the lease lapsed meanwhile). ``target``: the
        (generation, coordinator epoch) of the target that moved them away."""
        owned, lease_held = self._ownership.release(
            session, resources, why, lapsed_at=lambda: self._lapsed_at(session), target=target
        )
        if not lease_held:
            return False  # the next step fences and rejoins; the store frees the claims itself
        view_only = resources - {o.resource for o in owned}
        claims = {o.resource: o.epoch for o in owned}
        if view_only:
            stored = backend.member_view(session).owned or {}
            unknown = {r: e for r, e in stored.items() if r in view_only}
            claims.update(unknown)
            if unknown:
                self._record_unknown(session, unknown, why, target)
        backend.release(session, claims)
        return True

    def _record_unknown(
        self,
        session: Session,
        unknown: Mapping[str, int],
        why: str,
        target: tuple[int, int] | None,
    ) -> None:
        """Claims whose answer never reached this member (a lost reply), about to be
        released: recorded as acquired and released now (their grants' links unknown)."""
        generation, coordinator_epoch = target if target is not None else (None, None)
        now = self._clock.wall()
        for r, epoch in sorted(unknown.items()):
            o = OwnedResource(
                r, epoch, None, now, generation=generation, coordinator_epoch=coordinator_epoch
            )
            self._ownership.emit_acquired(session, o, "held in the store unknown to this member")
            self._ownership.emit(
                self._ownership.event(
                    EventKind.RELEASED,
                    session,
                    r,
                    epoch,
                    why,
                    at=now,
                    generation=generation,
                    coordinator_epoch=coordinator_epoch,
                )
            )

    def _ended_at(self, session: Session) -> float:
        """When this member's ownership of what it loses now ended: now, or the lease's deadline
        if it passed (a pause in the middle of a step: the store may have granted the
        resources to another member since, and this one stopped owning at the deadline)."""
        now = self._clock.wall()
        lapsed = self._lapsed_at(session)
        return now if lapsed is None else min(now, lapsed)

    def _lapsed_at(self, session: Session) -> float | None:
        """None while ``session``'s lease holds, else the wall time it ran out."""
        snap = self._lease.snapshot()
        if not snap.lapsed and snap.session == session:
            return None
        return self._lease.ended_at(snap)

    def _self_fence(self, backend: Backend, snap: LeaseSnapshot) -> None:
        """The lease lapsed: everything is lost as of the deadline; give the session up."""
        session = snap.session
        owned = self._ownership.forget()
        ended_at = self._lease.ended_at(snap)
        if session is not None:
            log.warning(
                "member %s of group %s could not renew its lease in time: stopped all work on "
                "%d resources and rejoins",
                self._member_id,
                self._group,
                len(owned),
            )
        self._ownership.lost(
            session, owned, "lease lapsed", EventKind.LOST, at=ended_at, target=self._target
        )
        if session is not None:
            try:
                backend.leave(session)
            except RebalancerError as exc:
                log.info("could not end the lapsed session of %s: %s", self._member_id, exc)
