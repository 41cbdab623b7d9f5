"""Where a job's batches go: a Delta table fenced by epoch (the default), or Parquet directories.

:class:`DeltaOutput` (``--output-format delta``): Spark writes the batch's rows as Parquet files
under the table's root (``_resource=<id>/batch=<n>-epoch=<e>-<uuid>/``: executors write, the
driver collects nothing), then the driver commits exactly those files as **one** Delta commit
with the resource's application transaction (:mod:`.delta_commit`): Delta itself refuses a stale
owner's batch, and a batch that already landed is never committed twice. Files of an attempt
that was refused or interrupted stay in the directory but not in the table (``VACUUM`` removes
them). The table is partitioned by ``_resource`` and every row has ``_batch``; any Delta reader
reads it (``spark.read.format("delta")``, delta-rs, Trino …). ``output`` is a path, an
``s3a://``/``s3://`` URL (delta-rs gets the endpoint and keys from Spark's ``fs.s3a.*``
settings, per bucket first, else from the AWS environment), or the name of a catalog table
(its location is looked up; Delta jars needed).

:class:`ParquetOutput` (``--output-format parquet``): each batch replaces the directory
``output/resource=<id>/batch=<n>/``. Exactly once as long as no owner is paused past its lease
*during* a write (the write runs inside the job's hold of the resource, so a revocation waits
for it, but a directory replace is not a commit a table can refuse); read it with
``spark.read.parquet(output)``.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, urlsplit

from rebalancer_spark.core.errors import ConfigurationError, RebalancerError
from rebalancer_spark.spark.delta_commit import PARTITION_COLUMN, DeltaCommitter, Landing
from rebalancer_spark.spark.file_history import HISTORY_DIR
from rebalancer_spark.spark.guard import WriteGuard

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "BATCH_COLUMN",
    "DeltaOutput",
    "Output",
    "ParquetOutput",
    "open_output",
    "s3_storage_options",
]

BATCH_COLUMN = "_batch"
_TABLE_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*){0,2}$")


class Output(Protocol):
    """What a batch is written to."""

    location: str

    def history_location(self) -> tuple[str, dict[str, str]]:
        """Where the group's file history lives (:mod:`.file_history`) and its storage
        options: ``<output>/_rebalancer_files``."""

    def landed(self, resource: str) -> int | None:
        """The highest batch id of ``resource`` that landed, or None when this output cannot
        tell (then a planned batch is simply written again)."""

    def fence(self, resource: str, epoch: int, who: Mapping[str, str]) -> int | None:
        """Make sure no writer of an epoch below ``epoch`` can land a batch of ``resource``
        any more; returns :meth:`landed` as of the fence."""

    def highest_batch(self, resource: str) -> int:
        """The highest batch id of ``resource`` the output holds (0: none). A new batch takes
        a higher id: one the output holds already would be taken for landed (Delta) or be
        replaced (Parquet), when the progress record that counts the ids was lost."""

    def write(
        self,
        df: DataFrame,
        *,
        resource: str,
        epoch: int,
        batch: int,
        who: Mapping[str, str],
        guard: WriteGuard,
    ) -> Landing:
        """Write ``df`` as batch ``batch`` of ``resource`` at ``epoch``; ``guard``
        (:mod:`.guard`) raises :class:`~rebalancer_spark.FencedError` when this job no
        longer owns the resource, and holds it through the write that makes the batch
        visible."""


def open_output(spark: SparkSession, location: str, group: str, output_format: str) -> Output:
    """The output of a job: ``output_format`` is ``delta`` or ``parquet``."""
    if output_format == "parquet":
        return ParquetOutput(location)
    if output_format == "delta":
        return DeltaOutput(spark, location, group)
    raise ConfigurationError(
        f"output format {output_format!r} is not one of delta, parquet: use --output-format delta"
    )


class DeltaOutput:
    """The Delta table of a group's output; see the module docstring."""

    def __init__(self, spark: SparkSession, location: str, group: str) -> None:
        self.spark = spark
        self.location = location
        spark_uri, delta_uri, options = _locate(spark, location)
        self.spark_uri = spark_uri
        self.committer = DeltaCommitter(
            delta_uri, group, storage_options=options, shown_as=spark_uri
        )
        # Delta's timestamp is microseconds; Spark writes INT96 Parquet timestamps otherwise.
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")

    def __repr__(self) -> str:
        return f"DeltaOutput({self.spark_uri!r})"

    def history_location(self) -> tuple[str, dict[str, str]]:
        uri = f"{self.committer.uri.rstrip('/')}/{HISTORY_DIR}"
        return uri, dict(self.committer.storage_options)

    def landed(self, resource: str) -> int | None:
        return self.committer.mark(resource).batch

    def highest_batch(self, resource: str) -> int:
        return self.committer.mark(resource).batch

    def fence(self, resource: str, epoch: int, who: Mapping[str, str]) -> int | None:
        return self.committer.fence(resource, epoch, who).batch

    def write(
        self,
        df: DataFrame,
        *,
        resource: str,
        epoch: int,
        batch: int,
        who: Mapping[str, str],
        guard: WriteGuard,
    ) -> Landing:
        if self.committer.landed(resource, epoch, batch):
            return Landing.ALREADY  # a previous attempt landed; only the progress is missing
        adds, rows, schema_json = self.stage(
            df, resource=resource, epoch=epoch, batch=batch, check=guard.check
        )
        if not adds:
            raise RebalancerError(
                f"Spark wrote no Parquet file for batch {batch} of {resource!r} under "
                f"{self.spark_uri}: the batch is retried"
            )
        return self.committer.commit(
            resource, epoch, batch, adds, who, schema_json=schema_json, rows=rows, guard=guard
        )

    def stage(
        self,
        df: DataFrame,
        *,
        resource: str,
        epoch: int,
        batch: int,
        check: Callable[[], None],
    ) -> tuple[list[Any], int, str]:
        """Spark writes ``df`` (aligned to the table, with ``_batch``) as new Parquet files
        of batch ``batch`` under the table's root, creating the table first when missing, and
        commits nothing: returns the files' ``AddAction`` s (none when Spark wrote no file),
        the rows written and the table schema. :meth:`write` commits them; the queue output
        (:mod:`.queue_output`) commits them with :meth:`DeltaCommitter.commit_fresh`."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as sf

        frame = self._aligned(_with_batch(df, batch))
        schema_json = _table_schema(frame)
        self.committer.table(schema_json)  # created before any file is written
        relative = (
            f"{PARTITION_COLUMN}={quote(resource, safe='')}/"
            f"batch={batch:010d}-epoch={epoch}-{uuid.uuid4().hex[:8]}"
        )
        target = f"{self.spark_uri}/{relative}"
        check()
        counted = Observation(f"rebalancer_rows_{uuid.uuid4().hex[:8]}")
        frame.observe(counted, sf.count(sf.lit(1)).alias("rows")).write.mode(
            "errorifexists"
        ).parquet(target)
        rows = int(counted.get["rows"])
        return self._adds(target, relative, resource), rows, schema_json

    def _aligned(self, df: DataFrame) -> DataFrame:
        """``df`` in the table's column order and types (a CSV batch whose inferred types
        differ from the first batch's is cast); columns the table lacks are refused."""
        from pyspark.sql import functions as sf
        from pyspark.sql.types import StructType

        current = self.committer.schema_json()
        if current is None:
            return df
        table = StructType.fromJson(json.loads(current))
        wanted = [f for f in table.fields if f.name != PARTITION_COLUMN]
        extra = sorted(set(df.columns) - {f.name for f in wanted})
        if extra:
            raise ConfigurationError(
                f"the batch has columns {extra} that the output Delta table {self.spark_uri} "
                f"does not have (its columns: {[f.name for f in wanted]}): give the job a fixed "
                "--schema, select the table's columns, or write to a new table"
            )
        have = {f.name: f.dataType for f in df.schema.fields}
        if [(f.name, f.dataType) for f in wanted] == list(have.items()):
            return df
        return df.select(
            [
                (sf.col(f.name) if f.name in have else sf.lit(None)).cast(f.dataType).alias(f.name)
                for f in wanted
            ]
        )

    def _adds(self, target: str, relative: str, resource: str) -> list[Any]:
        from deltalake.transaction import AddAction

        jvm: Any = self.spark.sparkContext._jvm
        conf = self.spark.sparkContext._jsc.hadoopConfiguration()
        path = jvm.org.apache.hadoop.fs.Path(target)
        adds = []
        for status in path.getFileSystem(conf).listStatus(path):
            name = str(status.getPath().getName())
            if name.startswith(("_", ".")) or not name.endswith(".parquet"):
                continue
            adds.append(
                AddAction(
                    f"{relative}/{name}",
                    int(status.getLen()),
                    {PARTITION_COLUMN: resource},
                    int(status.getModificationTime()),
                    True,
                    "{}",
                )
            )
        return adds


