"""The backend contract: what a coordination store must do, and nothing else.

A backend keeps, per group: the live member sessions (each with a lease that the *store*
expires), the coordinator and its epoch, the resource set, the published target, one claim per
resource with its resource epoch, and the last committed progress per resource. Every write
that depends on ownership or leadership is checked atomically by the store:

* :meth:`Backend.publish` only while ``epoch`` is the coordinator epoch and the caller's
  session is the coordinator's and alive;
* :meth:`Backend.claim` only for resources the current target (at ``generation``) gives the
  caller, that are free (released, never claimed, or held by an expired session); a grant
  raises the resource epoch by one and, in the same atomic step, tells the claimant what it
  superseded (a :class:`~rebalancer_spark.core.model.Grant`: the previous owner, its epoch,
  and whether and when it released or its lease expired), so the store keeps, per resource,
  the last holder and how and when its ownership ended;
* :meth:`Backend.commit` only while the caller's session is alive and holds the resource at
  exactly ``epoch``;
* :meth:`Backend.update_control` only while the group's control record is still at the
  version the caller read (compare-and-set); it wakes the group's watchers.

Everything else (threads, timing, protocols, assignors) lives above this contract, so a backend
is a translation of these calls to one store. Errors are translated at this boundary into the
tree of :mod:`rebalancer_spark.core.errors`. Methods may be called from several threads; an
implementation serialises them as it needs to.

The shared contract suite (``tests/contract/``) runs unchanged against every backend.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import ClassVar, Self

from rebalancer_spark.core.control import Control
from rebalancer_spark.core.model import (
    CoordinatorRecord,
    Grant,
    GroupState,
    JsonValue,
    Phase,
    Progress,
    Resource,
    Target,
)
from rebalancer_spark.core.protocols import MemberView
from rebalancer_spark.core.urls import BackendUrl

__all__ = ["Backend", "Capability", "Session", "Watch"]


class Capability(StrEnum):
    """What a backend can do beyond the contract; callers may *require* them at start-up."""

    PUSH_NOTIFICATIONS = "push_notifications"
    """Changes are pushed to watchers (ZooKeeper watches, Redis pub/sub), not polled."""
    MULTI_HOST = "multi_host"
    """Members may run on different hosts."""
    DURABLE = "durable"
    """Epochs and progress survive a restart of the store."""
    AUTHENTICATION = "authentication"
    """The store authenticates clients and can keep other identities out of the group."""
    PAUSE_TOLERANT = "pause_tolerant"
    """A client paused in the middle of a request (SIGSTOP, a long GC) never blocks the other
    clients. SQLite lacks it: a writer paused inside a transaction holds the file's lock."""


@dataclass(frozen=True, slots=True)
class Session:
    """One member's membership of one group, from join to leave or expiry."""

    group: str
    member_id: str
    session_id: str
    ttl: float
    """The lease the store *granted*, which may differ from the one asked for (ZooKeeper
    negotiates session timeouts): members self-fence on this value."""


class Watch(abc.ABC):
    """Wakes a waiter when a group may have changed. Spurious wake-ups are allowed; missed
    changes are not: a change made after :meth:`Backend.watch` returned wakes the next wait."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if the group may have changed."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop watching; a blocked :meth:`wait` returns."""


