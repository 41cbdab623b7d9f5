"""The output checked against ownership: four rules over an output table's commits.

Every commit our fenced writer makes to an output Delta table says, in its ``commitInfo``,
which group, resource, member session, resource epoch and batch it belongs to
(``docs/audit.md``, "The output check"). The audit table says when each epoch of each
resource was granted, to whom, and when that grant ended. This module holds the pure part of
the check (no I/O): it turns audit rows into :class:`Grant` intervals and judges a list of
:class:`OutputCommit` in table-version order against four rules:

1. ``granted``: a data commit's (group, resource, epoch) was granted, to that member session;
2. ``inside``: the commit time falls inside that grant (from ``acquired.at`` to the release,
   the loss or the predecessor's lease expiry; ``tolerance`` seconds either side for clock
   skew, plus :data:`COMMIT_TIME_RESOLUTION` since Delta records milliseconds);
3. ``epoch-order``: per resource, in version order, the epoch never goes down (fence and data
   commits alike): a stale owner committing after a newer one;
4. ``batch-once``: no (group, resource, batch) committed by two data commits.

A commit whose metadata cannot be read (a missing key, an epoch that is not a number) breaks
rule ``metadata`` and is not judged further.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

__all__ = [
    "COMMIT_TIME_RESOLUTION",
    "RULES",
    "Grant",
    "OutputCommit",
    "OutputViolation",
    "check_commits",
    "grants",
    "utc",
]

COMMIT_TIME_RESOLUTION = 0.001
"""Delta's ``commitInfo.timestamp`` is in milliseconds: a commit stamped in the same
millisecond as its grant may read up to this much before it."""

RULES: Mapping[str, str] = {
    "metadata": "the commit's rebalancer metadata is complete and well formed",
    "granted": "1: every data commit's epoch was granted to its member in the audit table",
    "inside": "2: every data commit falls inside its epoch's ownership interval",
    "epoch-order": "3: per resource, the epoch never goes down in table-version order",
    "batch-once": "4: no batch of a resource is committed twice",
}
"""Each rule's name and what it demands, as the verdict quotes them."""


@dataclass(frozen=True, slots=True)
class OutputCommit:
    """One commit of the output table made by the fenced writer (its ``commitInfo``)."""

    version: int
    at: float
    """``commitInfo.timestamp``, in epoch seconds."""
    kind: str
    """``data`` or ``fence``."""
    group: str
    resource: str
    member_id: str
    session_id: str
    epoch: int
    batch: int
    rows: int | None = None
    problem: str | None = None
    """Why the metadata could not be read (then the other fields are best effort)."""


@dataclass(frozen=True, slots=True)
class Grant:
    """One epoch of one resource as the audit table records it."""

    group: str
    resource: str
    epoch: int
    member_id: str
    session_id: str
    start: float
    end: float
    """``math.inf`` while the grant is still open at the end of the trail."""
    ended_by: str
    """``released``, ``lost``, ``expired`` (the successor's record of the lease expiry),
    ``superseded`` (the next grant's start, when nothing better is recorded) or ``open``."""


@dataclass(frozen=True, slots=True)
class OutputViolation:
    """One commit that broke one rule."""

    rule: str
    commit: OutputCommit
    detail: str


def grants(events: Iterable[Mapping[str, object]]) -> dict[tuple[str, str, int], list[Grant]]:
    """The grants of each (group, resource, epoch) found in audit rows (dicts with kind,
    group, resource, member_id, session_id, epoch, at, and where the table has them
    ``prev_epoch``, ``freed`` and ``freed_at``). A grant ends at the earliest of: its
    ``released`` / ``lost`` row, the time its successor says it was freed (``freed_at`` of
    the next ``acquired`` row whose ``prev_epoch`` is this epoch), and the next grant's start."""
    opened: dict[tuple[str, str, int], list[Mapping[str, object]]] = defaultdict(list)
    closed: dict[tuple[str, str, str, int], tuple[float, str]] = {}
    freed: dict[tuple[str, str, int], tuple[float, str]] = {}
    for e in events:
        kind = str(e["kind"])
        group, resource, epoch = str(e["group"]), str(e["resource"]), _int(e["epoch"])
        if kind == "acquired":
            opened[(group, resource, epoch)].append(e)
            prev, at = e.get("prev_epoch"), e.get("freed_at")
            if prev is not None and at is not None:
                how = "expired" if e.get("freed") == "expired" else "released"
                _keep_earliest(freed, (group, resource, _int(prev)), (_float(at), how))
        elif kind in ("released", "lost"):
            key4 = (group, resource, str(e["session_id"]), epoch)
            _keep_earliest(closed, key4, (_float(e["at"]), kind))
    later = _next_starts(opened)
    out: dict[tuple[str, str, int], list[Grant]] = {}
    for (group, resource, epoch), rows in opened.items():
        found: list[Grant] = []
        for row in rows:
            session = str(row["session_id"])
            ends = [(math.inf, "open"), (later[(group, resource, epoch)], "superseded")]
            if (group, resource, epoch) in freed:
                ends.append(freed[(group, resource, epoch)])
            if (group, resource, session, epoch) in closed:
                ends.append(closed[(group, resource, session, epoch)])
            end, how = min(ends, key=lambda item: item[0])
            start = _float(row["at"])
            found.append(
                Grant(group, resource, epoch, str(row["member_id"]), session, start, end, how)
            )
        out[(group, resource, epoch)] = sorted(found, key=lambda g: g.start)
    return out


