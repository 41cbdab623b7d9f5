"""``status``, ``members``, ``assignments``: what the store says about a group, read only."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from rebalancer_spark.cli.audit_commands import audit_module
from rebalancer_spark.cli.exits import EXIT_OK
from rebalancer_spark.cli.render import (
    emit,
    members_table,
    print_status,
    print_store_warnings,
    status_json,
    table,
    utc,
)
from rebalancer_spark.cli.store import backend_url, read_group, shown, store_warnings
from rebalancer_spark.core.model import GroupState, Progress, validate_group
from rebalancer_spark.core.status import (
    AssignmentStatus,
    assignment_statuses,
    group_status,
    member_health,
    member_statuses,
)

__all__ = ["cmd_assignments", "cmd_members", "cmd_status"]


def _read(
    args: argparse.Namespace, *, progress: bool = False
) -> tuple[str, GroupState, dict[str, Progress]]:
    """(the store as shown, the group's state, its progress if asked) from the options."""
    group = validate_group(args.group)
    url = backend_url(args.backend)
    where = shown(url)
    state, done = read_group(url, group, progress=progress)
    return where, state, done


def cmd_status(args: argparse.Namespace) -> int:
    backend, state, progress = _read(args, progress=True)
    status = group_status(state, progress)
    last = _last_rebalance(args.audit, state.group) if args.audit else None
    warnings = store_warnings(backend_url(args.backend))
    health = member_health(state)
    data = {
        **status_json(status, backend),
        "last_rebalance": last,
        "store_warnings": warnings,
        "member_health": [asdict(h) for h in health],
    }

    def human() -> None:
        print_status(status, backend, last, bool(args.audit))
        print_store_warnings([*warnings, *(h.text() for h in health)])

    emit(args.json, data, human)
    return EXIT_OK


def _last_rebalance(path: str, group: str) -> dict[str, Any] | None:
    """The group's last rebalance as the audit table at ``path`` tells it (see
    ``audit rebalances`` for the definition), or None if the table has none."""
    from rebalancer_spark.audit.rows import load_rows

    found = audit_module().rebalances(load_rows(path, group=group).rows)
    if not found:
        return None
    last = found[-1]
    keys = ("number", "generation", "trigger", "reason", "moved", "assigned", "by_generation")
    return {
        **{k: getattr(last, k) for k in keys},
        "start": utc(last.start),
        "duration": round(last.duration, 3),
        "members": list(last.members),
    }


def cmd_members(args: argparse.Namespace) -> int:
    backend, state, _ = _read(args)
    members = member_statuses(state)
    empty = f"no members: no live member in group {state.group} on {backend}"
    data = {"group": state.group, "backend": backend, "members": [asdict(m) for m in members]}
    emit(args.json, data, lambda: print(members_table(members) if members else empty))
    return EXIT_OK


def cmd_assignments(args: argparse.Namespace) -> int:
    backend, state, progress = _read(args, progress=True)
    rows = assignment_statuses(state, progress)
    heads = ("RESOURCE", "OWNER", "EPOCH", "TARGET OWNER", "PROGRESS EPOCH", "PENDING", "BYTES")
    keys = ("resource", "owner", "epoch", "target_owner", "progress_epoch")
    cells = [
        [*(getattr(r, k) for k in keys), *_lag(r), _short(r.stuck)]
        for r in rows
    ]  # fmt: skip
    text = table((*heads, "STUCK"), cells)
    empty = f"no resources in group {state.group} on {backend}"
    data = {"group": state.group, "backend": backend, "assignments": [asdict(r) for r in rows]}
    emit(args.json, data, lambda: print(text if rows else empty))
    return EXIT_OK


def _lag(row: AssignmentStatus) -> tuple[str | None, str | None]:
    """The PENDING and BYTES cells: files (``N+`` when the owner's listing stopped early) or,
    for a queue, ``N msg`` (a broker tells no bytes)."""
    if row.pending_messages is not None:
        return f"{row.pending_messages} msg", None
    if row.pending_files is None:
        return None, None
    mark = "+" if row.pending_more else ""
    return f"{row.pending_files}{mark}", f"{row.pending_bytes}{mark}"


def _short(stuck: str | None) -> str | None:
    return None if stuck is None else stuck if len(stuck) <= 60 else stuck[:57] + "..."
