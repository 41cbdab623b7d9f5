"""The fenced Delta output and the unit of work (batches), on this process's one SparkSession.

The zombie cases are played in one process with two members on one SQLite store: member ``a``
is the stale owner (its lease lapsed, or it stopped without draining, at a chosen moment of its
batch), member ``b`` the new owner; ``a``'s own local check is bypassed where the case is "a
driver paused right after that check", so that only the Delta table can refuse it.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark import EventKind, FencedError, Member, OwnershipEvent
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.sources.files import FileShareSource
from rebalancer_spark.spark.delta_commit import DeltaCommitter, Landing, Mark, app_id
from rebalancer_spark.spark.outputs import DeltaOutput, ParquetOutput
from tests.support.helpers import (
    GuardWith,
    SqliteMembers,
    assigned_source,
    read_delta,
    wait_for,
)

pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket.*127.0.0.1:pytest.PytestUnraisableExceptionWarning"
)


def _landing(root: Path, resource: str, files: int, rows: int = 3) -> set[str]:
    ids: set[str] = set()
    for f in range(files):
        path = root / resource / f"part-{f:03d}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"{resource}-{f:03d}-{r},{r}" for r in range(rows)]
        ids |= {line.split(",")[0] for line in lines}
        path.write_text("\n".join(lines) + "\n")
    return ids


def _history(path: Path) -> list[dict[str, Any]]:
    """The table's commits, oldest first, with their rebalancer metadata."""
    from deltalake import DeltaTable

    return sorted(DeltaTable(str(path)).history(), key=lambda c: int(c["version"]))


def _data_commits(path: Path) -> list[tuple[int, int]]:
    """(epoch, batch) of every data commit, in table order."""
    return [
        (int(c["rebalancer.epoch"]), int(c["rebalancer.batch"]))
        for c in _history(path)
        if c.get("rebalancer.kind") == "data"
    ]


def _ids(spark: Any, path: Path) -> list[str]:
    return sorted(r["id"] for r in read_delta(spark, path).select("id").collect())


# -- the mark -------------------------------------------------------------------------------


def test_a_mark_orders_by_epoch_then_batch_and_round_trips_through_a_version() -> None:
    assert Mark(3, 7) < Mark(4, 0) < Mark(4, 1)
    packed = Mark(3, 7).version
    assert packed is not None and Mark.of(packed) == Mark(3, 7)
    assert Mark.of(None) == Mark(0, 0)
    assert Mark(1 << 31, 0).version is None, "too big to pack: two transactions only"
    assert len(Mark(1 << 31, 0).transactions("g", "r")) == 2
    assert len(Mark(3, 7).transactions("g", "r")) == 3
    with pytest.raises(Exception, match="cannot be recorded"):
        Mark(1 << 63, 0)


def test_epochs_lifted_past_a_store_data_loss_fence_the_table_like_any_other(
    tmp_path: Path,
) -> None:
    """A store that lost its data lifts epochs above the wall clock in µs (about 2**51): the
    table takes them (no packed form then), refuses an owner of a smaller epoch, and a mark
    packed by an earlier version still counts."""
    import deltalake
    import pyarrow as pa
    from deltalake import CommitProperties, Transaction

    from rebalancer_spark.core.errors import FencedError
    from rebalancer_spark.spark.delta_commit import DeltaCommitter, app_id

    path = str(tmp_path / "out")
    rows = pa.table({"id": ["x"], "_resource": ["d0"]})
    packed = Mark(5, 9).version
    assert packed is not None
    old = CommitProperties(app_transactions=[Transaction(app_id("g", "d0"), packed)])
    deltalake.write_deltalake(path, rows, partition_by=["_resource"], commit_properties=old)
    committer = DeltaCommitter(path, "g")
    assert committer.mark("d0") == Mark(5, 9), "a mark packed by an earlier version is read"
    lifted = 1_795_670_234_842_492
    who = {"member_id": "m1", "session_id": "s1"}
    assert committer.fence("d0", lifted, who) == Mark(lifted, 9)
    assert DeltaCommitter(path, "g").mark("d0") == Mark(lifted, 9)
    assert committer.landed("d0", lifted, 9) and not committer.landed("d0", lifted, 10)
    with pytest.raises(FencedError):
        DeltaCommitter(path, "g").fence("d0", 6, who)  # an owner from before the loss
    assert committer.fence("d0", lifted + 1, who) == Mark(lifted + 1, 9)


