"""Proof from the trail: turn ownership events into intervals, then look for overlaps and gaps.

An *interval* is one ownership of one resource by one member session at one epoch: it opens
with an ``acquired`` event and closes with the ``released`` or ``lost`` event of the same
session and epoch (``at``, not ``observed_at``: a paused member's ownership ended when its
lease did). An interval whose end was never recorded (a process killed with -9) ends where the
store says it did: the next grant names it as its predecessor with ``freed_at`` (its lease's
expiry in the store), or a grant after the store lost its records names the time by which every
older lease had run out. Nothing is bridged for a grant that carries the chain but names
someone else (the chain check of :mod:`rebalancer_spark.core.chain` reports that): the
interval stays open. Only grants without the chain columns (a table written before them) end
an unclosed interval at their own start ("superseded"), as the trail cannot say more.

:func:`overlaps` reports every pair of intervals of the same resource that intersect by more
than ``tolerance`` seconds (clock skew between hosts); :func:`gaps` reports the time each
resource spent without an owner between two owners.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

__all__ = ["Gap", "Interval", "Overlap", "gaps", "intervals", "overlaps"]

_OPENING = "acquired"
_CLOSING = frozenset({"released", "lost"})


@dataclass(frozen=True, slots=True)
class Interval:
    """One member session's ownership of one resource at one epoch."""

    resource: str
    member_id: str
    session_id: str
    epoch: int
    start: float
    end: float
    """``math.inf`` while open; for a crashed owner, its lease's end as the store told its
    successor (``freed_at``)."""
    closed_by: str
    """``released``, ``lost``, ``expired`` (the store's lease expiry, named by the successor),
    ``released-in-store`` (the successor names a release whose row is missing), ``superseded``
    (a successor without chain columns: inferred from the next epoch) or ``open``."""


@dataclass(frozen=True, slots=True)
class Overlap:
    """Two owners of one resource at once: a violation of the product's first promise."""

    resource: str
    first: Interval
    second: Interval
    seconds: float


@dataclass(frozen=True, slots=True)
class Gap:
    """Time a resource spent without an owner between two ownerships."""

    resource: str
    after: Interval
    before: Interval
    seconds: float


def intervals(events: Iterable[Mapping[str, object]]) -> dict[str, list[Interval]]:
    """Group events (as dicts with kind, resource, member_id, session_id, epoch, at, and the
    chain columns where present) into intervals per resource, sorted by epoch then start."""
    trail = _Trail()
    for e in events:
        trail.add(e)
    by_resource: dict[str, list[Interval]] = defaultdict(list)
    for key, (member, start) in trail.opened.items():
        end, how = trail.end_of(key)
        resource, session, epoch = key
        by_resource[resource].append(Interval(resource, member, session, epoch, start, end, how))
    return {r: trail.superseded(r, items) for r, items in by_resource.items()}


_Key = tuple[str, str, int]
"""(resource, session, epoch): one ownership."""


