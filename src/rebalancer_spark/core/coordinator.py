"""The coordinator as a pure state machine: its roles, their legal transitions, what it
remembers between steps and the actions it asks for.

The coordinator thread (:mod:`rebalancer_spark.member.coordinator`) and the simulator
(:mod:`rebalancer_spark.testing.sim`) both read the group once per step, call ``decide`` and
carry out the :data:`Action` s it returns; neither takes a decision of its own. No I/O,
no threads, no clock: time comes in as ``now``.

::

    FOLLOWER --(role vacant)--> CANDIDATE --(elected)--> IDLE <--> DEBOUNCING
        ^                           |                     |  \\       |
        |                           +--(lost election)    |   +--> BARRIER <--+
        +---- (session lapsed, another coordinator, fenced, stepped down) ----+

============  ===================================================================================
follower      another member coordinates, or this member has no valid session: watch only
candidate     the role is vacant (or the store names this session at an epoch it did not adopt):
              :class:`Elect`
idle          coordinating; the published target matches the group
debouncing    coordinating; a change of members or resources waits out the stability window
              (``stability_window`` after the last change, ``max_rebalance_delay`` after the
              first at the latest)
barrier       coordinating under ``global_barrier``: a ``stopping`` target is out, waiting for
              every member's acknowledgement or ``barrier_timeout``
============  ===================================================================================

:data:`TRANSITIONS` writes the arrows down; :meth:`CoordinatorState.to` refuses any other move.
The decisions themselves (debounce, static members' rejoin grace, operator control, discovery,
the barrier) are :func:`rebalancer_spark.core.coordinator_rules.decide` and its feedback
functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import TypeAlias

from rebalancer_spark.core.config import MemberConfig, ProtocolName
from rebalancer_spark.core.control import Control
from rebalancer_spark.core.errors import RebalancerError
from rebalancer_spark.core.events import EventKind, Trigger
from rebalancer_spark.core.model import (
    CoordinatorRecord,
    GroupState,
    MemberRecord,
    Phase,
    Resource,
    Target,
)

__all__ = [
    "TRANSITIONS",
    "Action",
    "CoordinatorState",
    "Discover",
    "Elect",
    "Emit",
    "ForgetDrains",
    "GroupView",
    "IllegalTransition",
    "Note",
    "Publish",
    "Role",
    "Settings",
    "WakeAt",
]


class IllegalTransition(RebalancerError):
    """A move of the coordinator's role that :data:`TRANSITIONS` does not allow: a bug in the
    rules, never a condition of the group."""


class Role(StrEnum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    IDLE = "idle"
    DEBOUNCING = "debouncing"
    BARRIER = "barrier"


_COORDINATING = frozenset({Role.IDLE, Role.DEBOUNCING, Role.BARRIER})

TRANSITIONS: Mapping[Role, frozenset[Role]] = {
    Role.FOLLOWER: frozenset({Role.FOLLOWER, Role.CANDIDATE}),
    Role.CANDIDATE: frozenset({Role.FOLLOWER, Role.IDLE}),
    Role.IDLE: frozenset({Role.IDLE, Role.DEBOUNCING, Role.BARRIER, Role.CANDIDATE, Role.FOLLOWER}),
    Role.DEBOUNCING: frozenset(
        {Role.DEBOUNCING, Role.IDLE, Role.BARRIER, Role.CANDIDATE, Role.FOLLOWER}
    ),
    Role.BARRIER: frozenset(
        {Role.BARRIER, Role.IDLE, Role.DEBOUNCING, Role.CANDIDATE, Role.FOLLOWER}
    ),
}


def _frozen_floats(value: Mapping[str, float]) -> Mapping[str, float]:
    return MappingProxyType(dict(value))


@dataclass(frozen=True, slots=True)
class Settings:
    """What :func:`decide` needs of the member's configuration."""

    protocol: ProtocolName = ProtocolName.COOPERATIVE
    assignor: str = "sticky"
    stability_window: float = 0.1
    max_rebalance_delay: float = 5.0
    rejoin_grace: float = 0.0
    barrier_timeout: float = 10.0
    session_timeout: float = 10.0
    discovery_interval: float | None = None
    """Seconds between listings of the source; None: no discovery."""

    @classmethod
    def of(cls, config: MemberConfig, discovery_interval: float | None = None) -> Settings:
        return cls(
            protocol=config.protocol,
            assignor=config.assignor,
            stability_window=config.stability_window,
            max_rebalance_delay=config.max_rebalance_delay,
            rejoin_grace=config.rejoin_grace,
            barrier_timeout=config.barrier_timeout,
            session_timeout=config.session_timeout,
            discovery_interval=discovery_interval,
        )


