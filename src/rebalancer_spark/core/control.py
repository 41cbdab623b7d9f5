"""Operator control of a group's rebalancing: the control record and its transitions.

Use case: an operator pauses a group before maintenance, drains a member before stopping it,
pins a hot resource to a big member, or sets an imbalance threshold so that small imbalances
never cause a hand-over. The ``rebalancer-spark`` commands change a group's :class:`Control`
record in the store with a compare-and-set on its ``version``; the coordinator reads it with
the group's state and applies it when it computes a target (:func:`plan_target`).

The state machine (after RabbitMQ's queue master balancer)::

                pause                        rebalance (force one now)
    ACTIVE ------------------> PAUSED        ACTIVE ----+
      ^  <------------------     |              ^       |
      |        resume           |              +-------+
      +---------- reset --------+    (reset: back to the default record from any state)

Independently of the mode: ``drain`` adds a member to the drain set, ``undrain`` removes it;
``pin`` maps a resource to a member, ``unpin`` removes it; ``threshold`` sets the imbalance
threshold. Every change raises ``version`` by one. Pure values and functions: no I/O.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Collection, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

from rebalancer_spark.core.assignors import Assignor
from rebalancer_spark.core.errors import ConfigurationError, CorruptStateError

__all__ = [
    "HISTORY_LENGTH",
    "MAX_CONTROL_ENTRIES",
    "BalanceScope",
    "Control",
    "ControlMode",
    "balance_scope",
    "control_changes",
    "imbalance",
    "keep_assignment",
    "plan_target",
]

MAX_CONTROL_ENTRIES = 100
"""Most pins, and most drained members, one group's control record may hold."""

MAX_REQUEST_CHARS = 4096
"""The longest progress request (JSON text) the record keeps."""

HISTORY_LENGTH = 20
"""How many of the latest transitions a control record keeps (for ``status``)."""


class ControlMode(StrEnum):
    """Whether the coordinator may move owned resources."""

    ACTIVE = "active"
    """Rebalance as usual (subject to the imbalance threshold)."""
    PAUSED = "paused"
    """Ownership frozen: only resources without a live owner are assigned."""


