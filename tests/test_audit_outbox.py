"""The audit log's outbox: events of a killed process, or of a log closed while its table could
not be written, reach the table through the next log opened on it, in order, never twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rebalancer_spark.audit import DeltaAuditLog, load_events, verify_table
from rebalancer_spark.audit.outbox import Outbox, orphans, pending_batches, table_dir
from tests.support.helpers import wait_for

T0 = 1_790_000_000.0

# A writer that commits ``flushed`` events, keeps ``kept`` more in its outbox only (its flush
# interval is an hour), says so, and waits to be killed.
WRITER = textwrap.dedent(
    """
    import sys, time
    from rebalancer_spark.audit import DeltaAuditLog
    from rebalancer_spark.core.events import EventKind, OwnershipEvent

    table, outbox, flushed, kept = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    log = DeltaAuditLog(table, flush_interval=3600, outbox=outbox)

    def event(i):
        kind = EventKind.ACQUIRED if i % 2 == 0 else EventKind.RELEASED
        return OwnershipEvent(kind, "g", f"r{i // 2}", "m1", "s1", 1, 1790000000.0 + i,
                              1790000000.0 + i, "test")

    for i in range(flushed):
        log(event(i))
    assert log.flush(60), log.last_error
    for i in range(flushed, flushed + kept):
        log(event(i))
    deadline = time.monotonic() + 60
    while sum(1 for line in open(log.outbox) if '"row"' in line) < flushed + kept:
        assert time.monotonic() < deadline, "rows not kept in the outbox"
        time.sleep(0.01)
    print("kept", flush=True)
    time.sleep(600)
    """
)


def run_killed_writer(table: Path, outbox: Path, flushed: int, kept: int) -> None:
    """Run WRITER until its rows are kept, then kill -9 it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(table), str(outbox), str(flushed), str(kept)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "kept", f"the writer said {line!r}, exit {proc.poll()}"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.slow
@pytest.mark.parametrize(("flushed", "kept"), [(0, 4), (3, 4)])
def test_the_rows_of_a_killed_writer_are_written_by_the_next_log_once(
    tmp_path: Path, flushed: int, kept: int
) -> None:
    table, outbox = tmp_path / "audit", tmp_path / "outbox"
    run_killed_writer(table, outbox, flushed, kept)
    assert len(load_events(str(table))) == flushed  # the kept rows died with the process
    (left,) = list(table_dir(outbox, str(table)).glob("*.jsonl"))

    with DeltaAuditLog(str(table), outbox=outbox) as log:
        wait_for(lambda: not left.exists(), timeout=60, what="the orphan outbox replayed")
        assert log.flush(30)
    rows = load_events(str(table))
    # Every row once, in its session's order: seq 1..n without a gap or a repeat.
    assert sorted(int(str(r["seq"])) for r in rows) == list(range(1, flushed + kept + 1))
    assert verify_table(str(table)).chain_faults == ()
    assert list(table_dir(outbox, str(table)).glob("*.jsonl")) == []


def test_a_log_closed_before_its_rows_were_written_leaves_them_to_the_next(
    tmp_path: Path,
) -> None:
    from tests.test_audit_delta import clean_trail

    table, outbox = tmp_path / "audit", tmp_path / "outbox"
    log = DeltaAuditLog(str(table), flush_interval=3600, outbox=outbox)
    events = clean_trail()
    for e in events:
        log(e)
    kept = log.outbox
    assert kept is not None
    log.close(timeout=0)  # gives up at once: nothing in the table yet, everything kept
    assert load_events(str(table)) == []
    assert kept.read_text().count('"row"') == len(events)

    with DeltaAuditLog(str(table), outbox=outbox) as again:
        wait_for(lambda: not kept.exists(), timeout=60, what="the outbox replayed")
        assert again.backlog == 0
    assert len(load_events(str(table))) == len(events)


def test_a_clean_close_leaves_no_outbox_and_outbox_false_keeps_none(tmp_path: Path) -> None:
    from tests.test_audit_delta import clean_trail

    table, outbox = tmp_path / "audit", tmp_path / "outbox"
    with DeltaAuditLog(str(table), outbox=outbox) as log:
        for e in clean_trail():
            log(e)
        assert log.flush(30)
        assert log.outbox is not None and log.outbox.exists()
        assert log.backlog == 0
    assert list(table_dir(outbox, str(table)).glob("*")) == []
    with DeltaAuditLog(str(tmp_path / "other"), outbox=False) as log:
        assert log.outbox is None


