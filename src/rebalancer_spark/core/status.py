"""A group's status as an operator reads it: typed, read from one :class:`GroupState`.

Use case: ``rebalancer-spark status | members | assignments`` render these values (as text or
JSON); a dashboard or a test can build the same from a state it read. The imbalance shown is
the one the coordinator compares with the threshold (:func:`~.control.balance_scope`, shared
with :func:`~.control.plan_target`): over the members that may own (present: not leaving;
not drained), of the unpinned resources they hold now. Pure values and functions: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from rebalancer_spark.core.control import Control, ControlMode, balance_scope
from rebalancer_spark.core.model import GroupState, JsonValue, Phase, Progress, UnreadableProgress

__all__ = [
    "AssignmentStatus",
    "ControlStatus",
    "CoordinatorStatus",
    "DrainStatus",
    "GroupStatus",
    "HeldResource",
    "MemberHealth",
    "MemberStatus",
    "PinStatus",
    "ProgressView",
    "TargetStatus",
    "assignment_statuses",
    "control_status",
    "group_status",
    "member_health",
    "member_statuses",
    "progress_view",
]


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """A live member, what it says about itself and how many resources it owns now."""

    member_id: str
    host: str | None
    pid: str | None
    spark_app_id: str | None
    leaving: bool
    static: bool
    acked_generation: int
    coordinator: bool
    owned: int


@dataclass(frozen=True, slots=True)
class AssignmentStatus:
    """One resource: its owner now, its owner in the target, and its last progress."""

    resource: str
    owner: str | None
    epoch: int | None
    target_owner: str | None
    progress_epoch: int | None
    progress_member: str | None
    stuck: str | None = None
    """Why its owner cannot make progress (an unreadable progress record, a listing or a read
    that fails), with the command that fixes it; None when it can."""
    pending_files: int | None = None
    """Files listed and not processed yet, as the owner last listed them (None: not known,
    e.g. a resource that is not read in file batches)."""
    pending_bytes: int | None = None
    pending_more: bool = False
    """True when the owner's listing stopped early (``order=name``): at least that many."""
    pending_messages: int | None = None
    """For a queue: messages ready and not fetched yet, when its owner last committed a batch
    (None: not a queue, or the broker could not tell)."""


@dataclass(frozen=True, slots=True)
class ProgressView:
    """What ``status`` reads from a resource's progress record: stuck, and its lag."""

    stuck: str | None = None
    pending_files: int | None = None
    pending_bytes: int | None = None
    pending_more: bool = False
    pending_messages: int | None = None


def progress_view(resource: str, value: JsonValue) -> ProgressView:
    """The :class:`ProgressView` of a stored progress value (a file resource's record says
    ``stuck`` and ``pending``, a queue's record its ``pending`` messages; any other value
    says neither, unless it is unreadable)."""
    if isinstance(value, UnreadableProgress):
        return ProgressView(stuck=str(value.error()))
    if not isinstance(value, Mapping):
        return ProgressView()
    if "format" not in value:
        if _int(value.get("batches")) is None:  # not the queue loop's record: a user's value
            return ProgressView()
        pending = value.get("pending")
        depth = _int(pending.get("messages")) if isinstance(pending, Mapping) else None
        return ProgressView(pending_messages=depth)
    stuck = value.get("stuck")
    pending = value.get("pending")
    files = nbytes = None
    more = False
    if isinstance(pending, Mapping):
        files, nbytes = _int(pending.get("files")), _int(pending.get("bytes"))
        more = pending.get("more") is True
    if stuck is not None:
        stuck = (
            f"{stuck}; see `rebalancer-spark progress show --resource {resource}` "
            "(reset or skip fix what cannot be read)"
        )
    return ProgressView(None if stuck is None else str(stuck), files, nbytes, more)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True, slots=True)
class CoordinatorStatus:
    member_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class TargetStatus:
    generation: int
    phase: Phase
    coordinator_epoch: int
    resources_version: int


