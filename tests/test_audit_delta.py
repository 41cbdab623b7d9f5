"""The Delta audit trail: written by DeltaAuditLog, read back by deltalake and by Spark,
judged by the verifier and by the verify_audit job."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import subprocess
import sys
import threading
from collections import Counter
from datetime import UTC, datetime
from multiprocessing.synchronize import Event as EventType
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from rebalancer_spark.audit import (
    AUDIT_COLUMNS,
    DeltaAuditLog,
    history,
    load_events,
    read_audit,
    verify_events,
    verify_table,
)
from rebalancer_spark.audit.reader import delta_reader_available
from rebalancer_spark.core.errors import ConfigurationError, CorruptStateError
from rebalancer_spark.core.events import EventKind, OwnershipEvent
from tests.support.helpers import wait_for

JOB = Path(__file__).resolve().parents[1] / "jobs" / "verify_audit.py"
T0 = 1_790_000_000.0


def event(
    kind: EventKind | str,
    at: float,
    *,
    resource: str = "r",
    member_id: str = "m1",
    session_id: str | None = None,
    epoch: int = 1,
    group: str = "g",
    info: dict[str, str] | None = None,
) -> OwnershipEvent:
    return OwnershipEvent(
        kind=EventKind(kind),
        group=group,
        resource=resource,
        member_id=member_id,
        session_id=session_id or f"{member_id}-s",
        epoch=epoch,
        at=at,
        observed_at=at + 0.0005,
        reason=f"{kind} by test",
        info=info if info is not None else {"host": "h1", "pid": "4242", "spark_app_id": "app-1"},
    )


def as_row(e: OwnershipEvent) -> dict[str, object]:
    """What load_events gives back for ``e``: times in whole microseconds."""
    pid = e.info.get("pid")
    return {
        "group": e.group,
        "resource": e.resource,
        "member_id": e.member_id,
        "session_id": e.session_id,
        "kind": str(e.kind),
        "epoch": e.epoch,
        "at": round(e.at * 1_000_000) / 1_000_000,
        "observed_at": round(e.observed_at * 1_000_000) / 1_000_000,
        "reason": e.reason,
        "host": e.info.get("host"),
        "pid": int(pid) if pid is not None else None,
        "spark_app_id": e.info.get("spark_app_id"),
        "generation": e.generation,
        "coordinator_epoch": e.coordinator_epoch,
        "prev_member_id": e.prev_member_id,
        "prev_session_id": e.prev_session_id,
        "prev_epoch": e.prev_epoch,
        "freed": e.freed,
        "freed_at": None if e.freed_at is None else round(e.freed_at * 1_000_000) / 1_000_000,
        "trigger": e.trigger,
        "moves": e.moves,
        "pending_files": e.pending_files,
        "pending_bytes": e.pending_bytes,
        "pending_messages": e.pending_messages,
    }


def numbered(events: list[OwnershipEvent]) -> list[dict[str, object]]:
    """The rows of ``events``, each session's numbered in the order the log accepted them."""
    numbers: dict[str, int] = {}
    rows = []
    for e in events:
        numbers[e.session_id] = numbers.get(e.session_id, 0) + 1
        rows.append(as_row(e) | {"seq": numbers[e.session_id]})
    return rows


def clean_trail(group: str = "g") -> list[OwnershipEvent]:
    """r0 moves from m1 to m2 (0.25 s unowned); r1 stays with m2; m3 lost r2 to its lease."""
    return [
        event("acquired", T0 + 0.0, resource="r0", member_id="m1", group=group),
        event("acquired", T0 + 0.1, resource="r1", member_id="m2", group=group, info={}),
        event("acquired", T0 + 0.2, resource="r2", member_id="m3", group=group),
        event("released", T0 + 1.0, resource="r0", member_id="m1", group=group),
        dataclasses.replace(
            event("acquired", T0 + 1.25, resource="r0", member_id="m2", epoch=2, group=group),
            generation=3,
            coordinator_epoch=1,
            prev_member_id="m1",
            prev_session_id="m1-s",
            prev_epoch=1,
            freed="released",
            freed_at=T0 + 1.000123,
        ),
        event("lost", T0 + 2.123456, resource="r2", member_id="m3", group=group),
        event("fenced", T0 + 2.5, resource="r2", member_id="m3", group=group),
    ]


def overlapping_trail() -> list[OwnershipEvent]:
    """m2 acquires r0 at the same epoch while m1 still owns it: one second of two owners."""
    return [
        event("acquired", T0 + 0.0, resource="r0", member_id="m1"),
        event("acquired", T0 + 1.0, resource="r0", member_id="m2"),
        event("released", T0 + 2.0, resource="r0", member_id="m1"),
        event("released", T0 + 3.0, resource="r0", member_id="m2"),
    ]


