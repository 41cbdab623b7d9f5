"""A queue batch written by Spark into the group's output Delta table: once per key and queue,
fenced by the queue's epoch.

The fetched messages become a Spark DataFrame (``_resource``, ``_key``, ``_body`` binary,
``_headers`` JSON, ``_redelivered``), the user's ``transform`` runs on it in Spark, and then,
without the rows ever coming back to the driver:

1. the table's mark for the queue is checked (:class:`~.delta_commit.DeltaCommitter`): a newer
   epoch there refuses the batch (``FencedError``); a batch id that landed already is skipped;
2. the keys of the batch's messages that the queue's partition already holds are read from that
   same table version (delta-rs on the driver: the ``_key`` column of the ``_resource=<queue>``
   partition, filtered to the batch's keys, at most ``batch`` values);
3. Spark drops the rows with those keys (a broadcast anti-join) and repeated keys within the
   batch (one row per key is kept), and writes the rest as Parquet files under the table's root
   (:meth:`.outputs.DeltaOutput.stage`);
4. the driver commits those files as one Delta commit with the queue's application transaction
   ``rebalancer-spark/<group>/<queue>`` at version ``epoch * 2**32 + batch``, the same fence as
   for files, **only if no commit of the queue landed since the version read in 2**; if one did
   (a concurrent writer of the queue won the race), the files are left out and 1-4 run again
   against the new version (:meth:`~.delta_commit.DeltaCommitter.commit_fresh`).

So the table never holds a key twice for one queue: every commit of a queue raises its mark, and
a batch is committed only against the version whose keys it was deduplicated against. A new
owner of a queue *fences* the table (:meth:`QueueOutput.fence`) before its first batch, so a
stale owner cannot land a batch after the grant, even one it had already written. A batch whose
rows were all in the table commits nothing.

``_key`` must come through ``transform`` as the message key (step 2 looks up the batch's
message keys). Cost: step 2 reads the ``_key`` column of the queue's partition; compact the table
(``OPTIMIZE``) now and then.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.sources.queues import QueueMessage
from rebalancer_spark.spark.delta_commit import PARTITION_COLUMN, Landing
from rebalancer_spark.spark.guard import WriteGuard
from rebalancer_spark.spark.job_label import JobLabel

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from rebalancer_spark.spark.outputs import DeltaOutput

__all__ = ["KEY", "RESOURCE", "QueueOutput", "Transform", "messages_table"]

log = logging.getLogger("rebalancer_spark.queues")

KEY = "_key"
RESOURCE = PARTITION_COLUMN
Transform = Callable[["DataFrame"], "DataFrame"]
"""``transform(df)``: the batch's output rows, computed by Spark; must keep ``_key``."""


def messages_table(resource: str, messages: Sequence[QueueMessage]) -> pa.Table:
    """The raw rows of a batch: ``_resource``, ``_key``, ``_body`` (bytes), ``_headers`` (a JSON
    object) and ``_redelivered``."""
    import pyarrow as pa

    return pa.table(
        {
            RESOURCE: pa.array([resource] * len(messages), pa.string()),
            KEY: pa.array([m.key for m in messages], pa.string()),
            "_body": pa.array([m.body for m in messages], pa.binary()),
            "_headers": pa.array(
                [json.dumps(dict(m.headers), sort_keys=True) for m in messages], pa.string()
            ),
            "_redelivered": pa.array([m.redelivered for m in messages], pa.bool_()),
        }
    )


class QueueOutput:
    """Queue batches into ``output``'s Delta table; see the module docstring."""

    def __init__(
        self, spark: SparkSession, output: DeltaOutput, transform: Transform | None = None
    ) -> None:
        self.spark = spark
        self.output = output
        self.transform = transform

    def __repr__(self) -> str:
        return f"QueueOutput({self.output.spark_uri!r})"

    def fence(self, resource: str, epoch: int, who: Mapping[str, str]) -> int:
        """Make the table refuse any writer of ``resource`` below ``epoch`` (before the first
        batch of a new owner); returns the highest batch id of the queue in the table."""
        return self.output.committer.fence(resource, epoch, who).batch

    def write(
        self,
        resource: str,
        epoch: int,
        batch: int,
        messages: Sequence[QueueMessage],
        who: Mapping[str, str],
        guard: WriteGuard,
    ) -> tuple[Landing, int]:
        """Write the rows of ``messages`` whose key the queue does not have yet as batch
        ``batch`` of ``resource`` at ``epoch``; returns how it ended and the rows committed.
        ``guard`` (:mod:`.guard`) raises :class:`~rebalancer_spark.FencedError` once this job
        no longer owns the queue at ``epoch`` and holds it through the commit; the table
        raises it too when it holds a newer epoch."""
        label = JobLabel(
            self.spark.sparkContext,
            f"rebalancer group={self.output.committer.group} resource={resource} epoch={epoch} "
            f"batch={batch} ({len(messages)} messages)",
            resource=resource,
            epoch=epoch,
        )
        label.set()
        try:
            return self._write(resource, epoch, batch, messages, who, guard)
        finally:
            label.restore()

    def _write(
        self,
        resource: str,
        epoch: int,
        batch: int,
        messages: Sequence[QueueMessage],
        who: Mapping[str, str],
        guard: WriteGuard,
    ) -> tuple[Landing, int]:
        frame = self.spark.createDataFrame(messages_table(resource, messages))
        if self.transform is not None:
            frame = self.transform(frame)
        if KEY not in frame.columns:
            raise ConfigurationError(
                f"the batch of queue {resource!r} has no {KEY!r} column after the transform "
                f"(columns: {frame.columns}): keep the message key column through the transform"
            )
        frame = frame.dropDuplicates([KEY])
        candidates = sorted({m.key for m in messages})

        def prepare(dataset: Any) -> tuple[Sequence[Any], int]:
            fresh = self._without_present(frame, dataset, resource, candidates)
            adds, rows, _ = self.output.stage(
                fresh, resource=resource, epoch=epoch, batch=batch, check=guard.check
            )
            return adds, rows

        return self.output.committer.commit_fresh(
            resource, epoch, batch, who, prepare=prepare, guard=guard
        )

    def _without_present(
        self, frame: DataFrame, dataset: Any, resource: str, candidates: list[str]
    ) -> DataFrame:
        """``frame`` without the rows whose key ``dataset`` (the table at one version) holds
        for ``resource``."""
        import pyarrow.compute as pc
        from pyspark.sql import functions as sf

        if dataset is None:
            return frame
        present = (
            dataset.to_table(
                columns=[KEY],
                filter=(pc.field(RESOURCE) == resource) & pc.field(KEY).isin(candidates),
            )
            .column(KEY)
            .to_pylist()
        )
        if not present:
            return frame
        keys = self.spark.createDataFrame([(k,) for k in set(present)], f"{KEY} string")
        return frame.join(sf.broadcast(keys), on=KEY, how="left_anti")