@dataclass(frozen=True, slots=True)
class HeldResource:
    """A resource a member owns, under the epoch it was granted with."""

    resource: str
    epoch: int


@dataclass(frozen=True, slots=True)
class DrainStatus:
    """A drained member: whether it is still in the group and how much it still owns."""

    member_id: str
    present: bool
    owned: int


@dataclass(frozen=True, slots=True)
class PinStatus:
    """A pin of ``resource`` to ``member_id``, and who owns the resource now."""

    resource: str
    member_id: str
    owner: str | None


@dataclass(frozen=True, slots=True)
class ControlStatus:
    """The control record as ``status`` shows it; ``history`` as (version, wall-clock
    seconds, what), oldest first."""

    mode: ControlMode
    version: int
    rebalance_requests: int
    imbalance_threshold: float
    drain: tuple[DrainStatus, ...]
    pins: tuple[PinStatus, ...]
    history: tuple[tuple[int, float, str], ...]


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """Members, coordinator, target, who owns what, the imbalance, stability and control.

    ``owners`` maps every live member (and any other claim holder) to what it owns, sorted by
    resource; ``unowned`` lists the current resources nobody owns."""

    group: str
    members: tuple[MemberStatus, ...]
    coordinator: CoordinatorStatus | None
    target: TargetStatus | None
    resource_count: int
    resources_version: int
    owners: Mapping[str, tuple[HeldResource, ...]]
    unowned: tuple[str, ...]
    imbalance: float
    stable: bool
    control: ControlStatus
    stuck: Mapping[str, str] = field(default_factory=dict)
    """The resources whose owner cannot make progress, and why (read from their progress)."""
    pending_files: int | None = None
    """Files pending over the resources whose owner reports it (None: none does)."""
    pending_bytes: int | None = None
    pending_messages: int | None = None
    """Messages ready over the queues whose owner reports it (None: none does)."""


def member_statuses(state: GroupState) -> tuple[MemberStatus, ...]:
    """The live members, by member id."""
    owned = Counter(claim.member_id for claim in state.claims.values())
    coordinator = state.coordinator
    return tuple(
        MemberStatus(
            member_id=m.member_id,
            host=m.info.get("host"),
            pid=m.info.get("pid"),
            spark_app_id=m.info.get("spark_app_id"),
            leaving=m.leaving,
            static=m.static,
            acked_generation=m.acked_generation,
            coordinator=coordinator is not None and coordinator.session_id == m.session_id,
            owned=owned[m.member_id],
        )
        for m in sorted(state.members.values(), key=lambda rec: rec.member_id)
    )


@dataclass(frozen=True, slots=True)
class MemberHealth:
    """What a member publishes about its own trouble (its info's health keys, refreshed after
    its lease renewals when they change): callbacks that overran ``callback_timeout`` and
    ownership events its audit sinks have not written yet."""

    member_id: str
    callback_overruns: dict[str, int]
    audit_backlog: int

    def text(self) -> str:
        parts = [
            f"{name} did not return within callback_timeout {n} time{'s' if n > 1 else ''}"
            for name, n in sorted(self.callback_overruns.items())
        ]
        if self.audit_backlog:
            parts.append(f"{self.audit_backlog} ownership events not in the audit table yet")
        return f"member {self.member_id}: " + "; ".join(parts)


def member_health(state: GroupState) -> tuple[MemberHealth, ...]:
    """The live members that publish trouble (``callback_overruns``, ``audit_backlog`` in
    their info), by member id; a value that does not parse counts as nothing."""
    out = []
    for m in sorted(state.members.values(), key=lambda rec: rec.member_id):
        overruns: dict[str, int] = {}
        for item in m.info.get("callback_overruns", "").split(","):
            name, _, count = item.partition("=")
            if name and count.isdigit() and int(count):
                overruns[name] = int(count)
        backlog_text = m.info.get("audit_backlog", "0")
        backlog = int(backlog_text) if backlog_text.isdigit() else 0
        if overruns or backlog:
            out.append(MemberHealth(m.member_id, overruns, backlog))
    return tuple(out)


