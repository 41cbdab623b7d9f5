"""The vocabulary of a group: members, resources, claims, target assignments, epochs.

Everything here is an immutable value; nothing does I/O. A backend returns a
:class:`GroupState` snapshot, the coordinator computes a :class:`Target` from it, and members
turn their part of the target into :class:`Claim` s.

Epochs, the fencing tokens, come in two kinds:

* the **coordinator epoch** grows by one every time a different session becomes coordinator;
  every write the coordinator makes is checked against it atomically by the store;
* the **resource epoch** grows by one every time a resource is claimed by a new owner; every
  progress commit carries it and is refused once the resource has been claimed again.

Both are persisted by the store and never go backwards.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeAlias, TypeVar

from rebalancer_spark.core.control import Control
from rebalancer_spark.core.errors import ConfigurationError, CorruptStateError

__all__ = [
    "MAX_NAME_LENGTH",
    "MAX_PROGRESS_BYTES",
    "MAX_RESOURCE_ID_BYTES",
    "Claim",
    "CoordinatorRecord",
    "Freed",
    "Grant",
    "GroupHead",
    "GroupState",
    "JsonValue",
    "MemberRecord",
    "Phase",
    "Progress",
    "Resource",
    "ResourceChange",
    "Target",
    "UnreadableProgress",
    "decode_progress",
    "encode_progress",
    "fold_changes",
    "grant_epochs",
    "validate_group",
    "validate_member_id",
    "validate_resource_id",
]

JsonValue: TypeAlias = Any
"""Progress is any JSON value: a dict of offsets, a list of processed files, a number."""

MAX_NAME_LENGTH = 128
"""Longest group name or member id, in characters."""

MAX_RESOURCE_ID_BYTES = 1024
"""Longest resource id, in UTF-8 bytes (S3 keys are limited to the same)."""

_SURELY_SHORT = MAX_RESOURCE_ID_BYTES // 4
"""Characters that fit in :data:`MAX_RESOURCE_ID_BYTES` whatever they are (UTF-8 takes at
most 4 bytes per character, and an unpaired surrogate, 3, is refused as unprintable)."""

MAX_PROGRESS_BYTES = 512 * 1024
"""Largest committed progress, encoded as JSON; ZooKeeper's 1 MB znode limit is far above it."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_MEMBER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]*\Z")


def _check_name(kind: str, value: object, pattern: re.Pattern[str], allowed: str) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"{kind} must be a string, got {type(value).__name__} {value!r}")
    if not value or len(value) > MAX_NAME_LENGTH or not pattern.match(value):
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise ConfigurationError(
            f"{kind} {shown!r} is invalid: use 1 to {MAX_NAME_LENGTH} characters from {allowed}, "
            f"starting with a letter or digit (it becomes part of ZooKeeper paths and Redis keys)"
        )
    return value


def validate_group(value: object) -> str:
    """Return ``value`` if it is a usable group name, else raise :class:`ConfigurationError`."""
    return _check_name("group name", value, _NAME, "A-Z a-z 0-9 . _ -")


def validate_member_id(value: object) -> str:
    """Return ``value`` if it is a usable member id, else raise :class:`ConfigurationError`."""
    return _check_name("member id", value, _MEMBER, "A-Z a-z 0-9 . _ - : @")


def validate_resource_id(value: object) -> str:
    """Return ``value`` if it is a usable resource id, else raise :class:`ConfigurationError`.

    Resource ids may hold any printable text, slashes included (S3 prefixes, paths); the
    backends escape them so that they can never leave the group's key space. Control
    characters (NUL, newlines) and ids over :data:`MAX_RESOURCE_ID_BYTES` are refused.
    """
    if not isinstance(value, str):
        raise ConfigurationError(
            f"resource id must be a string, got {type(value).__name__} {value!r}"
        )
    if 0 < len(value) <= _SURELY_SHORT and value.isprintable():
        return value  # the common case in two C calls (a path's escaping asks per resource)
    size = len(value.encode("utf-8", "surrogatepass"))
    if not value or size > MAX_RESOURCE_ID_BYTES:
        raise ConfigurationError(
            f"resource id {value[:60]!r}{'...' if len(value) > 60 else ''} is {size} bytes long: "
            f"use 1 to {MAX_RESOURCE_ID_BYTES} bytes of UTF-8"
        )
    bad = next((c for c in value if not c.isprintable() or "\ud800" <= c <= "\udfff"), None)
    if bad is not None:
        raise ConfigurationError(
            f"resource id {value[:60]!r} contains the control or unpaired character {bad!r}: "
            "resource ids must be printable text"
        )
    return value