class ParquetOutput:
    """Parquet directories, one per batch; see the module docstring."""

    def __init__(self, location: str) -> None:
        self.location = location.rstrip("/")

    def __repr__(self) -> str:
        return f"ParquetOutput({self.location!r})"

    def history_location(self) -> tuple[str, dict[str, str]]:
        parts = urlsplit(self.location)
        if parts.scheme in ("", "file"):
            path = os.path.abspath(parts.path if parts.scheme else self.location)
            return f"{path}/{HISTORY_DIR}", {}
        raise ConfigurationError(
            f"a Parquet output at {self.location!r} cannot hold the file history (only a local "
            "or shared path can): use a Delta output (the default) for an S3 location"
        )

    def landed(self, resource: str) -> int | None:
        return None

    def fence(self, resource: str, epoch: int, who: Mapping[str, str]) -> int | None:
        return None

    def highest_batch(self, resource: str) -> int:
        folder = self.path(resource, 0).rsplit("/", 1)[0]
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return 0
        ids = [int(n[6:]) for n in names if n.startswith("batch=") and n[6:].isdigit()]
        return max(ids, default=0)

    def path(self, resource: str, batch: int) -> str:
        """``output/resource=<id>/batch=<n>``: the same for every owner that runs the batch,
        so a re-run replaces rather than duplicates."""
        return f"{self.location}/resource={quote(resource, safe='')}/batch={batch:010d}"

    def write(
        self,
        df: DataFrame,
        *,
        resource: str,
        epoch: int,
        batch: int,
        who: Mapping[str, str],
        guard: WriteGuard,
    ) -> Landing:
        frame = df.drop(PARTITION_COLUMN, BATCH_COLUMN)
        # Overwrite deletes first: never replace a batch the new owner is writing. Held, so
        # that a revocation waits for the directory to be whole before the claim goes back.
        with guard.holding():
            frame.write.mode("overwrite").parquet(self.path(resource, batch))
        return Landing.COMMITTED


