"""The lag samples kept for the audit table (spark/lag.py): the first of an owner, catching up
and falling behind at once, otherwise at most one per interval while the lag moves; and the
``lag`` rows in the Delta audit table."""

from __future__ import annotations

from pathlib import Path

from rebalancer_spark.audit import DeltaAuditLog, verify_table
from rebalancer_spark.audit.rows import load_rows
from rebalancer_spark.core.events import EventKind, OwnershipEvent
from rebalancer_spark.spark.lag import LagSampler


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_first_reading_of_an_owner_is_kept_then_only_moves_past_the_interval() -> None:
    clock = Clock()
    lag = LagSampler(60.0, clock)
    assert lag.take("a", 1, 10, 100)
    clock.now += 5
    assert not lag.take("a", 1, 9, 90)  # moved, but within the interval
    assert not lag.take("a", 1, 10, 100)  # unchanged
    clock.now += 60
    assert not lag.take("a", 1, 10, 100)  # past the interval, but the same as the last kept
    assert lag.take("a", 1, 8, 80)
    assert lag.take("b", 1, 8, 80)  # per resource


def test_catching_up_and_falling_behind_are_kept_at_once() -> None:
    clock = Clock()
    lag = LagSampler(60.0, clock)
    assert lag.take("a", 1, 3, 30)
    clock.now += 1
    assert lag.take("a", 1, 0, 0)
    assert not lag.take("a", 1, 0, 0)
    clock.now += 1
    assert lag.take("a", 1, 1, 10)


def test_a_new_epoch_starts_a_new_line() -> None:
    clock = Clock()
    lag = LagSampler(60.0, clock)
    assert lag.take("a", 1, 5, 50)
    assert lag.take("a", 2, 5, 50)
    assert not lag.take("a", 2, 5, 50)


def test_a_lag_row_round_trips_through_the_audit_table_and_is_not_ownership(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "audit")
    events = [
        OwnershipEvent(EventKind.ACQUIRED, "g", "a", "m1", "s1", 1, 10.0, 10.0, "granted"),
        OwnershipEvent(
            EventKind.LAG, "g", "a", "m1", "s1", 1, 11.0, 11.0, "7 files, 70 bytes pending",
            pending_files=7, pending_bytes=70,
        ),
        OwnershipEvent(EventKind.ACQUIRED, "g", "q", "m1", "s1", 1, 12.0, 12.0, "granted"),
        OwnershipEvent(
            EventKind.LAG, "g", "q", "m1", "s1", 1, 13.0, 13.0, "25 messages pending",
            pending_messages=25,
        ),
    ]  # fmt: skip
    with DeltaAuditLog(path, flush_interval=0) as log:
        for e in events:
            log(e)
        assert log.flush(), log.last_error
    rows = load_rows(path).rows
    sample, queue = [r for r in rows if r["kind"] == "lag"]
    assert (sample["pending_files"], sample["pending_bytes"]) == (7, 70)
    assert sample["pending_messages"] is None
    assert (queue["pending_files"], queue["pending_messages"]) == (None, 25)
    acquired = [r for r in rows if r["kind"] == "acquired"]
    assert [r["pending_files"] for r in acquired] == [None, None]
    verdict = verify_table(path)
    assert verdict.ok and verdict.resources == 2, verdict.report()
