"""The invariants of a chaos run (``tests/support/chaos.py``), from independent witnesses:
the member trails, the Delta audit table and the store's progress."""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rebalancer_spark.backends import open_backend
from rebalancer_spark.core import audit
from tests.support.procs import MemberProcesses

if TYPE_CHECKING:
    from tests.support.chaos import ChaosReport


def count_lost_commits(
    records: Sequence[dict[str, Any]],
    final: dict[str, tuple[float, int]],
    data_lost_at: Sequence[float],
) -> tuple[int, int, list[str]]:
    """(lost, lost with the store's data, examples).

    Evidence that an acknowledged commit survived: the first ``handed`` record of the resource
    at a higher epoch written after the commit's answer (the next owner read the progress after
    its claim, which the store grants only after every accepted commit of older epochs), or
    else the store's progress at the end (``final``: resource -> (read start, value)), is at
    least the commit's value. A commit whose evidence is short is lost, unless the store lost
    its data between the commit's request and the evidence (documented for Redis)."""
    losses = sorted(data_lost_at)
    handed: dict[str, list[tuple[float, int, int]]] = {}
    grants: dict[tuple[str, int], dict[str, Any]] = {}
    for r in records:
        if r["kind"] == "handed":
            value = r["progress"] if isinstance(r["progress"], int) else 0
            handed.setdefault(r["resource"], []).append((float(r["at"]), int(r["epoch"]), value))
        elif r["kind"] == "acquired":
            grants.setdefault((r["resource"], int(r["epoch"])), r)
    for items in handed.values():
        items.sort()
    lost = documented = 0
    examples: list[str] = []
    for r in records:
        if r["kind"] != "commit" or not r["ok"]:
            continue
        acked, epoch = float(r["at"]), int(r["epoch"])
        found: tuple[float, int | None, int] | None = next(
            ((at, e, v) for at, e, v in handed.get(r["resource"], []) if at > acked and e > epoch),
            None,
        )
        if found is None:
            at, v = final[r["resource"]]
            if at <= acked:
                continue  # answered after the last read: nothing can tell
            found = (at, None, v)
        seen_at, seen_epoch, seen = found
        if seen >= r["value"]:
            continue
        between = bisect.bisect_right(losses, seen_at) - bisect.bisect_left(
            losses, float(r["started_at"])
        )
        if between > 0:
            documented += 1
        else:
            lost += 1
            if len(examples) < 5:
                where = (
                    "the store's final read"
                    if seen_epoch is None
                    else f"the grant at epoch {seen_epoch} "
                    f"({_grant(grants.get((r['resource'], seen_epoch)))})"
                )
                examples.append(
                    f"{r['resource']}: value {r['value']} (epoch {epoch}, "
                    f"{_grant(grants.get((r['resource'], epoch)))}) sent at "
                    f"{float(r['started_at']):.3f}, acknowledged at {acked:.3f}, but "
                    f"{where} had {seen} at {seen_at:.3f}"
                )
    return lost, documented, examples


def _grant(acquired: dict[str, Any] | None) -> str:
    """Who was granted an epoch, and what the grant superseded, from its ``acquired`` line."""
    if acquired is None:
        return "no acquired line"
    return (
        f"{acquired.get('member_id')} session {acquired.get('session_id')} at "
        f"{float(acquired['at']):.3f}, after epoch {acquired.get('prev_epoch')} of "
        f"{acquired.get('prev_member_id')} ({acquired.get('freed')} at {acquired.get('freed_at')})"
    )


def every_resource_committed(
    procs: MemberProcesses, resources: Sequence[str], since: float
) -> bool:
    done = {
        r["resource"]
        for r in procs.records()
        if r["kind"] == "commit" and r["ok"] and r["started_at"] > since
    }
    return done >= set(resources)


def check(
    procs: MemberProcesses,
    report: ChaosReport,
    resources: Sequence[str],
    data_lost_at: Sequence[float],
    chaos_started: float,
) -> None:
    """Fill the report's invariant figures from the trails, the audit table and the store;
    ``chaos_started`` is the wall-clock time of the schedule's start."""
    from rebalancer_spark.audit import verify_table

    records = procs.records()
    owned = [r for r in records if r["kind"] in ("acquired", "released", "lost")]
    report.acquisitions = sum(
        1 for r in owned if r["kind"] == "acquired" and r["at"] > chaos_started
    )
    by_resource = audit.intervals(owned)
    report.double_ownerships_trail = len(audit.overlaps(by_resource))
    report.longest_gap_s = max((g.seconds for g in audit.gaps(by_resource)), default=0.0)
    verdict = verify_table(str(procs.audit_path), group=procs.group)
    report.double_ownerships_audit = len(verdict.overlaps)
    report.audit_events = verdict.events
    if verdict.chain is not None:
        report.chain_checked = verdict.chain.checked
        report.chain_unrecorded = len(verdict.chain.unrecorded)
    report.chain_faults = len(verdict.chain_faults)
    report.chain_examples = [f.message for f in verdict.chain_faults[:3]]
    report.commits_acknowledged = sum(1 for r in records if r["kind"] == "commit" and r["ok"])
    final = read_final_progress(procs, resources)
    later = procs.records()  # commits acknowledged before the read above are all in here
    lost, documented, examples = count_lost_commits(later, final, data_lost_at)
    report.lost_commits, report.lost_with_store_data = lost, documented
    report.lost_examples = examples


def read_final_progress(
    procs: MemberProcesses, resources: Sequence[str]
) -> dict[str, tuple[float, int]]:
    with open_backend(procs.observer_url) as store:
        at = time.time()
        progress = store.progress(procs.group, resources)
    return {r: (at, p.value if isinstance(p.value, int) else 0) for r, p in progress.items()} | {
        r: (at, 0) for r in resources if r not in progress
    }
