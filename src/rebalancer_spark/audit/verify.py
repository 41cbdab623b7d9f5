"""The verdict on an audit trail: did any resource ever have two owners at once?

Use case: after a chaos test or an incident, ``verify_table(path).report()`` says whether the
product's first promise held, shows every overlap in full (who, which epoch, from when to
when), every broken link of a resource's epoch chain with the rows around it, and sums up the
time resources spent without an owner. The proof itself is :mod:`rebalancer_spark.core.audit`
(intervals, overlaps) and :mod:`rebalancer_spark.core.chain` (the epoch chain); this module
reads the table and words the result. A table written before the chain columns is judged on
overlaps alone (a crashed owner's interval then ends at its successor's start), and the verdict
says that the chain check was skipped.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from rebalancer_spark.audit.reader import load_events
from rebalancer_spark.core.audit import Gap, Interval, Overlap, gaps, intervals, overlaps
from rebalancer_spark.core.chain import ChainCheck, ChainFault, check_chain
from rebalancer_spark.core.errors import ConfigurationError

__all__ = ["AuditVerdict", "history", "verify_events", "verify_table"]

_TOP_RESOURCES = 5
_NOT_OWNERSHIP = frozenset({"control", "rebalance", "stuck", "progress", "lag"})
_SHOWN_ROWS = 6


@dataclass(frozen=True)
class AuditVerdict:
    """What an audit trail proves. ``ok`` means no two ownerships of one resource shared
    more than ``tolerance`` seconds and every resource's epoch chain is unbroken."""

    ok: bool
    events: int
    resources: int
    members: int
    intervals: int
    open_intervals: int
    overlaps: tuple[Overlap, ...]
    gaps: tuple[Gap, ...]
    tolerance: float = 0.0
    chain: ChainCheck | None = None
    """The epoch chain check; None when it was skipped (no row carries the chain)."""

    @property
    def chain_faults(self) -> tuple[ChainFault, ...]:
        return () if self.chain is None else self.chain.faults

    def chain_summary(self) -> str:
        """One line on the chain check: what was checked, or why it was skipped."""
        c = self.chain
        if c is None:
            return (
                "chain check skipped: the table predates the chain columns (a crashed "
                "owner's ownership is taken to end at its successor's start)"
            )
        line = f"chain: {c.checked} grants checked, {_count(len(c.faults), 'broken link')}"
        if c.unrecorded:
            line += f", {len(c.unrecorded)} unrecorded (listed below)"
        if c.unchained:
            line += f", {c.unchained} grants without the chain columns (their links not checked)"
        return line

    def report(self) -> str:
        """The verdict in one line, then every overlap and broken link in full, then a
        summary of the gaps."""
        counts = (
            f"{self.events} events, {self.resources} resources, {self.members} members, "
            f"{self.intervals} ownerships ({self.open_intervals} still open), "
            f"tolerance {self.tolerance:g} s"
        )
        if self.ok:
            lines = [f"audit OK: no resource ever had two owners at once ({counts})"]
        else:
            problems = []
            if self.overlaps:
                problems.append(
                    f"{_count(len(self.overlaps), 'overlap')}: resources owned by two members "
                    "at once"
                )
            if self.chain_faults:
                problems.append(f"{_count(len(self.chain_faults), 'broken link')} of the chain")
            lines = [f"audit FAILED: {'; '.join(problems)} ({counts})"]
        lines.append(self.chain_summary())
        for fault in self.chain_faults:
            lines.extend(_fault_lines(fault))
        if self.chain is not None and self.chain.unrecorded:
            lines.append("unrecorded links (not faults):")
            for fault in self.chain.unrecorded[:_TOP_RESOURCES]:
                lines.append(f"  {fault.message}")
        if self.overlaps:
            lines.append("overlaps:")
        for overlap in self.overlaps:
            span = (
                f"for {overlap.seconds:.3f} s"
                if math.isfinite(overlap.seconds)
                else "with no end recorded (both still open)"
            )
            lines.append(f"  {overlap.resource}: two owners {span}")
            lines.append(f"    {_ownership(overlap.first)}")
            lines.append(f"    {_ownership(overlap.second)}")
        lines.extend(_gap_summary(self.gaps))
        return "\n".join(lines)