def test_a_live_writer_s_outbox_is_not_taken_and_a_torn_line_is_skipped(tmp_path: Path) -> None:
    directory = tmp_path / "box"
    live = Outbox(directory, "live")
    live.keep([(1, ["row"])])
    dead = Outbox(directory, "dead")
    dead.keep([(1, ["a"]), (2, ["b"])])
    dead.begin(1, 1)
    dead.keep([(3, ["c"])])
    dead.close(delete=False)
    with open(directory / "dead.jsonl", "a", encoding="utf-8") as torn:
        torn.write('{"i": 4, "row": ["d"')  # the process died while writing this line

    (orphan,) = list(orphans(directory))  # "live" is held by its writer
    assert orphan.writer_id == "dead"
    assert pending_batches(orphan, committed=0) == [(1, [["a"], ["b"], ["c"]])]
    assert pending_batches(orphan, committed=1) == [(2, [["b"], ["c"]])]
    orphan.close(delete=True)
    live.close(delete=True)
    assert list(directory.iterdir()) == []


def test_an_unwritable_outbox_is_a_configuration_error(tmp_path: Path) -> None:
    from rebalancer_spark.core.errors import ConfigurationError

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigurationError, match="cannot keep the audit outbox in"):
        DeltaAuditLog(str(tmp_path / "audit"), outbox=blocker)


def test_a_new_outbox_is_never_seen_unlocked_by_another_writer_s_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An outbox file is locked before the orphan scan can list it: a scan run at the worst
    moment (just before the new writer takes its lock) neither takes the file for an orphan
    nor makes the writer's lock fail (three processes opening one table's log at once did)."""
    import fcntl

    directory = tmp_path / "box"
    directory.mkdir()
    real_flock = fcntl.flock
    seen: list[list[str]] = []
    scanning: list[bool] = []

    def scan_first(fd: int, operation: int) -> None:
        if not scanning:  # the new writer's own lock: another writer's scan runs right before it
            scanning.append(True)
            taken = list(orphans(directory))
            seen.append([orphan.writer_id for orphan in taken])
            for orphan in taken:
                orphan.close(delete=False)
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", scan_first)
    box = Outbox(directory, "new")
    monkeypatch.undo()
    assert seen == [[]], "the scan found the new writer's outbox unlocked"
    box.keep([(1, ["row"])])
    assert list(orphans(directory)) == []  # held by its writer
    assert [p.name for p in directory.iterdir()] == ["new.jsonl"]
    box.close(delete=True)


def test_an_outbox_entry_that_cannot_be_read_does_not_stop_the_log(tmp_path: Path) -> None:
    """Something under an outbox's name that cannot be opened (a directory) or read (bytes
    that are not UTF-8) is skipped with a warning: the orphans after it are still replayed,
    and the log's writer thread goes on to write the log's own rows (it ended on the error
    before, and every later flush waited out its timeout)."""
    from tests.test_audit_delta import clean_trail

    table, outbox = tmp_path / "audit", tmp_path / "outbox"
    (table_dir(outbox, str(table)) / "junk.jsonl").mkdir(parents=True)
    (table_dir(outbox, str(table)) / "binary.jsonl").write_bytes(b"\xff\xfe\x00 not text\n")
    dead = Outbox(table_dir(outbox, str(table)), "dead")  # newer: scanned after the others
    dead.keep([(1, ["a"])])
    dead.close(delete=False)
    found = list(orphans(table_dir(outbox, str(table))))
    assert [orphan.writer_id for orphan in found] == ["dead"]
    for orphan in found:
        orphan.close(delete=True)
    events = clean_trail()
    with DeltaAuditLog(str(table), outbox=outbox) as log:
        for e in events:
            log(e)
        assert log.flush(30), f"the writer stopped: {log.last_error}"
    assert len(load_events(str(table))) == len(events)


def test_a_writer_killed_before_its_rename_leaves_a_file_the_next_scan_removes(
    tmp_path: Path,
) -> None:
    """A writer killed between creating ``.<id>.new`` and renaming it leaves an empty file
    that no scan reads as an outbox. A scan deletes it once it is old, empty and unlocked;
    a recent one (a writer about to lock it), a locked one and one with content stay."""
    import fcntl
    import time

    from rebalancer_spark.audit.outbox import STALE_NEW

    directory = tmp_path / "box"
    directory.mkdir()
    old = time.time() - STALE_NEW - 5
    dead, fresh, locked, written = (directory / f".{n}.new" for n in ("d", "f", "l", "w"))
    for path in (dead, fresh, locked):
        path.touch()
    written.write_text("?")
    for path in (dead, locked, written):
        os.utime(path, (old, old))
    with open(locked, "rb") as holder:
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert list(orphans(directory)) == []
        assert sorted(p.name for p in directory.iterdir()) == [".f.new", ".l.new", ".w.new"]
