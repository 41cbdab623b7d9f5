"""Which lanes the ownership timeline draws: one per resource, or aggregated.

One lane per resource is readable up to a few dozen resources. Beyond ``max_lanes`` the
timeline aggregates (``lanes="auto"``):

* by **prefix** when the resource ids share prefixes (``orders/2026-11/…``, the part before
  the last ``/``) that make between 2 and ``max_lanes`` lanes;
* else by **member** when there are at most ``max_lanes`` members: each lane shows how many
  resources that member owned over time;
* else by **range**: the sorted resource ids cut into ``max_lanes`` contiguous ranges, each
  labelled by its first and last id.

A prefix or range lane shows, stacked in member colours, the share of its resources each
member owned over time; white is the share without an owner.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from rebalancer_spark.core.errors import ConfigurationError

__all__ = ["LANE_MODES", "MAX_RESOURCE_LANES", "Lane", "choose_lanes"]

LANE_MODES = ("auto", "resource", "prefix", "member")
MAX_RESOURCE_LANES = 400
"""More resources than this are never drawn one per lane: the image would be unreadable."""


@dataclass(frozen=True)
class Lane:
    """One lane: its label and the resources it covers (or the member it follows)."""

    label: str
    resources: frozenset[str]
    member: str | None = None
    """For a member lane: the member whose owned resources it counts."""


def choose_lanes(
    resources: Iterable[str], members: Iterable[str], *, lanes: str = "auto", max_lanes: int = 60
) -> tuple[str, list[Lane]]:
    """(the mode used, the lanes in drawing order) for ``resources`` owned by ``members``."""
    if lanes not in LANE_MODES:
        raise ConfigurationError(f"lanes {lanes!r} is not one of {', '.join(LANE_MODES)}; use auto")
    if max_lanes < 2:
        raise ConfigurationError(f"max_lanes {max_lanes!r} is below 2; use 60")
    names = sorted(set(resources))
    people = sorted(set(members))
    if lanes == "resource" or (lanes == "auto" and len(names) <= max_lanes):
        if len(names) > MAX_RESOURCE_LANES:
            raise ConfigurationError(
                f"{len(names)} resources are too many to draw one per lane (at most "
                f"{MAX_RESOURCE_LANES}); use lanes auto, prefix or member"
            )
        return "resource", [Lane(n, frozenset([n])) for n in names]
    prefixed = _by_prefix(names, max_lanes)
    if lanes == "member" or (lanes == "auto" and not prefixed and len(people) <= max_lanes):
        everything = frozenset(names)
        return "member", [Lane(m, everything, member=m) for m in people]
    return "prefix", prefixed or _by_range(names, max_lanes)


def _by_prefix(names: list[str], max_lanes: int) -> list[Lane]:
    groups: dict[str, list[str]] = defaultdict(list)
    for name in names:
        head, sep, _ = name.rstrip("/").rpartition("/")
        groups[head + sep if sep else ""].append(name)
    if not 2 <= len(groups) <= max_lanes:
        return []
    return [
        Lane(f"{prefix or '(no prefix)'} ({len(items)})", frozenset(items))
        for prefix, items in sorted(groups.items())
    ]


def _by_range(names: list[str], max_lanes: int) -> list[Lane]:
    size = max(1, math.ceil(len(names) / max_lanes))
    out = []
    for i in range(0, len(names), size):
        chunk = names[i : i + size]
        label = chunk[0] if len(chunk) == 1 else f"{chunk[0]} … {chunk[-1]}"
        out.append(Lane(f"{label} ({len(chunk)})", frozenset(chunk)))
    return out
