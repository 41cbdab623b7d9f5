"""Reading the objects of an S3 resource into a Spark DataFrame, with or without hadoop-aws.

Two paths, chosen by the source's ``reader`` option (``auto`` picks the first that works):

* ``s3a``: where ``org.apache.hadoop.fs.s3a.S3AFileSystem`` is on Spark's classpath (a cluster
  with hadoop-aws), Spark's own reader loads ``s3a://bucket/key`` paths in the executors. The
  source's endpoint and region are set as per-bucket Hadoop keys
  (``fs.s3a.bucket.<bucket>.endpoint``, ``…endpoint.region``, ``…path.style.access``) unless
  the job already set them (``spark.hadoop.fs.s3a.…``); credentials come from S3A's own chain
  (environment, instance role) or from the ``spark.hadoop.fs.s3a.*`` keys you give.
* ``arrow``: elsewhere (pyspark from PyPI has no hadoop-aws), the driver fetches the batch's
  objects with ``pyarrow.fs.S3FileSystem`` using the credentials boto3 resolved. ``parquet``
  and ``orc`` become Arrow tables handed to ``spark.createDataFrame`` (cast to the schema when
  one is given); ``csv``, ``json`` and ``text`` are handed to Spark's own parsers
  (``spark.read.csv(rdd)``), so the reader options and the DDL schema mean what they mean on
  the file path. Limits: the batch passes through the driver's memory (keep
  ``max_files_per_batch`` times the object size modest), and CSV records must not span lines.

Both paths give the rows plus ``_file``, the object's URL.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rebalancer_spark.core.errors import ConfigurationError, SourceError
from rebalancer_spark.sources.s3 import S3Source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["load_s3", "s3a_available", "s3a_paths"]

log = logging.getLogger("rebalancer_spark.spark.s3")

S3A_CLASS = "org.apache.hadoop.fs.s3a.S3AFileSystem"
_GLOB = re.compile(r"([\\*?\[\]{}])")
_LINES = re.compile(r"\r\n|\r|\n")


def s3a_available(spark: SparkSession) -> bool:
    """Whether Spark's JVM can load the S3A filesystem (hadoop-aws is on the classpath)."""
    jvm: Any = spark.sparkContext._jvm
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(S3A_CLASS, False, loader)
    except Exception:
        return False
    return True


def load_s3(
    spark: SparkSession,
    source: S3Source,
    resource: str,
    names: Sequence[str],
    *,
    format: str,
    schema: str | None,
    options: Mapping[str, str],
) -> DataFrame:
    """The objects ``names`` of ``resource`` as one DataFrame with a ``_file`` column."""
    reader = source.reader
    if reader == "auto":
        reader = "s3a" if s3a_available(spark) else "arrow"
    elif reader == "s3a" and not s3a_available(spark):
        raise ConfigurationError(
            f"source {source!r} asks for reader=s3a but {S3A_CLASS} is not on Spark's "
            "classpath: add hadoop-aws (matching Spark's Hadoop version) or use reader=arrow"
        )
    keys = [source.key_prefix(resource) + name for name in names]
    if reader == "s3a":
        return _load_s3a(spark, source, keys, format, schema, options)
    return _load_arrow(spark, source, keys, format, schema, options)


def _load_s3a(
    spark: SparkSession,
    source: S3Source,
    keys: Sequence[str],
    format: str,
    schema: str | None,
    options: Mapping[str, str],
) -> DataFrame:
    from pyspark.sql import functions as sf

    conf: Any = spark.sparkContext._jsc.hadoopConfiguration()
    base = f"fs.s3a.bucket.{source.bucket}."
    wanted = {"endpoint.region": source.region_name()}
    if source.endpoint_url:
        wanted["endpoint"] = source.endpoint_url
        wanted["path.style.access"] = "true"
        wanted["connection.ssl.enabled"] = str(source.endpoint_url.startswith("https:")).lower()
    for key, value in wanted.items():
        if conf.get(base + key) is None and conf.get("fs.s3a." + key) is None:
            conf.set(base + key, value)
    paths = s3a_paths(source.bucket, keys)
    reader = spark.read.format(format).options(**options)
    if schema:
        reader = reader.schema(schema)
    return reader.load(paths).withColumn("_file", sf.col("_metadata.file_path"))


