"""Assignors: who owns what, as a pure function of (members, resources, previous assignment).

Use case
--------
The coordinator calls an assignor every time the live members or the set of resources change,
and publishes the result as the group's target. Under the cooperative protocol only resources
whose owner changes stop and hand over, so an assignor that moves little keeps work flowing:
start a fifth job next to four and a fifth of the resources move to it, nothing else moves;
with one resource and N jobs the holder keeps it while backups come and go.

Every assignor has the :class:`Assignor` signature: ``members`` are the live member ids,
``resources`` maps each resource id to its weight (a finite number above 0), ``previous`` is the
last target. ``previous`` may name departed members and removed resources; they are ignored.
A resource listed under several present members counts as held by the smallest member id.

Every assignor returns an :data:`Assignment` in which every member is a key (possibly with an
empty set) and every resource is in exactly one member's set; with no members it returns ``{}``.
The result depends on the contents of the inputs only, never on their iteration order.

Guarantees of :func:`sticky_balanced`
-------------------------------------
* **Equal weights** (all weights the same value): member counts differ by at most one, and the
  number of resources moved (as counted by :func:`moved`) equals :func:`minimum_moves`: a
  resource stays with its previous owner whenever balance allows, and when some members must
  hold one more than others, the extra goes to those who already hold more.
  4 members x 1,000 resources plus a fifth member: exactly 200 move.
* **Weighted**: max load - min load <= the largest single weight (the stated tolerance, up to a
  relative 1e-9 of float rounding). A resource leaves a member that is still present only when
  that member's load is above its fair share (total weight / members); resources of departed
  members, new resources and released ones go to the least loaded member, heaviest first
  (ties by resource id, then member id). An assignment already within the tolerance is kept as
  it is: re-running on its own output moves nothing.
* **Pure and deterministic**: no I/O, no randomness, inputs are not modified.

:func:`round_robin` ignores ``previous`` and deals the sorted resources to the sorted members;
it is balanced by count but moves almost everything on every change (a baseline to compare).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from collections.abc import Collection, Mapping
from collections.abc import Set as AbstractSet
from types import MappingProxyType
from typing import Protocol, TypeAlias

from rebalancer_spark.core.errors import ConfigurationError

__all__ = [
    "ASSIGNORS",
    "Assignment",
    "Assignor",
    "get_assignor",
    "minimum_moves",
    "moved",
    "round_robin",
    "sticky_balanced",
]

Assignment: TypeAlias = dict[str, frozenset[str]]
"""Member id -> the ids of the resources it owns."""

_SLACK = 1e-9
"""Relative slack on the weighted ceiling, so that float rounding never causes a move."""


class Assignor(Protocol):
    """The plug-in contract: a pure function from the group's state to a target."""

    def __call__(
        self,
        members: Collection[str],
        resources: Mapping[str, float],
        previous: Mapping[str, AbstractSet[str]],
    ) -> Assignment: ...


def _weights_are_uniform(resources: Mapping[str, float]) -> bool:
    """True if all weights are the same value; refuse a weight that is not finite and > 0."""
    distinct = set(resources.values())
    if all(0.0 < w < math.inf for w in distinct):
        return len(distinct) <= 1
    bad = min(r for r, w in resources.items() if not 0.0 < w < math.inf)
    raise ConfigurationError(
        f"weight of resource {bad!r} is {resources[bad]!r}: use a finite number above 0"
    )


def _claim(
    present: list[str], free: set[str], previous: Mapping[str, AbstractSet[str]]
) -> dict[str, set[str]]:
    """What each present member (sorted) still holds of ``free``; removes that from ``free``.

    On return ``free`` holds the resources nobody present holds: new ones and those of
    departed members. A resource listed twice stays with the smallest member id.
    """
    held: dict[str, set[str]] = {}
    for member in present:
        before = previous.get(member)
        mine = free.intersection(before) if before else set()
        free -= mine
        held[member] = mine
    return held


def _sticky_equal(
    present: list[str], held: dict[str, set[str]], free: set[str], count: int
) -> Assignment:
    base, extra = divmod(count, len(present))
    # The members that hold most get the extra slots (stable sort: ties go to the smaller id).
    bigger = set(sorted(present, key=lambda m: len(held[m]), reverse=True)[:extra])
    quota = {m: base + 1 if m in bigger else base for m in present}
    for member in present:
        surplus = len(held[member]) - quota[member]
        if surplus > 0:
            released = heapq.nlargest(surplus, held[member])
            held[member].difference_update(released)
            free.update(released)
    pool = sorted(free)
    start = 0
    for member in present:
        need = quota[member] - len(held[member])
        if need > 0:
            held[member].update(pool[start : start + need])
            start += need
    return {m: frozenset(held[m]) for m in present}


