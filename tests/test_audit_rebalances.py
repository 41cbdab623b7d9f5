"""Rebalances identified by generation from the coordinator's ``rebalance`` rows, with start,
end, moves and trigger; tables without those rows fall back to clustering by time and say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rebalancer_spark.audit import basis_notes, rebalances
from rebalancer_spark.audit.rows import load_rows
from rebalancer_spark.backends import open_backend
from rebalancer_spark.cli import main
from tests.support.audit_tables import as_events, row, write_audit

T0 = 1_790_000_000.0


def published(
    at: float, generation: int, trigger: str, reason: str, moves: int
) -> dict[str, object]:
    return row(
        "rebalance",
        T0 + at,
        "",
        "job-a",
        0,
        reason=reason,
        generation=generation,
        coordinator_epoch=1,
        trigger=trigger,
        moves=moves,
    )


def change(
    kind: str, at: float, resource: str, member: str, epoch: int, generation: int
) -> dict[str, object]:
    return row(kind, T0 + at, resource, member, epoch, generation=generation, coordinator_epoch=1)


def pin_then_drain() -> list[dict[str, object]]:
    """The case of issue 14: a start, then a pin and a drain issued 1.4 s apart. Each moves
    what it must within 0.05 s; clustering by time would merge them into one 1.4 s rebalance."""
    return [
        published(0.0, 1, "start", "start: job-a, job-b", 0),
        change("acquired", 0.02, "r0", "job-a", 1, 1),
        change("acquired", 0.03, "r1", "job-b", 1, 1),
        change("acquired", 0.03, "r2", "job-b", 1, 1),
        published(10.0, 2, "operator", "operator: pin r1 job-a", 1),
        change("released", 10.01, "r1", "job-b", 1, 2),
        change("acquired", 10.044, "r1", "job-a", 2, 2),
        published(11.4, 3, "operator", "operator: drain job-b", 1),
        change("released", 11.41, "r2", "job-b", 1, 3),
        change("acquired", 11.43, "r2", "job-a", 2, 3),
        published(20.0, 4, "discovery", "discovery: +0 -0", 0),
    ]


def test_rebalances_are_identified_by_generation() -> None:
    found = rebalances(as_events(pin_then_drain()))
    assert [(r.generation, r.trigger, r.moved) for r in found] == [
        (1, "start", 0),
        (2, "operator", 1),
        (3, "operator", 1),
        (4, "discovery", 0),
    ]
    assert [r.number for r in found] == [1, 2, 3, 4]
    assert [round(r.duration, 3) for r in found] == [0.03, 0.044, 0.03, 0.0]
    assert found[0].assigned == 3 and found[1].released == 1
    assert found[2].reason == "operator: drain job-b" and found[2].coordinator == "job-a"
    assert found[2].members == ("job-a", "job-b")
    assert basis_notes(found) == []


def test_without_rebalance_rows_changes_are_clustered_and_it_says_so() -> None:
    old = [e for e in pin_then_drain() if e["kind"] != "rebalance"]
    found = rebalances(as_events(old))
    assert [(r.generation, r.trigger) for r in found] == [(None, None), (None, None)]
    assert round(found[1].duration, 3) == 1.42  # the pin and the drain merged
    assert basis_notes(found) == [
        "group orders: all its rebalances guessed by clustering changes more than 2 s apart: "
        "the audit table has no rebalance rows for them (written before generations were "
        "recorded)"
    ]


def test_a_trail_upgraded_midway_clusters_only_what_came_before() -> None:
    old = [
        row("acquired", T0 - 30.0, "r0", "job-a", 1),
        row("released", T0 - 5.0, "r0", "job-a", 1),
        row("acquired", T0 - 4.9, "r0", "job-b", 2),
    ]
    found = rebalances(as_events(old + [e for e in pin_then_drain() if e["resource"] != "r0"]))
    assert [(r.generation, r.number) for r in found][:3] == [(None, 1), (None, 2), (1, 3)]
    assert basis_notes(found)[0].startswith("group orders: its first 2 rebalances guessed")


def test_an_acquisition_under_a_generation_without_its_row_still_counts() -> None:
    trail = [*pin_then_drain(), change("acquired", 30.0, "r3", "job-a", 1, 5)]
    last = rebalances(as_events(trail))[-1]
    assert (last.generation, last.trigger, last.assigned) == (5, "unknown", 1)
    assert last.reason == "no rebalance row for this generation"


def test_the_cli_and_status_use_generations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    audit = str(tmp_path / "audit")
    write_audit(audit, pin_then_drain())
    assert len(load_rows(audit).rows) == 11
    assert main(["audit", "rebalances", audit]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["#", "GROUP", "GEN", "TRIGGER"]
    assert lines[3].split()[2:4] == ["3", "operator"]
    assert lines[3].split()[5:7] == ["0.030", "1"]
    assert lines[-1].startswith("4 rebalances (by generation)")
    assert main(["audit", "rebalances", audit, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [i["trigger"] for i in data["items"]] == ["start", "operator", "operator", "discovery"]
    assert data["notes"] == []

    store = _store_of_orders(tmp_path)
    assert main(["status", "--group", "orders", "--backend", store, "--audit", audit]) == 0
    shown = capsys.readouterr().out
    assert "last rebalance: generation 4 (discovery: +0 -0) at " in shown
    assert "took 0.000 s, 0 moved" in shown


def _store_of_orders(tmp_path: Path) -> str:
    """A store that knows group ``orders`` (one live member): ``status`` answers exit 2 for a
    store or group that does not exist."""
    store = f"sqlite:///{tmp_path}/groups.db"
    with open_backend(store) as backend:
        backend.join("orders", "m1", info={"host": "test"}, ttl=60.0, static=False)
    return store


def test_status_says_when_it_guessed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    audit = str(tmp_path / "audit")
    write_audit(audit, [e for e in pin_then_drain() if e["kind"] != "rebalance"], chain=False)
    store = _store_of_orders(tmp_path)
    assert main(["status", "--group", "orders", "--backend", store, "--audit", audit]) == 0
    shown = capsys.readouterr().out
    assert "last rebalance: #2 at " in shown
    assert "(guessed by clustering: the audit table has no rebalance rows)" in shown
