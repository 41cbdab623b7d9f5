"""What the audit trail says about a group over time: current owners and rebalances.

Use case: after a deployment, ``rebalances(load_rows(path).rows)`` says how many rebalances
there were, what caused each, how long each took and how many resources each moved, from the
table alone (no access to the store, the coordinator or its metrics needed).

**Rebalances by generation.** The coordinator writes one ``rebalance`` row per target it
publishes (``generation``, ``trigger``: start, join, leave, crash, discovery or operator,
``moves``, details in ``reason``), and every ``acquired``, ``released`` and ``lost`` row
carries the generation under which it happened. A rebalance is then exact:

* ``start``: the publication of its generation (the ``rebalance`` row's ``at``);
* ``end``: the last ``acquired`` row carrying that generation (the publication itself when
  nothing moved); ``duration`` is the difference;
* ``moved``: the coordinator's count of resources whose owner changes (``moves``);
* ``acquired``, ``released``, ``lost``: the rows carrying that generation; among the
  acquisitions, ``assigned`` counts resources never owned before in the trail and
  ``returned`` those taken back by the member that owned them last.

**Tables written before generations were recorded** (no ``rebalance`` rows) fall back to
clustering by time: a group's ownership changes (``fenced`` is a refused write, not a change)
are sorted by ``at`` and cut wherever two consecutive changes are more than ``window`` seconds
apart (default :data:`DEFAULT_WINDOW`); each cluster is one rebalance from its first change to
its last, ``moved`` counts acquisitions by another member than the last owner, and
``trigger`` and ``generation`` are None. Two rebalances closer than ``window`` are merged into
one (a pin and a drain 1.4 s apart), which is why the generation is preferred. A group whose
trail starts before its first ``rebalance`` row (members upgraded while running) has its
earlier changes clustered and the rest by generation. :func:`basis_notes` says which groups
were clustered, so that reports can say so.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from rebalancer_spark.core.audit import intervals
from rebalancer_spark.core.errors import ConfigurationError

__all__ = ["DEFAULT_WINDOW", "Rebalance", "basis_notes", "current_owners", "rebalances"]

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
    generation: int | None = None
    """The target generation (None when recovered by clustering)."""
    trigger: str | None = None
    """start, join, leave, crash, discovery, operator (None when clustered; ``unknown`` for a
    generation whose ``rebalance`` row is missing)."""
    reason: str | None = None
    coordinator: str | None = None

    @property
    def by_generation(self) -> bool:
        return self.generation is not None

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
            "generation": self.generation,
            "trigger": self.trigger,
            "reason": self.reason,
            "coordinator": self.coordinator,
        }


def rebalances(
    events: Iterable[Mapping[str, object]], *, window: float = DEFAULT_WINDOW
) -> list[Rebalance]:
    """The rebalances of every group in ``events`` (dicts as :func:`load_rows` or
    :func:`load_events` returns), sorted by start time: by generation where the trail has
    ``rebalance`` rows, by clustering changes ``window`` seconds apart before (see the module
    docstring)."""
    if not math.isfinite(window) or window <= 0:
        raise ConfigurationError(
            f"window {window!r} is not a number of seconds above 0; use {DEFAULT_WINDOW:g}, "
            "or the longest hand-over you expect inside one rebalance"
        )
    by_group: dict[str, list[Mapping[str, object]]] = defaultdict(list)
    published: dict[str, dict[int, Mapping[str, object]]] = defaultdict(dict)
    for e in events:
        kind = str(e["kind"])
        if kind in _CHANGES:
            by_group[str(e["group"])].append(e)
        elif kind == "rebalance" and e.get("generation") is not None:
            published[str(e["group"])].setdefault(_int(e.get("generation")), e)
    found: list[Rebalance] = []
    for group in sorted(set(by_group) | set(published)):
        found.extend(_group_rebalances(group, by_group[group], published[group], window))
    found.sort(key=lambda r: (r.start, r.group))
    return found


def basis_notes(found: Iterable[Rebalance], window: float = DEFAULT_WINDOW) -> list[str]:
    """One sentence per group whose rebalances (some or all) were recovered by clustering."""
    clustered: dict[str, int] = defaultdict(int)
    exact: dict[str, int] = defaultdict(int)
    for r in found:
        if r.by_generation:
            exact[r.group] += 1
        else:
            clustered[r.group] += 1
    notes = []
    for group, n in sorted(clustered.items()):
        scope = "all its rebalances" if not exact[group] else f"its first {n} rebalances"
        notes.append(
            f"group {group}: {scope} guessed by clustering changes more than {window:g} s "
            "apart: the audit table has no rebalance rows for them (written before "
            "generations were recorded)"
        )
    return notes


def _group_rebalances(
    group: str,
    changes: list[Mapping[str, object]],
    published: Mapping[int, Mapping[str, object]],
    window: float,
) -> list[Rebalance]:
    changes.sort(key=lambda e: (_float(e["at"]), _order(e)))
    first_publish = min((_float(r["at"]) for r in published.values()), default=math.inf)
    # Each change goes to a bucket: ("g", generation) or ("c", cluster number).
    buckets: dict[tuple[str, int], list[tuple[Mapping[str, object], str | None]]] = {}
    last_owner: dict[str, str] = {}
    cluster, last_at = 0, -math.inf
    for e in changes:
        at, generation = _float(e["at"]), e.get("generation")
        if published and (generation is not None or at >= first_publish):
            if generation is None:
                continue  # a leave without a new target: no rebalance of its own
            key: tuple[str, int] = ("g", _int(generation))
        else:
            if at - last_at > window:
                cluster += 1
            last_at = at
            key = ("c", cluster)
        buckets.setdefault(key, []).append((e, _classify(e, last_owner)))
    for generation in published:
        buckets.setdefault(("g", generation), [])
    out = []
    for (how, number), items in buckets.items():
        row = published.get(number) if how == "g" else None
        out.append(_summary(group, number if how == "g" else None, row, items))
    out.sort(key=lambda r: r.start)
    return [replace(r, number=i) for i, r in enumerate(out, start=1)]


def _classify(e: Mapping[str, object], last_owner: dict[str, str]) -> str | None:
    """For an acquisition: ``assigned``, ``returned`` or ``moved`` (and remember the owner)."""
    if str(e["kind"]) != "acquired":
        return None
    resource, member = str(e["resource"]), str(e["member_id"])
    before = last_owner.get(resource)
    last_owner[resource] = member
    if before is None:
        return "assigned"
    return "returned" if before == member else "moved"


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
    group: str,
    generation: int | None,
    published: Mapping[str, object] | None,
    items: list[tuple[Mapping[str, object], str | None]],
) -> Rebalance:
    counts = {"acquired": 0, "released": 0, "lost": 0}
    classes = {"assigned": 0, "returned": 0, "moved": 0}
    for e, how in items:
        counts[str(e["kind"])] += 1
        if how is not None:
            classes[how] += 1
    times = [_float(e["at"]) for e, _ in items]
    acquired = [_float(e["at"]) for e, _ in items if str(e["kind"]) == "acquired"]
    trigger: str | None
    reason: str | None
    coordinator: str | None
    if published is not None:
        start = _float(published["at"])
        end = max([start, *acquired])
        moves = published.get("moves")
        moved = classes["moved"] if moves is None else _int(moves)
        trigger = str(published.get("trigger") or "unknown")
        reason, coordinator = str(published.get("reason") or ""), str(published["member_id"])
    else:
        start, end, moved = min(times), max(times), classes["moved"]
        trigger = "unknown" if generation is not None else None
        reason = "no rebalance row for this generation" if generation is not None else None
        coordinator = None
    return Rebalance(
        group=group,
        number=0,
        start=start,
        end=end,
        acquired=counts["acquired"],
        released=counts["released"],
        lost=counts["lost"],
        moved=moved,
        assigned=classes["assigned"],
        returned=classes["returned"],
        members=tuple(sorted({str(e["member_id"]) for e, _ in items})),
        generation=generation,
        trigger=trigger,
        reason=reason,
        coordinator=coordinator,
    )


def _order(e: Mapping[str, object]) -> int:
    """At the same instant, endings come before beginnings."""
    return 1 if str(e["kind"]) == "acquired" else 0


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"generation {value!r} is not an integer")
    return int(value)


def _float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"time {value!r} is not a number of epoch seconds")
    return float(value)