def write(path: Path, events: list[OwnershipEvent]) -> None:
    with DeltaAuditLog(str(path)) as log:
        for e in events:
            log(e)
        assert log.flush(), f"events not written: {log.last_error}"


@pytest.fixture
def table(tmp_path: Path) -> Path:
    return tmp_path / "audit"


# -- round trip ----------------------------------------------------------------------------


def test_events_come_back_from_load_events(table: Path) -> None:
    events = clean_trail("g") + clean_trail("other")
    write(table, events)

    loaded = load_events(str(table))

    expected = numbered(events)
    assert sorted(loaded, key=repr) == sorted(expected, key=repr)
    assert [(r["at"], r["resource"]) for r in loaded] == sorted(
        (r["at"], r["resource"]) for r in loaded
    )
    assert load_events(str(table), group="g") == [r for r in loaded if r["group"] == "g"]
    (r1,) = [r for r in loaded if r["group"] == "g" and r["resource"] == "r1"]
    assert r1["host"] is None and r1["pid"] is None and r1["spark_app_id"] is None  # no info


# pyspark's DataFrame.collect() leaves its socket to the local JVM for the garbage collector to
# close (pyspark/util.py, _load_from_socket: "automatically closed when garbage-collected"), which
# Python reports as an unclosed socket. Only that socket, to 127.0.0.1, is forgiven here.
PYSPARK_COLLECT_SOCKET = (
    r"ignore:Exception ignored in. <socket\.socket fd=\d+, family=\d+, type=\d+, proto=\d+, "
    r"laddr=\('127\.0\.0\.1', \d+\), raddr=\('127\.0\.0\.1', \d+\)>"
    r":pytest.PytestUnraisableExceptionWarning"
)