class _Trail:
    """What the events say about each ownership: its start, its end row, and the ends the
    chained grants of its successors name."""

    def __init__(self) -> None:
        self.opened: dict[_Key, tuple[str, float]] = {}
        self.closed: dict[_Key, tuple[float, str]] = {}
        self.named: dict[_Key, tuple[float, str]] = {}
        self.ended: dict[str, dict[int, float]] = defaultdict(dict)
        """Per resource: epoch -> when it ended, as a chained successor names it."""
        self.resets: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.chained: dict[tuple[str, int], bool] = {}
        self.implied: set[_Key] = set()
        """Ownerships whose end only a later reset or successor implies (see end_of)."""
        self._epochs: dict[str, list[int]] | None = None

    def add(self, e: Mapping[str, object]) -> None:
        kind = str(e["kind"])
        key = (str(e["resource"]), str(e["session_id"]), _int(e["epoch"]))
        if kind in _CLOSING:
            self.closed.setdefault(key, (_float(e["at"]), kind))
        if kind != _OPENING:
            return
        self.opened.setdefault(key, (str(e["member_id"]), _float(e["at"])))
        link = _link(e)
        resource, epoch = key[0], key[2]
        self.chained[(resource, epoch)] = self.chained.get((resource, epoch), False) or bool(link)
        if link is None:
            return
        prev_session, prev_epoch, freed, freed_at = link
        if prev_epoch is None and freed_at is not None:
            self.resets[resource].append((epoch, freed_at))
        elif prev_session and prev_epoch is not None and freed_at is not None:
            how = "expired" if freed == "expired" else "released-in-store"
            self.named.setdefault((resource, prev_session, prev_epoch), (freed_at, how))
            self.ended[resource].setdefault(prev_epoch, freed_at)

    def epochs(self, resource: str) -> list[int]:
        """The epochs acquired of ``resource``, sorted."""
        if self._epochs is None:
            self._epochs = defaultdict(list)
            for r, _, epoch in self.opened:
                self._epochs[r].append(epoch)
            for found in self._epochs.values():
                found.sort()
        return self._epochs[resource]

    def end_of(self, key: _Key) -> tuple[float, str]:
        """When and how the ownership ``key`` ended: its own row, the end a successor names,
        or, for one left open, the earliest end the store's later grants imply."""
        end, how = self.closed.get(key) or self.named.get(key, (math.inf, "open"))
        if how != "open":
            return end, how
        resource, _, epoch = key
        later = [t for e, t in self.resets.get(resource, []) if e > epoch]
        # Every epoch the store granted after this one, up to one whose end a successor
        # names, left no row (lost with a killed process): the store granted the first of
        # them only once this one had ended, so it ended by then too.
        known = self.epochs(resource)
        after = bisect.bisect_right(known, epoch)
        upto = known[after] if after < len(known) else math.inf
        unrecorded = [t for p, t in self.ended.get(resource, {}).items() if epoch < p < upto]
        if later or unrecorded:
            self.implied.add(key)
            return min([*later, *unrecorded]), "expired"
        return end, how

    def superseded(self, resource: str, items: list[Interval]) -> list[Interval]:
        """``items`` sorted by epoch then start; one with no end of its own (still open, or
        ended only by what a later reset implies) before an unchained grant of a higher epoch
        ends there at the latest (the store granted a higher epoch, so this session's claim
        had ended by then: all a table without the chain can say)."""
        items.sort(key=lambda i: (i.epoch, i.start))
        fixed: list[Interval] = []
        for item, later in zip(items, [*items[1:], None], strict=True):
            unknown = (resource, item.session_id, item.epoch) in self.implied
            if (
                (item.closed_by == "open" or unknown)
                and later is not None
                and later.epoch > item.epoch
                and later.start < item.end
                and not self.chained.get((resource, later.epoch), False)
            ):
                fixed.append(dataclasses.replace(item, end=later.start, closed_by="superseded"))
            else:
                fixed.append(item)
        return fixed


def _link(e: Mapping[str, object]) -> tuple[str, int | None, str, float | None] | None:
    """An acquired event's link of the chain: (prev session, prev epoch, freed, freed_at)."""
    freed = e.get("freed")
    if freed in (None, ""):
        return None
    prev_epoch = e.get("prev_epoch")
    freed_at = e.get("freed_at")
    return (
        str(e.get("prev_session_id") or ""),
        None if prev_epoch is None else _int(prev_epoch),
        str(freed),
        None if freed_at is None else _float(freed_at),
    )


def overlaps(by_resource: Mapping[str, list[Interval]], *, tolerance: float = 0.0) -> list[Overlap]:
    """Every pair of intervals of one resource that share more than ``tolerance`` seconds."""
    found: list[Overlap] = []
    for resource, items in by_resource.items():
        ordered = sorted(items, key=lambda i: i.start)
        for i, a in enumerate(ordered):
            for b in ordered[i + 1 :]:
                if b.start >= a.end:
                    break
                shared = min(a.end, b.end) - b.start
                if shared > tolerance:
                    found.append(Overlap(resource, a, b, shared))
    return found


def gaps(by_resource: Mapping[str, list[Interval]]) -> list[Gap]:
    """The unowned time between consecutive ownerships of each resource."""
    found: list[Gap] = []
    for resource, items in by_resource.items():
        ordered = sorted(items, key=lambda i: i.start)
        if not ordered:
            continue
        # The latest-ending ownership so far: time it covers is not a gap, even when a
        # shorter ownership overlapping it ended earlier.
        covering = ordered[0]
        for b in ordered[1:]:
            if b.start > covering.end:
                found.append(Gap(resource, covering, b, b.start - covering.end))
            if b.end > covering.end:
                covering = b
    return found


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str | float):
        raise ValueError(f"epoch {value!r} is not an integer")
    return int(value)


def _float(value: object) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, int | str | float):
        raise ValueError(f"time {value!r} is not a number")
    return float(value)
