"""Reading the objects of an S3 resource into a Spark DataFrame, with or without hadoop-aws.

Two paths, chosen by the source's ``reader`` option (``auto`` picks the first that works):

* ``s3a`` (the normal path): where ``org.apache.hadoop.fs.s3a.S3AFileSystem`` is on Spark's
  classpath (hadoop-aws: a cluster's own, ``--packages``, or the jars ``scripts/setup.sh``
  fetches, see :mod:`.packages`), Spark's own reader loads ``s3a://bucket/key`` paths and the
  executors read the objects; the driver only plans. The source's S3 settings become
  per-bucket Hadoop keys, ``fs.s3a.bucket.<bucket>.*``, so that two sources on two endpoints
  do not clash: ``endpoint.region``, and with ``endpoint_url`` also ``endpoint``,
  ``path.style.access=true`` and ``connection.ssl.enabled`` (off for ``http://``). The
  credentials are those boto3 resolves for the source (its chain or ``?profile=``), set as
  ``access.key``/``secret.key`` (and ``session.token`` with S3A's temporary-credentials
  provider) of that bucket; an instance or container role is left to S3A's own chain, which
  renews it; no credentials means anonymous access. A key you set yourself, per bucket or
  for every bucket (``spark.hadoop.fs.s3a.…`` or ``core-site.xml``), is never overridden,
  except that the endpoint (and a region) written in the source's URL beats a job-wide key.
  The values are set once per bucket and Spark session (S3A caches its filesystem): for
  short-lived credentials on a long job, prefer a role or your own credentials provider.
  Credentials are never logged nor put in an error message.
* ``arrow`` (the fallback where hadoop-aws is absent, or forced by ``reader=arrow``): the
  driver fetches the batch's objects with ``pyarrow.fs.S3FileSystem`` using the credentials
  boto3 resolved. ``parquet`` and ``orc`` become Arrow tables handed to
  ``spark.createDataFrame`` (cast to the schema when one is given); ``csv``, ``json`` and
  ``text`` are handed to Spark's own parsers (``spark.read.csv(rdd)``), so the reader options
  and the DDL schema mean what they mean on the file path. Limits: the batch passes through
  the driver's memory (keep ``max_files_per_batch`` times the object size modest), and CSV
  records must not span lines.

Both paths give the rows plus ``_file``, the object's URL ``s3://bucket/key`` (the key as
written, not %-quoted), so that an output does not depend on the reader.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rebalancer_spark.core.errors import ConfigurationError, SourceError
from rebalancer_spark.sources.s3.source import S3Source
from rebalancer_spark.spark.packages import HADOOP_AWS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["configure_s3a", "load_s3", "s3a_available", "s3a_paths"]

log = logging.getLogger("rebalancer_spark.spark.s3")

S3A_CLASS = "org.apache.hadoop.fs.s3a.S3AFileSystem"
_GLOB = re.compile(r"([\\*?\[\]{}])")
_LINES = re.compile(r"\r\n|\r|\n")
_ROLES = ("iam-role", "container-role")
_PY4J_LOGGERS = ("py4j", "py4j.clientserver", "py4j.java_gateway", "py4j.protocol")
_warned = threading.Event()  # the fallback is announced once per driver
_configured: set[tuple[str, str]] = set()  # (Spark application id, bucket)
_configured_lock = threading.Lock()


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
        if reader == "arrow" and not _warned.is_set():
            _warned.set()
            log.warning(
                "%s is not on Spark's classpath: S3 objects are read on the driver with "
                "pyarrow (the fallback); add %s for Spark's s3a:// reader",
                S3A_CLASS,
                HADOOP_AWS,
            )
    elif reader == "s3a" and not s3a_available(spark):
        raise ConfigurationError(
            f"source {source!r} asks for reader=s3a but {S3A_CLASS} is not on Spark's "
            f"classpath: add {HADOOP_AWS} (matching Spark's Hadoop; scripts/setup.sh fetches "
            "it, see rebalancer_spark.spark.packages) or use reader=arrow"
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

    configure_s3a(spark, source)
    reader = spark.read.format(format).options(**options)
    if schema:
        reader = reader.schema(schema)
    df = reader.load(s3a_paths(source.bucket, keys))
    # Spark names a file by its URI (s3a://, %-quoted): give it back as the arrow path does.
    jvm: Any = spark.sparkContext._jvm
    urls: list[Any] = []
    for key in keys:
        uri = str(jvm.org.apache.hadoop.fs.Path(f"s3a://{source.bucket}/{key}").toUri())
        urls += [sf.lit(uri), sf.lit(f"s3://{source.bucket}/{key}")]
    spark_path = sf.col("_metadata.file_path")
    return df.withColumn("_file", sf.coalesce(sf.create_map(*urls)[spark_path], spark_path))


def configure_s3a(spark: SparkSession, source: S3Source) -> None:
    """Sets ``source``'s endpoint, region and credentials as S3A keys of its bucket in
    ``spark``'s Hadoop configuration, leaving every key the job set itself (module docstring).
    Once per bucket and Spark application; logs what it chose, never a secret."""
    done = (str(spark.sparkContext.applicationId), source.bucket)
    with _configured_lock:
        if done in _configured:
            return
        credentials = _configure(spark.sparkContext._jsc.hadoopConfiguration(), source)
        _configured.add(done)
    log.info(
        "s3a://%s/ is read by Spark with the endpoint and region of %r and %s",
        source.bucket,
        source,
        credentials,
    )


def _configure(conf: Any, source: S3Source) -> str:
    base = f"fs.s3a.bucket.{source.bucket}."

    def unset(*names: str, bucket_only: bool = False) -> bool:
        prefixes = (base,) if bucket_only else (base, "fs.s3a.")
        return not any(_set_by_user(conf, p + n) for n in names for p in prefixes)

    # What the source's URL says beats a job-wide key; a key for this bucket beats both.
    wanted = {"endpoint.region": (source.region_name(), source.region is not None)}
    if source.endpoint_url:
        ssl = str(source.endpoint_url.startswith("https:")).lower()
        wanted["endpoint"] = (source.endpoint_url, True)
        wanted["path.style.access"] = ("true", True)
        wanted["connection.ssl.enabled"] = (ssl, True)
    for key, (value, explicit) in wanted.items():
        if unset(key, bucket_only=explicit):
            conf.set(base + key, value)
    if not unset("access.key", "secret.key", "aws.credentials.provider"):
        return "the credentials of the job's own fs.s3a keys"
    method = source.credential_method()
    if method in _ROLES:  # S3A's default chain asks the role, and renews its credentials
        return f"the credentials of S3A's own chain (boto3 found an {method})"
    provider = "AnonymousAWSCredentialsProvider"
    credentials = source.credentials()
    if credentials is not None:
        access, secret, token = credentials
        with _py4j_quiet():
            conf.set(base + "access.key", access)
            conf.set(base + "secret.key", secret)
            provider = "SimpleAWSCredentialsProvider"
            if token:
                conf.set(base + "session.token", token)
                provider = "TemporaryAWSCredentialsProvider"
    conf.set(base + "aws.credentials.provider", "org.apache.hadoop.fs.s3a." + provider)
    if credentials is None:
        return "no credentials (anonymous: boto3 found none)"
    return f"the credentials boto3 found ({method})"


@contextlib.contextmanager
def _py4j_quiet() -> Iterator[None]:
    """Py4J logs every command it sends at DEBUG: keep secrets out of a debug log."""
    loggers = [logging.getLogger(name) for name in _PY4J_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(max(logger.getEffectiveLevel(), logging.INFO))
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _set_by_user(conf: Any, key: str) -> bool:
    """Whether ``key`` has a value that is neither one of Hadoop's ``*-default.xml`` defaults
    nor a copy Spark made of the ``AWS_*`` environment variables (``fs.s3a.access.key`` …,
    the same credentials boto3's chain finds first, unless the source names a profile)."""
    if conf.get(key) is None:
        return False
    sources = conf.getPropertySources(key)
    if sources is None:
        return True
    return any(
        not (str(where).endswith("-default.xml") or " from AWS_" in str(where)) for where in sources
    )


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