@pytest.mark.spark_smoke
@pytest.mark.filterwarnings(PYSPARK_COLLECT_SOCKET)
@pytest.mark.parametrize("reader", ["delta", "arrow"])
def test_events_come_back_from_read_audit(
    spark: Any, table: Path, reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from chispa import assert_df_equality

    events = clean_trail("g") + clean_trail("other")
    write(table, events)
    schema = (
        "`group` string, resource string, member_id string, session_id string, kind string, "
        "epoch bigint, at timestamp, observed_at timestamp, reason string, host string, "
        "pid bigint, spark_app_id string, generation bigint, coordinator_epoch bigint, "
        "prev_member_id string, prev_session_id string, prev_epoch bigint, freed string, "
        "freed_at timestamp, trigger string, moves bigint, seq bigint, pending_files bigint, "
        "pending_bytes bigint, pending_messages bigint"
    )

    def frame_of(rows: list[dict[str, object]]) -> Any:
        for row in rows:
            for name in ("at", "observed_at", "freed_at"):
                if row[name] is not None:
                    row[name] = datetime.fromtimestamp(float(str(row[name])), UTC)
        return spark.createDataFrame([tuple(r[c] for c in AUDIT_COLUMNS) for r in rows], schema)

    def written(group: str | None) -> Any:
        return frame_of([r for r in numbered(events) if group is None or r["group"] == group])

    if reader == "delta":  # the test session has the Delta jars (scripts/setup.sh)
        assert delta_reader_available(spark)
    else:  # a Spark without them: the deltalake -> Arrow fallback
        monkeypatch.setattr("rebalancer_spark.audit.reader.delta_reader_available", lambda s: False)
    frame = read_audit(spark, str(table))
    assert tuple(frame.columns) == AUDIT_COLUMNS
    files = frame.inputFiles()
    if reader == "delta":  # Spark's Delta reader planned the table's Parquet files
        assert files, "no file planned"
        assert all(f.startswith(f"file:{table}/") and f.endswith(".parquet") for f in files)
        plan = frame._jdf.queryExecution().executedPlan().toString()
        assert "TahoeLogFileIndex" in plan or "DeltaFileIndex" in plan, plan
    else:  # rows handed over by the driver
        assert files == []
    for group in (None, "g"):
        got = read_audit(spark, str(table), group=group)
        assert_df_equality(got, written(group), ignore_row_order=True, ignore_nullable=True)
        loaded = frame_of(load_events(str(table), group=group))
        assert_df_equality(got, loaded, ignore_row_order=True, ignore_nullable=True)


# -- many writers --------------------------------------------------------------------------


def append_from_process(
    path: str, member: str, count: int, ready: EventType, go: EventType
) -> None:
    """Runs in a spawned process: open the log when told to go (racing to create the table),
    append ``count`` events, flushing every 20 so that commits race too."""
    ready.set()
    if not go.wait(120):
        raise RuntimeError(f"{member} was never told to go")
    with DeltaAuditLog(path, flush_interval=0.0) as log:
        for i in range(count):
            log(event("acquired", T0 + i / 1000, resource=f"r{i:03d}", member_id=member))
            if i % 20 == 19 and not log.flush(120):
                raise RuntimeError(f"{member}: flush timed out: {log.last_error}")


@pytest.mark.slow
def test_three_processes_append_to_one_new_table_at_once(table: Path) -> None:
    context = multiprocessing.get_context("spawn")  # deltalake panics in forked children
    go = context.Event()
    readies = [context.Event() for _ in range(3)]
    procs = [
        context.Process(target=append_from_process, args=(str(table), f"m{n}", 200, readies[n], go))
        for n in range(3)
    ]
    for proc in procs:
        proc.start()
    try:
        for n, ready in enumerate(readies):
            assert ready.wait(120), f"process m{n} did not start within 120 s"
        go.set()
        for proc in procs:
            proc.join(180)
        assert [proc.exitcode for proc in procs] == [0, 0, 0], "a writer failed: see its stderr"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(10)

    rows = load_events(str(table))
    keys = Counter((r["member_id"], r["resource"]) for r in rows)
    assert len(rows) == 600
    assert [key for key, seen in keys.items() if seen > 1] == []
    assert {member for member, _ in keys} == {"m0", "m1", "m2"}
    creates = [c for c in DeltaTable(str(table)).history() if c["operation"] == "CREATE TABLE"]
    assert len(creates) == 1, f"the table was created {len(creates)} times"


# -- verdicts ------------------------------------------------------------------------------


def test_a_clean_history_is_ok_and_its_gaps_are_measured() -> None:
    verdict = verify_events(as_row(e) for e in clean_trail())

    assert verdict.ok and verdict.overlaps == ()
    assert (verdict.events, verdict.resources, verdict.members) == (7, 3, 3)
    assert (verdict.intervals, verdict.open_intervals) == (4, 2)
    assert [(g.resource, round(g.seconds, 6)) for g in verdict.gaps] == [("r0", 0.25)]
    report = verdict.report()
    assert report.splitlines()[0].startswith("audit OK: no resource ever had two owners")
    assert "gaps: 1, 0.250 s in total, longest 0.250 s (r0" in report


def test_an_overlap_fails_the_verdict_and_is_named_in_the_report() -> None:
    verdict = verify_events(as_row(e) for e in overlapping_trail())

    assert not verdict.ok
    (overlap,) = verdict.overlaps
    assert overlap.resource == "r0" and overlap.seconds == pytest.approx(1.0)
    report = verdict.report()
    assert report.splitlines()[0].startswith("audit FAILED: 1 overlap:")
    assert "r0: two owners for 1.000 s" in report
    assert "member m1 epoch 1 session m1-s: 2026-09-21T14:13:20.000Z to " in report
    assert "member m2 epoch 1 session m2-s: 2026-09-21T14:13:21.000Z to " in report


def test_a_tolerance_forgives_clock_skew_and_must_be_sensible() -> None:
    rows = [as_row(e) for e in overlapping_trail()]
    assert verify_events(rows, tolerance=1.5).ok
    with pytest.raises(ConfigurationError, match="tolerance -1"):
        verify_events(rows, tolerance=-1)


def test_verify_table_and_history_read_the_table(table: Path) -> None:
    write(table, overlapping_trail())

    assert not verify_table(str(table)).ok
    assert verify_table(str(table), group="nobody").ok
    lines = history(load_events(str(table)))
    assert (
        lines[0] == "2026-09-21T14:13:20.000Z  r0  acquired  member=m1  epoch=1  acquired by test"
    )
    assert len(lines) == 4


# -- bad input -----------------------------------------------------------------------------


def test_an_unwritable_path_is_a_configuration_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    path = str(blocker / "audit")

    with pytest.raises(ConfigurationError, match="cannot create the Delta audit table") as caught:
        DeltaAuditLog(path)
    assert path in str(caught.value) and "give a path" in str(caught.value)


def test_a_foreign_delta_table_is_refused_and_left_alone(table: Path) -> None:
    foreign = pa.table({"id": [1, 2], "group": ["x", "y"], "epoch": ["1", "2"]})
    write_deltalake(str(table), foreign)
    before = DeltaTable(str(table)).version()

    with pytest.raises(CorruptStateError) as caught:
        DeltaAuditLog(str(table))
    message = str(caught.value)
    assert str(table) in message
    assert "missing columns resource, member_id" in message
    assert "unexpected columns id" in message
    assert "column epoch is string, expected long" in message
    after = DeltaTable(str(table))
    assert after.version() == before
    assert after.to_pyarrow_table().to_pylist() == foreign.to_pylist()
    with pytest.raises(CorruptStateError):
        load_events(str(table))


def test_reading_a_missing_table_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="no Delta audit table at"):
        load_events(str(tmp_path / "nothing"))