@dataclass(frozen=True, slots=True)
class GroupView:
    """What one step of the coordinator thread saw: its own session and one read of the group.

    Not a :class:`~rebalancer_spark.core.model.GroupState`: the coordinator never reads the
    claims (their number follows the resources). The one fact of claims a rule needs, whether a
    drained member still holds anything, is :attr:`holders`."""

    member_id: str
    session_id: str
    members: Mapping[str, MemberRecord]
    coordinator: CoordinatorRecord | None
    resources: Mapping[str, Resource]
    resources_version: int
    target: Target | None
    control: Control = field(default_factory=Control)
    holders: frozenset[str] = frozenset()
    """Which of the drained members (``control.drain``) hold at least one claim."""

    @classmethod
    def of(cls, member_id: str, session_id: str, state: GroupState) -> GroupView:
        """The view of a whole snapshot (the simulator and tests read whole snapshots)."""
        drained = state.control.drain
        return cls(
            member_id,
            session_id,
            state.members,
            state.coordinator,
            state.resources,
            state.resources_version,
            state.target,
            state.control,
            frozenset(c.member_id for c in state.claims.values() if c.member_id in drained),
        )

    def with_coordinator(self, record: CoordinatorRecord | None) -> GroupView:
        """The same read, with the coordinator an :class:`Elect` returned."""
        return replace(self, coordinator=record)


@dataclass(frozen=True, slots=True)
class CoordinatorState:
    """Everything the coordinator remembers between steps; a value, replaced on every step."""

    role: Role = Role.FOLLOWER
    epoch: int | None = None
    """The coordinator epoch while coordinating, else None."""
    seen_epoch: int | None = None
    """The latest coordinator epoch seen, coordinating or not (logs, metrics)."""
    pending: tuple[frozenset[str], int] | None = None
    """(present members, resources version) of the change being debounced."""
    first_change: float = 0.0
    last_change: float = 0.0
    away_since: Mapping[str, float] = field(default_factory=dict)
    """Static members of the target whose session ended, and since when (rejoin grace)."""
    static_seen: frozenset[str] = frozenset()
    """Members ever seen static: remembered by followers too, for a take-over."""
    drain_absent_since: Mapping[str, float] = field(default_factory=dict)
    stopping_since: float | None = None
    """When the ``stopping`` target of a barrier went out (or was found, inherited)."""
    control: Control | None = None
    """The control record last applied (None: not yet, or the role is new)."""
    forced: bool = False
    """The next target is an operator's forced rebalance."""
    drain_done: frozenset[str] = frozenset()
    operator_cause: str | None = None
    seen_leaving: frozenset[str] = frozenset()
    """Members seen draining: their departure from the target is a leave, not a crash."""
    next_discovery: float = 0.0
    listed_for_requests: int | None = None
    """The group's rebalance-request count when the source was last listed on demand."""
    present_members: int = 0
    """Members the latest target covers, as last computed coordinating (metrics)."""
    listed_resources: int = 0
    """Resources in the group's set, as last read coordinating (metrics)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "away_since", _frozen_floats(self.away_since))
        object.__setattr__(self, "drain_absent_since", _frozen_floats(self.drain_absent_since))

    @property
    def coordinating(self) -> bool:
        return self.role in _COORDINATING

    def to(self, role: Role, **changes: object) -> CoordinatorState:
        """This state in ``role`` (with ``changes``); :class:`IllegalTransition` if the
        transitions table does not allow the move."""
        if role not in TRANSITIONS[self.role]:
            raise IllegalTransition(
                f"the coordinator cannot go from {self.role.value} to {role.value}; legal next "
                f"roles: {sorted(r.value for r in TRANSITIONS[self.role])}"
            )
        return replace(self, role=role, **changes)  # type: ignore[arg-type]

    def update(self, **changes: object) -> CoordinatorState:
        """This state, same role, with ``changes``."""
        return replace(self, **changes)  # type: ignore[arg-type]


# -- actions: what the thread (or the simulator) carries out, in order ----------------------


@dataclass(frozen=True, slots=True)
class Elect:
    """Try to take the coordinator role; feed the answer to :func:`~.coordinator_rules.elected`
    and decide again on the same read."""


@dataclass(frozen=True, slots=True)
class Discover:
    """List the source and replace the group's resource set; feed the outcome to
    :func:`~.coordinator_rules.listed`; if the set changed, read the group anew, else decide
    again on the same read."""


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish ``assignment`` in ``phase`` at the coordinator ``epoch``. For a ``running``
    target, then emit a ``rebalance`` event (``trigger``, ``reason``, ``moves``) and report the
    rebalance (started at ``started_at``, ``moved`` resources)."""

    epoch: int
    assignment: Mapping[str, frozenset[str]]
    phase: Phase
    resources_version: int
    members: frozenset[str]
    """The members the target was computed for (present, or away within their grace)."""
    control: Control
    """The control record the target was planned under."""
    resources: int = 0
    started_at: float = 0.0
    moved: int = 0
    trigger: Trigger | None = None
    reason: str = ""
    moves: int = 0


@dataclass(frozen=True, slots=True)
class Emit:
    """Write an event (a ``control`` transition, ``drain done``) to the event sinks."""

    epoch: int
    resource: str
    reason: str
    kind: EventKind = EventKind.CONTROL


@dataclass(frozen=True, slots=True)
class ForgetDrains:
    """Remove ``members`` (drained, gone from the group) from the control record ``control``
    with a compare-and-set on its version; a conflict is no error (the next read sees it).
    Only while the session that decided it is still valid."""

    control: Control
    members: frozenset[str]


@dataclass(frozen=True, slots=True)
class Note:
    """A line for the log (``warning`` when ``warn``)."""

    text: str
    warn: bool = False


@dataclass(frozen=True, slots=True)
class WakeAt:
    """Look at the group again at ``at`` (monotonic seconds), or earlier on any change."""

    at: float


Action: TypeAlias = Elect | Discover | Publish | Emit | ForgetDrains | Note | WakeAt