def _shed(mine: set[str], weights: Mapping[str, float], ceiling: float, free: set[str]) -> float:
    """Release resources from ``mine`` into ``free`` until its load is <= ``ceiling``.

    Few moves: if one resource brings the load under the ceiling, release the lightest such;
    otherwise release the heaviest and go on. Returns the load left.
    """
    items = sorted(mine)
    items.sort(key=weights.__getitem__)  # ascending weight, ties by id
    ws = [weights[r] for r in items]
    load = math.fsum(ws)
    while load > ceiling:
        i = min(bisect_left(ws, load - ceiling), len(ws) - 1)
        resource = items.pop(i)
        load -= ws.pop(i)
        mine.discard(resource)
        free.add(resource)
        if load <= ceiling:
            load = math.fsum(ws)  # exact re-check: subtraction may have drifted
    return load


def _sticky_weighted(
    present: list[str], held: dict[str, set[str]], free: set[str], weights: Mapping[str, float]
) -> Assignment:
    heaviest = max(weights.values())
    fair = math.fsum(weights.values()) / len(present)
    loads = {m: math.fsum(weights[r] for r in held[m]) for m in present}
    # Keeping everything up to this ceiling still leaves max - min <= heaviest after the
    # least-loaded fill below; it is above the fair share, so only members above it release.
    ceiling = max(fair, min(loads.values()) + heaviest) * (1.0 + _SLACK)
    for member in present:
        if loads[member] > ceiling:
            loads[member] = _shed(held[member], weights, ceiling, free)
    pool = sorted(free)
    pool.sort(key=weights.__getitem__, reverse=True)  # heaviest first, ties by id (stable)
    heap = [(loads[m], m) for m in present]
    heapq.heapify(heap)
    for resource in pool:
        load, member = heap[0]
        held[member].add(resource)
        heapq.heapreplace(heap, (load + weights[resource], member))
    return {m: frozenset(held[m]) for m in present}


def sticky_balanced(
    members: Collection[str],
    resources: Mapping[str, float],
    previous: Mapping[str, AbstractSet[str]],
) -> Assignment:
    """Balanced, sticky, deterministic: see the guarantees in the module docstring."""
    present = sorted(set(members))
    if not present:
        return {}
    uniform = _weights_are_uniform(resources)
    free = set(resources)
    held = _claim(present, free, previous)
    if uniform:
        return _sticky_equal(present, held, free, len(resources))
    return _sticky_weighted(present, held, free, resources)


def round_robin(
    members: Collection[str],
    resources: Mapping[str, float],
    previous: Mapping[str, AbstractSet[str]],
) -> Assignment:
    """Deal the sorted resources to the sorted members in turn; ``previous`` is ignored."""
    present = sorted(set(members))
    if not present:
        return {}
    _weights_are_uniform(resources)
    ordered = sorted(resources)
    return {m: frozenset(ordered[i :: len(present)]) for i, m in enumerate(present)}


def moved(previous: Mapping[str, AbstractSet[str]], current: Mapping[str, AbstractSet[str]]) -> int:
    """How many resources changed owner from ``previous`` to ``current``.

    Counts resources present in both whose previous owner is still a key of ``current`` and
    owns them no longer; resources of departed members and new resources are not moves. A
    resource listed under several previous members counts as held by the smallest member id
    that is a key of ``current`` (as in the assignors).
    """
    unclaimed: set[str] = set()
    for owned in current.values():
        unclaimed.update(owned)
    count = 0
    for member in sorted(current):
        before = previous.get(member)
        if before:
            mine = unclaimed.intersection(before)
            unclaimed -= mine
            count += len(mine.difference(current[member]))
    return count


def minimum_moves(
    members: Collection[str],
    resources: Mapping[str, float],
    previous: Mapping[str, AbstractSet[str]],
) -> int:
    """The fewest moves (as counted by :func:`moved`) of any count-balanced assignment.

    Count-balanced: member counts differ by at most one. Weights are ignored, so this is the
    exact minimum for the equal-weight case.
    """
    present = sorted(set(members))
    if not present:
        return 0
    held = _claim(present, set(resources), previous)
    base, extra = divmod(len(resources), len(present))
    surplus = [len(mine) - base for mine in held.values() if len(mine) > base]
    return sum(surplus) - min(extra, len(surplus))


ASSIGNORS: Mapping[str, Assignor] = MappingProxyType(
    {"sticky": sticky_balanced, "round_robin": round_robin}
)
"""The assignors selectable by name; ``sticky`` is the default."""


def get_assignor(name: str) -> Assignor:
    """The assignor called ``name``; an unknown name is a :class:`ConfigurationError`."""
    try:
        return ASSIGNORS[name]
    except KeyError:
        known = ", ".join(repr(k) for k in sorted(ASSIGNORS))
        raise ConfigurationError(
            f"assignor {name!r} is unknown: use one of {known} (sticky is the default)"
        ) from None
