"""Files rewritten under the same name after they were processed: ``on_change=ignore`` (the
default: not read again) or ``on_change=reread`` (read again in a new batch, once per change),
on a file share and on S3, read by Spark; a warning, a metric and ``changed_files`` in the
progress either way."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.member.metrics import MemberMetrics, metrics_available
from rebalancer_spark.sources.base import FileSource
from rebalancer_spark.sources.files import FileShareSource
from rebalancer_spark.sources.s3 import S3Source
from rebalancer_spark.spark.outputs import ParquetOutput
from rebalancer_spark.spark.source import AssignedSource
from tests.servers.cloud import S3Bucket
from tests.support.helpers import SqliteMembers, assigned_source

pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket.*127.0.0.1:pytest.PytestUnraisableExceptionWarning"
)

LOG = "rebalancer_spark.ingest"


def _drain(spark: Any, src: AssignedSource) -> list[tuple[str, ...]]:
    """Run every pending batch of ``src``; the files of each, in order."""
    done: list[tuple[str, ...]] = []
    while (batch := src.next_batch(spark)) is not None:
        with batch:
            batch.write(batch.read())
        assert batch.outcome == "written", batch
        done.append(batch.files)
        assert len(done) < 10, "batches never end"
    return done


def _ids(spark: Any, output: ParquetOutput) -> list[str]:
    return sorted(r["id"] for r in spark.read.parquet(output.location).select("id").collect())


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "rewritten under the same name" in r.msg]


def _share(tmp_path: Path, option: str) -> tuple[Path, FileSource]:
    landing = tmp_path / "landing"
    (landing / "d").mkdir(parents=True)
    (landing / "d" / "a.csv").write_text("a1,1\n")
    (landing / "d" / "b.csv").write_text("b1,1\n")
    return landing / "d", FileShareSource(f"{landing.as_uri()}/{option}")


def _rewrite(path: Path, text: str) -> None:
    """Replace ``path`` atomically, as a producer would, with a later modification time."""
    before = path.stat().st_mtime_ns
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.utime(tmp, ns=(before + 2_000_000_000, before + 2_000_000_000))
    tmp.rename(path)


def test_on_change_is_a_checked_url_option(tmp_path: Path) -> None:
    assert FileShareSource(tmp_path.as_uri() + "/").on_change == "ignore"
    assert FileShareSource(tmp_path.as_uri() + "/?on_change=reread").on_change == "reread"
    with pytest.raises(ConfigurationError, match=r"on_change='always'.*ignore.*reread"):
        FileShareSource(tmp_path.as_uri() + "/?on_change=always")
    assert S3Source("s3://b/p/?on_change=reread").on_change == "reread"
    assert S3Source("s3://b/p/").on_change == "ignore"
    with pytest.raises(ConfigurationError, match="on_change"):
        S3Source("s3://b/p/?on_change=yes")


def test_a_same_size_rewrite_changes_the_fingerprint(tmp_path: Path) -> None:
    folder, source = _share(tmp_path, "")
    before = {f.name: f.fingerprint for f in source.files("d")}
    _rewrite(folder / "a.csv", "a2,1\n")  # same size, later mtime
    after = {f.name: f.fingerprint for f in source.files("d")}
    assert before["a.csv"] != after["a.csv"] and before["b.csv"] == after["b.csv"]


def test_ignore_reports_a_rewritten_file_once_and_does_not_read_it(
    spark: Any, members: SqliteMembers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder, source = _share(tmp_path, "")
    output = ParquetOutput(str(tmp_path / "out"))
    a = members.start("a", resources=["d"])
    counted: list[tuple[int, str]] = []
    src = assigned_source(a, "d", source, output, changed=lambda n, how: counted.append((n, how)))
    assert _drain(spark, src) == [("a.csv", "b.csv")]
    _rewrite(folder / "a.csv", "a2,2\na3,3\n")
    with caplog.at_level("WARNING", logger=LOG):
        assert _drain(spark, src) == []
        assert _drain(spark, src) == [], "nothing new on the next pass either"
    warned = _warnings(caplog)
    assert len(warned) == 1, "one warning per change, not one per pass"
    assert "a.csv" in warned[0] and "on_change=ignore" in warned[0]
    assert counted == [(1, "ignored")]
    assert isinstance(src.progress, dict)
    assert src.progress["changed_files"] == 1
    assert _ids(spark, output) == ["a1", "b1"], "the rewritten file is not read again"
    _rewrite(folder / "a.csv", "a4,4\n")  # a second change is a second report
    assert _drain(spark, src) == []
    assert src.progress["changed_files"] == 2 and counted[-1] == (1, "ignored")


def test_reread_reads_a_rewritten_file_in_a_new_batch_once_per_change(
    spark: Any, members: SqliteMembers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder, source = _share(tmp_path, "?on_change=reread")
    output = ParquetOutput(str(tmp_path / "out"))
    a = members.start("a", resources=["d"])
    counted: list[tuple[int, str]] = []
    src = assigned_source(a, "d", source, output, changed=lambda n, how: counted.append((n, how)))
    assert _drain(spark, src) == [("a.csv", "b.csv")]
    _rewrite(folder / "b.csv", "b2,2\nb3,3\n")
    with caplog.at_level("WARNING", logger=LOG):
        assert _drain(spark, src) == [("b.csv",)], "one new batch with the changed file"
        assert _drain(spark, src) == [], "and only once"
    assert len(_warnings(caplog)) == 1 and "on_change=reread" in _warnings(caplog)[0]
    assert counted == [(1, "reread")]
    assert isinstance(src.progress, dict)
    assert src.progress["changed_files"] == 1 and src.progress["next"] == 3
    assert _ids(spark, output) == ["a1", "b1", "b2", "b3"]
    # the next owner takes the recorded fingerprints over: no change, nothing read again
    b = members.start("b")
    a.stop()
    src_b = assigned_source(b, "d", source, output)
    assert src_b.epoch > src.epoch
    assert _drain(spark, src_b) == []
    _rewrite(folder / "b.csv", "b4,4\n")
    assert _drain(spark, src_b) == [("b.csv",)]
    assert _ids(spark, output) == ["a1", "b1", "b2", "b3", "b4"]


def test_a_progress_record_without_fingerprints_is_read_and_completed(
    spark: Any, members: SqliteMembers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder, source = _share(tmp_path, "?on_change=reread")
    (folder / "c.csv").write_text("c1,1\n")
    output = ParquetOutput(str(tmp_path / "out"))
    a = members.start("a", resources=["d"])
    owned = assigned_source(a, "d", source, output)
    # the record an earlier version wrote: a.csv and b.csv done, no versions; b takes it over
    old = {"done": ["a.csv", "b.csv"], "batch": None, "next": 2}
    a.commit("d", old, epoch=owned.epoch)
    b = members.start("b")
    a.stop()
    src = assigned_source(b, "d", source, output)
    assert src.progress == old
    with caplog.at_level("WARNING", logger=LOG):
        assert _drain(spark, src) == [("c.csv",)]
    assert _warnings(caplog) == [], "no fingerprint recorded: not counted as a change"
    assert isinstance(src.progress, dict)
    assert src.progress["format"] == 2 and src.progress["files"] == 3
    assert "done" not in src.progress, "the names moved to the file history"
    history = src.history().load("d")
    assert sorted(history) == ["a.csv", "b.csv", "c.csv"]
    assert all(entry.fingerprint for entry in history.values()), "fingerprints recorded"
    assert "changed_files" not in src.progress
    _rewrite(folder / "a.csv", "a9,9\n")
    assert _drain(spark, src) == [("a.csv",)], "from then on a change is seen"


@pytest.mark.parametrize("option", ["", "&on_change=reread"])
def test_an_s3_object_rewritten_under_its_key(
    spark: Any, s3_bucket: S3Bucket, members: SqliteMembers, tmp_path: Path, option: str
) -> None:
    s3_bucket.put("landing/r/a.csv", "a1,1\n")
    s3_bucket.put("landing/r/b.csv", "b1,1\n")
    source = S3Source(f"s3://{s3_bucket.name}/landing/?endpoint_url={s3_bucket.endpoint}{option}")
    output = ParquetOutput(str(tmp_path / "out"))
    a = members.start("a", resources=["r"], session_timeout=15.0)
    counted: list[tuple[int, str]] = []
    src = assigned_source(a, "r", source, output, changed=lambda n, how: counted.append((n, how)))
    assert _drain(spark, src) == [("a.csv", "b.csv")]
    s3_bucket.put("landing/r/a.csv", "a2,1\n")  # same size, another ETag
    reread = bool(option)
    assert _drain(spark, src) == ([("a.csv",)] if reread else [])
    assert counted == [(1, "reread" if reread else "ignored")]
    assert isinstance(src.progress, dict) and src.progress["changed_files"] == 1
    assert _ids(spark, output) == (["a1", "a2", "b1"] if reread else ["a1", "b1"])


@pytest.mark.skipif(not metrics_available(), reason="prometheus_client is not installed")
def test_changed_files_are_a_metric() -> None:
    metrics = MemberMetrics(
        "g",
        "m",
        owned=lambda: 0,
        is_coordinator=lambda: False,
        epoch=lambda: None,
        group_members=lambda: 0,
        group_resources=lambda: 0,
    )
    metrics.changed_files(2, "ignored")
    metrics.changed_files(1, "reread")
    text = metrics.text()
    assert 'rebalancer_changed_files_total{action="ignored",group="g",member="m"} 2.0' in text
    assert 'rebalancer_changed_files_total{action="reread",group="g",member="m"} 1.0' in text