def _empty_pins() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Control:
    """One group's control record. The default record is what a group without one gets."""

    mode: ControlMode = ControlMode.ACTIVE
    rebalance_requests: int = 0
    """Counts ``rebalance`` requests; the coordinator forces a rebalance when it grows."""
    drain: frozenset[str] = frozenset()
    """Members that get nothing while they stay in the group."""
    pins: Mapping[str, str] = field(default_factory=_empty_pins)
    """Resource id -> member id: the resource stays on that member while it is present."""
    imbalance_threshold: float = 0.0
    """No owned resource moves while :func:`imbalance` stays at or under it (0: always
    balance)."""
    version: int = 0
    """Raised by one with every change; the compare-and-set token."""
    history: tuple[tuple[int, float, str], ...] = ()
    """The latest transitions, oldest first: (version, wall-clock time, what and by whom)."""
    requests: Mapping[str, str] = field(default_factory=_empty_pins)
    """Resource id -> an operator's request on its progress (``rebalancer-spark progress
    reset|skip``), as the JSON text its owner decodes; the owner removes it once applied. Not
    part of the plan: a request changes no owner."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "history", tuple(self.history)[-HISTORY_LENGTH:])
        object.__setattr__(self, "pins", MappingProxyType(dict(self.pins)))
        object.__setattr__(self, "requests", MappingProxyType(dict(self.requests)))
        object.__setattr__(self, "drain", frozenset(self.drain))
        t = self.imbalance_threshold
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 <= t < math.inf:
            raise ConfigurationError(
                f"imbalance threshold {t!r} is invalid: use a finite number >= 0 "
                "(0 balances on every change)"
            )
        object.__setattr__(self, "imbalance_threshold", float(t))

    def ownership(self) -> tuple[object, ...]:
        """What of the record the plan depends on: mode, rebalance requests, drains, pins and
        threshold (not the progress requests, the history or the version)."""
        return (self.mode, self.rebalance_requests, self.drain, dict(self.pins),
                self.imbalance_threshold)  # fmt: skip

    # -- transitions (each returns the next record, version + 1) -----------------------------

    def _next(self, **changes: object) -> Control:
        return replace(self, version=self.version + 1, **changes)  # type: ignore[arg-type]

    def noted(self, at: float, what: str) -> Control:
        """This record with the transition to it noted in :attr:`history` (same version)."""
        return replace(self, history=(*self.history, (self.version, float(at), what[:200])))

    def pause(self) -> Control:
        return self._next(mode=ControlMode.PAUSED)

    def resume(self) -> Control:
        return self._next(mode=ControlMode.ACTIVE)

    def request_rebalance(self) -> Control:
        return self._next(rebalance_requests=self.rebalance_requests + 1)

    def drain_member(self, member: str) -> Control:
        from rebalancer_spark.core.model import validate_member_id  # model imports this module

        validate_member_id(member)
        _check_size("drained members", len(self.drain | {member}))
        return self._next(drain=self.drain | {member})

    def undrain_members(self, members: Collection[str]) -> Control:
        return self._next(drain=self.drain - set(members))

    def pin(self, resource: str, member: str) -> Control:
        from rebalancer_spark.core.model import validate_member_id, validate_resource_id

        validate_resource_id(resource)
        validate_member_id(member)
        pins = {**self.pins, resource: member}
        _check_size("pins", len(pins))
        return self._next(pins=pins)

    def unpin(self, resource: str) -> Control:
        return self._next(pins={r: m for r, m in self.pins.items() if r != resource})

    def with_request(self, resource: str, request: str) -> Control:
        """``request`` (JSON text) for ``resource``'s owner, replacing one not applied yet."""
        from rebalancer_spark.core.model import validate_resource_id

        validate_resource_id(resource)
        if len(request) > MAX_REQUEST_CHARS:
            raise ConfigurationError(
                f"a progress request is at most {MAX_REQUEST_CHARS} characters, this one "
                f"{len(request)}: name a shorter file"
            )
        requests = {**self.requests, resource: request}
        _check_size("progress requests", len(requests))
        return self._next(requests=requests)

    def without_request(self, resource: str, request: str) -> Control | None:
        """The record once ``resource``'s owner applied ``request``; None when the record
        holds another request for it now (a newer one, applied later) or none."""
        if self.requests.get(resource) != request:
            return None
        return self._next(requests={r: q for r, q in self.requests.items() if r != resource})

    def with_threshold(self, threshold: float) -> Control:
        return self._next(imbalance_threshold=threshold)

    def reset(self) -> Control:
        """The default record (active, no drains, no pins, threshold 0); the rebalance
        request counter is kept so that it never goes back, and so are the progress requests
        not applied yet (they are not control of ownership)."""
        return Control(
            rebalance_requests=self.rebalance_requests,
            version=self.version + 1,
            history=self.history,
            requests=self.requests,
        )

    # -- storage -------------------------------------------------------------------------

    def encode(self) -> str:
        """The record as compact JSON, without ``version`` (the store keeps that); a record
        without progress requests has no ``requests`` key, as before they existed."""
        raw: dict[str, object] = {
            "mode": str(self.mode),
            "rebalance_requests": self.rebalance_requests,
            "drain": sorted(self.drain),
            "pins": dict(sorted(self.pins.items())),
            "imbalance_threshold": self.imbalance_threshold,
            "history": [list(h) for h in self.history],
        }
        if self.requests:
            raw["requests"] = dict(sorted(self.requests.items()))
        return json.dumps(
            raw,
            separators=(",", ":"),
            sort_keys=True,
            ensure_ascii=False,
        )

    @classmethod
    def decode(cls, group: str, text: str | bytes, version: int) -> Control:
        """The record stored for ``group``; data this library did not write is a
        :class:`CorruptStateError`."""
        try:
            raw = json.loads(text)
            return cls(
                mode=ControlMode(raw["mode"]),
                rebalance_requests=int(raw["rebalance_requests"]),
                drain=frozenset(str(m) for m in raw["drain"]),
                pins={str(r): str(m) for r, m in dict(raw["pins"]).items()},
                imbalance_threshold=float(raw["imbalance_threshold"]),
                version=int(version),
                history=tuple(
                    (int(v), float(at), str(what)) for v, at, what in raw.get("history", [])
                ),
                requests={str(r): str(q) for r, q in dict(raw.get("requests", {})).items()},
            )
        except (
            ValueError,
            TypeError,
            KeyError,
            ConfigurationError,
            OverflowError,  # int() of an infinite float
            RecursionError,  # absurdly nested JSON
        ) as exc:
            shown = text[:80] if isinstance(text, str) else text[:80].decode("utf-8", "replace")
            raise CorruptStateError(
                f"the control record of group {group!r} is not one rebalancer-spark writes "
                f"({type(exc).__name__}: {exc}; seen {shown!r}): run 'rebalancer-spark reset "
                f"--group {group}' to write the default record"
            ) from None

    def describe(self) -> str:
        """One line for logs and the status table."""
        pins = ", ".join(f"{r}->{m}" for r, m in sorted(self.pins.items())) or "none"
        return (
            f"mode {self.mode}, drain {', '.join(sorted(self.drain)) or 'none'}, pins {pins}, "
            f"imbalance threshold {self.imbalance_threshold:g}, "
            f"rebalance requests {self.rebalance_requests}, version {self.version}"
        )