class Backend(abc.ABC):
    """A coordination store. Open one with :func:`rebalancer_spark.backends.open_backend`."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    options: ClassVar[Mapping[str, str]] = {}
    """The URL query options this backend accepts, each with a one-line description: the
    table of its grammar (``backends/<name>/url.py``), against which the registry checks URLs
    without importing the backend."""

    def __init__(self, url: BackendUrl) -> None:
        self.url = url

    # -- sessions -------------------------------------------------------------------------

    @abc.abstractmethod
    def join(
        self, group: str, member_id: str, *, info: Mapping[str, str], ttl: float, static: bool
    ) -> Session:
        """Start a session for ``member_id`` with a lease of ``ttl`` seconds.

        Raises :class:`MemberIdInUse` if a live session of the group has that member id."""

    @abc.abstractmethod
    def renew(self, session: Session) -> None:
        """Extend the lease by ``ttl`` from now; :class:`SessionExpired` if it already lapsed.

        The store must end the session no earlier than ``ttl`` after the *start* of the last
        successful renewal, and must end it once that time has passed without a renewal, even
        if the process is still running: on stores whose clients keep sessions alive by
        themselves (ZooKeeper's pings), the backend enforces this."""

    @abc.abstractmethod
    def set_leaving(self, session: Session) -> None:
        """Mark the member as draining: the coordinator assigns it nothing from now on."""

    @abc.abstractmethod
    def leave(self, session: Session) -> None:
        """End the session, releasing its claims (and coordinatorship). Idempotent."""

    # -- reading ----------------------------------------------------------------------------

    @abc.abstractmethod
    def state(self, group: str) -> GroupState:
        """A consistent snapshot of the group; only live sessions and their claims appear."""

    @abc.abstractmethod
    def member_view(self, session: Session) -> MemberView:
        """This member's part of the target and its claims; :class:`SessionExpired` if gone."""

    @abc.abstractmethod
    def progress(self, group: str, resources: Collection[str]) -> dict[str, Progress]:
        """The last committed progress of each resource that has any."""

    @abc.abstractmethod
    def watch(self, group: str) -> Watch:
        """Start watching ``group`` for changes of any kind."""

    # -- coordinator ---------------------------------------------------------------------------

    @abc.abstractmethod
    def elect(self, session: Session) -> CoordinatorRecord | None:
        """Become coordinator if the role is vacant (or its holder's session expired), raising
        the coordinator epoch by one; return the coordinator after the attempt (None only if
        the caller's own session has lapsed). Also removes expired sessions of the group."""

    @abc.abstractmethod
    def publish(
        self,
        session: Session,
        epoch: int,
        assignment: Mapping[str, Collection[str]],
        *,
        phase: Phase,
        resources_version: int,
    ) -> Target:
        """Publish a new target generation; :class:`FencedError` unless ``epoch`` is current
        and ``session`` is the live coordinator."""

    @abc.abstractmethod
    def resign(self, session: Session, epoch: int) -> None:
        """Give up the coordinator role if held at ``epoch`` (the epoch is kept)."""

    # -- resources -------------------------------------------------------------------------

    @abc.abstractmethod
    def update_resources(
        self,
        group: str,
        *,
        replace: Collection[Resource] | None = None,
        add: Collection[Resource] = (),
        remove: Collection[str] = (),
    ) -> int:
        """Change the group's resource set atomically; return its new version (unchanged if
        the set did not change)."""

    # -- operator control ------------------------------------------------------------------

    @abc.abstractmethod
    def update_control(self, group: str, expected_version: int, control: Control) -> Control:
        """Store ``control`` as the group's control record if the stored record's version is
        still ``expected_version`` (0: none was ever written); return it as stored, with
        version ``expected_version + 1``. :class:`ControlConflict` if the version moved on.
        Wakes the group's watchers; :meth:`state` returns the record in its snapshot."""

    # -- ownership ---------------------------------------------------------------------------

    @abc.abstractmethod
    def claim(
        self, session: Session, resources: Collection[str], generation: int
    ) -> dict[str, Grant]:
        """Claim what is free among ``resources``; return the granted ones, each with its new
        epoch and what it superseded (:class:`Grant`), read and written in the same atomic
        step as the grant. A resource already held by this session is returned with the grant
        that gave it (same epoch, same predecessor). The cost stays constant per call: the
        chain rides on the reads and writes a claim makes anyway."""

    @abc.abstractmethod
    def release(self, session: Session, claims: Mapping[str, int]) -> None:
        """Release claims held by this session at the given epochs (others are ignored)."""

    @abc.abstractmethod
    def acknowledge(self, session: Session, generation: int) -> None:
        """Record that this member handled ``generation`` (global barrier)."""

    @abc.abstractmethod
    def commit(self, session: Session, resource: str, epoch: int, progress: JsonValue) -> None:
        """Store ``progress`` for ``resource`` if this live session holds it at ``epoch``;
        else :class:`FencedError` (or :class:`SessionExpired`)."""

    # -- lifecycle ------------------------------------------------------------------------

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections. Idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
