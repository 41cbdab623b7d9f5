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

One front, a narrow interface: :class:`Backend`'s public methods are concrete and do what every
store needs alike: they validate group, member and resource ids (a group must move between
backends unchanged, so no backend stores what another would refuse), drop duplicate ids,
encode progress (:func:`~rebalancer_spark.core.model.encode_progress`: JSON that reads back as
committed, within the size limit) and skip calls that have nothing to do. Each then calls the
protected method of the same name (``_join``, ``_claim``, ``_commit`` …) that a backend
implements for its store. A refusal is raised as :class:`MemberIdInUse`, :class:`SessionExpired`
or :class:`FencedError` built from facts (:func:`expired`, :func:`fenced_commit`,
:func:`fenced_coordinator` fill in the session's), so its text is the same for every backend.

Epochs never go backwards, even when the store loses its state: the front remembers, per
group, the store's identity marker of the group (:meth:`Backend.incarnation`) and the highest
epoch it saw per resource (:mod:`.epochs`; :meth:`Backend.remember_epochs` adds epochs recorded
elsewhere, such as the audit table). A join that finds another incarnation than the one this
handle joined before lifts every remembered epoch into the store (:meth:`Backend.lift_epochs`)
before anything is granted, and :meth:`Backend.claim` never passes on a grant at or below an
epoch already seen: it hands it back, lifts the epoch and leaves the resource to the next claim.

The shared contract suite (``tests/contract/``) runs unchanged against every backend.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import math
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import ClassVar, Generic, Self, TypeVar

from rebalancer_spark.backends.epochs import EpochMemory
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.control import Control
from rebalancer_spark.core.coordinator import GroupView
from rebalancer_spark.core.errors import (
    ConfigurationError,
    FencedError,
    RebalancerError,
    SessionExpired,
)
from rebalancer_spark.core.model import (
    CoordinatorRecord,
    Grant,
    GroupHead,
    GroupState,
    JsonValue,
    Phase,
    Progress,
    Resource,
    ResourceChange,
    Target,
    encode_progress,
    validate_group,
    validate_member_id,
    validate_resource_id,
)
from rebalancer_spark.core.protocols import MemberHead, MemberView
from rebalancer_spark.core.urls import BackendUrl

__all__ = [
    "REMEMBER_AT_ONCE",
    "REMEMBER_STAGGER",
    "REMEMBER_STAGGER_MAX",
    "RESOURCE_LOG_IDS",
    "RESOURCE_LOG_SHARE",
    "RESOURCE_LOG_VERSIONS",
    "Backend",
    "Capability",
    "GroupReader",
    "Interest",
    "KeptParts",
    "Session",
    "TargetChange",
    "Watch",
    "expired",
    "fenced_commit",
    "fenced_coordinator",
    "resource_log_limit",
]

log = logging.getLogger("rebalancer_spark.backend")

RESOURCE_LOG_VERSIONS = 64
"""How many of the resource set's last changes a store logs (:meth:`Backend.resource_changes`),
at most: a reader further behind reads the set whole."""


RESOURCE_LOG_IDS = 1024
"""The log of a resource set names at least this many ids (:func:`resource_log_limit`)."""

RESOURCE_LOG_SHARE = 4
"""... or one in this many of the set's resources, if that is more."""


def resource_log_limit(size: int) -> int:
    """How many ids the log of a resource set of ``size`` resources names at most, over all
    its changes: :data:`RESOURCE_LOG_IDS`, or a :data:`RESOURCE_LOG_SHARE`-th of the set if
    that is more. A change larger than that is not logged (a reader behind it reads the set
    whole, which costs little more), and the oldest changes are dropped to keep the log
    within it."""
    return max(RESOURCE_LOG_IDS, size // RESOURCE_LOG_SHARE)


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


class Interest(StrEnum):
    """Which changes of a group a watcher acts on (:meth:`Watch.focus`).

    Use case: in a group of 100 members every claim, release and acknowledgement used to wake
    all 200 watches (each member's reconciler and coordinator thread), and each woken thread
    read the store: O(members²) reads per rebalance, for changes only the coordinator acts on.
    """

    ALL = "all"
    """Every change: the coordinator, and operators' tools (the default)."""
    MEMBER = "member"
    """What a member's reconciler acts on: a new target, control, the end of its own session
    (ZooKeeper wakes for that one member's record, not for others joining or leaving, which
    change nothing a member acts on until a target says so), and releases of resources that
    the target gives this member (on ZooKeeper, those its last claim found held: the
    reconciler claims on every new target)."""
    SUCCESSION = "succession"
    """What a member that does not coordinate watches for: the coordinator going away
    (membership and lease events, resignations, elections), members coming, whose
    records say which are static (a coordinator that takes over gives a static member that
    it saw before its rejoin grace), and a new resource set (a follower remembers it, so that
    it can declare it again into a store that lost the group: :class:`GroupReader`)."""
    COORDINATOR = "coordinator"
    """:attr:`SUCCESSION` without members coming: what a follower that gives no rejoin grace
    (``rejoin_grace`` 0, the default, and the only value for a member that is not static)
    watches for, since the static members it saw change nothing it would do. On ZooKeeper
    the ``coordinator`` znode and the ``resources`` pointer: a join or a leave in a group of
    100 woke the 99 followers, each to read the 100 member records (about 10,000 reads a
    join). SQLite reads the group's coordinator row (with the set's version), not its change
    counter, when the file changed. Redis wakes as for :attr:`SUCCESSION`."""


class Watch(abc.ABC):
    """Wakes a waiter when a group may have changed. Spurious wake-ups are allowed; missed
    changes are not: a change made after :meth:`Backend.watch` returned wakes the next wait
    (among the changes its :attr:`interest` covers)."""

    interest: Interest = Interest.ALL
    member_id: str | None = None

    def focus(self, interest: Interest, member_id: str | None = None) -> None:
        """From now on, wake only for the changes ``interest`` covers (for
        :attr:`Interest.MEMBER`: the releases of resources that the target gives
        ``member_id``, once its claim found them held). SQLite tells only the coordinator's
        changes apart (:attr:`Interest.COORDINATOR`) and wakes for all otherwise. Redis
        subscribes only to the channels of the interest
        and wakes once when it widens (once the wider subscription is confirmed); ZooKeeper
        watches only the znodes of the interest and wakes once when it widens. Either way
        widening never loses a change."""
        self.interest, self.member_id = interest, member_id

    @abc.abstractmethod
    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if the group may have changed."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop watching; a blocked :meth:`wait` returns."""


class Backend(abc.ABC):
    """A coordination store. Open one with :func:`rebalancer_spark.backends.open_backend`.

    The public methods are the contract (see the module docstring); a backend implements the
    protected ones, which receive ids already validated and deduplicated and progress already
    encoded as JSON text."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    options: ClassVar[Mapping[str, str]] = {}
    """The URL query options this backend accepts, each with a one-line description: the
    table of its grammar (``backends/<name>/url.py``), against which the registry checks URLs
    without importing the backend."""

    def __init__(self, url: BackendUrl) -> None:
        self.url = url
        self.epochs = EpochMemory()
        """What this handle knows of each group's epochs (see the module docstring)."""

    # -- sessions -------------------------------------------------------------------------

    def join(
        self, group: str, member_id: str, *, info: Mapping[str, str], ttl: float, static: bool
    ) -> Session:
        """Start a session for ``member_id`` with a lease of ``ttl`` seconds.

        Raises :class:`MemberIdInUse` if a live session of the group has that member id."""
        validate_group(group)
        validate_member_id(member_id)
        if isinstance(ttl, bool) or not (isinstance(ttl, int | float) and 0 < ttl < math.inf):
            raise ConfigurationError(f"session ttl {ttl!r} for group {group!r}: use seconds > 0")
        session = self._join(group, member_id, info=dict(info), ttl=ttl, static=static)
        incarnation = self._incarnation(group)
        if self.epochs.is_new(group, incarnation):
            self._adopt(group, incarnation)
        self.epochs.joined(group, incarnation)
        return session

    def _adopt(self, group: str, incarnation: str | None) -> None:
        """A group this handle knows epochs of, in an incarnation it did not join before:
        declare the remembered resource set again if the group has none, and lift the epochs.

        When this handle joined another incarnation before (it saw the loss), every resource it
        can name (remembered, in the new set, or its own) is lifted to at least the wall clock
        in microseconds, as Redis lifts its base: every epoch handed out before grew by one per
        grant from 1 (or from such a base), so it is below that as long as the clock did not go
        back by more than the group's lifetime, whichever member held the resource. A first
        join with epochs told of (the audit table) lifts those epochs only."""
        known = self.epochs.floors(group)
        saw_loss = self.epochs.incarnation(group) is not None
        remembered = self.epochs.resources(group)
        current = self._state(group).resources
        restored = 0
        if remembered and not current:
            self._update_resources(group, replace=remembered, add=(), remove=[], base=None)
            restored = len(remembered)
        floors = dict(known)
        if saw_loss:
            base = time.time_ns() // 1000
            names = set(known) | {r.id for r in remembered} | set(current)
            floors = {r: max(known.get(r, 0), base) for r in names}
        lifted = self._lift_epochs(group, floors) if floors else 0
        log.warning(
            "group %s: the store holds an incarnation of the group (%s) that this member did "
            "not join before (it was created again: the store lost its state, or it is "
            "another store): %d of %d resource epochs lifted to at least %d, so that no epoch "
            "goes backwards; %d resources declared again",
            group,
            incarnation,
            lifted,
            len(floors),
            min(floors.values(), default=0),
            restored,
        )

    def incarnation(self, group: str) -> str | None:
        """The store's identity marker of ``group``, written when the group was created (None
        if the group does not exist). Another value than before means the group was created
        again: the store lost its state (or it is another store)."""
        validate_group(group)
        return self._incarnation(group)

    def store_warnings(self) -> list[str]:
        """What an operator should know about how the store is set up (for ``status``): a
        Redis server that persists nothing, for instance. Empty where there is nothing to say."""
        return self._store_warnings()

    def _store_warnings(self) -> list[str]:
        return []

    def remember_epochs(self, group: str, epochs: Mapping[str, int]) -> None:
        """Epochs of ``group``'s resources recorded durably elsewhere (the audit table, an
        operator's floor): this handle grants nothing at or below them, and lifts them into the
        store when it first joins the group or finds it created again."""
        validate_group(group)
        self.epochs.see(group, {validate_resource_id(r): int(e) for r, e in epochs.items()})

    def lift_epochs(self, group: str, floors: Mapping[str, int]) -> int:
        """Raise the stored epoch of each free resource of ``floors`` to at least its floor, so
        that its next grant is above it; resources held now are left alone (their holders are
        fenced by the store as ever). Returns how many were raised."""
        validate_group(group)
        checked = {validate_resource_id(r): int(e) for r, e in floors.items() if int(e) > 0}
        return self._lift_epochs(group, checked) if checked else 0

    def renew(self, session: Session) -> None:
        """Extend the lease by ``ttl`` from now; :class:`SessionExpired` if it already lapsed.

        The store must end the session no earlier than ``ttl`` after the *start* of the last
        successful renewal, and must end it once that time has passed without a renewal, even
        if the process is still running: on stores whose clients keep sessions alive by
        themselves (ZooKeeper's pings), the backend enforces this."""
        self._renew(session)

    def update_info(self, session: Session, info: Mapping[str, str]) -> None:
        """Replace the member's published info (what ``status`` shows of it: host, pid, its
        health) while the session lives; :class:`SessionExpired` if it is gone. Wakes
        nobody: info is for operators, not for the protocol."""
        self._update_info(session, {str(k): str(v) for k, v in info.items()})

    def set_leaving(self, session: Session) -> None:
        """Mark the member as draining: the coordinator assigns it nothing from now on."""
        self._set_leaving(session)

    def leave(self, session: Session) -> None:
        """End the session, releasing its claims (and coordinatorship). Idempotent."""
        self._leave(session)

    # -- reading ----------------------------------------------------------------------------

    def state(self, group: str) -> GroupState:
        """A consistent snapshot of the group; only live sessions and their claims appear."""
        validate_group(group)
        state = self._state(group)
        self.epochs.saw_state(state)
        return state

    def member_view(self, session: Session, *, claims: bool = True) -> MemberView:
        """This member's part of the target and its claims; :class:`SessionExpired` if gone.

        ``claims=False``: without the claims (:attr:`MemberView.owned` is None), for a member
        that knows them: while its session lives only its own calls change them, so one whose
        last view's claims were what it held, and whose calls since all returned, holds what
        the store holds. Its read then follows what moved in the target, not its claims (a
        thousand claims read, sent and decoded by each member on every change of the
        target)."""
        return self._member_view(session, claims)

    def member_head(self, session: Session) -> MemberHead:
        """The target's generation, phase and coordinator epoch, in O(1);
        :class:`SessionExpired` if the session is gone. A member whose head has not moved and
        that has nothing left to do need not read its view (:func:`~.protocols.idle`)."""
        return self._member_head(session)

    def head(self, group: str) -> GroupHead:
        """The small part of the group in one consistent read (members, coordinator, control,
        the resource set's version and the target's generation): its cost follows the members,
        not the resources. :class:`GroupReader` builds the coordinator's view on it."""
        validate_group(group)
        return self._head(group)

    def control(self, group: str) -> Control:
        """The group's control record alone (the default record when none was written): one
        small read, whatever the members and resources."""
        validate_group(group)
        return self._control(group)

    def resources(
        self, group: str, known: tuple[int, Mapping[str, Resource]] | None = None
    ) -> tuple[int, dict[str, Resource]]:
        """The group's resource set and its version, read together. Given ``known``, the set
        at some version (a copy kept from an earlier call on the same session, which this does
        not change), only the changes since that version are read where the store still logs
        them (:meth:`resource_changes`): a listing that found one new prefix among 100,000
        reads one id, not the set. The whole set otherwise."""
        validate_group(group)
        if known is not None:
            change = self._resource_changes(group, known[0])
            if change is not None:
                resources = change.apply(known[1]) if change.size else dict(known[1])
                self.epochs.saw_resources(group, resources, change.version)
                return change.version, resources
        version, resources = self._resources(group)
        self.epochs.saw_resources(group, resources, version)
        return version, resources

    def resource_changes(self, group: str, since: int) -> ResourceChange | None:
        """What changed in the group's resource set after version ``since``, up to its current
        version, read together; None if the store no longer logs every change since then (it
        keeps the last :data:`RESOURCE_LOG_VERSIONS` changes, as long as they name at most
        :func:`resource_log_limit` ids in all, and none across a change larger than that) or
        ``since`` is not a version it reached: read the set whole then. Versions count the
        changes of one incarnation of the group: a caller that kept a version across a store
        that lost the group (a new session) must not ask by it."""
        validate_group(group)
        if isinstance(since, bool) or not isinstance(since, int) or since < 0:
            raise ConfigurationError(
                f"resource_changes(since={since!r}) of group {group!r}: use a version the "
                "store returned (an integer of 0 or more)"
            )
        return self._resource_changes(group, since)

    def remember_resources(self, group: str, since: int | None = None) -> int:
        """Read the group's resource set only to remember it (:class:`~.epochs.EpochMemory`:
        to declare it again into a store that lost the group) and return its version: what a
        follower's coordinator thread needs of it. Given ``since``, the version this handle
        last remembered on the same session, only the changes after it are read where the
        store logs them, and kept beside the set remembered (:meth:`resource_changes`). A
        backend that can keep the set as read, and build it only if it is ever needed, does
        (ZooKeeper: 100 followers each built 100,000 resources at once when a group of 100
        started; SQLite and Redis keep the rows as read: on SQLite about 60 ms a follower at
        100,000 resources instead of 215); the default reads it as :meth:`resources` does."""
        validate_group(group)
        if since is not None:
            change = self._resource_changes(group, since)
            if change is not None and self.epochs.changed_resources(group, change):
                return change.version
        return self._remember_resources(group)

    def _remember_resources(self, group: str) -> int:
        version, _ = self.resources(group)
        return version

    def target(self, group: str) -> Target | None:
        """The current target (None if none was published), read whole and consistently."""
        validate_group(group)
        return self._target(group)

    def holders(self, group: str, sessions: Mapping[str, str]) -> frozenset[str]:
        """Which of ``sessions`` (member id → session id) hold at least one claim. Cheap for
        a few members on SQLite and Redis; ZooKeeper keeps no claims per session, so there it
        reads every resource's epoch record (the coordinator asks only while a drain is
        unfinished)."""
        validate_group(group)
        return self._holders(group, dict(sessions)) if sessions else frozenset()

    def progress(self, group: str, resources: Collection[str]) -> dict[str, Progress]:
        """The last committed progress of each resource that has any: every commit
        acknowledged before the call began is in it, unless the store lost it (Redis without
        persistence, docs/operations.md). On a ZooKeeper ensemble the read syncs its server
        with the leader first (a ``sync`` is not a quorum read: a leader just cut off from the
        others can still answer it). A member needs none of it after a claim: each
        :class:`Grant` carries the progress it hands over."""
        validate_group(group)
        ids = _ids(resources)
        return self._progress(group, ids) if ids else {}

    def watch(self, group: str) -> Watch:
        """Start watching ``group`` for changes of any kind."""
        validate_group(group)
        return self._watch(group)

    # -- coordinator ---------------------------------------------------------------------------

    def elect(self, session: Session) -> CoordinatorRecord | None:
        """Become coordinator if the role is vacant (or its holder's session expired), raising
        the coordinator epoch by one; return the coordinator after the attempt (None only if
        the caller's own session has lapsed). Also removes expired sessions of the group."""
        return self._elect(session)

    def publish(
        self,
        session: Session,
        epoch: int,
        assignment: Mapping[str, Collection[str]],
        *,
        phase: Phase,
        resources_version: int,
        previous: Target | None = None,
    ) -> Target:
        """Publish a new target generation; :class:`FencedError` unless ``epoch`` is current
        and ``session`` is the live coordinator.

        ``previous``: the target the caller believes current (the coordinator's kept copy).
        The backend may then write only the difference (:class:`TargetChange`), after checking
        in the same atomic step that the store still holds that generation; otherwise, or
        without ``previous``, it writes the whole target. Only the ids new to a member are
        validated again: those of ``previous`` were checked when it was published."""
        change = None if previous is None else TargetChange.between(previous, assignment)
        checked: dict[str, list[str]] = {}
        for m, owned in assignment.items():
            ids = list(dict.fromkeys(owned))
            new = ids if change is None else change.added.get(m, ())
            _ids(new)  # validation only
            checked[validate_member_id(m)] = ids
        return self._publish(
            session,
            epoch,
            checked,
            phase=phase,
            resources_version=resources_version,
            change=change,
        )

    def resign(self, session: Session, epoch: int) -> None:
        """Give up the coordinator role if held at ``epoch`` (the epoch is kept)."""
        self._resign(session, epoch)

    # -- resources -------------------------------------------------------------------------

    def update_resources(
        self,
        group: str,
        *,
        replace: Iterable[Resource] | None = None,
        add: Iterable[Resource] = (),
        remove: Collection[str] = (),
        known: tuple[int, Mapping[str, Resource]] | None = None,
    ) -> int:
        """Change the group's resource set atomically; return its new version (unchanged if
        the set did not change). ``replace`` is the whole new set (then ``add`` and ``remove``
        change it further); given ``known``, the set at some version as this handle read it
        (what a coordinator keeps, :class:`GroupReader`), a store still at that version is
        sent only the difference (a listing that found one new prefix among 100,000 writes one
        id, not the set), and one that moved on gets ``replace`` whole, as without it.
        ``replace`` and ``add`` may be any iterables (read once). The handle remembers the
        set it wrote (:class:`~.epochs.EpochMemory`), to declare it again into a store that
        lost the group."""
        validate_group(group)
        removed = _ids(remove)
        add = list(add)  # read twice below (the store's write, this handle's memory)
        if replace is None:
            version, changed = self._update_resources(
                group, replace=None, add=add, remove=removed, base=None
            )
            put = {r.id: r for r in add}
            if not self.epochs.wrote_resources(group, version, changed, put, removed):
                # Another writer changed the set since this handle last saw it: remember the
                # set as it is, not this delta applied to an older one. The write is done
                # either way: a read that fails leaves the older set remembered until the
                # next read replaces it.
                with contextlib.suppress(RebalancerError):
                    self.resources(group)
            return version
        replace = list(replace)
        wanted = {r.id: r for r in replace}
        wanted.update((r.id, r) for r in add)
        for rid in removed:
            wanted.pop(rid, None)
        if known is None:
            version, _ = self._update_resources(
                group, replace=replace, add=add, remove=removed, base=None
            )
        else:
            before = known[1]
            put_list = [r for rid, r in wanted.items() if before.get(rid) != r]
            gone = [rid for rid in before if rid not in wanted]
            version, _ = self._update_resources(
                group, replace=list(wanted.values()), add=put_list, remove=gone, base=known[0]
            )
        # Written whole (or as its change from a store still at ``base``): the set is
        # ``wanted`` at ``version``, whatever other writers did before.
        self.epochs.saw_resources(group, wanted, version)
        return version

    # -- operator control ------------------------------------------------------------------

    def update_control(self, group: str, expected_version: int, control: Control) -> Control:
        """Store ``control`` as the group's control record if the stored record's version is
        still ``expected_version`` (0: none was ever written); return it as stored, with
        version ``expected_version + 1``. :class:`ControlConflict` if the version moved on.
        Wakes the group's watchers; :meth:`state` returns the record in its snapshot."""
        validate_group(group)
        return self._update_control(group, expected_version, control)

    # -- ownership ---------------------------------------------------------------------------

    def claim(
        self, session: Session, resources: Collection[str], generation: int
    ) -> dict[str, Grant]:
        """Claim what is free among ``resources``; return the granted ones, each with its new
        epoch, what it superseded and the progress it hands over (:attr:`Grant.progress`, the
        resource's last accepted commit, None if it has none), read and written in the same
        atomic step as the grant. A resource already held by this session is returned with
        the grant that gave it (same epoch, same predecessor) and its progress now. The cost
        stays constant per call: the chain and the progress ride on the reads and writes a
        claim makes anyway."""
        grants = self._claim(session, _ids(resources), generation)
        epochs = {r: g.epoch for r, g in grants.items()}
        low = self.epochs.refused(session.group, epochs, session.session_id)
        if low:
            return self._refuse_backwards(session, grants, low)
        self.epochs.see(session.group, epochs, session.session_id)
        return grants

    def _refuse_backwards(
        self, session: Session, grants: dict[str, Grant], low: dict[str, int]
    ) -> dict[str, Grant]:
        """Grants at or below an epoch already seen: hand them back, lift their epochs above
        what is known, and return the other grants (the next claim takes them higher)."""
        floors = {r: self.epochs.floor(session.group, r) for r in low}
        self._release(session, low)
        self._lift_epochs(session.group, floors)
        shown = ", ".join(f"{r} at {e} (known {floors[r]})" for r, e in list(low.items())[:5])
        log.warning(
            "group %s: the store granted %d resources at epochs that went backwards (%s): it "
            "lost its state. They were handed back and their epochs lifted; the next claim "
            "takes them above every epoch known",
            session.group,
            len(low),
            shown,
        )
        kept = {r: g for r, g in grants.items() if r not in low}
        self.epochs.see(session.group, {r: g.epoch for r, g in kept.items()}, session.session_id)
        return kept

    def release(self, session: Session, claims: Mapping[str, int]) -> None:
        """Release claims held by this session at the given epochs (others are ignored)."""
        if claims:
            self._release(session, {validate_resource_id(r): e for r, e in claims.items()})

    def acknowledge(self, session: Session, generation: int) -> None:
        """Record that this member handled ``generation`` (global barrier)."""
        self._acknowledge(session, generation)

    def commit(self, session: Session, resource: str, epoch: int, progress: JsonValue) -> None:
        """Store ``progress`` for ``resource`` if this live session holds it at ``epoch``;
        else :class:`FencedError` (or :class:`SessionExpired`)."""
        text = encode_progress(validate_resource_id(resource), progress)
        self._commit(session, resource, epoch, text)
        self.epochs.see(session.group, {resource: epoch}, session.session_id)

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

    # -- what each backend implements -------------------------------------------------------
    # Called by the public method of the same name, with ids validated and deduplicated (in
    # their first order) and progress encoded; each keeps the promise written there.

    @abc.abstractmethod
    def _join(
        self, group: str, member_id: str, *, info: dict[str, str], ttl: float, static: bool
    ) -> Session: ...

    @abc.abstractmethod
    def _renew(self, session: Session) -> None: ...

    @abc.abstractmethod
    def _incarnation(self, group: str) -> str | None: ...

    @abc.abstractmethod
    def _update_info(self, session: Session, info: dict[str, str]) -> None: ...

    @abc.abstractmethod
    def _lift_epochs(self, group: str, floors: dict[str, int]) -> int:
        """Never called with no floors; every floor above 0."""

    @abc.abstractmethod
    def _set_leaving(self, session: Session) -> None: ...

    @abc.abstractmethod
    def _leave(self, session: Session) -> None: ...

    @abc.abstractmethod
    def _state(self, group: str) -> GroupState: ...

    @abc.abstractmethod
    def _member_view(self, session: Session, claims: bool) -> MemberView: ...

    @abc.abstractmethod
    def _member_head(self, session: Session) -> MemberHead: ...

    @abc.abstractmethod
    def _head(self, group: str) -> GroupHead: ...

    @abc.abstractmethod
    def _control(self, group: str) -> Control: ...

    @abc.abstractmethod
    def _resources(self, group: str) -> tuple[int, dict[str, Resource]]: ...

    @abc.abstractmethod
    def _resource_changes(self, group: str, since: int) -> ResourceChange | None:
        """:meth:`resource_changes` (``since`` checked): None unless the store logged every
        change after ``since`` and ``since`` is at most its current version."""

    @abc.abstractmethod
    def _target(self, group: str) -> Target | None: ...

    @abc.abstractmethod
    def _holders(self, group: str, sessions: dict[str, str]) -> frozenset[str]: ...

    @abc.abstractmethod
    def _progress(self, group: str, resources: list[str]) -> dict[str, Progress]:
        """Never called with no resources."""

    @abc.abstractmethod
    def _watch(self, group: str) -> Watch: ...

    @abc.abstractmethod
    def _elect(self, session: Session) -> CoordinatorRecord | None: ...

    @abc.abstractmethod
    def _publish(
        self,
        session: Session,
        epoch: int,
        assignment: dict[str, list[str]],
        *,
        phase: Phase,
        resources_version: int,
        change: TargetChange | None,
    ) -> Target: ...

    @abc.abstractmethod
    def _resign(self, session: Session, epoch: int) -> None: ...

    @abc.abstractmethod
    def _update_resources(
        self,
        group: str,
        *,
        replace: Collection[Resource] | None,
        add: Collection[Resource],
        remove: list[str],
        base: int | None,
    ) -> tuple[int, bool]:
        """:meth:`update_resources`: the set becomes ``replace`` (if given) with ``add`` put
        and ``remove`` dropped (an id in both is dropped). With ``base``, ``replace`` is given
        and ``add`` / ``remove`` are exactly the difference from the set at version ``base``
        to ``replace``: a store still at ``base`` may write only them. Returns the set's
        version after the call and whether this call changed the set (a delta that changed
        nothing returns the version as it found it: perhaps one another writer made, which
        this handle's memory must not take for this delta's, :meth:`.EpochMemory.
        wrote_resources`)."""

    @abc.abstractmethod
    def _update_control(self, group: str, expected_version: int, control: Control) -> Control: ...

    @abc.abstractmethod
    def _claim(self, session: Session, resources: list[str], generation: int) -> dict[str, Grant]:
        """Each grant with its :attr:`Grant.progress`."""

    @abc.abstractmethod
    def _release(self, session: Session, claims: dict[str, int]) -> None:
        """Never called with no claims."""

    @abc.abstractmethod
    def _acknowledge(self, session: Session, generation: int) -> None: ...

    @abc.abstractmethod
    def _commit(self, session: Session, resource: str, epoch: int, text: str) -> None:
        """``text``: the progress as JSON (:func:`~rebalancer_spark.core.model.encode_progress`),
        to store as it is or inside the backend's own record."""


_K = TypeVar("_K")


class KeptParts(Generic[_K]):
    """Each member's part of the target as its session's last view read it, in one backend
    handle, with what the backend needs to name it to the store (``_K``): a backend whose store
    logs the target's changes reads only the changes since (the SQLite and Redis backends;
    ZooKeeper's session keeps its own). A member's next session replaces its entry; ending a
    session (:meth:`forget`) drops it."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str], tuple[str, _K]] = {}

    def get(self, session: Session) -> _K | None:
        """What ``session`` kept, if this very session kept it."""
        found = self._kept.get((session.group, session.member_id))
        return found[1] if found is not None and found[0] == session.session_id else None

    def keep(self, session: Session, kept: _K) -> None:
        self._kept[(session.group, session.member_id)] = (session.session_id, kept)

    def forget(self, session: Session) -> None:
        """Drop what ``session`` kept (its member's next session keeps its own)."""
        key = (session.group, session.member_id)
        found = self._kept.get(key)
        if found is not None and found[0] == session.session_id:
            self._kept.pop(key, None)


@dataclass(frozen=True, slots=True)
class TargetChange:
    """A target as the difference from the one published at generation :attr:`base`: what a
    backend writes when the store still holds ``base`` (:meth:`Backend.publish`). A join or a
    leave that moves k resources changes k ids, whatever the total."""

    base: int
    """The generation this change applies to."""
    added: Mapping[str, frozenset[str]]
    """Member → ids it gets that it did not have at ``base`` (members with none left out)."""
    removed: Mapping[str, frozenset[str]]
    """Member → ids it had at ``base`` and no longer has (members with none left out)."""
    dropped: frozenset[str]
    """Members of ``base`` that the new target no longer names."""

    @classmethod
    def between(cls, previous: Target, assignment: Mapping[str, Collection[str]]) -> TargetChange:
        added: dict[str, frozenset[str]] = {}
        removed: dict[str, frozenset[str]] = {}
        old = previous.assignment
        for m, owned in assignment.items():
            now, before = frozenset(owned), old.get(m, frozenset())
            if now != before:
                if gained := now - before:
                    added[m] = gained
                if lost := before - now:
                    removed[m] = lost
        dropped = frozenset(old) - frozenset(assignment)
        for m in dropped:
            if old[m]:
                removed[m] = old[m]
        return cls(previous.generation, added, removed, dropped)

    @property
    def size(self) -> int:
        """Ids this change writes."""
        return sum(map(len, self.added.values())) + sum(map(len, self.removed.values()))


def _ids(resources: Collection[str]) -> list[str]:
    """``resources`` without duplicates, in their first order, each a valid resource id
    (:func:`validate_resource_id`): no backend stores an id that another would refuse."""
    return [validate_resource_id(r) for r in dict.fromkeys(resources)]


def expired(session: Session, why: str, *, doing: str = "") -> SessionExpired:
    """The :class:`SessionExpired` of ``session``: the store says it is over, ``why``."""
    return SessionExpired(
        session.group, session.member_id, session.session_id, why=why, doing=doing
    )


def fenced_commit(
    session: Session,
    resource: str,
    epoch: int,
    *,
    holder: str | None = None,
    current_epoch: int | None = None,
    why: str = "",
) -> FencedError:
    """The :class:`FencedError` of a progress commit by ``session`` at ``epoch``: the resource
    is held by ``holder`` (None: nobody) at ``current_epoch``, or refused ``why``."""
    return FencedError(
        write="commit",
        group=session.group,
        member=session.member_id,
        resource=resource,
        epoch=epoch,
        holder=holder,
        current_epoch=current_epoch,
        why=why,
    )


def fenced_coordinator(
    session: Session,
    epoch: int,
    *,
    holder: str | None = None,
    current_epoch: int | None = None,
    why: str = "",
) -> FencedError:
    """The :class:`FencedError` of a coordinator write by ``session`` carrying ``epoch``: the
    coordinator is ``holder`` (None: nobody) at ``current_epoch``, or refused ``why``."""
    return FencedError(
        write="coordinator",
        group=session.group,
        member=session.member_id,
        epoch=epoch,
        holder=holder,
        current_epoch=current_epoch,
        why=why,
    )


REMEMBER_AT_ONCE = 8
"""How many followers read a new resource set as soon as they see it (:class:`GroupReader`):
those ranked first among the followers' sorted ids. The others take turns
(:data:`REMEMBER_STAGGER`). A few reads at once cost a store little, and a group of up to
this many followers keeps no window in which a store that lost the group together with its
coordinator gets back an older set from a follower whose turn had not come (a test that
killed the coordinator and lost the store right after a change of the set caught it)."""
REMEMBER_STAGGER = 0.1
"""Seconds between two followers' reads of a new resource set beyond the first
:data:`REMEMBER_AT_ONCE` (:class:`GroupReader`): the follower ranked *i* among the followers'
sorted ids reads it ``(i - REMEMBER_AT_ONCE + 1)`` times this after it saw the new version.
100 followers that read a set of 100,000 at once kept Redis busy past its 5 s command timeout
at start-up (about 60 ms of the server each); spaced this far apart they keep it busy about
60 % of the time, and each other command waits behind one read at most, most of the time."""
REMEMBER_STAGGER_MAX = 10.0
"""The longest a follower puts off remembering a new resource set: beyond 100 followers
that take turns, the turns come closer together than :data:`REMEMBER_STAGGER` so that the
last one still comes within this many seconds (a cap on each delay alone would have every
follower past the hundredth read at once, at the cap)."""


class GroupReader:
    """The coordinator's view of one group, read in proportion to what changed.

    Each :meth:`read` reads the group's head (:meth:`Backend.head`: members, coordinator,
    control, versions; its size follows the members), and the resource set or the target only
    when the head says they changed since the copy kept here: a wake-up of an idle coordinator,
    a join or a leave read no resource and no target at 100,000 resources. A target this
    coordinator published itself is kept as it was written (:meth:`published`), so it is never
    read back. Not thread-safe: one reader per coordinator thread.

    The first ``at_once`` followers (:data:`REMEMBER_AT_ONCE`, by their sorted ids) remember
    a new set as soon as they see it; each of the others puts it off by its rank beyond them
    times ``stagger`` (:data:`REMEMBER_STAGGER`; closer together if the last turn would
    come after :data:`REMEMBER_STAGGER_MAX` seconds), so that the followers of a large group
    read it one after the other, not all at once; its thread wakes when :attr:`remember_due`
    comes and calls :meth:`remember` (:class:`~.member.coordinator.CoordinatorLoop`).
    """

    def __init__(
        self,
        backend: Backend,
        group: str,
        *,
        clock: Clock,
        at_once: int | None = None,
        stagger: float | None = None,
    ) -> None:
        self._backend = backend
        self._group = group
        self._clock = clock
        self._at_once = REMEMBER_AT_ONCE if at_once is None else at_once
        self._stagger = REMEMBER_STAGGER if stagger is None else stagger
        self._resources: tuple[int, Mapping[str, Resource]] | None = None
        self._remembered: int | None = None
        """The version of the set last remembered as a follower (not built here)."""
        self._due: float | None = None
        """When this follower remembers the set whose version it has not read yet (monotonic
        seconds on ``clock``), or None if it has nothing to read."""
        self._fresh = True
        """Nothing read since the start or :meth:`forget` (:attr:`needs_read`)."""
        self._head: GroupHead | None = None
        self._target: Target | None = None
        self._session: str | None = None
        self.reads = {"head": 0, "resources": 0, "target": 0, "holders": 0}
        """How many reads of each kind this reader made (benchmarks, tests)."""

    def read(self, member_id: str, session_id: str) -> GroupView:
        """The group as the coordinator rules need it. Every member keeps the resource set
        (read again only when its version moves: a listing that changed, not a rebalance), so
        that any member can declare it again into a store that lost it: the front remembers
        what it read (:class:`~.epochs.EpochMemory`), and a follower that skipped this read
        would leave a store that lost the group together with its coordinator with no resource
        set at all (session 18 tried it; see
        ``test_a_store_that_lost_the_group_with_its_coordinator_gets_the_set_back_from_a_follower``).
        A follower (the role held by another live session) only remembers the set, in its
        turn (the class docstring; :meth:`Backend.remember_resources`: on ZooKeeper the
        chunks as read, built only if a store that lost the group needs them; 100 followers
        built 100,000 resources each, together, when a group of 100 started) and reads no
        target:
        :func:`~rebalancer_spark.core.coordinator_rules.decide` looks at neither before this
        member holds the role (a vacant role is an election at once: a candidate's read is the
        head alone, and :meth:`won` completes it). With the role held, the set is read and
        built, and the target brought up to date."""
        if session_id != self._session:
            # A new session: the store may have lost the group (and numbered it afresh) since
            # anything here was read, so nothing kept is trusted.
            self.forget()
            self._resources = None
            self._remembered = None
            self._session = session_id
        head = self._head = self._backend.head(self._group)
        self._fresh = False
        self.reads["head"] += 1
        if all(rec.session_id != session_id for rec in head.members.values()):
            # Not a member of what the store holds: it may have lost the group and numbered
            # the set afresh before this member noticed, so no version kept here names it.
            self._resources = None
            self._remembered = None
        coordinator = head.coordinator
        if coordinator is not None and coordinator.session_id == session_id:
            return self._whole(member_id, session_id, head, coordinator)
        if coordinator is not None:
            # A follower: only remembers the set. (A candidate reads nothing more: when a
            # coordinator left, 99 followers each built 100,000 resources for an election
            # that one of them wins.)
            kept = self._remembered if self._resources is None else self._resources[0]
            if kept == head.resources_version:
                self._due = None
            else:
                if self._due is None:  # kept if the version moves again before the turn
                    self._due = self._turn(member_id, head, coordinator)
                self.remember()
        return GroupView(
            member_id,
            session_id,
            head.members,
            coordinator,
            {},
            head.resources_version,
            None,
            head.control,
        )

    def _turn(self, member_id: str, head: GroupHead, coordinator: CoordinatorRecord) -> float:
        """When this follower's turn to read the new set ``head`` names comes (the class
        docstring), on the reader's clock."""
        followers = sorted(m for m in head.members if m != coordinator.member_id)
        rank = followers.index(member_id) if member_id in followers else 0
        turn = max(rank - self._at_once + 1, 0)
        turns = max(len(followers) - self._at_once, 1)
        spacing = min(self._stagger, REMEMBER_STAGGER_MAX / turns)
        return self._clock.monotonic() + turn * spacing

    def remember(self) -> bool:
        """Remember the new set if this follower's turn has come (:attr:`remember_due`);
        whether it read. The loop also calls it alone when its watch reported nothing since
        the last :meth:`read`: the head that set the turn said the set moved, so it is not
        read again (on ZooKeeper a head is the members' 100 records, and 99 followers each
        reading it once more cost 9,000 reads when a group of 100 got its first set)."""
        if self._due is None or self._clock.monotonic() < self._due:
            return False
        kept = self._remembered if self._resources is None else self._resources[0]
        self._remembered = self._backend.remember_resources(self._group, kept)
        self._resources = None
        self._due = None
        self.reads["resources"] += 1
        return True

    @property
    def needs_read(self) -> bool:
        """True until the first :meth:`read`, and again after :meth:`forget` (an error): a
        turn to remember a set, or anything else, is known only from a read."""
        return self._fresh

    @property
    def remember_due(self) -> float | None:
        """When this follower will remember a new resource set it has not read yet (monotonic
        seconds on the reader's clock), or None if it has nothing to read."""
        return self._due

    def won(self, view: GroupView, record: CoordinatorRecord) -> GroupView:
        """``view``, the read of the step whose election ``record`` answered (won), completed
        with what a coordinator decides on: the set and the target, on the same head."""
        assert self._head is not None and record.session_id == view.session_id
        return self._whole(view.member_id, view.session_id, self._head, record)

    def _whole(
        self, member_id: str, session_id: str, head: GroupHead, coordinator: CoordinatorRecord
    ) -> GroupView:
        self._due = None  # the coordinator reads the set itself, now
        if self._resources is None or self._resources[0] != head.resources_version:
            # The changes since the set kept here, if the store logs them (a listing that
            # found one new prefix among 100,000 is one id), else the set whole.
            self._resources = self._backend.resources(self._group, self._resources)
            self.reads["resources"] += 1
        version, resources = self._resources
        known = self._target
        if head.generation == 0:
            self._target = None
        elif known is None or known.generation != head.generation:
            self._target = self._backend.target(self._group)
            self.reads["target"] += 1
        return GroupView(
            member_id,
            session_id,
            head.members,
            coordinator,
            resources,
            version,
            self._target,
            head.control,
            self._holders(head, self._target),
        )

    def _holders(self, head: GroupHead, target: Target | None) -> frozenset[str]:
        """Drained members still present with nothing in the target: whether they hold
        claims is the one fact of claims a coordinator needs (``drain done``)."""
        sessions = {
            m: rec.session_id
            for m, rec in head.members.items()
            if m in head.control.drain and not (target and target.assignment.get(m))
        }
        if not sessions:
            return frozenset()
        self.reads["holders"] += 1
        return self._backend.holders(self._group, sessions)

    @property
    def resources(self) -> tuple[int, Mapping[str, Resource]] | None:
        """The set as this coordinator last read it, with its version (None if it keeps
        none): what :meth:`Backend.update_resources` takes as ``known``."""
        return self._resources

    @property
    def target(self) -> Target | None:
        """The target as last read or published (the base of the next publication)."""
        return self._target

    def published(self, target: Target) -> None:
        """Keep ``target``, which this coordinator has just published."""
        self._target = target

    def forget(self) -> None:
        """Drop what is kept (after an error: the next read starts afresh), but the version of
        the set kept or remembered: on the same session the store is the same incarnation of
        the group, whose versions name the same sets, so the next read of the set reads only
        what changed since (:meth:`Backend.resources`; a follower's memory of the set answers
        for its own version, :meth:`~.epochs.EpochMemory.changed_resources`). A new session
        drops that too (:meth:`read`)."""
        self._fresh = True
        self._due = None
        self._target = None
