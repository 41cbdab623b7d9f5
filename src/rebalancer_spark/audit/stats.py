"""What the audit trail says about a group over time: current owners and rebalances.

Use case: after a deployment, ``rebalances(load_events(path))`` says how many rebalances there
were, how long each took and how many resources each moved, from the table alone (no access to
the store, the coordinator or its metrics needed).

**What counts as a rebalance.** The audit rows record ownership changes, not the coordinator's
target generations, so a rebalance is recovered from time: the ownership changes of one group
(``acquired``, ``released`` and ``lost`` events; ``fenced`` is a refused write, not a change)
are sorted by ``at`` and cut wherever two consecutive changes are more than ``window`` seconds
apart (default :data:`DEFAULT_WINDOW`). Each cluster is one rebalance:

* ``duration``: from its first change to its last (the time resources were in motion; a
  cluster of one event lasts 0 s);
* ``moved``: acquisitions of a resource whose previous owner was *another* member;
* ``assigned``: acquisitions of a resource never owned before in the trail (first assignment,
  or a newly listed resource);
* ``returned``: acquisitions by the member that owned it last (a rejoin after a lapse, or a
  static member that came back within its rejoin grace).

A crashed member (``kill -9``) leaves no ``released`` or ``lost`` row; its resources are
acquired by others once its session expires, and those acquisitions form (or join) the
rebalance. Pick ``window`` above the protocol's hand-over time (milliseconds to a second) and
below the time between deployments; two rebalances closer than ``window`` count as one.
The coordinator's own, generation-exact view (first change to publication) is in the metrics
(``rebalancer_rebalance_duration_seconds``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rebalancer_spark.core.audit import intervals
from rebalancer_spark.core.errors import ConfigurationError

__all__ = ["DEFAULT_WINDOW", "Rebalance", "current_owners", "rebalances"]

DEFAULT_WINDOW = 2.0
"""Seconds of quiet that end a rebalance (see the module docstring)."""

_CHANGES = frozenset({"acquired", "released", "lost"})


@dataclass(frozen=True, slots=True)
class Rebalance:
    """One cluster of ownership changes of one group (see the module docstring)."""

    group: str
    number: int
    """1 for the group's first rebalance in the trail, then 2, 3 ..."""
    start: float
    end: float
    acquired: int
    released: int
    lost: int
    moved: int
    assigned: int
    returned: int
    members: tuple[str, ...]
    """Every member with a change in this rebalance, sorted."""

    @property
    def duration(self) -> float:
        return self.end - self.start

    def as_dict(self) -> dict[str, object]:
        return {
            "group": self.group,
            "number": self.number,
            "start": self.start,
            "end": self.end,
            "duration": self.duration,
            "acquired": self.acquired,
            "released": self.released,
            "lost": self.lost,
            "moved": self.moved,
            "assigned": self.assigned,
            "returned": self.returned,
            "members": list(self.members),
        }


def rebalances(
    events: Iterable[Mapping[str, object]], *, window: float = DEFAULT_WINDOW
) -> list[Rebalance]:
    """The rebalances of every group in ``events`` (dicts as :func:`load_events` returns),
    sorted by start time."""
    if not math.isfinite(window) or window <= 0:
        raise ConfigurationError(
            f"window {window!r} is not a number of seconds above 0; use {DEFAULT_WINDOW:g}, "
            "or the longest hand-over you expect inside one rebalance"
        )
    by_group: dict[str, list[Mapping[str, object]]] = defaultdict(list)
    for e in events:
        if str(e["kind"]) in _CHANGES:
            by_group[str(e["group"])].append(e)
    found: list[Rebalance] = []
    for group, changes in by_group.items():
        changes.sort(key=lambda e: (_float(e["at"]), _order(e)))
        last_owner: dict[str, str] = {}
        cluster: list[Mapping[str, object]] = []
        number = 0
        for e in changes:
            if cluster and _float(e["at"]) - _float(cluster[-1]["at"]) > window:
                number += 1
                found.append(_summary(group, number, cluster, last_owner))
                cluster = []
            cluster.append(e)
        if cluster:
            found.append(_summary(group, number + 1, cluster, last_owner))
    found.sort(key=lambda r: (r.start, r.group))
    return found


def current_owners(events: Iterable[Mapping[str, object]]) -> list[dict[str, object]]:
    """Each resource's owner as the trail ends, sorted by (group, resource): member, epoch,
    since when, and host; ``member_id`` None for a resource last released or lost."""
    by_group: dict[str, list[Mapping[str, object]]] = defaultdict(list)
    hosts: dict[tuple[str, str], object] = {}
    for e in events:
        by_group[str(e["group"])].append(e)
        hosts[(str(e["session_id"]), str(e["member_id"]))] = e.get("host")
    rows: list[dict[str, object]] = []
    for group, trail in sorted(by_group.items()):
        for resource, items in sorted(intervals(trail).items()):
            last = max(items, key=lambda i: (i.epoch, i.start))
            is_open = last.closed_by == "open"
            rows.append(
                {
                    "group": group,
                    "resource": resource,
                    "member_id": last.member_id if is_open else None,
                    "epoch": last.epoch,
                    "since": last.start if is_open else last.end,
                    "host": hosts.get((last.session_id, last.member_id)) if is_open else None,
                    "state": "owned" if is_open else last.closed_by,
                }
            )
    return rows


def _summary(
    group: str, number: int, cluster: list[Mapping[str, object]], last_owner: dict[str, str]
) -> Rebalance:
    counts = {"acquired": 0, "released": 0, "lost": 0}
    moved = assigned = returned = 0
    for e in cluster:
        kind, resource, member = str(e["kind"]), str(e["resource"]), str(e["member_id"])
        counts[kind] += 1
        if kind != "acquired":
            continue
        before = last_owner.get(resource)
        if before is None:
            assigned += 1
        elif before == member:
            returned += 1
        else:
            moved += 1
        last_owner[resource] = member
    return Rebalance(
        group=group,
        number=number,
        start=_float(cluster[0]["at"]),
        end=_float(cluster[-1]["at"]),
        acquired=counts["acquired"],
        released=counts["released"],
        lost=counts["lost"],
        moved=moved,
        assigned=assigned,
        returned=returned,
        members=tuple(sorted({str(e["member_id"]) for e in cluster})),
    )


def _order(e: Mapping[str, object]) -> int:
    """At the same instant, endings come before beginnings."""
    return 1 if str(e["kind"]) == "acquired" else 0


def _float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"time {value!r} is not a number of epoch seconds")
    return float(value)