# -- flushing and closing ------------------------------------------------------------------


def test_flush_returns_once_the_rows_are_readable(table: Path) -> None:
    log = DeltaAuditLog(str(table), flush_interval=3600.0)  # writes only when asked to
    try:
        assert log.flush(0.0)  # nothing pending
        for e in clean_trail():
            log(e)
        assert load_events(str(table)) == []  # the table exists from the start, empty
        assert log.written == 0
        assert log.flush(30.0)
        assert len(load_events(str(table))) == 7 and log.written == 7
    finally:
        log.close()
    log.close()  # idempotent
    log(event("released", T0 + 9))  # after close: dropped, never raised
    assert len(load_events(str(table))) == 7


def test_a_failing_write_is_kept_and_retried(table: Path) -> None:
    aside = table.with_name("aside")
    with DeltaAuditLog(str(table), flush_interval=0.0) as log:
        table.rename(aside)
        table.write_text("the table is gone, a file is in its place")
        log(event("acquired", T0))

        assert not log.flush(0.2)
        error = wait_for(lambda: log.last_error, timeout=30, what="a write failure")
        assert error is not None and str(table) in error and log.written == 0

        table.unlink()
        aside.rename(table)
        assert log.flush(30.0), f"not written after the table came back: {log.last_error}"
        assert log.last_error is None and log.written == 1
    assert len(load_events(str(table))) == 1


def test_a_commit_that_landed_but_reported_failure_is_not_repeated(
    table: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    landed: list[int] = []

    def landed_then_failed(*args: Any, **kwargs: Any) -> None:
        write_deltalake(*args, **kwargs)
        landed.append(1)
        if len(landed) == 1:
            raise OSError("connection reset by peer after the commit")

    monkeypatch.setattr("rebalancer_spark.audit.delta.write_deltalake", landed_then_failed)
    with DeltaAuditLog(str(table), flush_interval=0.0) as log:
        log(event("acquired", T0))
        assert log.flush(30.0), log.last_error
        log(event("released", T0 + 1))
        assert log.flush(30.0), log.last_error

    assert len(landed) == 2  # the first batch was found in the table, not written again
    assert [r["kind"] for r in load_events(str(table))] == ["acquired", "released"]


def test_events_queued_while_a_write_was_in_doubt_are_written_too(
    table: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    queued = threading.Event()
    calls: list[int] = []

    def landed_then_failed(*args: Any, **kwargs: Any) -> None:
        write_deltalake(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            assert queued.wait(30), "the test did not queue the later events"
            raise OSError("timeout waiting for the object store's answer")

    monkeypatch.setattr("rebalancer_spark.audit.delta.write_deltalake", landed_then_failed)
    with DeltaAuditLog(str(table), flush_interval=0.0) as log:
        log(event("acquired", T0))
        wait_for(lambda: calls, timeout=30, what="the first write to land")
        for i in range(3):  # queued while the first write's outcome is unknown
            log(event("released", T0 + 1 + i))
        queued.set()
        assert log.flush(30.0), log.last_error
        assert log.written == 4
    assert len(load_events(str(table))) == 4, "events queued during the backoff were dropped"


# -- the job -------------------------------------------------------------------------------


def run_job(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    return subprocess.run(
        [sys.executable, str(JOB), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_job_passes_a_clean_table(table: Path) -> None:
    write(table, clean_trail())

    done = run_job("--audit", str(table), "--history")

    assert done.returncode == 0, done.stderr
    assert "audit OK: no resource ever had two owners at once" in done.stdout
    assert "2026-09-21T14:13:21.250Z  r0  acquired  member=m2  epoch=2" in done.stdout


def test_the_job_fails_a_table_with_an_overlap(table: Path) -> None:
    write(table, overlapping_trail())

    done = run_job("--audit", str(table), "--tolerance", "0.5")

    assert done.returncode == 1, done.stderr
    assert "audit FAILED: 1 overlap:" in done.stdout


def test_the_job_says_what_to_do_about_bad_input(tmp_path: Path) -> None:
    done = run_job("--audit", str(tmp_path / "nothing"))

    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "no Delta audit table at" in line and "pass the path" in line
