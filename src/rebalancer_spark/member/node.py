"""A member of a group: join, own resources, commit progress fenced by epoch, leave by draining.

Use case::

    from rebalancer_spark import Member, MemberConfig

    config = MemberConfig(group="orders", backend="sqlite:///var/lib/rb/groups.db")
    with Member(config, resources=["a", "b", "c"], on_assigned=start, on_revoked=stop) as m:
        for owned in m.assigned():                   # from memory, no round trip
            ...
            m.commit(owned.resource, {"offset": 42})  # refused once ownership moved on

:class:`Member` is the façade over three threads: the *heartbeat* renews the lease
(:mod:`.lease`), the *coordinator* thread takes the coordinator role when it is vacant and
computes targets (:mod:`.coordinator`), and the *member* thread reconciles what this member
holds (:mod:`.ownership`) with its part of the target, calling the callbacks
(:mod:`.reconciler`). User callbacks run on the member thread: ``on_revoked`` must return only
once work on those resources has stopped, because the claims are released right after it
returns. A newly granted resource appears in :meth:`Member.assigned` as soon as the claim is
granted, possibly a moment before ``on_assigned`` for it has returned; the progress handed
over travels with each :class:`OwnedResource`, so work can start from either. While a user
callback runs, the member thread cannot deliver ``on_lost``: if the lease lapses meanwhile,
``assigned()`` and ``owns()`` return nothing and ``commit()`` is refused from the lease's
deadline on, and ``on_lost`` follows once the callback returns (a resource being revoked is
then reported ``lost`` as of the deadline, not ``released``). Keep callbacks short.

A store that lost its state (Redis restarted without persistence, an SQLite file replaced, a
ZooKeeper chroot deleted) ends the member's session: the next renewal fails, the member stops
its work at once (everything ``lost``) and rejoins; its backend handle then lifts every epoch it
knew into the new incarnation of the group (:mod:`rebalancer_spark.backends.base`), so epochs
never go back. ``epoch_floors`` (resource -> epoch, e.g. read from the audit table with
:func:`rebalancer_spark.audit.reader.epoch_floors`; the Spark jobs do) adds epochs recorded
durably elsewhere, for a process that never saw the group before.

A member whose work cannot go on (its Spark driver's JVM died) calls :meth:`Member.abandon`
instead of :meth:`Member.stop`: everything is lost at once, without draining, and the session
ends in the store. A member whose own thread fails (a bug) does the same by itself, and from
then on :meth:`Member.assigned` raises :class:`MemberFailed` (:attr:`Member.error` holds the
cause): a job's loop stops on it instead of running on with nothing owned.

Lifecycle (enforced; see :data:`TRANSITIONS` in :mod:`.state`)::

    CREATED --> STARTING --> RUNNING <--> REJOINING
       |           |            \\          /
       |           |             DRAINING         (RUNNING, REJOINING and DRAINING
       |           |                |              all go to STOPPING)
       +-----------+--> STOPPED <-- STOPPING
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Self

from rebalancer_spark.backends import open_backend
from rebalancer_spark.backends.base import Backend, Session
from rebalancer_spark.core.clock import Clock, SystemClock
from rebalancer_spark.core.config import MemberConfig
from rebalancer_spark.core.errors import (
    ConfigurationError,
    FencedError,
    MemberFailed,
    RebalancerError,
)
from rebalancer_spark.core.events import EventKind, EventSink
from rebalancer_spark.core.model import JsonValue, Resource, validate_member_id
from rebalancer_spark.member.control import GroupControl
from rebalancer_spark.member.coordinator import CoordinatorLoop, RebalanceRecord
from rebalancer_spark.member.defaults import default_backend_url, generated_member_id
from rebalancer_spark.member.lease import Heartbeat, Lease
from rebalancer_spark.member.logfields import LogContext, bind_thread
from rebalancer_spark.member.metrics import MemberMetrics, metrics_available
from rebalancer_spark.member.ownership import Callback, OwnedResource, Ownership
from rebalancer_spark.member.reconciler import Reconciler
from rebalancer_spark.member.state import TRANSITIONS, Lifecycle, MemberState

__all__ = ["TRANSITIONS", "Member", "MemberState", "OwnedResource", "default_backend_url", "join"]

log = logging.getLogger("rebalancer_spark.member")


class Member:
    """One member of a group; see the module docstring."""

    def __init__(
        self,
        config: MemberConfig,
        *,
        resources: Iterable[str | Resource] | None = None,
        on_assigned: Callback | None = None,
        on_revoked: Callback | None = None,
        on_lost: Callback | None = None,
        event_sinks: Sequence[EventSink] = (),
        info: Mapping[str, str] | None = None,
        clock: Clock | None = None,
        backend: Backend | None = None,
        discover: Callable[[], Collection[Resource]] | None = None,
        discovery_interval: float = 30.0,
        epoch_floors: Mapping[str, int] | None = None,
    ) -> None:
        self.config = config
        self._epoch_floors = dict(epoch_floors or {})
        self.group = config.group
        self.member_id = validate_member_id(config.member_id or generated_member_id())
        self._resources = None if resources is None else _as_resources(resources)
        self._discover = discover
        self._discovery_interval = discovery_interval
        self.info: dict[str, str] = {
            "host": socket.gethostname(),
            "pid": str(os.getpid()),
            **(info or {}),
        }
        self._clock: Clock = clock or SystemClock()
        self._event_sinks = list(event_sinks)
        self._own_backend = backend is None
        self._backend = backend
        self._lease = Lease(self._clock, config.effective_safety_margin)
        # One lock for the lifecycle and what is held; the condition wakes waiters on changes.
        self._lock = threading.RLock()
        self._stopping = False
        self._changed = threading.Condition(self._lock)
        self._lifecycle = Lifecycle(self.member_id, self._changed)
        self._coordinator: CoordinatorLoop | None = None
        self.log_context = LogContext(self.group, self.member_id, self._seen_epoch)
        """The group, member and epoch fields of this member's log lines (see logfields)."""
        self.metrics: MemberMetrics | None = self._make_metrics()
        """This member's Prometheus metrics (None without prometheus_client)."""
        if self.metrics is not None:
            event_sinks = [self.metrics, *event_sinks]
        self._ownership = Ownership(
            self.group,
            self.member_id,
            self.info,
            self._clock,
            self._changed,
            on_assigned=on_assigned,
            on_revoked=on_revoked,
            on_lost=on_lost,
            event_sinks=event_sinks,
            callback_timeout=config.effective_callback_timeout,
        )
        self._reconciler = Reconciler(
            config,
            self.member_id,
            static=config.member_id is not None,
            info=self.info,
            clock=self._clock,
            lease=self._lease,
            ownership=self._ownership,
            lifecycle=self._lifecycle,
        )
        self._heartbeat: Heartbeat | None = None
        self._published_health: dict[str, str] = {}
        self.rebalances: list[RebalanceRecord] = []
        """Rebalances made while this member was coordinator (most recent last, capped)."""

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def state(self) -> MemberState:
        return self._lifecycle.state

    @property
    def error(self) -> BaseException | None:
        """Why the member stopped on its own, if it did."""
        return self._reconciler.error

    def start(self) -> Self:
        """Join the group (raising at once on a live duplicate id, a bad URL or an unreachable
        store), declare the resources if given, and start the member's threads."""
        self._lifecycle.move(MemberState.STARTING)
        try:
            if self._backend is None:
                self._backend = open_backend(self.config.backend, clock=self._clock)
            backend = self._backend
            if self._epoch_floors:  # recorded durably elsewhere: never granted again below
                backend.remember_epochs(self.group, self._epoch_floors)
            if self._resources is not None:
                backend.update_resources(self.group, replace=self._resources)
            if self.config.metrics_port and self.metrics is not None:
                self.metrics.serve(self.config.metrics_port)
            self._reconciler.join(backend)
        except BaseException:
            self._lifecycle.move(MemberState.STOPPED)
            if self.metrics is not None:
                self.metrics.close()
            self._close_backend()
            raise
        self._heartbeat = Heartbeat(
            backend,
            self._lease,
            self._clock,
            self.config.effective_heartbeat_interval,
            on_renewed=self._renewed,
        )
        self._coordinator = CoordinatorLoop(
            self.config,
            backend,
            self._clock,
            self._lease.valid_session,
            self._record_rebalance,
            discover=self._discover,
            discovery_interval=self._discovery_interval,
            event_sinks=self._event_sinks,
            info=self.info,
        )
        for thread in (self._heartbeat.thread, self._coordinator.thread, self._reconciler.thread):
            bind_thread(thread, self.log_context)
        self._lifecycle.move(MemberState.RUNNING)
        self._heartbeat.start()
        self._coordinator.start()
        self._reconciler.start(backend, self._coordinator)
        return self

    def stop(self, *, drain: bool = True) -> None:
        """Leave the group. With ``drain`` (the default) the member first asks the coordinator
        to move its resources away, waits until they are released (at most ``drain_timeout``),
        then leaves; without it, it releases everything at once and leaves."""
        with self._lock:
            if self.state in (MemberState.STOPPING, MemberState.STOPPED) or self._stopping:
                return
            if self.state is MemberState.CREATED:
                self._lifecycle.move(MemberState.STOPPED)
                return
            self._stopping = True  # a second stop() from another thread returns at once
        if drain and self._backend is not None:
            self._reconciler.drain(self._backend, self.config.drain_timeout)
        self._lifecycle.move(MemberState.STOPPING)
        self._reconciler.stop()
        if self._coordinator is not None:
            self._coordinator.stop()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self._reconciler.leave(self._backend)
        self._close_backend()
        if self.metrics is not None:
            self.metrics.close()
        self._lifecycle.move(MemberState.STOPPED)

    close = stop

    def _end_session(self, session: Session) -> None:
        if self._backend is None:
            return
        try:
            self._backend.leave(session)
        except RebalancerError as exc:
            log.warning(
                "member %s could not end its session (%s); its resources move when the session "
                "times out",
                self.member_id,
                exc,
            )

    def abandon(self, reason: str, *, wait: float = 5.0) -> bool:
        """Stop owning at once, without draining, and leave: for a member whose work cannot go
        on (the Spark driver it runs in lost its JVM). Return whether this call did it (False
        if the member was not running: never started, stopping or stopped already).

        In this order: the lease is fenced locally, as when it lapses (``assigned()`` and
        ``owns()`` return nothing and ``commit()`` is refused from this instant); renewals and
        the coordinator role stop; the member thread is asked to end and waited for at most
        ``wait`` seconds (a user callback may still run on it); everything held is reported
        ``lost`` as of the fence ("abandoned: <reason>"; events, then ``on_lost``). The session
        is ended in the store right after the fence, before anything that may wait: that frees
        its claims and coordinator role in one atomic step, so the others take the resources
        over in one rebalance instead of after the session timeout.

        Ending the session at once is safe because the fence comes first and the store checks
        every commit against the session and epoch atomically: a commit that reaches the store
        after the session ended is refused. It is right only when nothing of this member can
        still write output outside the store's fence: the work itself has stopped (a dead JVM
        runs no Spark job). Otherwise use :meth:`stop` (drain) or let the lease run out."""
        with self._lock:
            if self._stopping or self.state not in (MemberState.RUNNING, MemberState.REJOINING):
                return False
            self._stopping = True
        self._reconciler.stop(timeout=0)  # first: a lapse seen now must not mean "rejoin"
        fenced_at = self._clock.wall()
        session = self._lease.snapshot().session
        if session is not None:
            self._lease.lapse(session)
            # Ended in the store before anything that may wait (thread joins, callbacks, log
            # output to a pipe nobody reads any more): the resources move whatever follows.
            self._end_session(session)
        log.error(
            "member %s of group %s abandoned its %d resources without draining: %s",
            self.member_id,
            self.group,
            len(self._ownership),
            reason,
        )
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._coordinator is not None:
            self._coordinator.stop()
        self._lifecycle.move(MemberState.STOPPING)
        if not self._reconciler.stop(timeout=wait):
            log.warning(
                "member %s: the member thread is still in a user callback after %.1f s; "
                "leaving without it",
                self.member_id,
                wait,
            )
        # A rejoin in flight when the lease was fenced may have started a newer session.
        current = self._lease.snapshot().session or session
        self._ownership.lost(
            current, self._ownership.forget(), f"abandoned: {reason}", EventKind.LOST, at=fenced_at
        )
        self._lease.end()
        if current is not None and current != session:
            self._end_session(current)
        self._close_backend()
        if self.metrics is not None:
            self.metrics.close()
        self._lifecycle.move(MemberState.STOPPED)
        return True

    def __enter__(self) -> Self:
        """Start the member unless it was started already (as :func:`join` does)."""
        return self.start() if self.state is MemberState.CREATED else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _close_backend(self) -> None:
        if self._own_backend and self._backend is not None:
            self._backend.close()

    # -- queries (from memory) --------------------------------------------------------------

    def assigned(self) -> list[OwnedResource]:
        """The resources this member owns now, sorted by id; empty once the lease lapsed.
        Raises :class:`MemberFailed` once the member thread failed (:attr:`error`): the member
        left the group for good, which an empty list would hide from a job's loop."""
        error = self._reconciler.error
        if error is not None:
            raise MemberFailed(self.group, self.member_id, f"{error!r:.300}")
        return self._owned()

    def _owned(self) -> list[OwnedResource]:
        if self._lease.valid_session() is None:
            return []
        return self._ownership.all()

    def owns(self, resource: str) -> OwnedResource | None:
        """The ownership of ``resource`` if this member holds it now with a valid lease."""
        if self._lease.valid_session() is None:
            return None
        return self._ownership.get(resource)

    @contextmanager
    def hold(self, resource: str, epoch: int) -> Iterator[OwnedResource]:
        """Own ``resource`` at ``epoch`` throughout the block: wrap in it a write that must
        land while the resource is owned (a fenced output commit). A revocation of the
        resource waits for the block to end (at most ``callback_timeout``, then the resource
        is ``lost``) before it emits ``released`` and gives the claim back, and refuses new
        holds once it has begun. Raises :class:`FencedError` when this member does not own
        the resource at ``epoch`` now (it moved, is being released, or the lease lapsed). A
        lapse during the block does not wait: only the output's own fence stops a late
        write then. Keep the block short: it delays a rebalance by its length."""
        if self._lease.valid_session() is None:
            raise self._refused(
                f"member {self.member_id!r} of group {self.group!r} cannot hold resource "
                f"{resource!r} at epoch {epoch}: its lease lapsed; stop working on it"
            )
        try:
            owned = self._ownership.begin_hold(resource, epoch)
        except FencedError as exc:
            raise self._refused(str(exc)) from None
        try:
            yield owned
        finally:
            self._ownership.end_hold(resource, epoch)

    def rediscover(self) -> None:
        """Ask for a new listing of the source now (acted on by whichever member
        coordinates; on this member only if it coordinates)."""
        if self._coordinator is not None:
            self._coordinator.rediscover()

    @property
    def discovery_error(self) -> str | None:
        """Why this member's last listing of the source failed, while it coordinates."""
        return None if self._coordinator is None else self._coordinator.discovery_error

    @property
    def is_coordinator(self) -> bool:
        return self._coordinator is not None and self._coordinator.epoch is not None

    @property
    def coordinator_epoch(self) -> int | None:
        return None if self._coordinator is None else self._coordinator.epoch

    @property
    def session(self) -> Session | None:
        return self._lease.valid_session()

    def wait_until(self, predicate: Callable[[Member], bool], timeout: float) -> bool:
        """Wait until ``predicate(self)`` holds after a change of what this member holds, at
        most ``timeout`` seconds; return whether it held."""
        return self._ownership.wait_until(lambda: predicate(self), timeout, 0.05)

    # -- writes ------------------------------------------------------------------------------

    def commit(self, resource: str, progress: JsonValue, *, epoch: int | None = None) -> None:
        """Commit ``progress`` for ``resource``, fenced by the epoch it is owned at.

        Pass the ``epoch`` of the :class:`OwnedResource` the work was done under: if the
        resource was lost and granted again meanwhile, that work is refused rather than
        committed under the new ownership. Raises :class:`FencedError` if this member does
        not own the resource now (at ``epoch``), its lease lapsed, or the store says ownership
        moved on; then stop working on the resource."""
        owned = self.owns(resource)
        session = self._lease.valid_session()
        if owned is None or session is None:
            raise self._refused(
                f"commit for resource {resource!r} refused: member {self.member_id!r} of group "
                f"{self.group!r} does not own it now; stop working on it"
            )
        if epoch is not None and epoch != owned.epoch:
            raise self._refused(
                f"commit for resource {resource!r} at epoch {epoch} refused: member "
                f"{self.member_id!r} lost it since and owns it again at epoch {owned.epoch}; "
                "redo the work from the progress handed over with the new ownership"
            )
        backend = self._require_backend()
        try:
            backend.commit(session, resource, owned.epoch, progress)
        except FencedError as exc:
            self._ownership.emit(
                self._ownership.event(EventKind.FENCED, session, resource, owned.epoch, str(exc))
            )
            self._lease.changed.set()
            self._refused(str(exc))
            raise

    def _refused(self, message: str) -> FencedError:
        """Count a refused commit (metrics) and return the error to raise."""
        if self.metrics is not None:
            self.metrics.refused_write()
        return FencedError(message)

    def set_resources(self, resources: Iterable[str | Resource]) -> int:
        """Replace the group's resource set; returns its new version."""
        return self._require_backend().update_resources(
            self.group, replace=_as_resources(resources)
        )

    def add_resources(self, resources: Iterable[str | Resource]) -> int:
        """Add resources to the group's set; returns its new version."""
        return self._require_backend().update_resources(self.group, add=_as_resources(resources))

    def remove_resources(self, resources: Iterable[str]) -> int:
        """Remove resources from the group's set; returns its new version."""
        return self._require_backend().update_resources(self.group, remove=list(resources))

    def group_control(self) -> GroupControl:
        """Control of this member's group through its store handle, acting as this member
        (a Spark job reads and removes operators' progress requests with it)."""
        return GroupControl(self._require_backend(), self.group, actor=self.member_id,
                            clock=self._clock)  # fmt: skip

    def _require_backend(self) -> Backend:
        if self._backend is None or self.state is MemberState.STOPPED:
            raise RebalancerError(
                f"member {self.member_id!r} of group {self.group!r} is {self.state.value}: "
                "start() it first"
            )
        return self._backend

    def _record_rebalance(self, record: RebalanceRecord) -> None:
        self.rebalances.append(record)
        del self.rebalances[:-100]
        if self.metrics is not None:
            self.metrics.rebalanced(record.published_at - record.started_at, record.moved)

    # -- observability -----------------------------------------------------------------------

    def metrics_text(self) -> str:
        """This member's metrics in the Prometheus text format."""
        if self.metrics is None:
            raise ConfigurationError(
                f"member {self.member_id!r} has no metrics: prometheus_client is not installed; "
                "pip install 'rebalancer-spark[metrics]'"
            )
        return self.metrics.text()

    def _seen_epoch(self) -> int | None:
        return None if self._coordinator is None else self._coordinator.seen_epoch

    def _make_metrics(self) -> MemberMetrics | None:
        if not metrics_available():
            if self.config.metrics_port:
                raise ConfigurationError(
                    f"metrics_port = {self.config.metrics_port} needs prometheus_client: pip "
                    "install 'rebalancer-spark[metrics]', or set metrics_port to 0"
                )
            return None
        return MemberMetrics(
            self.group,
            self.member_id,
            owned=lambda: len(self._owned()),
            is_coordinator=lambda: self.is_coordinator,
            epoch=self._seen_epoch,
            group_members=lambda: self._coordinator_count("present_members"),
            group_resources=lambda: self._coordinator_count("listed_resources"),
            discovery_failing=lambda: self.discovery_error is not None,
            overruns=lambda: self.callback_overruns,
            audit_backlog=self.audit_backlog,
        )

    def _renewed(self, seconds: float) -> None:
        """After each renewal (heartbeat thread): the metric, and this member's health in its
        published info when it changed (``status`` shows it)."""
        if self.metrics is not None:
            self.metrics.renewed(seconds)
        health = health_info(self.callback_overruns, self.audit_backlog())
        session, backend = self._lease.valid_session(), self._backend
        if health == self._published_health or session is None or backend is None:
            return
        try:
            backend.update_info(session, {**self.info, **health})
        except RebalancerError as exc:  # the next renewal tries again
            log.debug("member %s could not publish its health: %s", self.member_id, exc)
            return
        self._published_health = health

    def audit_backlog(self) -> int:
        """Ownership events accepted by this member's event sinks and not yet written: the
        sum of the ``backlog`` of the sinks that keep one (``DeltaAuditLog``)."""
        return sum(int(getattr(sink, "backlog", 0)) for sink in self._event_sinks)

    @property
    def callback_overruns(self) -> dict[str, int]:
        """How many times each callback did not return within ``callback_timeout``."""
        with self._lock:
            return dict(self._ownership.overruns)

    def _coordinator_count(self, name: str) -> int:
        return 0 if self._coordinator is None else int(getattr(self._coordinator, name))


