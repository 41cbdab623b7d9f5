"""``audit verify | history | timeline | rebalances | owners`` and ``history``: the Delta audit
table (and, for ``verify --output``, an output table) read with deltalake, imported on use."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from rebalancer_spark.cli.exits import EXIT_CHECK_FAILED, EXIT_OK, fail
from rebalancer_spark.cli.render import emit, print_rebalances, table, utc
from rebalancer_spark.core.config import parse_duration
from rebalancer_spark.core.errors import RebalancerError
from rebalancer_spark.core.model import validate_group

__all__ = [
    "OWNERSHIP_KINDS",
    "audit_module",
    "cmd_history",
    "cmd_owners",
    "cmd_rebalances",
    "cmd_timeline",
    "cmd_verify",
]

OWNERSHIP_KINDS = ("acquired", "released", "lost", "fenced")
"""Rows that are ownerships; control and rebalance rows are marks above the lanes."""


def audit_module() -> Any:
    """:mod:`rebalancer_spark.audit`, or a one-line error naming what to install."""
    try:
        from rebalancer_spark import audit
    except ImportError as exc:
        fail(f"the audit commands need deltalake and pyarrow ({exc})")
    return audit


def _group(args: argparse.Namespace) -> str | None:
    return validate_group(args.group) if args.group is not None else None


def cmd_verify(args: argparse.Namespace) -> int:
    group = _group(args)
    options = _storage_options(args.storage_option) or None
    verdict = audit_module().verify_table(
        args.path, group=group, tolerance=args.tolerance, storage_options=options
    )
    data: dict[str, Any] = asdict(verdict)
    reports, ok = [verdict.report()], verdict.ok
    if args.output is not None:
        from rebalancer_spark.audit.output_check import verify_output

        checked = verify_output(
            args.path, args.output, group=group, tolerance=args.tolerance, storage_options=options
        )
        data["output"] = checked.as_dict()
        reports.append(checked.report())
        ok = ok and checked.ok
    emit(args.json, data, lambda: print("\n".join(reports)))
    return EXIT_OK if ok else EXIT_CHECK_FAILED


def _storage_options(pairs: Sequence[str] | None) -> dict[str, str]:
    """``KEY=VALUE`` pairs as deltalake storage options (values never shown)."""
    options: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            fail(
                f"--storage-option {key.strip() or '(empty)'!r} is not KEY=VALUE; give e.g. "
                "--storage-option AWS_ENDPOINT_URL=http://host:9000 (or set the AWS_* "
                "environment variables)"
            )
        options[key.strip()] = value
    return options


def _since(text: str) -> float:
    """Epoch seconds from ``--since``: an ISO time (UTC unless it says otherwise) or a
    duration back from now."""
    try:
        stamp = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        try:
            return time.time() - parse_duration("--since", text)
        except RebalancerError:
            fail(
                f"--since {text!r} is neither a time nor a duration; give a UTC time such as "
                "2026-11-21T06:00:00Z or a duration back from now such as 10m or 2h"
            )
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def _events(args: argparse.Namespace, *, since: bool = True) -> list[dict[str, Any]]:
    """The events of the audit table at ``args.path``, filtered by the options given (by
    ``--since`` only if ``since``)."""
    group = _group(args)
    audit_module()
    from rebalancer_spark.audit.rows import load_rows

    events: list[dict[str, Any]] = load_rows(args.path, group=group).rows
    resource = getattr(args, "resource", None)
    if resource is not None:
        events = [e for e in events if e["resource"] == resource]
    if since and getattr(args, "since", None) is not None:
        start = _since(args.since)
        events = [e for e in events if e["at"] >= start]
    return events


def cmd_history(args: argparse.Namespace) -> int:
    audit = audit_module()
    events = _events(args)
    lines: list[str] = audit.history(events)
    emit(args.json, {"events": events}, lambda: print("\n".join(lines) or "no events"))
    return EXIT_OK


def cmd_timeline(args: argparse.Namespace) -> int:
    everything = _events(args)
    events = [e for e in everything if e["kind"] in OWNERSHIP_KINDS]
    try:
        from rebalancer_spark.audit.timeline import save_timeline
    except ImportError as exc:
        fail(f"audit timeline needs matplotlib ({exc})")
    image = save_timeline(
        everything, args.out, title=args.title, lanes=args.lanes, max_lanes=args.max_lanes
    )
    owners = {str(e["member_id"]) for e in events if e["kind"] == "acquired"}
    resources = len({e["resource"] for e in events})
    data = {
        "out": args.out,
        **{k: getattr(image, k) for k in ("width", "height", "lanes", "lane_count", "marks")},
        **{"events": len(events), "resources": resources, "members": len(owners)},
    }
    text = (
        f"wrote {args.out} ({image.width}x{image.height} px): {resources} resources, "
        f"{len(owners)} members, {len(events)} events; {image.lane_count} lanes by "
        f"{image.lanes}, {image.marks} rebalance and control marks"
    )
    emit(args.json, data, lambda: print(text))
    return EXIT_OK


def cmd_rebalances(args: argparse.Namespace) -> int:
    # Rebalances are computed on the whole trail (a move just after --since is still a move,
    # not a first assignment), then those starting at or after --since are kept.
    since = None if args.since is None else _since(args.since)
    found = audit_module().rebalances(_events(args, since=False), window=args.window)
    if since is not None:
        found = [r for r in found if r.start >= since]
    durations = sorted(r.duration for r in found)
    summary = {
        "rebalances": len(found),
        "window": args.window,
        "median_duration": durations[len(durations) // 2] if durations else None,
        "max_duration": durations[-1] if durations else None,
        "moved": sum(r.moved for r in found),
        "notes": audit_module().basis_notes(found, args.window),
    }
    items = [r.as_dict() for r in found]
    emit(args.json, {**summary, "items": items}, lambda: print_rebalances(found, summary))
    return EXIT_OK


def cmd_owners(args: argparse.Namespace) -> int:
    rows = audit_module().current_owners(_events(args))
    heads = ("GROUP", "RESOURCE", "OWNER", "EPOCH", "SINCE (UTC)", "HOST", "STATE")
    keys = ("group", "resource", "member_id", "epoch")
    cells = [[*(r[k] for k in keys), utc(r["since"]), r["host"], r["state"]] for r in rows]
    text = table(heads, cells) if rows else "no resources in the audit table"
    emit(args.json, {"owners": rows}, lambda: print(text))
    return EXIT_OK
