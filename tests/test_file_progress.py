"""The progress record of a file resource stays small whatever the history (the names live in
the file history, a Delta table next to the output); listings start after the floor with
``order=name``; records of the earlier format are read and migrated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark.core.errors import ConfigurationError, CorruptStateError
from rebalancer_spark.sources.files import FileShareSource
from rebalancer_spark.spark.file_progress import FileBatch, FileProgress, parse
from rebalancer_spark.spark.outputs import ParquetOutput
from rebalancer_spark.spark.source import AssignedSource
from tests.support.helpers import SqliteMembers, assigned_source

pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket.*127.0.0.1:pytest.PytestUnraisableExceptionWarning"
)


def _drain(spark: Any, src: AssignedSource, limit: int = 50) -> list[tuple[str, ...]]:
    done: list[tuple[str, ...]] = []
    while (batch := src.next_batch(spark)) is not None:
        with batch:
            batch.commit()
        done.append(batch.files)
        assert len(done) < limit, "batches never end"
    return done


def _size(src: AssignedSource) -> int:
    return len(json.dumps(src.progress, separators=(",", ":")).encode())


def test_the_floor_follows_the_watermark_a_lookback_behind() -> None:
    state = FileProgress()
    b1 = FileBatch(1, ("a", "b"))
    after = state.done(b1, now=100.0, lookback=0.0)
    assert (after.watermark, after.floor, after.files) == ("b", "b", 2)
    assert state.done(b1, now=100.0, lookback=None).floor is None, "order=none: no floor"
    s = FileProgress()
    for i in range(40):  # a batch every 10 s, look-back 60 s
        s = s.done(FileBatch(i + 1, (f"f{i:03d}",)), now=10.0 * i, lookback=60.0)
        s = FileProgress(**{**_fields(s), "batch": None})
    assert s.watermark == "f039" and s.floor is not None
    assert "f030" <= s.floor <= "f033", s.floor  # about 60 s behind, never closer
    assert len(s.marks) <= 5, "a handful of marks, not one per batch"


def _fields(s: FileProgress) -> dict[str, Any]:
    return {k: getattr(s, k) for k in s.__dataclass_fields__}


def test_records_of_either_format_parse_and_anything_else_is_corrupt() -> None:
    old = parse("r", {"done": ["b", "a"], "batch": None, "next": 3, "versions": {"a": "1:2"}})
    assert old.legacy and old.watermark == "b" and old.files == 2 and old.next == 3
    new = parse("r", old.done(FileBatch(3, ("c",)), 1.0, None).as_json())
    assert not new.legacy and new.files == 3 and new.watermark == "c"
    for bad in ([1, 2], "x", {"format": 2}, {"format": 9, "next": 1}, {"done": 3, "next": 1}):
        with pytest.raises(CorruptStateError, match="progress reset"):
            parse("r", bad)


def test_listing_options_are_checked(tmp_path: Path) -> None:
    source = FileShareSource(tmp_path.as_uri() + "/?order=name&lookback=15m")
    assert (source.order, source.lookback) == ("name", 900.0)
    with pytest.raises(ConfigurationError, match="order='time'"):
        FileShareSource(tmp_path.as_uri() + "/?order=time")
    with pytest.raises(ConfigurationError, match="needs order=name"):
        FileShareSource(tmp_path.as_uri() + "/?lookback=1h")


def test_a_sorted_walk_lists_only_names_above_after(tmp_path: Path) -> None:
    for name in ["2026-11-24/a.csv", "2026-11-24/b.csv", "2026-11-25/a.csv", "2026-11-25/c.csv"]:
        (tmp_path / "r" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "r" / name).write_text("x\n")
    source = FileShareSource(tmp_path.as_uri() + "/")
    assert [f.name for f in source.files("r", after="2026-11-25/a.csv")] == ["2026-11-25/c.csv"]
    assert [f.name for f in source.files("r", after="2026-11-24/b.csv")] == [
        "2026-11-25/a.csv",
        "2026-11-25/c.csv",
    ]
    assert len(source.files("r")) == 4


def test_progress_stays_small_and_a_late_file_within_the_lookback_is_read(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    folder = tmp_path / "landing" / "d"
    folder.mkdir(parents=True)
    for i in range(0, 60, 2):
        (folder / f"f{i:03d}.csv").write_text(f"x{i},1\n")
    source = FileShareSource(f"{(tmp_path / 'landing').as_uri()}/?order=name&lookback=1h")
    output = ParquetOutput(str(tmp_path / "out"))
    a = members.start("a", resources=["d"])
    src = assigned_source(a, "d", source, output, max_files_per_batch=5)
    sizes = []
    while (batch := src.next_batch(spark)) is not None:
        with batch:
            batch.commit()
        sizes.append(_size(src))
    assert len(sizes) == 6 and max(sizes) < 1024, sizes
    assert isinstance(src.progress, dict) and src.progress["files"] == 30
    (folder / "f007.csv").write_text("late,1\n")  # under a name below the watermark
    (folder / "f099.csv").write_text("new,1\n")
    assert _drain(spark, src) == [("f007.csv", "f099.csv")]
    assert _drain(spark, src) == []
    # the next owner reads the history once and plans nothing already done
    b = members.start("b")
    a.stop()
    src_b = assigned_source(b, "d", source, output, max_files_per_batch=5)
    assert src_b.epoch > src.epoch and _drain(spark, src_b) == []
    assert len(src_b.history().load("d")) == 32


def test_without_lookback_a_listing_starts_after_the_last_name(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    folder = tmp_path / "landing" / "d"
    folder.mkdir(parents=True)
    for i in range(4):
        (folder / f"f{i}.csv").write_text("x,1\n")
    source = FileShareSource(f"{(tmp_path / 'landing').as_uri()}/?order=name")
    a = members.start("a", resources=["d"])
    src = assigned_source(a, "d", source, ParquetOutput(str(tmp_path / "out")))
    assert len(_drain(spark, src)) == 2
    assert isinstance(src.progress, dict) and src.progress["floor"] == "f3.csv"
    (folder / "f0b.csv").write_text("late,1\n")  # below the floor: not listed, by design
    (folder / "f4.csv").write_text("new,1\n")
    assert [f.name for f in src.listed()] == ["f4.csv"]
    assert _drain(spark, src) == [("f4.csv",)]


def test_nested_layouts_are_resources_at_a_depth(tmp_path: Path) -> None:
    for name in ["date=1/hour=00/a.csv", "date=1/hour=01/b.csv", "date=2/hour=00/c.csv"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    (tmp_path / "date=2" / "_tmp").mkdir()
    source = FileShareSource(tmp_path.as_uri() + "/?depth=2")
    found = [r.id for r in source.discover()]
    assert found == ["date=1/hour=00", "date=1/hour=01", "date=2/hour=00"]
    assert [f.name for f in source.files("date=1/hour=01")] == ["b.csv"]
    assert [r.id for r in FileShareSource(tmp_path.as_uri() + "/").discover()] == [
        "date=1",
        "date=2",
    ]
    with pytest.raises(ConfigurationError, match="depth='0'"):
        FileShareSource(tmp_path.as_uri() + "/?depth=0")


def test_a_nested_resource_is_ingested_like_any_other(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    folder = tmp_path / "landing" / "date=1" / "hour=00"
    folder.mkdir(parents=True)
    (folder / "a.csv").write_text("a,1\n")
    source = FileShareSource((tmp_path / "landing").as_uri() + "/?depth=2")
    a = members.start("a", resources=["date=1/hour=00"])
    out = ParquetOutput(str(tmp_path / "out"))
    src = assigned_source(a, "date=1/hour=00", source, out)
    batch = src.next_batch(spark)
    assert batch is not None
    with batch:
        batch.write(batch.read())
    assert batch.outcome == "written" and src.next_batch(spark) is None
    assert [r["id"] for r in spark.read.parquet(out.location).collect()] == ["a"]
    assert list(src.history().load("date=1/hour=00")) == ["a.csv"]


def test_a_long_batch_keeps_its_list_in_the_plans_table_and_the_next_owner_reads_it_back(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    """A batch of 300 files (about 9 KiB of names) leaves the record under 4 KiB: its list is
    in the plans table, named by digest; an owner that dies with it open hands over exactly
    those files; a plans table that lost it is reported, not guessed at."""
    import shutil

    folder = tmp_path / "landing" / "d"
    folder.mkdir(parents=True)
    for i in range(600):
        (folder / f"a-rather-long-file-name-{i:05d}.csv").write_text(f"x{i},1\n")
    source = FileShareSource(f"{(tmp_path / 'landing').as_uri()}/?order=name")
    output = ParquetOutput(str(tmp_path / "out"))
    a = members.start("a", resources=["d"])
    src = assigned_source(a, "d", source, output, max_files_per_batch=300)
    first = src.next_batch(spark)
    assert first is not None and len(first.files) == 300
    record = src.progress
    assert isinstance(record, dict) and _size(src) < 4096, record
    digest = record["batch"]["plan"]
    assert record["batch"] == {"id": 1, "plan": digest, "count": 300}
    assert FileBatch(1, first.files).digest() == digest
    # the owner dies with batch 1 open: the next one reads the plan back, files and order
    b = members.start("b")
    a.stop(drain=False)
    src_b = assigned_source(b, "d", source, output, max_files_per_batch=300)
    assert src_b.epoch > src.epoch
    again = src_b.next_batch(spark)
    assert again is not None and again.id == 1 and again.files == first.files
    with again:
        again.write(again.read())
    second = src_b.next_batch(spark)
    assert (
        second is not None and second.files == tuple(sorted(f.name for f in folder.iterdir()))[300:]
    )
    with second:
        second.write(second.read())
    assert src_b.next_batch(spark) is None
    rows = spark.read.parquet(output.location).select("id").collect()
    assert sorted(r["id"] for r in rows) == sorted(f"x{i}" for i in range(600))
    assert src_b.progress["files"] == 600 and src_b.progress["batch"] is None
    # a third batch opens, then its plan is lost (the table removed): a clear error
    for i in range(600, 900):
        (folder / f"a-rather-long-file-name-{i:05d}.csv").write_text(f"x{i},1\n")
    assert src_b.next_batch(spark) is not None
    c = members.start("c")
    b.stop(drain=False)
    shutil.rmtree(src_b.history().plans_uri)
    src_c = assigned_source(c, "d", source, output, max_files_per_batch=300)
    with pytest.raises(CorruptStateError) as caught:
        src_c.next_batch(spark)
    text = str(caught.value)
    assert "batch 3" in text and "holds 0 files" in text and "progress reset" in text, text
    src_c.note_stuck(caught.value)  # what the ingest loop does: the record says it is stuck
    record = src_c.progress
    assert isinstance(record, dict) and "holds 0 files" in record["stuck"]
    assert record["batch"]["plan"] and record["batch"]["count"] == 300, record["batch"]


def test_plans_are_found_by_batch_and_digest_and_committed_ones_are_pruned(
    tmp_path: Path,
) -> None:
    from rebalancer_spark.spark.file_history import FileHistory

    history = FileHistory(str(tmp_path / "history"), "g")
    assert history.load_plan("r", 1, "none") == ((), {})  # no table yet
    plans = {}
    for batch in (1, 2, 3):
        files = tuple(f"b{batch}-{i:03d}.csv" for i in range(100))
        plan = FileBatch(batch, files).digest()
        history.save_plan("r", batch, plan, 7, files, {})
        plans[batch] = (plan, files)
    history.save_plan("r", 3, plans[3][0], 7, plans[3][1], {})  # a retry adds nothing
    history.save_plan("other", 1, "x", 1, ("o.csv",), {"o.csv": "12@3"})
    assert history.load_plan("r", 3, plans[3][0]) == (plans[3][1], {})
    assert history.load_plan("r", 3, plans[2][0]) == ((), {}), "another digest is another plan"
    assert history.load_plan("other", 1, "x") == (("o.csv",), {"o.csv": "12@3"})
    history.prune_plans("r", below=3)
    assert history.load_plan("r", 1, plans[1][0]) == ((), {})
    assert history.load_plan("r", 2, plans[2][0]) == ((), {})
    assert history.load_plan("r", 3, plans[3][0]) == (plans[3][1], {})
    assert history.load_plan("other", 1, "x")[0] == ("o.csv",)
