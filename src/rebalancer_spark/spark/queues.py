"""The reference ingestion loop for queue sources on a Spark driver.

::

    source = RabbitMqSource(job.source)           # or SqsSource(job.source)
    node = start(spark, job, source)
    stats = run_queue_ingest(spark, node, source, output, stop, transform=parse_orders)

Every batch of a queue this job owns becomes a Spark DataFrame with the columns ``_resource``,
``_key`` (the dedupe key), ``_body`` (binary), ``_headers`` (JSON) and ``_redelivered``;
``transform`` (optional) turns it into the output rows and must keep ``_key``. The rows go to a
Delta table written with ``deltalake`` (:mod:`.queue_output`: one row per key and queue, even
under redelivery and stale owners), then the progress is committed fenced by the resource
epoch, then the messages are acknowledged (:mod:`.queue_loop`). Each batch sets the Spark job
description to ``rebalancer group=… resource=… epoch=…``.

The messages pass through the driver (they come from one broker connection per queue); Spark
runs the transformation. That suits queues whose batches fit in the driver's memory, which a
bounded ``batch=`` guarantees.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from rebalancer_spark.sources.queues import QueueSource
from rebalancer_spark.spark.queue_loop import QueueLoop, QueueStats
from rebalancer_spark.spark.queue_output import KeyedDeltaOutput
from rebalancer_spark.spark.session import RebalancerNode

if TYPE_CHECKING:
    import pyarrow as pa
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
    """Run the loop until ``stop`` is set; see the module docstring."""

    def process(resource: str, epoch: int, table: pa.Table) -> pa.Table:
        sc = spark.sparkContext
        sc.setJobDescription(
            f"rebalancer group={node.member.group} resource={resource} epoch={epoch} "
            f"({table.num_rows} messages)"
        )
        sc.setLocalProperty("spark.rebalancer.resource", resource)
        sc.setLocalProperty("spark.rebalancer.epoch", str(epoch))
        df = spark.createDataFrame(table)
        if transform is not None:
            df = transform(df)
        result: pa.Table = df.toArrow()
        return result

    def audit_first() -> None:
        if node.audit is not None and not node.audit.flush(timeout=30):
            log.warning("audit table %s lags behind: %s", node.job.audit, node.audit.last_error)

    loop = QueueLoop(
        node.member,
        source,
        KeyedDeltaOutput(output),
        process=process,
        before_first_batch=audit_first,
    )
    return loop.run(stop, node.job.poll_interval)


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

    return job_main(argv, prog, loop, schemes=schemes, make_source=make_source)
