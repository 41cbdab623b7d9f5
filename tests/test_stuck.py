"""A resource that cannot make progress is *stuck*, shown with its error and the command that
fixes it, while every other resource of the member goes on: an unreadable progress record (on
every backend), a listing that fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark.backends import open_backend
from rebalancer_spark.cli.main import main as cli
from rebalancer_spark.core.errors import CorruptStateError, SourceError
from rebalancer_spark.core.model import UnreadableProgress
from rebalancer_spark.core.status import group_status
from rebalancer_spark.member.metrics import MemberMetrics, metrics_available
from rebalancer_spark.sources.files import FileShareSource
from rebalancer_spark.spark.outputs import ParquetOutput
from tests.support.helpers import SqliteMembers, assigned_source, wait_for
from tests.support.raw_progress import write_raw_progress
from tests.test_member import Group


def _landing(tmp_path: Path, *resources: str) -> FileShareSource:
    for r in resources:
        (tmp_path / "landing" / r).mkdir(parents=True)
        (tmp_path / "landing" / r / "a.csv").write_text(f"{r},1\n")
    return FileShareSource((tmp_path / "landing").as_uri() + "/")


def test_an_unreadable_progress_record_stalls_only_its_resource(
    spark: Any, backend_url: str, group: str, tmp_path: Path
) -> None:
    source = _landing(tmp_path, "bad", "good")
    out = tmp_path / "out"
    output = ParquetOutput(str(out))
    g = Group(backend_url, group)
    try:
        a = g.start("a", resources=["bad", "good"])
        wait_for(lambda: a.owns("bad") and a.owns("good"), timeout=15, what="a owns both")
        for r in ("bad", "good"):
            owned = a.owns(r)
            assert owned is not None
            a.commit(r, {"format": 2, "next": 1, "batch": None, "files": 0}, epoch=owned.epoch)
        write_raw_progress(backend_url, group, "bad", "1\nx\n{not json")
        with open_backend(backend_url) as store:  # the read of every progress goes on
            progress = store.progress(group, ["bad", "good"])
            assert isinstance(progress["bad"].value, UnreadableProgress)
            assert progress["good"].value["format"] == 2
            status = group_status(store.state(group), progress)
        assert list(status.stuck) == ["bad"] and "progress reset" in status.stuck["bad"]
        b = g.start("b")  # a new owner takes both over: its grants carry the bad record too
        a.stop(drain=False)
        wait_for(lambda: b.owns("bad") and b.owns("good"), timeout=20, what="b owns both")
        bad = assigned_source(b, "bad", source, output)
        with pytest.raises(CorruptStateError, match="progress reset"):
            bad.next_batch(spark)
        bad.note_stuck(CorruptStateError("unreadable"))
        assert bad.stuck == "unreadable"
        reset = ["progress", "reset", "--backend", backend_url, "--group", group]
        assert cli([*reset, "--resource", "bad", "--all", "--force"]) == 0
        again = bad.next_batch(spark)  # the owner replaces the record on the operator's request
        assert again is not None and again.files == ("a.csv",)
        assert isinstance(bad.progress, dict) and bad.progress["reset"]["after"] is None
        good = assigned_source(b, "good", source, output)
        batch = good.next_batch(spark)
        assert batch is not None and batch.files == ("a.csv",)
        with batch:
            batch.write(batch.read())
        assert batch.outcome == "written" and good.next_batch(spark) is None
    finally:
        g.close()


def test_a_failing_listing_is_recorded_as_stuck_and_shown_by_status(
    spark: Any,
    members: SqliteMembers,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = _landing(tmp_path, "d")
    a = members.start("a", resources=["d", "../escape"])
    src = assigned_source(a, "../escape", source, ParquetOutput(str(tmp_path / "out")))
    with pytest.raises(SourceError, match="would leave the directory"):
        src.next_batch(spark)
    src.note_stuck(SourceError("cannot list files of resource '../escape': denied"))
    d = assigned_source(a, "d", source, ParquetOutput(str(tmp_path / "out")))
    assert d.next_batch(spark) is not None
    assert cli(["assignments", "--backend", members.url, "--group", members.group, "--json"]) == 0
    rows = {r["resource"]: r for r in json.loads(capsys.readouterr().out)["assignments"]}
    assert "cannot list files" in rows["../escape"]["stuck"]
    assert rows["d"]["stuck"] is None and rows["d"]["pending_files"] == 0
    assert cli(["status", "--backend", members.url, "--group", members.group]) == 0
    text = capsys.readouterr().out
    assert "stuck: 1" in text and "../escape: cannot list files" in text
    assert cli(["status", "--backend", members.url, "--group", members.group, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data["stuck"]) == ["../escape"] and data["pending"]["files"] == 0


@pytest.mark.skipif(not metrics_available(), reason="prometheus_client is not installed")
def test_stuck_and_lag_are_metrics() -> None:
    metrics = MemberMetrics(
        "g", "m", owned=lambda: 0, is_coordinator=lambda: False, epoch=lambda: None,
        group_members=lambda: 0, group_resources=lambda: 0,
    )  # fmt: skip
    metrics.resource_state("r", "listing fails", None)
    metrics.resource_state("s", None, (3, 120))
    text = metrics.text()
    assert 'rebalancer_resource_stuck{group="g",member="m",resource="r"} 1.0' in text
    assert 'rebalancer_pending_files{group="g",member="m",resource="s"} 3.0' in text
    assert 'rebalancer_pending_bytes{group="g",member="m",resource="s"} 120.0' in text
    metrics.resource_gone("r")
    assert 'resource="r"' not in metrics.text()
