"""The reference ingestion loop for queue sources on a Spark driver.

::

    source = RabbitMqSource(job.source)           # or SqsSource(job.source)
    node = start(spark, job, source)
    stats = run_queue_ingest(spark, node, source, output, stop, transform=parse_orders)

Every batch of a queue this job owns becomes a Spark DataFrame with the columns ``_resource``,
``_key`` (the dedupe key), ``_body`` (binary), ``_headers`` (JSON) and ``_redelivered``;
``transform`` (optional) turns it into the output rows in Spark and must keep ``_key``. Spark
writes the rows whose key the queue does not have yet as Parquet files into the group's output
Delta table, and the driver commits them in one Delta commit fenced by the queue's epoch, like
a file batch (:mod:`.queue_output`: one row per key and queue, even under redelivery and stale
owners); then the progress is committed fenced by the epoch, then the messages are
acknowledged (:mod:`.queue_loop`). Each batch sets the Spark job description to
``rebalancer group=… resource=… epoch=… batch=…``.

The messages reach the driver (they come from one broker connection per queue) and go to Spark
as the batch's DataFrame; the rows after the transform never come back to the driver. That suits
queues whose batches fit in the driver's memory, which a bounded ``batch=`` guarantees.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.sources.queues import QueueSource
from rebalancer_spark.spark.job_config import JobConfig
from rebalancer_spark.spark.outputs import DeltaOutput
from rebalancer_spark.spark.queue_loop import QueueLoop, QueueStats
from rebalancer_spark.spark.queue_output import QueueOutput
from rebalancer_spark.spark.session import RebalancerNode

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["queue_job_main", "run_queue_ingest"]

log = logging.getLogger("rebalancer_spark.queues")


def run_queue_ingest(
    spark: SparkSession,
    node: RebalancerNode,
    source: QueueSource,
    output: str,
    stop: threading.Event,
    *,
    transform: Callable[[DataFrame], DataFrame] | None = None,
) -> QueueStats:
    """Run the loop until ``stop`` is set, writing to the Delta table ``output`` (a path, an
    ``s3a://`` URL or a catalog table name); see the module docstring."""
    delta = node.output
    if not isinstance(delta, DeltaOutput) or delta.location != output:
        delta = DeltaOutput(spark, output, node.member.group)
    loop = QueueLoop(
        node.member,
        source,
        QueueOutput(spark, delta, transform),
        before_first_batch=node.flush_audit,
        watch=node.queue_lag,
    )
    return loop.run(stop, node.job.poll_interval)


def _delta_only(job: JobConfig) -> None:
    if job.output_format != "delta":
        raise ConfigurationError(
            f"--output-format {job.output_format} is not available for queue jobs: their output "
            "is a Delta table (one row per message key), so give --output-format delta"
        )


def queue_job_main(
    argv: Sequence[str],
    prog: str,
    make_source: Callable[[str], QueueSource],
    *,
    schemes: Collection[str],
    transform: Callable[[DataFrame], DataFrame] | None = None,
) -> int:
    """The whole of a ``spark-submit`` queue job (``jobs/ingest_rabbitmq.py``,
    ``jobs/ingest_sqs.py``) on :func:`~rebalancer_spark.spark.jobs.job_main`: open the source
    with ``make_source``, join the group, run :func:`run_queue_ingest` until SIGTERM or
    Ctrl-C, then drain and leave. Returns the exit code (2 for bad options)."""
    from rebalancer_spark.spark.jobs import JobContext, job_main

    def loop(ctx: JobContext) -> str:
        assert isinstance(ctx.source, QueueSource)
        stats = run_queue_ingest(
            ctx.spark, ctx.node, ctx.source, ctx.output, ctx.stop, transform=transform
        )
        return (
            f"{stats.batches} batches, {stats.messages} messages, {stats.written} rows "
            f"written, {stats.duplicates} duplicates dropped, {stats.fenced} fenced"
        )

    return job_main(argv, prog, loop, schemes=schemes, make_source=make_source, check=_delta_only)
