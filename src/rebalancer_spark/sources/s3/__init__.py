"""The S3 source plug-in (``s3://bucket/prefix/``): discovery and listing with boto3
(:mod:`.source`) and its own Spark-side loading (:mod:`.spark_read`: Spark's ``s3a://``
reader, or pyarrow where hadoop-aws is absent), reached through the
:class:`~rebalancer_spark.sources.base.FileSource` hooks. boto3, pyarrow and pyspark are
imported only when used."""

from __future__ import annotations

from rebalancer_spark.sources.s3.source import S3Source

__all__ = ["S3Source"]