_K = TypeVar("_K")


def _keep_earliest(ends: dict[_K, tuple[float, str]], key: _K, end: tuple[float, str]) -> None:
    if key not in ends or end[0] < ends[key][0]:
        ends[key] = end


def _next_starts(
    opened: Mapping[tuple[str, str, int], Sequence[Mapping[str, object]]],
) -> dict[tuple[str, str, int], float]:
    """Per (group, resource, epoch): the earliest start of any later epoch (inf: none)."""
    starts: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    for (group, resource, epoch), rows in opened.items():
        starts[(group, resource)].append((epoch, min(_float(r["at"]) for r in rows)))
    next_start: dict[tuple[str, str, int], float] = {}
    for (group, resource), items in starts.items():
        items.sort()
        earliest = math.inf
        for epoch, start in reversed(items):
            next_start[(group, resource, epoch)] = earliest
            earliest = min(earliest, start)
    return next_start


def check_commits(
    commits: Sequence[OutputCommit],
    granted: Mapping[tuple[str, str, int], Sequence[Grant]],
    *,
    tolerance: float = 0.0,
) -> list[OutputViolation]:
    """Every violation of the four rules by ``commits`` (fence and data commits of the fenced
    writer; foreign commits left out), in table-version order."""
    found: list[OutputViolation] = []
    newest: dict[tuple[str, str], OutputCommit] = {}
    landed: dict[tuple[str, str, int], OutputCommit] = {}
    slack = tolerance + COMMIT_TIME_RESOLUTION
    for c in sorted(commits, key=lambda c: c.version):
        if c.problem is not None:
            found.append(OutputViolation("metadata", c, c.problem))
            continue
        key = (c.group, c.resource)
        top = newest.get(key)
        if top is not None and c.epoch < top.epoch:
            found.append(
                OutputViolation(
                    "epoch-order",
                    c,
                    f"epoch {c.epoch} after version {top.version} committed epoch {top.epoch} "
                    f"({top.kind} by {top.member_id}): a stale owner committed after a newer one",
                )
            )
        else:
            newest[key] = c
        if c.kind != "data":
            continue
        found.extend(_against_grant(c, granted.get((c.group, c.resource, c.epoch), ()), slack))
        batch_key = (c.group, c.resource, c.batch)
        first = landed.get(batch_key)
        if first is not None:
            found.append(
                OutputViolation(
                    "batch-once",
                    c,
                    f"batch {c.batch} of {c.resource} was already committed by version "
                    f"{first.version} (epoch {first.epoch}, member {first.member_id})",
                )
            )
        else:
            landed[batch_key] = c
    return found


def _against_grant(
    c: OutputCommit, candidates: Sequence[Grant], slack: float
) -> list[OutputViolation]:
    if not candidates:
        return [
            OutputViolation(
                "granted",
                c,
                f"no acquired row for epoch {c.epoch} of {c.resource} in group {c.group}: "
                "the audit table never granted that epoch",
            )
        ]
    mine = [g for g in candidates if (g.member_id, g.session_id) == (c.member_id, c.session_id)]
    if not mine:
        holders = ", ".join(f"{g.member_id} (session {g.session_id})" for g in candidates)
        return [
            OutputViolation(
                "granted",
                c,
                f"epoch {c.epoch} of {c.resource} was granted to {holders}, not to "
                f"{c.member_id} (session {c.session_id})",
            )
        ]
    if any(g.start - slack <= c.at <= g.end + slack for g in mine):
        return []
    grant = min(mine, key=lambda g: min(abs(c.at - g.start), abs(c.at - g.end)))
    if c.at < grant.start:
        when = f"{grant.start - c.at:.3f} s before it began"
    else:
        when = f"{c.at - grant.end:.3f} s after it ended ({grant.ended_by})"
    return [
        OutputViolation(
            "inside",
            c,
            f"epoch {c.epoch} of {c.resource} was held by {grant.member_id} from "
            f"{utc(grant.start)} to {utc(grant.end)}; the commit came {when}, "
            f"beyond the tolerance of {slack - COMMIT_TIME_RESOLUTION:g} s",
        )
    ]


def utc(seconds: float) -> str:
    """``seconds`` since the epoch as an ISO UTC time to the millisecond (``open`` for inf)."""
    if not math.isfinite(seconds):
        return "open"
    stamp = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str | float):
        raise ValueError(f"epoch {value!r} is not an integer")
    return int(value)


def _float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | str | float):
        raise ValueError(f"time {value!r} is not a number")
    return float(value)