def health_info(overruns: Mapping[str, int], backlog: int) -> dict[str, str]:
    """The health keys of a member's published info: ``callback_overruns``
    (``on_revoked=2,on_assigned=1``) and ``audit_backlog`` (events not in the audit table
    yet), each present only when not zero."""
    out: dict[str, str] = {}
    stuck = ",".join(f"{name}={n}" for name, n in sorted(overruns.items()) if n)
    if stuck:
        out["callback_overruns"] = stuck
    if backlog:
        out["audit_backlog"] = str(backlog)
    return out


def _as_resources(resources: Iterable[str | Resource]) -> list[Resource]:
    out = [r if isinstance(r, Resource) else Resource(r) for r in resources]
    counts = Counter(r.id for r in out)
    dupes = sorted(r for r, n in counts.items() if n > 1)
    if dupes:
        raise ConfigurationError(
            f"resource ids must be unique; repeated: {dupes[:5]}: list each resource once"
        )
    return out


def join(
    group: str,
    *,
    resources: Iterable[str | Resource] | None = None,
    on_assigned: Callback | None = None,
    on_revoked: Callback | None = None,
    on_lost: Callback | None = None,
    event_sinks: Sequence[EventSink] = (),
    **options: object,
) -> Member:
    """Join ``group`` and return the started :class:`Member`; ``options`` are the keys of
    :class:`MemberConfig` (``backend=``, ``member_id=``, ``protocol=``, ``session_timeout=``
    ...). Use it as a context manager, or call ``stop()`` to leave."""
    config = MemberConfig.from_mapping(
        {"group": group, **options}, default_backend=default_backend_url()
    )
    member = Member(
        config,
        resources=resources,
        on_assigned=on_assigned,
        on_revoked=on_revoked,
        on_lost=on_lost,
        event_sinks=event_sinks,
    )
    return member.start()
