"""Printing: aligned tables, the status report, JSON objects (strict: no NaN or Infinity)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rebalancer_spark.core.status import ControlStatus, GroupStatus, MemberStatus

if TYPE_CHECKING:
    from rebalancer_spark.audit.stats import Rebalance

__all__ = [
    "control_json",
    "emit",
    "members_table",
    "number",
    "print_control",
    "print_rebalances",
    "print_status",
    "print_store_warnings",
    "status_json",
    "table",
    "utc",
]


def emit(as_json: bool, data: object, human: Callable[[], None]) -> None:
    """Print ``data`` as one JSON object if ``as_json``, else call ``human``."""
    if as_json:
        print(json.dumps(_finite(data), sort_keys=True, allow_nan=False))
    else:
        human()


def _finite(value: Any) -> Any:
    """``value`` with open-ended times (infinite floats) as None, for strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """``rows`` under ``headers`` in aligned columns (None as ``-``, booleans as yes/no)."""
    cells = [list(headers), *([_cell(v) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def number(value: float) -> int | float:
    """``value`` as an int when it is whole (counts), else rounded for display."""
    return int(value) if float(value).is_integer() else round(value, 3)


def utc(seconds: float) -> str:
    """Epoch seconds as an ISO time in UTC with a ``Z``, to the millisecond."""
    return _iso(seconds).replace("+00:00", "Z")


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")


# -- the group's status ---------------------------------------------------------------------


def status_json(status: GroupStatus, backend: str) -> dict[str, Any]:
    """The JSON object of ``status --json`` (without ``last_rebalance``)."""
    target = status.target
    return {
        "group": status.group,
        "backend": backend,
        "members": [asdict(m) for m in status.members],
        "coordinator": asdict(status.coordinator) if status.coordinator else None,
        "target": None if target is None else {**asdict(target), "phase": str(target.phase)},
        "resources": {"count": status.resource_count, "version": status.resources_version},
        "owners": {m: [asdict(h) for h in held] for m, held in status.owners.items()},
        "unowned": list(status.unowned),
        "imbalance": number(status.imbalance),
        "stable": status.stable,
        "control": control_json(status.control),
        "stuck": dict(status.stuck),
        "pending": {
            "files": status.pending_files,
            "bytes": status.pending_bytes,
            "messages": status.pending_messages,
        },
    }


def control_json(control: ControlStatus) -> dict[str, Any]:
    """The ``control`` object of ``status --json`` and of the control commands."""
    return {
        "mode": str(control.mode),
        "version": control.version,
        "rebalance_requests": control.rebalance_requests,
        "imbalance_threshold": control.imbalance_threshold,
        "drain": [asdict(d) for d in control.drain],
        "pins": [asdict(p) for p in control.pins],
        "history": [
            {"version": v, "at": _iso(at), "what": what} for v, at, what in control.history
        ],
    }


def members_table(members: Sequence[MemberStatus]) -> str:
    keys = ("member_id", "host", "pid", "spark_app_id", "coordinator", "leaving", "static")
    heads = ("MEMBER", "HOST", "PID", "SPARK APP", "COORDINATOR", "LEAVING", "STATIC", "ACKED")
    rows = [[getattr(m, k) for k in (*keys, "acked_generation", "owned")] for m in members]
    return table((*heads, "OWNED"), rows)


def print_status(
    status: GroupStatus, backend: str, last: Mapping[str, Any] | None, audit_given: bool
) -> None:
    """The human ``status`` report; ``last``: the last rebalance from the audit table."""
    coord, target = status.coordinator, status.target
    print(f"group {status.group} on {backend}")
    print(f"coordinator: {f'{coord.member_id} (epoch {coord.epoch})' if coord else 'none'}")
    if target:
        print(
            f"target: generation {target.generation}, phase {target.phase}, "
            f"coordinator epoch {target.coordinator_epoch}"
        )
    else:
        print("target: none published")
    print(f"resources: {status.resource_count} (version {status.resources_version})")
    print(f"imbalance: {number(status.imbalance)}, stable: {_cell(status.stable)}")
    print(f"last rebalance: {_last_rebalance(last, audit_given)}")
    if status.pending_files is not None:
        print(f"pending: {status.pending_files} files, {status.pending_bytes} bytes")
    if status.pending_messages is not None:
        print(f"pending: {status.pending_messages} messages in the queues")
    if status.stuck:
        print(f"stuck: {len(status.stuck)}")
        for resource, why in status.stuck.items():
            print(f"  {resource}: {why}")
    print_control(status.control)
    _print_members_and_owners(status)


def print_store_warnings(warnings: Sequence[str]) -> None:
    """The warnings of ``status`` (the store's set-up, ``Backend.store_warnings``, and the
    members' published health), one a line."""
    for warning in warnings:
        print(f"WARNING: {warning}")


def _last_rebalance(last: Mapping[str, Any] | None, audit_given: bool) -> str:
    if not last:
        return "none in the audit table" if audit_given else "give --audit PATH to see it"
    if last["by_generation"]:
        what = f"generation {last['generation']} ({last['reason'] or last['trigger']})"
        basis = ""
    else:
        what = f"#{last['number']}"
        basis = " (guessed by clustering: the audit table has no rebalance rows)"
    return (
        f"{what} at {last['start']} UTC, took {last['duration']:.3f} s, "
        f"{last['moved']} moved, {last['assigned']} assigned{basis}"
    )


def _print_members_and_owners(status: GroupStatus) -> None:
    if not status.members:
        print(f"no members: no live member in group {status.group}")
    else:
        print(f"\nmembers: {len(status.members)}\n{members_table(status.members)}")
    if status.owners:
        print("\nowners:")
        for member, claims in status.owners.items():
            held = ", ".join(f"{c.resource} (epoch {c.epoch})" for c in claims)
            print(f"  {member}: {held or 'nothing'}")
    print(f"unowned: {', '.join(status.unowned) or 'none'}")


def print_control(control: ControlStatus) -> None:
    """The control record's lines of the human ``status`` report."""
    drains = ", ".join(
        f"{d.member_id} (owns {d.owned}{'' if d.present else ', gone'})" for d in control.drain
    )
    pins = ", ".join(
        f"{p.resource} -> {p.member_id} (owner {p.owner or 'none'})" for p in control.pins
    )
    print(
        f"control: {control.mode} (version {control.version}), imbalance threshold "
        f"{control.imbalance_threshold:g}, rebalance requests {control.rebalance_requests}"
    )
    print(f"draining: {drains or 'none'}")
    print(f"pinned: {pins or 'none'}")
    if control.history:
        print("control history:")
        for version, at, what in control.history:
            print(f"  v{version}  {_iso(at)}  {what}")


# -- the audit table ------------------------------------------------------------------------


def print_rebalances(found: Sequence[Rebalance], summary: Mapping[str, Any]) -> None:
    """The human ``audit rebalances`` table and its summary line and notes."""
    if not found:
        print("no rebalances")
        return
    heads = ("#", "GROUP", "GEN", "TRIGGER", "START (UTC)", "DURATION S", "MOVED")
    tail = ("ASSIGNED", "RETURNED", "RELEASED", "LOST", "MEMBERS")
    rows = [_rebalance_row(r) for r in found]
    print(table((*heads, *tail), rows))
    notes = summary["notes"]
    basis = "by generation" if not notes else "by generation where recorded"
    print(
        f"{len(found)} rebalances ({basis}), median {summary['median_duration']:.3f} s, "
        f"longest {summary['max_duration']:.3f} s, {summary['moved']} resources moved"
    )
    for note in notes:
        print(f"note: {note}")


def _rebalance_row(r: Rebalance) -> list[object]:
    start, duration = utc(r.start), f"{r.duration:.3f}"
    head = (r.number, r.group, r.generation, r.trigger, start, duration, r.moved)
    return [*head, r.assigned, r.returned, r.released, r.lost, ",".join(r.members)]
