"""What a member holds now, and what accompanies every change of it: the user callbacks and the
ownership events.

The member thread (:mod:`.reconciler`) changes the map: resources are *added* when the store
grants them, *released* when the target moves them away, and *forgotten* when the store gave
them up already or the lease lapsed. User threads read it through the member (``assigned()``,
``owns()``). One lock guards it, shared with the member's lifecycle; a condition on that lock
wakes whoever waits for a change.

Each change emits one :class:`OwnershipEvent` per resource to the event sinks and calls the
matching callback with every resource concerned: ``on_assigned`` after they are added,
``on_revoked`` *before* they are removed (the claims are given back right after it returns, so
it must return only once work on them has stopped), ``on_lost`` after they are forgotten. A
callback or a sink that raises is logged and the member carries on.

A write that must land while the resource is still owned (the fenced Delta commit of a batch)
runs inside a *hold* (:meth:`Ownership.begin_hold`, ``Member.hold``): a release refuses new
holds of the resource from the moment it starts, and after ``on_revoked`` returns it waits for
the holds in progress to end before it emits ``released`` and gives the claim back. So no
commit of a released epoch lands after its ``released`` event (the audit's output check, rule
2). A lapse cannot wait: what is held then is lost at the deadline, and only the output
table's fence stops a late commit.

Callbacks are *bounded*: each runs on a thread of its own and the member waits for it at most
``callback_timeout`` seconds. One that overruns is left running, logged, and the resources it
was called with are given up as ``lost`` (the reason names the callback): :meth:`release` and
:meth:`add` return them so that the member gives their claims back and they move. A release
waits for holds at most ``callback_timeout`` seconds too; past it the resources are ``lost``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from rebalancer_spark.backends.base import Session
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.errors import FencedError
from rebalancer_spark.core.events import EventKind, EventSink, OwnershipEvent
from rebalancer_spark.core.model import Grant, JsonValue

__all__ = ["Callback", "OwnedResource", "Ownership"]

log = logging.getLogger("rebalancer_spark.member")


@dataclass(frozen=True, slots=True)
class OwnedResource:
    """A resource this member owns now: its id, the epoch it was granted at, and the progress
    the previous owner committed (None for a resource never committed)."""

    resource: str
    epoch: int
    progress: JsonValue
    acquired_at: float
    grant: Grant | None = None
    """What the store said the grant superseded (the audit's epoch chain)."""
    generation: int | None = None
    """The target generation that gave it."""
    coordinator_epoch: int | None = None
    """The coordinator epoch of that target."""


Callback = Callable[[Sequence[OwnedResource]], None]


class Ownership:
    """The resources member ``member_id`` of ``group`` holds; see the module docstring."""

    def __init__(
        self,
        group: str,
        member_id: str,
        info: Mapping[str, str],
        clock: Clock,
        changed: threading.Condition,
        *,
        on_assigned: Callback | None = None,
        on_revoked: Callback | None = None,
        on_lost: Callback | None = None,
        event_sinks: Sequence[EventSink] = (),
        callback_timeout: float = 5.0,
    ) -> None:
        self._group = group
        self._member_id = member_id
        self._info = info
        self._clock = clock
        self._changed = changed
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._on_lost = on_lost
        self._sinks = list(event_sinks)
        self._callback_timeout = callback_timeout
        self._held: dict[str, OwnedResource] = {}
        self._holds: dict[tuple[str, int], int] = {}
        """Per (resource, epoch): how many holds run now (:meth:`begin_hold`)."""
        self._leaving: set[str] = set()
        """Resources a release is under way for: no new hold of them."""
        self._version = 0
        self.overruns: dict[str, int] = {}
        """Per callback name: how many of its calls overran ``callback_timeout``."""

    # -- reads ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._changed:
            return len(self._held)

    def get(self, resource: str) -> OwnedResource | None:
        with self._changed:
            return self._held.get(resource)

    def all(self) -> list[OwnedResource]:
        """Everything held, sorted by resource id."""
        with self._changed:
            return [self._held[r] for r in sorted(self._held)]

    @property
    def version(self) -> int:
        """Grows with every change of what is held (a step that changed nothing keeps it)."""
        with self._changed:
            return self._version

    def epochs(self) -> dict[str, int]:
        with self._changed:
            return {r: o.epoch for r, o in self._held.items()}

    def not_held(self, granted: Mapping[str, Grant]) -> dict[str, Grant]:
        """The entries of ``granted`` (resource to grant) for resources not held yet."""
        with self._changed:
            return {r: e for r, e in granted.items() if r not in self._held}

    def missing(self, resources: Collection[str]) -> frozenset[str]:
        """Those of ``resources`` not held."""
        with self._changed:
            return frozenset(r for r in resources if r not in self._held)

    def wait_until(self, predicate: Callable[[], bool], timeout: float, step: float) -> bool:
        """Wait until ``predicate()`` holds, checking it under the lock after every change and
        at least every ``step`` seconds, at most ``timeout`` seconds; return whether it held."""
        deadline = self._clock.monotonic() + timeout
        with self._changed:
            while not predicate():
                remaining = deadline - self._clock.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, step))
            return True

    def begin_hold(self, resource: str, epoch: int) -> OwnedResource:
        """Start a hold of ``resource`` at ``epoch`` (module docstring; end it with
        :meth:`end_hold`): a release of it waits for the hold's end, at most
        ``callback_timeout``, before it emits ``released`` and gives the claim back. Raises
        :class:`FencedError` if it is not held at ``epoch`` now, or a release of it has
        begun. The caller checks the lease."""
        with self._changed:
            owned = self._held.get(resource)
            if owned is None or owned.epoch != epoch or resource in self._leaving:
                now = "not held" if owned is None else f"held at epoch {owned.epoch}"
                if owned is not None and owned.epoch == epoch:
                    now = "being released"
                raise FencedError(
                    f"member {self._member_id} of group {self._group} no longer owns resource "
                    f"{resource!r} at epoch {epoch} ({now}): the write is not made; stop "
                    "working on it"
                )
            key = (resource, epoch)
            self._holds[key] = self._holds.get(key, 0) + 1
            return owned

    def end_hold(self, resource: str, epoch: int) -> None:
        """End a hold that :meth:`begin_hold` started."""
        key = (resource, epoch)
        with self._changed:
            left = self._holds.pop(key) - 1
            if left:
                self._holds[key] = left
            elif resource in self._leaving:
                self._changed.notify_all()

    def _holds_ended(self, owned: Sequence[OwnedResource]) -> bool:
        """Wait (at most ``callback_timeout``) until no hold of ``owned`` runs."""
        keys = [(o.resource, o.epoch) for o in owned]
        return self.wait_until(
            lambda: not any(k in self._holds for k in keys),
            self._callback_timeout,
            self._callback_timeout,
        )

    # -- changes ---------------------------------------------------------------------------------

    def add(self, session: Session, owned: Sequence[OwnedResource]) -> list[OwnedResource]:
        """Hold ``owned`` (granted by the store), then emit and call ``on_assigned``; return
        what was given up because the callback overran (its claims are the caller's to give
        back), else nothing."""
        with self._changed:
            for o in owned:
                self._held[o.resource] = o
            self._version += 1
            self._changed.notify_all()
        self._send([self._acquired(session, o, "granted by the target") for o in owned])
        if self._call(self._on_assigned, owned, "on_assigned"):
            return []
        given_up = self.forget([o.resource for o in owned])
        self.lost(session, given_up, self._overran("on_assigned"), EventKind.LOST)
        return given_up

    def emit_acquired(
        self, session: Session, o: OwnedResource, reason: str, *, at: float | None = None
    ) -> None:
        """The ``acquired`` event of ``o``, carrying its grant's link of the epoch chain; ``at``
        is when the store's grant came back (``o.acquired_at``) unless given: a batch of
        thousands of grants all began then, however long their events take to send."""
        self._send([self._acquired(session, o, reason, at=at)])

    def _acquired(
        self, session: Session, o: OwnedResource, reason: str, *, at: float | None = None
    ) -> OwnershipEvent:
        return self.event(
            EventKind.ACQUIRED,
            session,
            o.resource,
            o.epoch,
            reason,
            at=o.acquired_at if at is None else at,
            generation=o.generation,
            coordinator_epoch=o.coordinator_epoch,
            chain=o.grant,
        )

    def release(
        self,
        session: Session,
        resources: Collection[str],
        why: str,
        *,
        lapsed_at: Callable[[], float | None],
        target: tuple[int, int] | None = None,
    ) -> tuple[list[OwnedResource], bool]:
        """Call ``on_revoked`` for the held ones among ``resources``, wait for their holds to
        end, emit, then stop holding them; return them, sorted, and whether the lease still
        held when that was done. ``lapsed_at()`` is None while the lease holds, else the wall
        time it ran out: a callback or a hold that outlived the lease ends in ``lost`` at that
        time, not in ``released`` afterwards (the store may have granted the resources
        meanwhile). Giving the claims back to the store is the caller's part, and only if the
        lease held.
        ``target`` is the (generation, coordinator epoch) of the target that moved them away,
        None for a leave or drain without one."""
        with self._changed:
            owned = [self._held[r] for r in sorted(resources) if r in self._held]
            self._leaving.update(o.resource for o in owned)
        returned = self._call(self._on_revoked, owned, "on_revoked")
        drained = returned and self._holds_ended(owned)
        now = self._clock.wall()  # before the lease is looked at: within the lease if valid
        ended = lapsed_at()
        with self._changed:  # forgotten meanwhile (the member abandoned): reported already
            # By resource and epoch: a commit replaces the held record (its progress).
            owned = [o for o in owned if (h := self._held.get(o.resource)) and h.epoch == o.epoch]
        generation, coordinator_epoch = target if target is not None else (None, None)
        if ended is not None:
            kind, reason, at = (
                EventKind.LOST,
                "lease lapsed while on_revoked or a write held them",
                ended,
            )
        elif not returned:
            kind, reason, at = EventKind.LOST, self._overran("on_revoked"), now
        elif not drained:
            reason = (
                f"a write holding them did not end within callback_timeout = "
                f"{self._callback_timeout:g} s"
            )
            kind, at = EventKind.LOST, now
        else:
            kind, reason, at = EventKind.RELEASED, why, now
        self._send(self._each(kind, session, owned, reason, at, generation, coordinator_epoch))
        with self._changed:
            for o in owned:
                self._held.pop(o.resource, None)
            self._leaving.difference_update(o.resource for o in owned)
            self._version += 1
            self._changed.notify_all()
        return owned, ended is None

    def forget(self, resources: Collection[str] | None = None) -> list[OwnedResource]:
        """Stop holding ``resources`` (everything if None) without any event or callback;
        return what was held of them, sorted. Report them with :meth:`lost`."""
        with self._changed:
            wanted = sorted(self._held if resources is None else resources)
            owned = [self._held.pop(r) for r in wanted if r in self._held]
            self._leaving.difference_update(wanted)
            self._version += 1
            self._changed.notify_all()
        return owned

    def lost(
        self,
        session: Session | None,
        owned: Sequence[OwnedResource],
        why: str,
        kind: EventKind,
        *,
        at: float | None = None,
        target: tuple[int, int] | None = None,
    ) -> None:
        """Report forgotten resources: emit ``kind`` for each (if there was a session, at
        ``at`` or now) and call ``on_lost``. ``target``: the (generation, coordinator epoch)
        of the latest target the member saw."""
        generation, coordinator_epoch = target if target is not None else (None, None)
        if session is not None:
            self._send(self._each(kind, session, owned, why, at, generation, coordinator_epoch))
        self._call(self._on_lost, owned, "on_lost")

    # -- callbacks and events ------------------------------------------------------------------

    def emit(self, *events: OwnershipEvent) -> None:
        """Send ``events`` (made by :meth:`event`) to every sink, together."""
        self._send(events)

    def _each(
        self,
        kind: EventKind,
        session: Session,
        owned: Sequence[OwnedResource],
        reason: str,
        at: float | None,
        generation: int | None,
        coordinator_epoch: int | None,
    ) -> list[OwnershipEvent]:
        """One event of ``kind`` per resource of ``owned``, all alike but for the resource."""
        return [
            self.event(
                kind,
                session,
                o.resource,
                o.epoch,
                reason,
                at=at,
                generation=generation,
                coordinator_epoch=coordinator_epoch,
            )
            for o in owned
        ]

    def event(
        self,
        kind: EventKind,
        session: Session,
        resource: str,
        epoch: int,
        reason: str,
        *,
        at: float | None = None,
        generation: int | None = None,
        coordinator_epoch: int | None = None,
        chain: Grant | None = None,
    ) -> OwnershipEvent:
        """One ownership event of this member, not sent yet (``at``: when it happened,
        default now; ``chain``: the grant of an ``acquired`` event)."""
        now = self._clock.wall()
        at = now if at is None else min(at, now)
        freed_at = None if chain is None else chain.freed_at
        if freed_at is not None:
            # The store's time of the predecessor's end, on the store's clock (Redis ends
            # leases by its host's wall clock): it came before this grant's answer, so never
            # later than the grant on this member's clock, whatever step the store's clock
            # took.
            freed_at = min(freed_at, at)
        return OwnershipEvent(
            kind=kind,
            group=self._group,
            resource=resource,
            member_id=self._member_id,
            session_id=session.session_id,
            epoch=epoch,
            at=at,
            observed_at=now,
            reason=reason,
            info=self._info,
            generation=generation,
            coordinator_epoch=coordinator_epoch,
            prev_member_id=None if chain is None else chain.prev_member_id,
            prev_session_id=None if chain is None else chain.prev_session_id,
            prev_epoch=None if chain is None else chain.prev_epoch,
            freed=None if chain is None or chain.freed is None else chain.freed.value,
            freed_at=freed_at,
        )

    def _send(self, events: Sequence[OwnershipEvent]) -> None:
        """Send the events of one change to every sink: in one call of its ``emit_many`` where
        it has one (see :data:`~rebalancer_spark.core.events.EventSink`), else one call per
        event. A sink that raises is logged and the others carry on."""
        if not events:
            return
        for sink in self._sinks:
            many = getattr(sink, "emit_many", None)
            if many is not None:
                try:
                    many(events)
                except Exception:
                    log.exception("event sink failed for %d events from %s", len(events), events[0])
                continue
            for event in events:
                try:
                    sink(event)
                except Exception:
                    log.exception("event sink failed for %s", event)

    def _call(self, callback: Callback | None, owned: Sequence[OwnedResource], name: str) -> bool:
        """Run ``callback(owned)`` on a thread of its own; return whether it ended (returned
        or raised) within ``callback_timeout`` seconds. One that overruns is left running."""
        if callback is None or not owned:
            return True
        done = threading.Event()

        def run() -> None:
            try:
                callback(owned)
            except Exception:
                log.exception("%s callback of member %s raised; continuing", name, self._member_id)
            finally:
                done.set()

        threading.Thread(target=run, name=f"rebalancer-{name}", daemon=True).start()
        if done.wait(self._callback_timeout):
            return True
        with self._changed:
            self.overruns[name] = self.overruns.get(name, 0) + 1
        shown = ", ".join(o.resource for o in owned[:5]) + (", ..." if len(owned) > 5 else "")
        log.error(
            "member %s: %s did not return within callback_timeout = %g s (called with %d "
            "resources: %s); they are given up as lost so that they move. The callback is "
            "still running: fix it so that it returns, or raise callback_timeout",
            self._member_id,
            name,
            self._callback_timeout,
            len(owned),
            shown,
        )
        return False

    def _overran(self, name: str) -> str:
        return f"{name} did not return within callback_timeout = {self._callback_timeout:g} s"