def encode_progress(resource: str, progress: JsonValue) -> str:
    """Encode progress as compact JSON, refusing what cannot round-trip or is too large."""
    try:
        text = json.dumps(progress, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"progress for resource {resource!r} is not JSON-serialisable ({exc}): commit "
            "dicts, lists, strings, numbers, booleans or None"
        ) from None
    if json.loads(text) != progress:
        raise ConfigurationError(
            f"progress for resource {resource!r} would not read back as committed (JSON turns "
            "tuples into lists and every dict key into a string): commit lists and dicts "
            "with string keys"
        )
    if len(text.encode()) > MAX_PROGRESS_BYTES:
        raise ConfigurationError(
            f"progress for resource {resource!r} is {len(text.encode())} bytes as JSON, over the "
            f"limit of {MAX_PROGRESS_BYTES}: commit a watermark (offset, last key) rather than "
            "every item processed"
        )
    return text


@dataclass(frozen=True, slots=True)
class UnreadableProgress:
    """What a store read gives for a progress record it cannot decode (bytes that are not
    JSON, a record not in the store's form), instead of failing the whole read: the owner of
    that one resource is then stuck (:meth:`error`), and every other resource goes on."""

    resource: str
    text: str
    """The start of what the store holds (at most 120 characters)."""
    reason: str

    def error(self) -> CorruptStateError:
        return CorruptStateError(
            f"stored progress of resource {self.resource!r} is not readable ({self.reason}; it "
            f"holds {self.text!r}); it was not written by rebalancer-spark: inspect it with "
            "`rebalancer-spark progress show`, then `rebalancer-spark progress reset` it"
        )


def decode_progress(resource: str, text: str) -> JsonValue:
    """Decode stored progress; data that is not JSON gives an :class:`UnreadableProgress`."""
    try:
        return json.loads(text)
    except ValueError as exc:
        return UnreadableProgress(resource, text[:120], f"not JSON: {exc}")


@dataclass(frozen=True, slots=True, order=True)
class Resource:
    """Something to be owned by exactly one member: an S3 prefix, a directory, a queue."""

    id: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        validate_resource_id(self.id)
        weight: object = self.weight
        if isinstance(weight, bool) or not (
            isinstance(weight, int | float) and 0 < weight < float("inf")
        ):
            raise ConfigurationError(
                f"weight of resource {self.id!r} is {self.weight!r}: use a finite number above 0"
            )


@dataclass(frozen=True, slots=True)
class ResourceChange:
    """What changed in a group's resource set from version :attr:`since` to :attr:`version`,
    as a store that logs its changes returns it (:meth:`~.backends.base.Backend.resources`): an
    id is in :attr:`put` or in :attr:`removed`, never in both."""

    since: int
    version: int
    put: Mapping[str, Resource]
    """Resources added, or whose weight changed, after :attr:`since` (id to resource)."""
    removed: frozenset[str]
    """Ids that were in the set at :attr:`since` and no longer are."""

    def apply(self, known: Mapping[str, Resource]) -> dict[str, Resource]:
        """The set at :attr:`version`, from ``known``, the set at :attr:`since` (not changed)."""
        out = dict(known)
        for rid in self.removed:
            out.pop(rid, None)
        out.update(self.put)
        return out

    @property
    def size(self) -> int:
        """Ids this change names."""
        return len(self.put) + len(self.removed)


_V = TypeVar("_V")


def fold_changes(entries: Iterable[tuple[str, _V | None]]) -> tuple[dict[str, _V], set[str]]:
    """Logged changes of a resource set, oldest first, each entry an id with what it was put
    as (None: removed), as one change: what is put at the end, and what is removed."""
    put: dict[str, _V] = {}
    removed: set[str] = set()
    for rid, value in entries:
        if value is None:
            put.pop(rid, None)
            removed.add(rid)
        else:
            removed.discard(rid)
            put[rid] = value
    return put, removed


class Phase(StrEnum):
    """Where a group's rebalancing stands (the global-barrier protocol uses ``STOPPING``)."""

    RUNNING = "running"
    STOPPING = "stopping"


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """A live member session as the store sees it."""

    member_id: str
    session_id: str
    info: Mapping[str, str] = field(default_factory=dict)
    acked_generation: int = 0
    leaving: bool = False
    static: bool = False


@dataclass(frozen=True, slots=True)
class CoordinatorRecord:
    """Which session coordinates the group, under which coordinator epoch."""

    member_id: str
    session_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Claim:
    """A resource owned by a member session since it was granted with ``epoch``."""

    resource: str
    member_id: str
    session_id: str
    epoch: int


