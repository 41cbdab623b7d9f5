"""The Spark glue on this process's one SparkSession: file source, batches, ingest, audit."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark import FencedError, MemberConfig
from rebalancer_spark.audit import verify_table
from rebalancer_spark.audit.rows import load_rows
from rebalancer_spark.core.errors import ConfigurationError, RebalancerError, SourceError
from rebalancer_spark.sources import open_source
from rebalancer_spark.sources.files import FileShareSource
from rebalancer_spark.spark.ingest import run_ingest
from rebalancer_spark.spark.options import JobConfig
from rebalancer_spark.spark.outputs import ParquetOutput
from rebalancer_spark.spark.session import assigned_sources, start
from rebalancer_spark.spark.source import AssignedSource
from tests.support.helpers import SqliteMembers, assigned_source, read_delta, wait_for

# Spark's collect() leaves its local socket to the garbage collector.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket.*127.0.0.1:pytest.PytestUnraisableExceptionWarning"
)


def _landing(root: Path, dirs: int, files: int, rows: int = 3) -> set[str]:
    """CSV files ``id,value`` under root/dNN/; returns every id written."""
    ids: set[str] = set()
    for d in range(dirs):
        for f in range(files):
            path = root / f"d{d:02d}" / f"part-{f:03d}.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = []
            for r in range(rows):
                ident = f"d{d:02d}-{f:03d}-{r}"
                ids.add(ident)
                lines.append(f"{ident},{r}")
            path.write_text("\n".join(lines) + "\n")
    return ids


# -- the file-share source ------------------------------------------------------------------


def test_sub_directories_are_resources_and_hidden_names_are_ignored(tmp_path: Path) -> None:
    for name in ("b", "a", ".hidden", "_temporary"):
        (tmp_path / name).mkdir()
    (tmp_path / "a" / "x.csv").write_text("1\n")
    (tmp_path / "a" / "deep").mkdir()
    (tmp_path / "a" / "deep" / "y.csv").write_text("2\n")
    (tmp_path / "a" / ".x.csv.tmp").write_text("partial")
    (tmp_path / "a" / "_SUCCESS").write_text("")
    (tmp_path / "file-at-top.csv").write_text("")
    source = open_source(tmp_path.as_uri() + "/")
    assert isinstance(source, FileShareSource)
    assert [r.id for r in source.discover()] == ["a", "b"]
    assert [f.name for f in source.files("a")] == ["deep/y.csv", "x.csv"]
    assert source.location("a") == f"file://{tmp_path / 'a'}/"
    with pytest.raises(SourceError, match="leave the directory"):
        source.files("../outside")


def test_an_unreachable_share_is_a_source_error(tmp_path: Path) -> None:
    source = FileShareSource((tmp_path / "not-mounted").as_uri() + "/")
    with pytest.raises(SourceError, match=r"not-mounted.*mounted"):
        source.discover()
    with pytest.raises(ConfigurationError, match="file:///"):
        FileShareSource("file://host/dir/")


def test_weights_can_be_bytes(tmp_path: Path) -> None:
    (tmp_path / "big").mkdir()
    (tmp_path / "small").mkdir()
    (tmp_path / "big" / "f").write_bytes(b"x" * 1000)
    (tmp_path / "small" / "f").write_bytes(b"x" * 10)
    source = FileShareSource(tmp_path.as_uri() + "/", weigh="bytes")
    assert {r.id: r.weight for r in source.discover()} == {"big": 1000.0, "small": 10.0}
    by_url = open_source(tmp_path.as_uri() + "/?weight=bytes")
    assert {r.id: r.weight for r in by_url.discover()} == {"big": 1000.0, "small": 10.0}
    plain = open_source(tmp_path.as_uri() + "/?weight=none")
    assert {r.id: r.weight for r in plain.discover()} == {"big": 1.0, "small": 1.0}
    with pytest.raises(ConfigurationError, match="contradicts"):
        FileShareSource(tmp_path.as_uri() + "/?weight=none", weigh="bytes")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("?weigh=bytes", r"unknown option 'weigh' \(did you mean weight\?\).*weight=none\|bytes"),
        ("?weight=objects", r"weight='objects'.*none, bytes"),
        ("?weight=bytes&weight=none", "twice"),
        ("?poll=1", "unknown option 'poll'"),
        ("#frag", "'#'"),
    ],
)
def test_unknown_or_bad_file_share_options_are_refused(
    tmp_path: Path, query: str, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        open_source(tmp_path.as_uri() + "/" + query)


def test_a_directory_that_cannot_be_a_resource_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("good", "bad\nname", "tab\there", "ok ü"):
        (tmp_path / name).mkdir()
    source = FileShareSource(tmp_path.as_uri() + "/")
    with caplog.at_level("WARNING", logger="rebalancer_spark.sources.files"):
        found = [r.id for r in source.discover()]
    assert found == ["good", "ok ü"]
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert "'bad\\nname'" in warned and "'tab\\there'" in warned and "rename" in warned


# -- batches, fenced -----------------------------------------------------------------------


@pytest.mark.spark_smoke
def test_a_killed_batch_is_rerun_identically_and_the_stale_owner_is_fenced(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    _landing(landing, dirs=1, files=5)
    source = FileShareSource(landing.as_uri() + "/")
    output = ParquetOutput(str(tmp_path / "out"))
    a = members.start("a", resources=["d00"])
    src_a = assigned_source(a, "d00", source, output)
    batch = src_a.next_batch(spark)
    assert batch is not None
    first = batch.planned
    assert first.files == ("part-000.csv", "part-001.csv")
    df = batch.read()
    description = spark.sparkContext.getLocalProperty("spark.job.description")
    assert f"group={members.group} resource=d00 epoch={src_a.epoch} batch=1" in description
    df.drop("_resource", "_batch").write.mode("overwrite").parquet(output.path("d00", 1))
    # a dies between writing and committing; b takes over.
    b = members.start("b")
    a.stop(drain=False)
    src_b = assigned_source(b, "d00", source, output)
    assert src_b.epoch > src_a.epoch
    assert src_b.planned == first, "the unfinished batch is handed over as planned"
    with pytest.raises(FencedError):
        batch.commit()
    while (next_batch := src_b.next_batch(spark)) is not None:
        with next_batch:
            next_batch.write(next_batch.read())
    assert src_b.pending_files() == []
    out = spark.read.parquet(str(tmp_path / "out"))
    assert out.count() == 15
    assert out.select("id").distinct().count() == 15
    assert sorted(r["batch"] for r in out.select("batch").distinct().collect()) == [1, 2, 3]


@pytest.mark.spark_smoke
def test_the_job_description_is_the_batch_s_only_while_the_batch_runs(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    _landing(landing, dirs=1, files=4)
    source = FileShareSource(landing.as_uri() + "/")
    output = ParquetOutput(str(tmp_path / "out"))
    src = assigned_source(members.start("a", resources=["d00"]), "d00", source, output)
    sc = spark.sparkContext
    sc.setJobDescription("the user's own job")
    # An earlier test's batch that was read and never ended may have left its label.
    sc.setLocalProperty("spark.rebalancer.resource", None)
    try:
        written = read = 0
        while (batch := src.next_batch(spark)) is not None:
            with batch:
                df = batch.read()
                assert f"resource=d00 epoch={src.epoch} batch=" in sc.getLocalProperty(
                    "spark.job.description"
                )
                assert sc.getLocalProperty("spark.rebalancer.resource") == "d00"
                read += 1
                batch.write(df)
                assert sc.getLocalProperty("spark.job.description") == "the user's own job"
                written += 1
            assert sc.getLocalProperty("spark.job.description") == "the user's own job"
            assert sc.getLocalProperty("spark.rebalancer.resource") is None
        assert read == written == 2
        # A batch that fails inside ``with`` puts the description back too.
        (landing / "d00" / "late.csv").write_text("late-0,0\n")
        batch = src.next_batch(spark)
        assert batch is not None

        def broken_pipeline() -> None:
            with batch:
                batch.read()
                raise RuntimeError("the pipeline broke")

        with pytest.raises(RuntimeError, match="the pipeline broke"):
            broken_pipeline()
        assert batch.outcome == "failed"
        assert sc.getLocalProperty("spark.job.description") == "the user's own job"
    finally:
        sc.setJobDescription(None)


def test_names_with_spaces_percent_signs_and_non_ascii_are_read_exactly_once(
    spark: Any, members: SqliteMembers, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    resource = "a b%20ü"
    names = ["x y.csv", "p%41.csv", "pA.csv", "ü.csv", "g[1]{2}.csv", "sub dir/z%.csv"]
    for i, name in enumerate(names):
        path = landing / resource / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"row-{i},{i}\n", encoding="utf-8")
    source = FileShareSource(landing.as_uri() + "/")
    assert [r.id for r in source.discover()] == [resource]
    a = members.start("a", resources=[resource])
    output = ParquetOutput(str(tmp_path / "out"))
    src = assigned_source(a, resource, source, output)
    batches = 0
    while (batch := src.next_batch(spark)) is not None:
        with batch:
            df = batch.read()
            rows = df.collect()
            assert len(rows) == len(batch.files), f"one row per file of {batch.files}"
            batch.write(df)
        batches += 1
        assert batches <= 3, "a batch is read again"
    assert src.pending_files() == []
    got = sorted(r["id"] for r in spark.read.parquet(output.location).select("id").collect())
    assert got == sorted(f"row-{i}" for i in range(len(names))), "every file exactly once"
    # a streaming query loads location() as it is: the whole directory, recursively
    whole = spark.read.option("recursiveFileLookup", "true").csv(source.location(resource))
    assert whole.count() == len(names)


def test_a_batch_of_many_files_is_looked_up_on_the_driver_without_a_listing_job(
    spark: Any, tmp_path: Path
) -> None:
    """Past 32 paths Spark looks named files up with a job of one task per path (5,000 files:
    10 s of tasks); load_files looks a batch's files up on the driver and leaves the setting as
    it found it."""
    from rebalancer_spark.spark.reading import load_files

    ids = _landing(tmp_path / "landing", dirs=1, files=200, rows=1)
    source = FileShareSource((tmp_path / "landing").as_uri() + "/")
    names = sorted(f.name for f in source.files("d00"))
    setting = "spark.sql.sources.parallelPartitionDiscovery.threshold"
    sc = spark.sparkContext
    for before in (None, "64"):
        if before is not None:
            spark.conf.set(setting, before)
        group = f"lookup-{before}"
        sc.setJobGroup(group, "the lookup of a batch's files")
        try:
            df = load_files(
                spark, source, "d00", names, format="csv", schema="id STRING, value INT",
                options={},
            )  # fmt: skip
            jobs = list(sc.statusTracker().getJobIdsForGroup(group))
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
            sc.setLocalProperty("spark.job.description", None)
        assert jobs == [], f"building the DataFrame of 200 files ran Spark jobs {jobs}"
        assert spark.conf.get(setting, None) == before, "the setting is restored"
        assert {r["id"] for r in df.select("id").collect()} == ids
    spark.conf.unset(setting)


def test_reading_without_a_file_source_says_what_to_do(members: SqliteMembers) -> None:
    a = members.start("a", resources=["q1"])
    owned = wait_for(lambda: a.owns("q1"), timeout=10, what="q1 owned")
    assert owned is not None
    src = AssignedSource(
        group=a.group,
        resource="q1",
        epoch=owned.epoch,
        progress=None,
        source=None,
        commit=lambda r, v, e: a.commit(r, v, epoch=e),
        owner=a,
        before_first_read=lambda: None,
        who={"member_id": a.member_id},
    )
    with pytest.raises(RebalancerError, match="--source"):
        src.pending_files()
    src.commit({"offset": 7})
    assert src.progress == {"offset": 7}


# -- the node on the driver and the ingest loop ------------------------------------------------


def test_assigned_sources_without_a_node_is_a_clear_error() -> None:
    with pytest.raises(RebalancerError, match=r"start\(spark, job\)"):
        assigned_sources()


def test_one_job_ingests_every_file_exactly_once_and_audits_it(
    spark: Any, tmp_path: Path, group: str
) -> None:
    landing = tmp_path / "landing"
    ids = _landing(landing, dirs=3, files=4)
    output = tmp_path / "out"
    audit = tmp_path / "audit"
    job = JobConfig(
        member=MemberConfig(
            group=group,
            backend=f"sqlite://{tmp_path}/groups.db?poll=0.005",
            member_id="driver-1",
            session_timeout=3.0,
            stability_window=0.02,
        ),
        source=landing.as_uri() + "/",
        output=str(output),
        audit=str(audit),
        schema="id STRING, value INT",
        max_files_per_batch=3,
        poll_interval=0.05,
        discovery_interval=0.2,
    )
    node = start(spark, job)
    stop = threading.Event()
    result: list[Any] = []
    runner = threading.Thread(target=lambda: result.append(run_ingest(spark, node, stop)))
    runner.start()
    try:
        wait_for(
            lambda: (
                len(assigned_sources()) == 3
                and all(not s.pending_files() and s.planned is None for s in assigned_sources())
            ),
            timeout=120,
            what="every file to be ingested",
        )
        # A directory that appears later is discovered and ingested too.
        ids |= {f"late-{r}" for r in range(2)}
        late = landing / "d99"
        late.mkdir()
        (late / ".part.tmp").write_text("late-0,0\nlate-1,1\n")
        (late / ".part.tmp").rename(late / "part.csv")
        wait_for(
            lambda: any(
                s.resource == "d99" and s.planned is None and not s.pending_files()
                for s in assigned_sources()
            ),
            timeout=60,
            what="the late directory to be ingested",
        )
    finally:
        stop.set()
        runner.join(60)
        node.stop()
    out = read_delta(spark, output)
    got = [r["id"] for r in out.select("id").collect()]
    assert sorted(got) == sorted(ids), "every input row exactly once"
    assert result and result[0].fenced == 0
    verdict = verify_table(str(audit), group=group)
    assert verdict.ok and verdict.resources == 4
    # The lag, sampled into the audit table: each resource starts behind and ends caught up.
    lag = [r for r in load_rows(str(audit), group=group).rows if r["kind"] == "lag"]
    peak: dict[str, int] = {}
    last: dict[str, int] = {}
    for row in sorted(lag, key=lambda r: float(str(r["at"]))):
        resource, pending = str(row["resource"]), int(str(row["pending_files"]))
        peak[resource] = max(peak.get(resource, 0), pending)
        last[resource] = pending
    assert sorted(last) == ["d00", "d01", "d02", "d99"], lag
    assert all(n > 0 for n in peak.values()), peak
    assert all(n == 0 for n in last.values()), last


def test_once_ingests_what_is_there_and_ends_by_itself(
    spark: Any, tmp_path: Path, group: str
) -> None:
    landing = tmp_path / "landing"
    ids = _landing(landing, dirs=2, files=3)
    (landing / "d01" / "part-000.csv").write_text("bad,not-a-number\n")  # rows become nulls
    ids.discard("d01-000-0")
    ids -= {"d01-000-1", "d01-000-2"}
    ids.add("bad")
    output = tmp_path / "out"
    job = JobConfig(
        member=MemberConfig(
            group=group,
            backend=f"sqlite://{tmp_path}/groups.db?poll=0.005",
            member_id="driver-once",
            session_timeout=3.0,
            stability_window=0.02,
        ),
        source=f"{landing.as_uri()}/?order=name",
        output=str(output),
        schema="id STRING, value INT",
        max_files_per_batch=2,
        poll_interval=0.05,
        discovery_interval=0.2,
    )
    node = start(spark, job)
    result: list[Any] = []
    runner = threading.Thread(
        target=lambda: result.append(run_ingest(spark, node, threading.Event(), once=True))
    )
    runner.start()
    try:
        runner.join(120)
        assert not runner.is_alive(), "--once did not end by itself"
    finally:
        node.stop()
    assert result and result[0].files == 6 and result[0].stuck == {}
    got = [r["id"] for r in read_delta(spark, output).select("id").collect()]
    assert sorted(got) == sorted(ids), "every input row exactly once"


def test_a_job_started_while_its_store_is_paused_joins_once_it_is_back(
    spark: Any, tmp_path: Path, group: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A Redis restart or a ZooKeeper leader election under a starting job: it tries again
    # (it used to exit with 2 at the first unanswered connection).
    import time

    from tests.servers.redis import RedisServer

    server = RedisServer(tmp_path / "redis")
    server.start()
    landing = tmp_path / "landing"
    _landing(landing, dirs=1, files=1)
    job = JobConfig(
        member=MemberConfig(
            group=group,
            backend=server.url(query="timeout=1&connect_timeout=1"),
            member_id="driver-1",
            session_timeout=3.0,
        ),
        source=landing.as_uri() + "/",
        output=str(tmp_path / "out"),
        schema="id STRING, value INT",
    )
    server.pause()
    resume = threading.Timer(3.0, server.resume)
    resume.start()
    began = time.monotonic()
    try:
        with caplog.at_level("WARNING", logger="rebalancer_spark.spark"):
            node = start(spark, job)
        try:
            assert time.monotonic() - began >= 2.5, "joined while the store was paused"
            assert node.member.session is not None
            assert "the store is unavailable while joining group" in caplog.text
        finally:
            node.stop()
    finally:
        resume.join()
        server.stop()
