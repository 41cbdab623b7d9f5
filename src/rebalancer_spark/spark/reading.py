"""DataFrames of file resources: the files of one batch of one resource.

:func:`load_files` reads named files of one resource of any
:class:`~rebalancer_spark.sources.base.FileSource`: the source's own loading where it has one
(:meth:`~rebalancer_spark.sources.base.FileSource.load`; S3's, with or without hadoop-aws),
else Spark's own reader on the source's paths (local disks, NFS/SMB mounts, ``hdfs://``).
Every row gets ``_file``, the path or URL it came from. :meth:`~.batch.Batch.read` adds
``_resource`` (the resource id) and ``_batch`` (the batch id).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rebalancer_spark.sources.base import FileSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BATCH_COLUMN", "FILE_COLUMN", "RESOURCE_COLUMN", "load_files"]

RESOURCE_COLUMN = "_resource"
BATCH_COLUMN = "_batch"
FILE_COLUMN = "_file"
_GLOB = re.compile(r"([\\*?\[\]{}])")


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
    return reader.load(paths).withColumn(FILE_COLUMN, sf.col("_metadata.file_path"))