def s3a_paths(bucket: str, keys: Sequence[str]) -> list[str]:
    """The ``s3a://`` paths Spark reads ``keys`` from. Hadoop takes a path string literally (it
    does not %-decode it) and S3A asks for ``path.toUri().getPath()``, the key as written, so
    a key is not %-quoted: only glob characters are escaped."""
    return [f"s3a://{bucket}/" + _GLOB.sub(r"\\\1", k) for k in keys]


def _filesystem(source: S3Source) -> Any:
    from pyarrow import fs

    kwargs: dict[str, Any] = {
        "region": source.region_name(),
        "connect_timeout": source.connect_timeout,
        "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=source.retries),
    }
    if source.endpoint_url:
        parts = urlsplit(source.endpoint_url)
        kwargs["endpoint_override"] = parts.netloc
        kwargs["scheme"] = parts.scheme
    credentials = source.credentials()
    if credentials is None:
        kwargs["anonymous"] = True
    else:
        kwargs["access_key"], kwargs["secret_key"], kwargs["session_token"] = credentials
    return fs.S3FileSystem(**kwargs)


def _load_arrow(
    spark: SparkSession,
    source: S3Source,
    keys: Sequence[str],
    format: str,
    schema: str | None,
    options: Mapping[str, str],
) -> DataFrame:
    from pyspark.sql import functions as sf

    filesystem = _filesystem(source)
    frames = []
    for key in keys:
        url = f"s3://{source.bucket}/{key}"
        try:
            df = _one_object(spark, filesystem, f"{source.bucket}/{key}", format, schema, options)
        except OSError as exc:
            raise SourceError(
                f"cannot read {url} of source {source!r} ({exc}): the object may have been "
                "deleted, or the endpoint or credentials are wrong; the batch stays planned "
                "and is retried"
            ) from None
        frames.append(df.withColumn("_file", sf.lit(url)))
    return functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames)


def _one_object(
    spark: SparkSession,
    filesystem: Any,
    path: str,
    format: str,
    schema: str | None,
    options: Mapping[str, str],
) -> DataFrame:
    from pyspark.sql import functions as sf

    if format in ("parquet", "orc"):
        if format == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path, filesystem=filesystem)
        else:
            import pyarrow.orc as po

            with filesystem.open_input_file(path) as handle:
                table = po.read_table(handle)
        df = spark.createDataFrame(table)
        if schema:
            fields = spark.createDataFrame([], schema).schema.fields
            df = df.select([sf.col(f"`{f.name}`").cast(f.dataType).alias(f.name) for f in fields])
        return df
    lowered = {k.lower(): v for k, v in options.items()}
    encoding = lowered.get("encoding") or lowered.get("charset") or "utf-8"
    with filesystem.open_input_stream(path) as handle:
        text = handle.read().decode(encoding)
    whole = lowered.get("wholetext" if format == "text" else "multiline", "").lower() == "true"
    lines = [text] if whole else _LINES.split(text)
    if lines and lines[-1] == "" and not whole:
        lines.pop()  # the final newline ends the last line, it does not start one
    if format == "text":
        return spark.createDataFrame([(line,) for line in lines], "value STRING")
    rdd: Any = spark.sparkContext.parallelize(lines, 1)  # the readers take an RDD too
    reader = spark.read.options(**options)
    if schema:
        reader = reader.schema(schema)
    if format == "csv":
        return reader.csv(rdd)
    if format == "json":
        return reader.json(rdd)
    raise ConfigurationError(
        f"format {format!r} cannot be read from S3 here: use csv, json, text, parquet or orc"
    )