def _with_batch(df: DataFrame, batch: int) -> DataFrame:
    from pyspark.sql import functions as sf

    frame = df.drop(PARTITION_COLUMN)
    return frame.withColumn(BATCH_COLUMN, sf.lit(batch).cast("long"))


def _table_schema(df: DataFrame) -> str:
    from pyspark.sql.types import StringType, StructField, StructType

    fields = [*df.schema.fields, StructField(PARTITION_COLUMN, StringType(), True)]
    return str(StructType(fields).json())


def _locate(spark: SparkSession, location: str) -> tuple[str, str, dict[str, str]]:
    """(URI Spark writes to, URI delta-rs commits to, delta-rs storage options)."""
    if _TABLE_NAME.match(location) and not os.path.exists(location):
        location = _catalog_location(spark, location)
    parts = urlsplit(location)
    if parts.scheme in ("s3", "s3a"):
        bucket, key = parts.netloc, parts.path.rstrip("/")
        return f"s3a://{bucket}{key}", f"s3://{bucket}{key}", _s3_options(spark, bucket)
    if parts.scheme in ("", "file"):
        path = os.path.abspath(parts.path if parts.scheme else location).rstrip("/")
        return f"file://{path}", path, {}
    raise ConfigurationError(
        f"output {location!r} has the scheme {parts.scheme!r}: a Delta output is a local or "
        "shared path, an s3a:// (or s3://) URL, or a catalog table name"
    )


def _catalog_location(spark: SparkSession, name: str) -> str:
    try:
        detail = spark.sql(f"DESCRIBE DETAIL {name}").collect()[0]
    except Exception as exc:
        raise ConfigurationError(
            f"output {name!r} looks like a catalog table name but Spark cannot describe it "
            f"({str(exc).splitlines()[0][:200]}): create it as a Delta table partitioned by "
            "_resource, or give a path"
        ) from None
    if str(detail["format"]).lower() != "delta":
        raise ConfigurationError(
            f"output table {name!r} is a {detail['format']} table, not Delta: give a Delta "
            "table or a path"
        )
    return str(detail["location"])


def s3_storage_options(spark: SparkSession, bucket: str) -> dict[str, str]:
    """delta-rs storage options for ``bucket`` from Spark's ``fs.s3a.*`` settings."""
    return _s3_options(spark, bucket)


def _s3_options(spark: SparkSession, bucket: str) -> dict[str, str]:
    """delta-rs options from Spark's ``fs.s3a.*`` settings (``fs.s3a.bucket.<b>.*`` first)."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()

    def get(key: str) -> str | None:
        value = conf.get(f"fs.s3a.bucket.{bucket}.{key}") or conf.get(f"fs.s3a.{key}")
        return None if value is None else str(value)

    options: dict[str, str] = {}
    endpoint = get("endpoint")
    if endpoint:
        ssl = (get("connection.ssl.enabled") or "true").lower() != "false"
        if "://" not in endpoint:
            endpoint = f"{'https' if ssl else 'http'}://{endpoint}"
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    for key, option in (
        ("access.key", "AWS_ACCESS_KEY_ID"),
        ("secret.key", "AWS_SECRET_ACCESS_KEY"),
        ("session.token", "AWS_SESSION_TOKEN"),
        ("endpoint.region", "AWS_REGION"),
    ):
        value = get(key)
        if value:
            options[option] = value
    if (get("path.style.access") or "").lower() == "true":
        options["AWS_FORCE_PATH_STYLE"] = "true"
    return options
