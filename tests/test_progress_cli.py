"""``rebalancer-spark progress show|reset|skip``: the operator's requests are refused without
--force while a member owns the resource, and applied by the owner, fenced, with an event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark.backends import open_backend
from rebalancer_spark.cli.main import main as cli
from rebalancer_spark.member.control import GroupControl
from rebalancer_spark.sources.files import FileShareSource
from rebalancer_spark.spark.outputs import ParquetOutput
from rebalancer_spark.spark.source import AssignedSource
from tests.support.helpers import SqliteMembers, assigned_source


def _drain(spark: Any, src: AssignedSource) -> list[tuple[str, ...]]:
    done: list[tuple[str, ...]] = []
    while (batch := src.next_batch(spark)) is not None:
        with batch:
            batch.commit()
        done.append(batch.files)
        assert len(done) < 10, "batches never end"
    return done


def test_show_reset_and_skip(
    spark: Any, members: SqliteMembers, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "landing" / "d"
    folder.mkdir(parents=True)
    for name in ("a.csv", "b.csv", "c.csv"):
        (folder / name).write_text("x,1\n")
    source = FileShareSource((tmp_path / "landing").as_uri() + "/")
    out = tmp_path / "out"
    a = members.start("a", resources=["d"])
    events: list[tuple[str, str]] = []
    src = assigned_source(
        a, "d", source, ParquetOutput(str(out)), event=lambda k, r, e, why: events.append((k, why))
    )
    assert len(_drain(spark, src)) == 2
    store = ["--backend", members.url, "--group", members.group, "--resource", "d"]

    assert cli(["progress", "show", *store, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["owner"] == "a" and shown["progress"]["files"] == 3 and shown["stuck"] is None

    with pytest.raises(SystemExit) as refused:
        cli(["progress", "reset", *store, "--all"])
    assert refused.value.code == 3 and "owned by member a" in capsys.readouterr().err
    forced = ["--force"]
    assert cli(["progress", "reset", *store, "--after", "a.csv", *forced]) == 0
    assert "member a applies it" in capsys.readouterr().out
    # the request waits in the group's control record, in the store, until the owner takes it
    with open_backend(members.url) as backend:
        (left,) = backend.control(members.group).requests.values()
    assert json.loads(left)["after"] == "a.csv"
    assert cli(["progress", "show", *store, "--json"]) == 0
    waiting = json.loads(capsys.readouterr().out)["request"]
    assert waiting["what"] == "reset: read again every file above 'a.csv'", waiting
    assert _drain(spark, src) == [("b.csv", "c.csv")], "read again above a.csv"
    assert events and events[-1][0] == "progress" and "above 'a.csv'" in events[-1][1]
    with open_backend(members.url) as backend:
        control = backend.control(members.group)
    assert dict(control.requests) == {}, "the owner removed the request it applied"
    assert [what for _, _, what in control.history[-2:]] == [
        f"progress request on d by {json.loads(left)['by']}",
        "progress request on d applied by a",
    ]
    assert _drain(spark, src) == []
    # An owner that read the control record before the request was removed (a cache of up to
    # a second) finds its id in the progress record: taken, not applied a second time.

    def leave(text: str) -> None:
        with open_backend(members.url) as backend:
            GroupControl(backend, members.group).request_progress("d", text)

    leave(left)
    assert _drain(spark, src) == [], "a reset applied twice reads its files again"
    assert src.progress["request"] == json.loads(left)["id"]
    with open_backend(members.url) as backend:
        assert dict(backend.control(members.group).requests) == {}
    # Text that is not a request (written by hand) is removed, logged, and stalls nothing.
    for bad in ('{"action": "drop", "id": "x"}', '{"action": "skip", "id": "y"}', "[1"):
        leave(bad)
        assert _drain(spark, src) == []
        with open_backend(members.url) as backend:
            assert dict(backend.control(members.group).requests) == {}, bad

    (folder / "d.csv").write_text("poison\n")
    assert cli(["progress", "skip", *store, "--file", "d.csv", *forced]) == 0
    assert _drain(spark, src) == [], "the skipped file is not read"
    assert "d.csv" in src.history().load("d")

    (folder / "e.csv").write_text("x,1\n")
    batch = src.next_batch(spark)
    assert batch is not None and batch.files == ("e.csv",)  # planned, its read fails forever
    assert cli(["progress", "skip", *store, "--batch", str(batch.id), *forced]) == 0
    assert src.next_batch(spark) is None and src.planned is None
    assert [k for k, _ in events] == ["progress", "progress", "progress"]