def _check_size(what: str, size: int) -> None:
    if size > MAX_CONTROL_ENTRIES:
        raise ConfigurationError(
            f"a group's control record may hold at most {MAX_CONTROL_ENTRIES} {what}, this "
            f"change would make {size}: remove some first"
        )


def control_changes(old: Control, new: Control) -> list[tuple[str, str]]:
    """The transitions from ``old`` to ``new`` as (resource or ``""``, reason) pairs, in a
    fixed order: what the coordinator writes to the audit trail when it applies ``new``."""
    out: list[tuple[str, str]] = []
    tag = f"control v{new.version}"
    if old.mode is not new.mode:
        out.append(("", f"{tag}: {'paused' if new.mode is ControlMode.PAUSED else 'resumed'}"))
    if new.rebalance_requests > old.rebalance_requests:
        out.append(("", f"{tag}: rebalance requested"))
    out.extend(("", f"{tag}: drain {m}") for m in sorted(new.drain - old.drain))
    out.extend(("", f"{tag}: undrain {m}") for m in sorted(old.drain - new.drain))
    out += _per_resource(old.pins, new.pins, f"{tag}: pin to {{}}", f"{tag}: unpin from {{}}")
    if old.imbalance_threshold != new.imbalance_threshold:
        out.append(("", f"{tag}: imbalance threshold {new.imbalance_threshold:g}"))
    out += _per_resource(old.requests, new.requests, f"{tag}: progress request for its owner",
                         f"{tag}: progress request taken by its owner")  # fmt: skip
    if not out and new.version != old.version:
        out.append(("", f"{tag}: no change"))
    return out


def _per_resource(
    old: Mapping[str, str], new: Mapping[str, str], set_to: str, unset: str
) -> list[tuple[str, str]]:
    """One change per resource whose entry was set or changed (``set_to`` formatted with the
    new value) or removed (``unset`` formatted with the old one), in resource order."""
    out: list[tuple[str, str]] = []
    for resource in sorted(set(old) | set(new)):
        before, after = old.get(resource), new.get(resource)
        if after is not None and after != before:
            out.append((resource, set_to.format(after)))
        elif after is None:
            out.append((resource, unset.format(before)))
    return out


# -- the pure planning the coordinator applies ------------------------------------------


def imbalance(
    assignment: Mapping[str, AbstractSet[str]],
    weights: Mapping[str, float],
    members: Collection[str],
) -> float:
    """Max minus min load over ``members``, a member's load being the total weight of the
    resources ``assignment`` gives it (its count when every weight is 1); 0 for no members."""
    loads = [math.fsum(weights.get(r, 0.0) for r in assignment.get(m, ())) for m in members]
    return max(loads) - min(loads) if loads else 0.0


@dataclass(frozen=True, slots=True)
class BalanceScope:
    """What the balance covers under a control record: the one rule that both the coordinator
    (:func:`plan_target`) and the operator's ``status`` apply.

    ``eligible``: the present members that may own (not drained), sorted. ``pinned``: the pins
    in force, those of a current resource to an eligible member; any other pin is ignored and
    its resource balanced like the rest. ``free``: the weights of the resources the assignor
    balances (every current resource but the pinned ones).
    """

    eligible: tuple[str, ...]
    pinned: Mapping[str, str]
    free: Mapping[str, float]

    def imbalance(self, assignment: Mapping[str, AbstractSet[str]]) -> float:
        """The :func:`imbalance` the threshold is compared with: of the unpinned resources
        ``assignment`` gives each eligible member (pinned ones and unknown ones weigh 0)."""
        return imbalance(assignment, self.free, self.eligible)


def balance_scope(
    members: Collection[str], weights: Mapping[str, float], control: Control
) -> BalanceScope:
    """The :class:`BalanceScope` of the present ``members`` and the current resources
    (``weights``) under ``control``."""
    eligible = tuple(m for m in sorted(set(members)) if m not in control.drain)
    pinned = {r: m for r, m in control.pins.items() if r in weights and m in eligible}
    free = {r: w for r, w in weights.items() if r not in pinned} if pinned else weights
    return BalanceScope(eligible, MappingProxyType(pinned), MappingProxyType(free))


