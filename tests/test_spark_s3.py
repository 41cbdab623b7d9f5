"""Reading S3 resources from Spark: through Spark's own ``s3a://`` reader (the executors read
the objects; hadoop-aws comes with the test session) and through the pyarrow fallback, with the
fenced batches that make it exactly-once."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark import FencedError, Member
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.sources.s3 import S3Source
from rebalancer_spark.sources.s3.spark_read import s3a_available, s3a_paths
from rebalancer_spark.spark import packages
from rebalancer_spark.spark.outputs import ParquetOutput
from rebalancer_spark.spark.source import AssignedSource, FileBatch
from tests.servers.cloud import SECRET_KEY, MotoServer, S3Bucket
from tests.support.helpers import SqliteMembers, assigned_source


def _read(spark: Any, src: AssignedSource) -> Any:
    """The next batch of ``src`` as a DataFrame (planned, fenced), or None."""
    batch = src.next_batch(spark)
    return None if batch is None else batch.read()


def _planned(src: AssignedSource) -> FileBatch:
    assert src.planned is not None
    return src.planned


pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket.*127.0.0.1:pytest.PytestUnraisableExceptionWarning"
)


def _landing(bucket: S3Bucket, resource: str, files: int, rows: int = 3) -> set[str]:
    ids: set[str] = set()
    for f in range(files):
        lines = []
        for r in range(rows):
            ident = f"{resource}-{f:03d}-{r}"
            ids.add(ident)
            lines.append(f"{ident},{r}")
        bucket.put(f"landing/{resource}/part-{f:03d}.csv", "\n".join(lines) + "\n")
    return ids


def _member(members: SqliteMembers, name: str, resources: list[str] | None = None) -> Member:
    # Spark on a shared 2-core machine: no lapse mid-test.
    return members.start(name, resources=resources, session_timeout=15.0)


def _source(bucket: S3Bucket, reader: str = "auto", *more: str) -> S3Source:
    options = "&".join([f"endpoint_url={bucket.endpoint}", f"reader={reader}", *more])
    return S3Source(f"s3://{bucket.name}/landing/?{options}")


def test_auto_uses_spark_s3a_reader_where_hadoop_aws_is_present(spark: Any) -> None:
    # the test session has the jars scripts/setup.sh fetched (rebalancer_spark.spark.packages)
    assert s3a_available(spark)


def test_s3a_paths_name_each_key_as_written(spark: Any) -> None:
    # S3A asks S3 for path.toUri().getPath() without its leading '/': Hadoop's Path must give
    # back the key exactly, not a %-quoted form of it (no hadoop-aws here: Path is enough).
    keys = ["in/x y.csv", "in/p%41.csv", "in/ü.csv", "in/a+b=c&d.csv"]
    jvm: Any = spark.sparkContext._jvm
    for key, path in zip(keys, s3a_paths("lake", keys), strict=True):
        uri = jvm.org.apache.hadoop.fs.Path(path).toUri()
        assert (uri.getScheme(), uri.getAuthority(), uri.getPath()) == ("s3a", "lake", "/" + key)
    assert s3a_paths("lake", ["in/g[1]{2}*?.csv"]) == ["s3a://lake/in/g\\[1\\]\\{2\\}\\*\\?.csv"]


def test_reader_s3a_without_hadoop_aws_says_what_to_do(
    spark: Any, s3_bucket: S3Bucket, members: SqliteMembers, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a Spark without hadoop-aws, as a plain `pip install pyspark` is
    monkeypatch.setattr("rebalancer_spark.sources.s3.spark_read.s3a_available", lambda spark: False)
    s3_bucket.put("landing/r1/a.csv", "x,1\n")
    src = assigned_source(_member(members, "a", ["r1"]), "r1", _source(s3_bucket, reader="s3a"))
    wanted = re.escape(packages.HADOOP_AWS)  # at the Hadoop version of the installed pyspark
    with pytest.raises(
        ConfigurationError, match=rf"S3AFileSystem.*{wanted}.*setup.sh.*reader=arrow"
    ):
        _read(spark, src)


def test_an_s3_batch_is_read_with_its_resource_batch_and_file(
    spark: Any, s3_bucket: S3Bucket, members: SqliteMembers
) -> None:
    ids = _landing(s3_bucket, "r1", files=3)
    source = _source(s3_bucket, reader="auto")
    src = assigned_source(_member(members, "a", ["r1"]), "r1", source)
    df = _read(spark, src)
    assert df is not None and src.planned is not None
    assert src.planned.files == ("part-000.csv", "part-001.csv")
    rows = df.collect()
    assert df.columns == ["id", "value", "_file", "_resource", "_batch"]
    assert {r["id"] for r in rows} == {i for i in ids if "-002-" not in i}
    assert {r["_resource"] for r in rows} == {"r1"} and {r["_batch"] for r in rows} == {1}
    assert {r["_file"] for r in rows} == {
        f"s3://{s3_bucket.name}/landing/r1/part-00{n}.csv" for n in (0, 1)
    }
    assert sorted(r["value"] for r in rows if r["id"].startswith("r1-000")) == [0, 1, 2]
    # Spark's file source planned the s3a:// objects: the executors read them, not the driver
    assert sorted(df.inputFiles()) == [
        f"s3a://{s3_bucket.name}/landing/r1/part-00{n}.csv" for n in (0, 1)
    ]
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "FileScan csv" in plan and f"s3a://{s3_bucket.name}/landing/r1" in plan, plan
    assert "ExistingRDD" not in plan and "LocalTableScan" not in plan, plan


@pytest.mark.spark_smoke
def test_a_killed_s3_batch_is_rerun_identically_and_the_stale_owner_is_fenced(
    spark: Any, s3_bucket: S3Bucket, members: SqliteMembers, tmp_path: Path
) -> None:
    ids = _landing(s3_bucket, "r1", files=5)
    source = _source(s3_bucket)
    output = str(tmp_path / "out")
    a = _member(members, "a", ["r1"])
    src_a = assigned_source(a, "r1", source)
    df = _read(spark, src_a)
    assert df is not None
    first = src_a.planned
    df.drop("_resource", "_batch").write.mode("overwrite").parquet(
        ParquetOutput(output).path("r1", 1)
    )
    # a dies between writing and committing; b takes over the planned batch
    b = _member(members, "b")
    a.stop(drain=False)
    src_b = assigned_source(b, "r1", source)
    assert src_b.epoch > src_a.epoch
    assert src_b.planned == first, "the unfinished batch is handed over as planned"
    with pytest.raises(FencedError):
        src_a.mark_done(_planned(src_a))
    batches = 0
    while (df := _read(spark, src_b)) is not None:
        df.drop("_resource", "_batch").write.mode("overwrite").parquet(
            ParquetOutput(output).path("r1", _planned(src_b).id)
        )
        src_b.mark_done(_planned(src_b))
        batches += 1
    assert batches == 3 and src_b.pending_files() == []
    out = spark.read.parquet(output)
    assert out.count() == len(ids) == 15
    assert {r["id"] for r in out.select("id").collect()} == ids
    # a file that lands later is picked up by a new batch, and only it
    s3_bucket.put("landing/r1/part-100.csv", "late,1\n")
    df = _read(spark, src_b)
    assert df is not None and [r["id"] for r in df.collect()] == ["late"]
    assert src_b.planned is not None and src_b.planned.id == 4


@pytest.mark.parametrize("reader", ["s3a", "arrow"])
def test_other_formats_through_either_reader(
    spark: Any, s3_bucket: S3Bucket, members: SqliteMembers, reader: str
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": ["p1", "p2"], "value": [1, 2]}), buffer)
    s3_bucket.put("landing/pq/a.parquet", buffer.getvalue())
    s3_bucket.put("landing/js/a.json", '{"id": "j1", "value": 5}\n{"id": "j2", "value": 6}\n')
    s3_bucket.put("landing/tx/a.txt", "line one\nline two\n")
    s3_bucket.put("landing/hd/a.csv", "id,value\nh1,1\nh2,2\n")
    s3_bucket.put("landing/hd/b.csv", "")
    s3_bucket.put("landing/hd/c.csv", "id,value\nh3,3\n")
    source = _source(s3_bucket, reader)
    a = _member(members, "a", ["pq", "js", "tx", "hd"])
    hd = assigned_source(a, "hd", source, options={"header": "true"}, max_files_per_batch=3)
    hd_df = _read(spark, hd)
    assert hd_df is not None
    assert sorted((r["id"], r["value"]) for r in hd_df.collect()) == [
        ("h1", 1),
        ("h2", 2),
        ("h3", 3),
    ], "headers skipped, an empty object gives no rows"
    pq_df = _read(
        spark, assigned_source(a, "pq", source, format="parquet", schema="id STRING, value BIGINT")
    )
    assert pq_df is not None
    assert sorted((r["id"], r["value"]) for r in pq_df.collect()) == [("p1", 1), ("p2", 2)]
    js_df = _read(spark, assigned_source(a, "js", source, format="json"))
    assert js_df is not None
    assert sorted((r["id"], r["value"]) for r in js_df.collect()) == [("j1", 5), ("j2", 6)]
    tx_df = _read(spark, assigned_source(a, "tx", source, format="text", schema=None))
    assert tx_df is not None
    assert [r["value"] for r in tx_df.collect()] == ["line one", "line two"]
    for df in (hd_df, pq_df, js_df, tx_df):
        files = df.inputFiles()
        if reader == "s3a":  # Spark's file source on s3a:// paths
            assert files and all(f.startswith(f"s3a://{s3_bucket.name}/landing/") for f in files)
        else:  # rows the driver fetched and handed to Spark: no file source
            assert files == []


@pytest.mark.parametrize("reader", ["s3a", "arrow"])
def test_keys_with_odd_characters_are_read_and_named_as_written(
    spark: Any, s3_bucket: S3Bucket, members: SqliteMembers, reader: str
) -> None:
    names = ["x y.csv", "p%41.csv", "ü.csv", "a+b=c&d.csv", "g[1]{2}.csv"]
    for n, name in enumerate(names):
        s3_bucket.put(f"landing/odd/{name}", f"odd-{n},{n}\n")
    a = _member(members, "a", ["odd"])
    src = assigned_source(a, "odd", _source(s3_bucket, reader), max_files_per_batch=10)
    df = _read(spark, src)
    assert df is not None
    got = {(r["_file"], r["id"]) for r in df.collect()}
    assert got == {
        (f"s3://{s3_bucket.name}/landing/odd/{name}", f"odd-{n}") for n, name in enumerate(names)
    }, "the same _file, the key as written, whichever reader read it"


def test_each_bucket_gets_its_own_s3a_endpoint_and_credentials(
    spark: Any,
    s3_bucket: S3Bucket,
    moto_server: MotoServer,
    members: SqliteMembers,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a second bucket read with the keys of a named profile, next to the first read with the
    # environment's: each has its own fs.s3a.bucket.<name>.* keys, and no secret is logged
    other = S3Bucket(f"{s3_bucket.name}-p", moto_server, moto_server.client("s3"))
    other.client.create_bucket(Bucket=other.name)
    credentials = tmp_path / "credentials"
    credentials.write_text(
        "[reader]\naws_access_key_id = profile-access\naws_secret_access_key = profile-secret\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    s3_bucket.put("landing/e1/a.csv", "env-0,0\n")
    other.put("landing/p1/a.csv", "profile-0,0\n")
    a = _member(members, "a", ["e1", "p1"])
    caplog.set_level(logging.DEBUG)
    by_env = assigned_source(a, "e1", _source(s3_bucket, "s3a"))
    by_profile = assigned_source(a, "p1", _source(other, "s3a", "profile=reader"))
    assert _read(spark, by_env) is not None and _read(spark, by_profile) is not None
    conf: Any = spark.sparkContext._jsc.hadoopConfiguration()
    for bucket, access in ((s3_bucket, "testing-access-key"), (other, "profile-access")):
        base = f"fs.s3a.bucket.{bucket.name}."
        assert conf.get(base + "endpoint") == bucket.endpoint
        assert conf.get(base + "path.style.access") == "true"
        assert conf.get(base + "connection.ssl.enabled") == "false"
        assert conf.get(base + "access.key") == access
    for secret in (SECRET_KEY, "profile-secret"):
        assert secret not in caplog.text
