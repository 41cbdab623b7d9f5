"""The reference ingestion loop: every file of every owned resource lands in the output once.

Resources are the directories of a file share or the sub-prefixes of an S3 prefix.

For each resource this job owns now, read the next batch of files (see
:mod:`rebalancer_spark.spark.source` for why batches make this exactly-once), write it as
Parquet to the batch's own directory, replacing anything a killed owner left there, and commit.
Resources come and go while the loop runs; a batch whose commit is fenced, or whose resource
was lost before its output was written, is simply dropped (the new owner re-runs it); a batch
whose Spark read or write fails stays planned and is retried. The loop ends when ``stop`` is
set.

One window remains: an owner that loses the resource *while* Spark writes (a pause longer than
the lease in the middle of the write) may still finish replacing that batch's directory after
the new owner re-ran and committed it. The rows it writes are the same rows (same files, same
batch), but a kill in the middle of that late write would leave the directory incomplete.
Keep the session timeout well above the longest expected pause of a driver.

The output is partitioned as ``output/resource=<id>/batch=<n>/`` so that
``spark.read.parquet(output)`` gives every row with its ``resource`` and ``batch`` columns.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rebalancer_spark.core.errors import FencedError, RebalancerError, SourceError
from rebalancer_spark.spark.session import RebalancerNode

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["IngestStats", "run_ingest"]

log = logging.getLogger("rebalancer_spark.ingest")


@dataclass(slots=True)
class IngestStats:
    """What one job's loop did."""

    batches: int = 0
    files: int = 0
    rows: int = 0
    fenced: int = 0
    errors: int = 0
    per_resource: dict[str, int] = field(default_factory=dict)


def run_ingest(
    spark: SparkSession, node: RebalancerNode, output: str, stop: threading.Event
) -> IngestStats:
    """Run the loop until ``stop`` is set; see the module docstring."""
    stats = IngestStats()
    name = node.member.member_id
    while not stop.is_set():
        worked = False
        for src in node.assigned_sources():
            if stop.is_set():
                break
            try:
                df = src.read(spark)
                if df is None:
                    continue
                batch = src.batch
                assert batch is not None
                target = src.output_path(output)
                rows = df.count()
                owned = node.member.owns(src.resource)
                if owned is None or owned.epoch != src.epoch:
                    # Lost while reading: the new owner re-runs this batch; writing now could
                    # replace output it already committed (overwrite deletes first).
                    stats.fenced += 1
                    log.warning("[%s] %s: lost before writing, batch dropped", name, src)
                    continue
                df.drop("_resource", "_batch").write.mode("overwrite").parquet(target)
                src.commit()
            except FencedError as exc:
                stats.fenced += 1
                log.warning("[%s] %s: ownership moved on, batch dropped: %s", name, src, exc)
                continue
            except SourceError as exc:
                log.warning("[%s] %s: cannot list files, retrying: %s", name, src, exc)
                continue
            except RebalancerError as exc:
                log.warning("[%s] %s: %s", name, src, exc)
                continue
            except Exception:  # a Spark read or write failed: the batch stays planned
                stats.errors += 1
                log.exception(
                    "[%s] %s: batch failed; it is retried (same files, same path)", name, src
                )
                continue
            worked = True
            stats.batches += 1
            stats.files += len(batch.files)
            stats.rows += rows
            stats.per_resource[src.resource] = stats.per_resource.get(src.resource, 0) + 1
            log.info(
                "[%s] %s epoch %d batch %d: %d files, %d rows -> %s",
                name,
                src.resource,
                src.epoch,
                batch.id,
                len(batch.files),
                rows,
                target,
            )
        if not worked:
            stop.wait(node.job.poll_interval)
    return stats