def verify_events(
    events: Iterable[Mapping[str, object]], *, tolerance: float = 0.0
) -> AuditVerdict:
    """Judge a trail of events (dicts with kind, resource, member_id, session_id, epoch, at,
    and the chain columns where the table has them); ``control`` and ``rebalance`` events are
    left out (they are not about ownership)."""
    if not math.isfinite(tolerance) or tolerance < 0:
        raise ConfigurationError(
            f"tolerance {tolerance!r} is not a number of seconds >= 0; use 0, or the clock "
            "skew between the members' hosts"
        )
    rows = list(events)
    # Control rows (an operator's pause, drain, pin...) are not ownership: not judged here.
    trail = [e for e in rows if str(e["kind"]) not in _NOT_OWNERSHIP]
    by_resource = intervals(trail)
    found = overlaps(by_resource, tolerance=tolerance)
    every = [item for items in by_resource.values() for item in items]
    # Every row, control rows too: a session's row numbers (seq) must leave no gap.
    chain = check_chain(rows, tolerance=tolerance)
    # No grant carrying the chain: a table written before it.
    chain_result = None if chain.checked == 0 and not chain.faults else chain
    return AuditVerdict(
        ok=not found and not chain.faults,
        events=len(trail),
        resources=len({str(e["resource"]) for e in trail}),
        members=len({str(e["member_id"]) for e in trail}),
        intervals=len(every),
        open_intervals=sum(1 for item in every if item.closed_by == "open"),
        overlaps=tuple(found),
        gaps=tuple(gaps(by_resource)),
        tolerance=tolerance,
        chain=chain_result,
    )


def verify_table(
    path: str,
    *,
    group: str | None = None,
    tolerance: float = 0.0,
    storage_options: Mapping[str, str] | None = None,
) -> AuditVerdict:
    """Judge the audit table at ``path`` (of ``group`` only, if given); read with deltalake."""
    events = load_events(path, group=group, storage_options=storage_options)
    return verify_events(events, tolerance=tolerance)


def history(events: Iterable[Mapping[str, object]]) -> list[str]:
    """One line per event, in time order: UTC time (ms), resource, kind, member, epoch and
    reason."""
    ordered = sorted(events, key=lambda e: (_seconds(e["at"]), str(e["resource"])))
    width = max((len(str(e["resource"])) for e in ordered), default=0)
    return [
        f"{_utc(_seconds(e['at']))}  {e['resource']!s:<{width}}  {e['kind']!s:<8}  "
        f"member={e['member_id']}  epoch={e['epoch']}  {e.get('reason') or ''}".rstrip()
        for e in ordered
    ]


def _gap_summary(found: tuple[Gap, ...]) -> list[str]:
    if not found:
        return ["gaps: none"]
    longest = max(found, key=lambda gap: gap.seconds)
    lines = [
        f"gaps: {len(found)}, {sum(gap.seconds for gap in found):.3f} s in total, longest "
        f"{longest.seconds:.3f} s ({longest.resource}, from {_utc(longest.after.end)}, "
        f"{longest.after.member_id} epoch {longest.after.epoch} -> "
        f"{longest.before.member_id} epoch {longest.before.epoch})"
    ]
    per_resource: dict[str, list[float]] = defaultdict(list)
    for gap in found:
        per_resource[gap.resource].append(gap.seconds)
    top = sorted(per_resource.items(), key=lambda item: (-sum(item[1]), item[0]))
    shown = top[:_TOP_RESOURCES]
    lines.append(f"gaps per resource (top {len(shown)} of {len(top)} by total time):")
    lines.extend(
        f"  {resource}: {_count(len(spans), 'gap')}, {sum(spans):.3f} s in total, "
        f"longest {max(spans):.3f} s"
        for resource, spans in shown
    )
    return lines


def _fault_lines(fault: ChainFault) -> list[str]:
    lines = [f"  [{fault.kind}] {fault.message}", "    rows around it:"]
    for row in sorted(fault.rows, key=lambda r: _seconds(r["at"]))[:_SHOWN_ROWS]:
        link = ""
        if row.get("freed") not in (None, ""):
            link = (
                f" prev={row.get('prev_member_id')}/{row.get('prev_epoch')} "
                f"freed={row.get('freed')}"
                + (
                    f" at {_utc(_seconds(row['freed_at']))}"
                    if row.get("freed_at") is not None
                    else ""
                )
            )
        lines.append(
            f"      {_utc(_seconds(row['at']))} {row['kind']} member={row['member_id']} "
            f"session={row['session_id']} epoch={row['epoch']}{link}"
        )
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _ownership(item: Interval) -> str:
    end = "still open" if math.isinf(item.end) else f"{_utc(item.end)} ({item.closed_by})"
    return (
        f"member {item.member_id} epoch {item.epoch} session {item.session_id}: "
        f"{_utc(item.start)} to {end}"
    )


def _utc(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "open"
    stamp = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _seconds(value: object) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"time {value!r} is not a number of epoch seconds")
    return float(value)