class Freed(StrEnum):
    """Why a resource was free when the store granted it."""

    NEW = "new"
    """Never owned before (as far as the store knows: its first grant)."""
    RELEASED = "released"
    """The previous owner released it (or left the group, giving up its claims)."""
    EXPIRED = "expired"
    """The previous owner's session or lease expired in the store (a crash, a pause past the
    lease, a lost connection; or the store lost its records, then ``prev_epoch`` is None)."""


@dataclass(frozen=True, slots=True)
class Grant:
    """A claim granted by the store, and what it superseded: the link of the resource's epoch
    chain that the audit table records with every ``acquired`` row.

    ``prev_*`` name the owner at ``prev_epoch`` (None for a first grant). ``freed_at`` is
    when that owner stopped owning, as the store knows it, in wall-clock seconds: the release
    time, or the moment the store's lease of its session ran out (ZooKeeper, which keeps no
    such time, gives the store time of this grant: an upper bound). ``prev_epoch`` is
    ``epoch - 1``, 0 for a first grant, and None only when the store lost its records (a Redis
    restarted without its data): then ``freed`` is ``expired`` and ``freed_at`` the time by
    which every lease of the lost records had run out.
    """

    epoch: int
    freed: Freed | None = Freed.NEW
    """None only for a resource whose store record predates the chain (written by an older
    version of this library): the predecessor is then unknown."""
    prev_member_id: str | None = None
    prev_session_id: str | None = None
    prev_epoch: int | None = 0
    freed_at: float | None = None
    progress: Progress | None = None
    """What the grant hands over: the resource's last accepted commit, read in the same atomic
    step as the grant (None if it has none), so the new owner resumes from it without asking
    the store again."""

    def with_progress(self, progress: Progress | None) -> Grant:
        """This grant handing over ``progress``: ``dataclasses.replace(self, progress=...)``
        at a fraction of its cost (a claim makes one per resource)."""
        return Grant(
            self.epoch,
            self.freed,
            self.prev_member_id,
            self.prev_session_id,
            self.prev_epoch,
            self.freed_at,
            progress,
        )


def grant_epochs(grants: Mapping[str, Grant]) -> dict[str, int]:
    """Each granted resource's epoch: ``claim``'s answer without the chain."""
    return {r: g.epoch for r, g in grants.items()}


@dataclass(frozen=True, slots=True)
class Target:
    """The assignment the coordinator wants, published under its epoch.

    ``generation`` grows by one with every publication. ``resources_version`` is the version
    of the resource set the target was computed from.
    """

    generation: int
    coordinator_epoch: int
    assignment: Mapping[str, frozenset[str]]
    phase: Phase = Phase.RUNNING
    resources_version: int = 0

    def owner_of(self) -> dict[str, str]:
        """Map each assigned resource to its target member."""
        return {r: m for m, rs in self.assignment.items() for r in rs}


@dataclass(frozen=True, slots=True)
class Progress:
    """The last progress committed for a resource, and by which owner and epoch."""

    resource: str
    value: JsonValue
    epoch: int
    member_id: str


@dataclass(frozen=True, slots=True)
class GroupHead:
    """The small part of a group, read in one consistent step: what the coordinator reads on
    every wake-up. Its size follows the members, never the resources: the resource set and the
    target are read only when :attr:`resources_version` or :attr:`generation` says they changed
    (:class:`~rebalancer_spark.backends.base.GroupReader`)."""

    group: str
    members: Mapping[str, MemberRecord]
    coordinator: CoordinatorRecord | None
    resources_version: int
    generation: int
    """The generation of the current target (0: none published yet)."""
    control: Control = field(default_factory=Control)


@dataclass(frozen=True, slots=True)
class GroupState:
    """A consistent snapshot of one group in the store."""

    group: str
    members: Mapping[str, MemberRecord]
    coordinator: CoordinatorRecord | None
    resources: Mapping[str, Resource]
    resources_version: int
    target: Target | None
    claims: Mapping[str, Claim]
    control: Control = field(default_factory=Control)
    """The operator's control record (:mod:`rebalancer_spark.core.control`); the default
    record when none was ever written."""

    def is_stable(self) -> bool:
        """True when the target covers every live member that is not leaving and every
        resource is claimed by its target owner and nothing else is claimed: the moment a
        rebalance has settled."""
        target = self.target
        if target is None:
            return not self.resources and not self.claims
        if target.phase is not Phase.RUNNING:
            return False
        active = {m for m, rec in self.members.items() if not rec.leaving}
        leaving = set(self.members) - active
        if not active <= set(target.assignment) or leaving & set(target.assignment):
            return False
        owners = target.owner_of()
        if set(owners) != set(self.resources) or len(self.claims) != len(owners):
            return False
        return all(
            (claim := self.claims.get(r)) is not None and claim.member_id == m
            for r, m in owners.items()
        )
