"""DataFrames of file resources: the files of one batch of one resource.

:func:`load_files` reads named files of one resource of any
:class:`~rebalancer_spark.sources.base.FileSource`: the source's own loading where it has one
(:meth:`~rebalancer_spark.sources.base.FileSource.load`; S3's, with or without hadoop-aws),
else Spark's own reader on the source's paths (local disks, NFS/SMB mounts, ``hdfs://``).
Every row gets ``_file``, the path or URL it came from. :meth:`~.batch.Batch.read` adds
``_resource`` (the resource id) and ``_batch`` (the batch id).

Spark's reader looks the named files up when the DataFrame is built. Past
``spark.sql.sources.parallelPartitionDiscovery.threshold`` paths (32 by default) it does so
with a Spark job of one task per path: 5,000 small files then took 10 s of listing tasks
here, before a row was read. A batch's files were listed by the source a moment ago and are
named one by one, so :func:`load_files` raises that threshold above the batch's size for the
time of the lookup (0.5 s for the same 5,000 files, on the driver), then puts it back. The
lookups that change it are serialised in this process, so concurrent batches never leave the
setting changed. This is for file shares and HDFS, where a lookup is a ``stat`` or a name-node call;
a source with its own loading (S3, where each lookup is a request) keeps Spark's parallel
lookup.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rebalancer_spark.sources.base import FileSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BATCH_COLUMN", "FILE_COLUMN", "RESOURCE_COLUMN", "load_files"]

RESOURCE_COLUMN = "_resource"
BATCH_COLUMN = "_batch"
FILE_COLUMN = "_file"
_GLOB = re.compile(r"([\\*?\[\]{}])")
_DISCOVERY = "spark.sql.sources.parallelPartitionDiscovery.threshold"
_LOOKUP = threading.Lock()
log = logging.getLogger("rebalancer_spark.ingest")


def load_files(
    spark: SparkSession,
    source: FileSource,
    resource: str,
    names: Sequence[str],
    *,
    format: str,
    schema: str | None,
    options: Mapping[str, str],
) -> DataFrame:
    """The files ``names`` (relative to ``resource``) as one DataFrame with ``_file``."""
    own = source.load(spark, resource, names, format=format, schema=schema, options=options)
    if own is not None:
        return own
    from pyspark.sql import functions as sf

    base = source.location(resource)
    # Hadoop takes a path string literally (no %-decoding), except for glob characters: escape
    # only those, so that "x y.csv", "p%41.csv" and "ü.csv" name exactly those files.
    paths = [base + _GLOB.sub(r"\\\1", name) for name in names]
    reader = spark.read.format(format).options(**options)
    if schema:
        reader = reader.schema(schema)
    with driver_lookup(spark, len(paths)):
        df = reader.load(paths)
    return df.withColumn(FILE_COLUMN, sf.col("_metadata.file_path"))


@contextmanager
def driver_lookup(spark: SparkSession, paths: int) -> Iterator[None]:
    """Spark looks ``paths`` named files up on the driver inside this block, not with a job of
    one task per path (see the module docstring); the setting is restored on the way out. A
    session that refuses the setting, or a Spark Connect session (whose ``load`` looks nothing
    up), is left as it is."""
    before = spark.conf.get(_DISCOVERY, None)
    if paths < int(before or 32) or getattr(spark, "_jsparkSession", None) is None:
        yield
        return
    with _LOOKUP:
        before = spark.conf.get(_DISCOVERY, None)
        try:
            spark.conf.set(_DISCOVERY, str(paths + 1))
        except Exception as exc:  # a cluster that forbids the setting: Spark's own lookup
            log.info("the files of a batch are looked up by Spark's listing job: %s", exc)
            yield
            return
        try:
            yield
        finally:
            if before is None:
                spark.conf.unset(_DISCOVERY)
            else:
                spark.conf.set(_DISCOVERY, before)