def assignment_statuses(
    state: GroupState, progress: Mapping[str, Progress]
) -> tuple[AssignmentStatus, ...]:
    """Every resource listed, claimed or in the target, by id; ``progress`` as read from the
    store (resources missing from it have none)."""
    targets = state.target.owner_of() if state.target else {}
    claims = state.claims
    out = []
    for r in sorted(set(state.resources) | set(claims) | set(targets)):
        view = progress_view(r, progress[r].value) if r in progress else ProgressView()
        out.append(
            AssignmentStatus(
                resource=r,
                owner=claims[r].member_id if r in claims else None,
                epoch=claims[r].epoch if r in claims else None,
                target_owner=targets.get(r),
                progress_epoch=progress[r].epoch if r in progress else None,
                progress_member=progress[r].member_id if r in progress else None,
                stuck=view.stuck,
                pending_files=view.pending_files,
                pending_bytes=view.pending_bytes,
                pending_more=view.pending_more,
                pending_messages=view.pending_messages,
            )
        )
    return tuple(out)


def control_status(state: GroupState) -> ControlStatus:
    """The group's control record, with what its drained and pinned names own now."""
    c: Control = state.control
    owned = Counter(claim.member_id for claim in state.claims.values())
    return ControlStatus(
        mode=c.mode,
        version=c.version,
        rebalance_requests=c.rebalance_requests,
        imbalance_threshold=c.imbalance_threshold,
        drain=tuple(DrainStatus(m, m in state.members, owned[m]) for m in sorted(c.drain)),
        pins=tuple(
            PinStatus(r, m, state.claims[r].member_id if r in state.claims else None)
            for r, m in sorted(c.pins.items())
        ),
        history=c.history,
    )


def group_status(state: GroupState, progress: Mapping[str, Progress] | None = None) -> GroupStatus:
    """The whole status of the group ``state`` describes; ``progress`` (as read from the
    store) adds the stuck resources and the lag."""
    coord, target = state.coordinator, state.target
    views = {r: progress_view(r, p.value) for r, p in (progress or {}).items()}
    known = [v for v in views.values() if v.pending_files is not None]
    depths = [v.pending_messages for v in views.values() if v.pending_messages is not None]
    return GroupStatus(
        group=state.group,
        members=member_statuses(state),
        coordinator=CoordinatorStatus(coord.member_id, coord.epoch) if coord else None,
        target=None
        if target is None
        else TargetStatus(
            target.generation, target.phase, target.coordinator_epoch, target.resources_version
        ),
        resource_count=len(state.resources),
        resources_version=state.resources_version,
        owners=_owners(state),
        unowned=tuple(sorted(set(state.resources) - set(state.claims))),
        imbalance=_imbalance(state),
        stable=state.is_stable(),
        control=control_status(state),
        stuck={r: v.stuck for r, v in sorted(views.items()) if v.stuck is not None},
        pending_files=sum(v.pending_files or 0 for v in known) if known else None,
        pending_bytes=sum(v.pending_bytes or 0 for v in known) if known else None,
        pending_messages=sum(depths) if depths else None,
    )


def _owners(state: GroupState) -> dict[str, tuple[HeldResource, ...]]:
    owners: dict[str, list[HeldResource]] = {m: [] for m in sorted(state.members)}
    for name, claim in sorted(state.claims.items()):
        owners.setdefault(claim.member_id, []).append(HeldResource(name, claim.epoch))
    return {m: tuple(held) for m, held in owners.items()}


def _imbalance(state: GroupState) -> float:
    present = [m for m, rec in state.members.items() if not rec.leaving]
    weights = {name: res.weight for name, res in state.resources.items()}
    held: dict[str, set[str]] = {}
    for name, claim in state.claims.items():
        held.setdefault(claim.member_id, set()).add(name)
    return balance_scope(present, weights, state.control).imbalance(held)