# -- one job ---------------------------------------------------------------------------------


@pytest.mark.spark_smoke
def test_batches_land_once_in_delta_and_spark_reads_them(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    ids = _landing(tmp_path / "landing", "d0", files=5)
    source = FileShareSource((tmp_path / "landing").as_uri() + "/")
    out = tmp_path / "out"
    output = DeltaOutput(spark, str(out), members.group)
    a = members.start("a", resources=["d0"])
    src = assigned_source(a, "d0", source, output)
    written = 0
    while (batch := src.next_batch(spark)) is not None:
        with batch:
            batch.write(batch.read())
        assert batch.outcome == "written"
        written += 1
        assert written <= 3, "a batch was planned again"
    assert _ids(spark, out) == sorted(ids)
    df = read_delta(spark, out)
    assert {"_resource", "_batch", "_file"} <= set(df.columns)
    assert {r["_batch"] for r in df.select("_batch").collect()} == {1, 2, 3}
    assert _data_commits(out) == [(src.epoch, 1), (src.epoch, 2), (src.epoch, 3)]
    commit = _history(out)[-1]
    assert commit["rebalancer.resource"] == "d0" and commit["rebalancer.member_id"] == "a"
    assert commit["rebalancer.rows"] == "3"
    assert output.landed("d0") == 3


def test_a_resource_id_with_spaces_and_percent_signs_round_trips(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    resource = "a b%20ü"
    ids = _landing(tmp_path / "landing", resource, files=2)
    source = FileShareSource((tmp_path / "landing").as_uri() + "/")
    out = tmp_path / "out"
    a = members.start("a", resources=[resource])
    src = assigned_source(a, resource, source, DeltaOutput(spark, str(out), members.group))
    while (batch := src.next_batch(spark)) is not None:
        with batch:
            batch.write(batch.read())
    df = read_delta(spark, out)
    assert sorted(r["id"] for r in df.collect()) == sorted(ids)
    assert {r["_resource"] for r in df.collect()} == {resource}


def test_a_later_batch_with_other_inferred_types_is_cast_and_extra_columns_refused(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    output = DeltaOutput(spark, str(out), members.group)
    (tmp_path / "landing" / "r").mkdir(parents=True)
    (tmp_path / "landing" / "r" / "a.csv").write_text("x,1\n")
    source = FileShareSource((tmp_path / "landing").as_uri() + "/")
    a = members.start("a", resources=["r"])
    src = assigned_source(a, "r", source, output, schema="id STRING, value INT")
    batch = src.next_batch(spark)
    assert batch is not None
    with batch:
        batch.write(batch.read())
    (tmp_path / "landing" / "r" / "b.csv").write_text("y,2\n")
    batch = src.next_batch(spark)
    assert batch is not None
    with batch:  # value arrives as a string, is cast back to the table's INT
        batch.write(batch.read().selectExpr("id", "CAST(value AS STRING) AS value", "_file"))
    assert read_delta(spark, out).schema["value"].dataType.typeName() == "integer"
    (tmp_path / "landing" / "r" / "c.csv").write_text("z,3\n")
    batch = src.next_batch(spark)
    assert batch is not None
    with pytest.raises(ConfigurationError, match=r"columns \['extra'\].*--schema"), batch:
        batch.write(batch.read().selectExpr("*", "1 AS extra"))
    assert batch.outcome == "failed" and src.planned is not None, "the batch stays planned"


def test_an_output_partitioned_otherwise_is_refused(spark: Any, tmp_path: Path) -> None:
    spark.range(2).write.format("delta").save(str(tmp_path / "other"))
    committer = DeltaCommitter(str(tmp_path / "other"), "g")
    with pytest.raises(ConfigurationError, match=r"partitioned by nothing.*_resource"):
        committer.mark("r")


# -- zombies: the stale owner at each moment of its batch --------------------------------------


def _two_owners(
    spark: Any, members: SqliteMembers, tmp_path: Path, files: int
) -> tuple[Any, Member, Member, FileShareSource, DeltaOutput, set[str]]:
    ids = _landing(tmp_path / "landing", "d0", files=files)
    source = FileShareSource((tmp_path / "landing").as_uri() + "/")
    output = DeltaOutput(spark, str(tmp_path / "out"), members.group)
    a = members.start("a", resources=["d0"])
    src_a = assigned_source(a, "d0", source, output)
    b = members.start("b")
    return src_a, a, b, source, output, ids


def _take_over(b: Member, a: Member, source: FileShareSource, output: DeltaOutput) -> Any:
    a.stop(drain=False)  # a's session ends without a release: b is granted d0 at a new epoch
    wait_for(lambda: b.owns("d0"), timeout=20, what="b to own d0")
    return assigned_source(b, "d0", source, output)


def _run_all(spark: Any, src: Any) -> list[str]:
    outcomes = []
    while (batch := src.next_batch(spark)) is not None:
        with batch:
            batch.write(batch.read())
        outcomes.append(str(batch.outcome))
        assert len(outcomes) <= 5, outcomes
    return outcomes


@pytest.mark.spark_smoke
def test_a_stale_owner_paused_before_its_write_is_refused_by_the_table(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    src_a, a, b, source, output, ids = _two_owners(spark, members, tmp_path, files=4)
    batch_a = src_a.next_batch(spark)  # planned, not read yet
    assert batch_a is not None
    df_a = batch_a.read()
    src_b = _take_over(b, a, source, output)
    assert src_b.epoch == src_a.epoch + 1
    assert _run_all(spark, src_b) == ["written", "written"]
    # a wakes up; its local check is past (a pause right after it): only Delta can refuse.
    with pytest.raises(FencedError, match=f"epoch {src_b.epoch}.*refused by the table"):
        output.write(df_a, resource="d0", epoch=src_a.epoch, batch=batch_a.id,
                     who=src_a.who, guard=GuardWith())  # fmt: skip
    assert _ids(spark, tmp_path / "out") == sorted(ids), "every row exactly once"
    assert all(epoch == src_b.epoch for epoch, _ in _data_commits(tmp_path / "out"))


def test_a_stale_owner_paused_during_its_write_cannot_commit_after_the_successor(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    src_a, a, b, source, output, ids = _two_owners(spark, members, tmp_path, files=4)
    batch_a = src_a.next_batch(spark)
    assert batch_a is not None
    paused: list[Any] = []

    def pause_after_the_files() -> None:  # the hold of the commit: a "pauses" there
        if not paused:
            paused.append(_take_over(b, a, source, output))
            paused.append(_run_all(spark, paused[0]))

    with pytest.raises(FencedError, match="refused by the table"):
        output.write(batch_a.read(), resource="d0", epoch=src_a.epoch, batch=batch_a.id,
                     who=src_a.who, guard=GuardWith(inside_hold=pause_after_the_files))  # fmt: skip
    src_b, outcomes = paused
    assert outcomes == ["written", "written"], "the successor fenced, then re-ran batch 1"
    kinds = [c.get("rebalancer.kind") for c in _history(tmp_path / "out")]
    assert kinds.count("fence") == 1
    assert _data_commits(tmp_path / "out") == [(src_b.epoch, 1), (src_b.epoch, 2)]
    assert _ids(spark, tmp_path / "out") == sorted(ids), "every row exactly once"


def test_a_batch_committing_while_its_resource_is_revoked_lands_before_the_release(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    """The Delta commit runs inside the job's hold of the resource: a drain that revokes the
    resource while the commit is under way waits for it, so the commit's time comes before
    a's ``released`` row (the audit's output check, rule 2) and the batch lands."""
    ids = _landing(tmp_path / "landing", "d0", files=2)
    source = FileShareSource((tmp_path / "landing").as_uri() + "/")
    output = DeltaOutput(spark, str(tmp_path / "out"), members.group)
    events: list[OwnershipEvent] = []
    revoked = threading.Event()
    a = members.start("a", resources=["d0"], event_sinks=[events.append],
                      on_revoked=lambda owned: revoked.set())  # fmt: skip
    src_a = assigned_source(a, "d0", source, output, max_files_per_batch=2)
    batch = src_a.next_batch(spark)
    assert batch is not None
    df = batch.read()
    drain = threading.Thread(target=a.stop, name="test-drain")

    def revoke_mid_commit() -> None:  # the commit has begun: a drains meanwhile
        drain.start()
        assert revoked.wait(10), "on_revoked never ran"
        time.sleep(0.2)

    landing = output.write(df, resource="d0", epoch=src_a.epoch, batch=batch.id, who=src_a.who,
                           guard=GuardWith(src_a.guard, inside_hold=revoke_mid_commit))  # fmt: skip
    drain.join(20)
    assert not drain.is_alive(), "the drain never ended"
    assert landing is Landing.COMMITTED
    (committed,) = [c for c in _history(tmp_path / "out") if c.get("rebalancer.kind") == "data"]
    (released,) = [e for e in events if e.kind is EventKind.RELEASED]
    assert released.at >= int(committed["timestamp"]) / 1000, "the commit came after the release"
    assert _ids(spark, tmp_path / "out") == sorted(ids)


def test_a_kill_between_the_delta_commit_and_the_progress_commit_is_recovered_exactly(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    src_a, a, b, source, output, ids = _two_owners(spark, members, tmp_path, files=4)
    batch_a = src_a.next_batch(spark)
    assert batch_a is not None
    landing = output.write(batch_a.read(), resource="d0", epoch=src_a.epoch, batch=batch_a.id,
                           who=src_a.who, guard=src_a.guard)  # fmt: skip
    assert landing is Landing.COMMITTED  # ... and a dies before its progress commit
    src_b = _take_over(b, a, source, output)
    assert src_b.planned == batch_a.planned, "the batch is handed over as planned"
    assert _run_all(spark, src_b) == ["written"], "batch 1 is skipped as landed, batch 2 runs"
    assert _data_commits(tmp_path / "out") == [(src_a.epoch, 1), (src_b.epoch, 2)]
    assert _ids(spark, tmp_path / "out") == sorted(ids), "every row exactly once"
    assert src_b.pending_files() == []


def test_a_stale_owner_cannot_plan_or_commit_its_progress(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    src_a, a, b, source, output, _ = _two_owners(spark, members, tmp_path, files=4)
    batch_a = src_a.next_batch(spark)
    assert batch_a is not None
    _take_over(b, a, source, output)
    with batch_a:  # every fenced step ends the batch the same way
        batch_a.write(batch_a.read())
    assert batch_a.outcome == "fenced"
    with pytest.raises(FencedError):
        src_a.next_batch(spark)


def _more_files(root: Path, resource: str, first: int, files: int) -> set[str]:
    ids: set[str] = set()
    for f in range(first, first + files):
        lines = [f"{resource}-{f:03d}-{r},{r}" for r in range(3)]
        ids |= {line.split(",")[0] for line in lines}
        (root / resource / f"part-{f:03d}.csv").write_text("\n".join(lines) + "\n")
    return ids


@pytest.mark.parametrize("kind", ["delta", "parquet"])
def test_batches_planned_after_a_lost_progress_record_take_ids_above_the_outputs(
    spark: Any, members: SqliteMembers, tmp_path: Path, kind: str
) -> None:
    # A store that lost its data starts every progress record again, batch ids from 1; the
    # file history still knows the files done. Reusing an id the output holds would take
    # the new batch for landed (Delta) or replace an old one (Parquet): rows lost.
    ids = _landing(tmp_path / "landing", "d0", files=4)
    source = FileShareSource((tmp_path / "landing").as_uri() + "/")
    out = tmp_path / "out"
    output: DeltaOutput | ParquetOutput = (
        DeltaOutput(spark, str(out), members.group) if kind == "delta" else ParquetOutput(str(out))
    )
    a = members.start("a", resources=["d0"])
    src = assigned_source(a, "d0", source, output)
    assert _run_all(spark, src) == ["written", "written"]
    a.commit("d0", None, epoch=src.epoch)  # the record as a store that lost it gives it
    ids |= _more_files(tmp_path / "landing", "d0", first=10, files=3)
    again = assigned_source(a, "d0", source, output)
    assert again.progress is None
    assert _run_all(spark, again) == ["written", "written"]
    if kind == "delta":
        assert _ids(spark, out) == sorted(ids), "every row exactly once"
        assert [b for _, b in _data_commits(out)] == [1, 2, 3, 4]
    else:
        got = spark.read.parquet(str(out))
        assert sorted(r["id"] for r in got.collect()) == sorted(ids), "every row exactly once"
        assert {r["batch"] for r in got.select("batch").collect()} == {1, 2, 3, 4}


def test_a_store_unavailable_while_planning_skips_that_resource_for_this_pass(
    spark: Any, members: SqliteMembers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Redis restarting or paused under a job: the pass goes on with the other resources and
    # the job lives (it used to exit with the store's error).
    from types import SimpleNamespace

    from rebalancer_spark.core.errors import BackendUnavailable
    from rebalancer_spark.spark.batch import batches

    _landing(tmp_path / "landing", "d0", files=2)
    _landing(tmp_path / "landing", "d1", files=2)
    source = FileShareSource((tmp_path / "landing").as_uri() + "/")
    output = DeltaOutput(spark, str(tmp_path / "out"), members.group)
    a = members.start("a", resources=["d0", "d1"])
    srcs = [assigned_source(a, r, source, output) for r in ("d0", "d1")]
    commit = a.commit

    def down(resource: str, *args: Any, **kwargs: Any) -> None:
        if resource == "d0":
            raise BackendUnavailable("Redis at 'redis://127.0.0.1:1/0' did not answer in time")
        commit(resource, *args, **kwargs)

    monkeypatch.setattr(a, "commit", down)
    node = SimpleNamespace(assigned_sources=lambda: srcs)
    planned = [b.resource for b in batches(spark, node)]  # type: ignore[arg-type]
    assert planned == ["d1"]
    monkeypatch.setattr(a, "commit", commit)
    assert [b.resource for b in batches(spark, node)] == ["d0", "d1"]  # type: ignore[arg-type]


# -- the other output, and catalog tables ------------------------------------------------------


def test_the_parquet_output_replaces_a_batch_directory(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    ids = _landing(tmp_path / "landing", "d0", files=3)
    source = FileShareSource((tmp_path / "landing").as_uri() + "/")
    output = ParquetOutput(str(tmp_path / "out"))
    a = members.start("a", resources=["d0"])
    src = assigned_source(a, "d0", source, output)
    assert _run_all(spark, src) == ["written", "written"]
    got = spark.read.parquet(str(tmp_path / "out"))
    assert sorted(r["id"] for r in got.collect()) == sorted(ids)
    assert {r["batch"] for r in got.select("batch").collect()} == {1, 2}


def test_a_catalog_table_name_is_an_output(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    name = f"bronze_{members.group.replace('-', '_')}"[:60]
    spark.sql(
        f"CREATE TABLE {name} (id STRING, value INT, _file STRING, _batch BIGINT, "
        f"_resource STRING) USING delta PARTITIONED BY (_resource) "
        f"LOCATION '{tmp_path / 'catalog'}'"
    )
    ids = _landing(tmp_path / "landing", "d0", files=2)
    source = FileShareSource((tmp_path / "landing").as_uri() + "/")
    output = DeltaOutput(spark, name, members.group)
    a = members.start("a", resources=["d0"])
    src = assigned_source(a, "d0", source, output)
    assert _run_all(spark, src) == ["written"]
    assert sorted(r["id"] for r in spark.table(name).collect()) == sorted(ids)
    txn = json.dumps(_history(tmp_path / "catalog")[-1])
    assert app_id(members.group, "d0") not in txn  # the txn is an action, not commitInfo
    assert output.committer.mark("d0") == Mark(src.epoch, 1)