def _held(
    members: list[str], weights: Mapping[str, float], previous: Mapping[str, AbstractSet[str]]
) -> dict[str, set[str]]:
    """What each member (sorted) still holds of the current resources; a resource listed
    twice stays with the smallest member id (as in the assignors)."""
    free = set(weights)
    held: dict[str, set[str]] = {}
    for member in members:
        mine = free.intersection(previous.get(member, ()))
        free -= mine
        held[member] = mine
    return held


def keep_assignment(
    members: Collection[str],
    weights: Mapping[str, float],
    previous: Mapping[str, AbstractSet[str]],
) -> dict[str, frozenset[str]]:
    """Nothing a present member holds moves: each keeps what it held of the current resources;
    resources nobody present holds (new ones, those of departed members) go to the least loaded
    member, heaviest first (ties by resource id, then member id)."""
    present = sorted(set(members))
    if not present:
        return {}
    held = _held(present, weights, previous)
    taken = set().union(*held.values())
    orphans = sorted(set(weights) - taken)
    orphans.sort(key=lambda r: weights[r], reverse=True)
    heap = [(math.fsum(weights[r] for r in held[m]), m) for m in present]
    heapq.heapify(heap)
    for resource in orphans:
        load, member = heap[0]
        held[member].add(resource)
        heapq.heapreplace(heap, (load + weights[resource], member))
    return {m: frozenset(held[m]) for m in present}


def plan_target(
    assignor: Assignor,
    members: Collection[str],
    weights: Mapping[str, float],
    previous: Mapping[str, AbstractSet[str]],
    control: Control,
    *,
    forced: bool = False,
) -> dict[str, frozenset[str]]:
    """The target the coordinator publishes under ``control``; every member in ``members``
    is a key of the result.

    * **drain**: drained members get nothing (unless the group is paused);
    * **pins**: a resource pinned to a present, undrained member goes to it; pinned resources
      are outside the balance (the others are balanced among the undrained members);
    * **paused**: nothing a present member holds moves; resources without a present owner go
      to their pinned member if present and undrained, else to the least loaded undrained
      member (none at all if every member is drained);
    * **threshold**: unless ``forced`` (an operator's ``rebalance``) or the threshold is 0, if
      keeping everything where it is (:func:`keep_assignment`) leaves an :func:`imbalance` at or
      under the threshold, that is the target: nothing owned moves; otherwise ``assignor``
      balances.

    With the default :class:`Control` the result is ``assignor(members, weights, previous)``.
    """
    present = sorted(set(members))
    if not present:
        return {}
    scope = balance_scope(present, weights, control)
    eligible, pinned, free = list(scope.eligible), scope.pinned, scope.free
    result: dict[str, set[str]] = {m: set() for m in present}
    if control.mode is ControlMode.PAUSED:
        held = _held(present, weights, previous)
        for member, mine in held.items():
            result[member].update(mine)
        taken = set().union(*held.values())
        orphans = {r: w for r, w in weights.items() if r not in taken}
        for r in [r for r in orphans if r in pinned]:
            result[pinned[r]].add(r)
            del orphans[r]
        if eligible and orphans:
            loads = {m: result[m] for m in eligible}
            placed = keep_assignment(eligible, {**orphans, **_weights_of(loads, weights)}, loads)
            for member, got in placed.items():
                result[member].update(got)
        return {m: frozenset(rs) for m, rs in result.items()}
    none: frozenset[str] = frozenset()
    # Without pins nothing is taken out of the previous parts, and the assignor's parts are
    # the result as they are (copying 100,000 ids twice was a third of a plan's time).
    prev: dict[str, AbstractSet[str]] = (
        {m: frozenset(previous.get(m, none)) - pinned.keys() for m in eligible}
        if pinned
        else {m: previous.get(m, none) for m in eligible}
    )
    base: Mapping[str, AbstractSet[str]] | None = None
    threshold = control.imbalance_threshold
    if not forced and threshold > 0:
        # Only a threshold needs the assignment that keeps everything (built on every plan,
        # it was half the time of a plan of 100,000 resources).
        kept = keep_assignment(eligible, free, prev)
        if scope.imbalance(kept) <= threshold:
            base = kept
    if base is None:
        base = assignor(eligible, free, prev)
    if not pinned:
        return {m: frozenset(base.get(m, none)) for m in present}
    for member, given in base.items():
        result[member].update(given)
    for resource, member in pinned.items():
        result[member].add(resource)
    return {m: frozenset(rs) for m, rs in result.items()}


def _weights_of(
    held: Mapping[str, AbstractSet[str]], weights: Mapping[str, float]
) -> dict[str, float]:
    return {r: weights[r] for rs in held.values() for r in rs}
