"""The unit of work: one batch of one owned resource, planned, read, written and committed.

::

    from rebalancer_spark.spark import batches

    for batch in batches(spark):                  # what this job owns now, one batch each
        with batch:                               # a fenced plan, read, write or commit ends
            df = batch.read()                     #   the batch quietly (batch.outcome)
            batch.write(df.where("amount > 0"))   # one fenced Delta commit, then the progress

:func:`batches` goes once over the resources this job owns now and yields the next batch of
each one that has work (:meth:`AssignedSource.next_batch`: the batch an earlier owner left
unfinished, or a new one planned from the pending files). Inside ``with batch``:

* :meth:`Batch.read` gives the batch's files as a DataFrame with ``_resource``, ``_batch`` and
  ``_file`` columns, and names group, resource, epoch and batch in the Spark job description
  of the calling thread until the batch ends (``with batch`` exits, or ``write``/``commit``
  returns), when the thread's previous description is put back;
* :meth:`Batch.write` writes a DataFrame as that batch to the job's output (:mod:`.outputs`) —
  fenced inside the output's own commit — and then marks the files done, fenced again;
  :meth:`Batch.commit` only marks them done, for a pipeline that wrote them elsewhere itself.

Every step checks ownership first, and every way ownership can be found gone — the store
refusing the plan or the progress, the Delta table refusing the commit, the local lease
lapsing — is the same :class:`~rebalancer_spark.FencedError`, which ``with batch`` swallows
(``batch.outcome`` is then ``"fenced"``, with a log line): the new owner re-runs or skips the
batch. Any other error propagates and leaves the batch planned, to be retried, same files, same
batch id. A batch left without ``write``/``commit`` also stays planned.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import TracebackType
from typing import TYPE_CHECKING

from rebalancer_spark.core.errors import (
    BackendUnavailable,
    CorruptStateError,
    FencedError,
    RebalancerError,
    SourceError,
)
from rebalancer_spark.spark.delta_commit import Landing
from rebalancer_spark.spark.file_progress import FileBatch
from rebalancer_spark.spark.job_label import JobLabel
from rebalancer_spark.spark.source import AssignedSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from rebalancer_spark.spark.session import RebalancerNode

__all__ = ["Batch", "batches"]

log = logging.getLogger("rebalancer_spark.ingest")


class Batch:
    """One planned batch of one resource; see the module docstring."""

    def __init__(self, source: AssignedSource, spark: SparkSession, planned: FileBatch) -> None:
        self.source = source
        self.spark = spark
        self.planned = planned
        self.outcome: str | None = None
        self._label: JobLabel | None = None
        """None while open; then ``"written"``, ``"landed"`` (an earlier attempt had landed
        it), ``"committed"``, ``"fenced"``, ``"failed"`` or ``"open"`` (left planned)."""

    def __repr__(self) -> str:
        return (
            f"Batch({self.resource!r}, epoch={self.epoch}, id={self.id}, "
            f"{len(self.files)} files, outcome={self.outcome})"
        )

    @property
    def resource(self) -> str:
        return self.source.resource

    @property
    def epoch(self) -> int:
        return self.source.epoch

    @property
    def id(self) -> int:
        return self.planned.id

    @property
    def files(self) -> tuple[str, ...]:
        return self.planned.files

    def read(self) -> DataFrame:
        """The batch's files as a DataFrame: their own columns, then ``_file`` (path or URL),
        ``_resource`` and ``_batch``."""
        from pyspark.sql import functions as sf

        from rebalancer_spark.spark.reading import BATCH_COLUMN, RESOURCE_COLUMN, load_files

        self.source.check_owner()
        self._labelled()
        settings = self.source.read_settings
        df = load_files(
            self.spark,
            self.source.files_source(),
            self.resource,
            self.files,
            format=settings.format,
            schema=settings.schema,
            options=dict(settings.options or {}),
        )
        return df.withColumn(RESOURCE_COLUMN, sf.lit(self.resource)).withColumn(
            BATCH_COLUMN, sf.lit(self.id)
        )

    def _labelled(self) -> None:
        """Name group, resource, epoch and batch in the thread's Spark job description."""
        if self._label is None:
            description = (
                f"rebalancer group={self.source.group} resource={self.resource} "
                f"epoch={self.epoch} batch={self.id} ({len(self.files)} files)"
            )
            self._label = JobLabel(
                self.spark.sparkContext, description, resource=self.resource, epoch=self.epoch
            )
        self._label.set()

    def _unlabelled(self) -> None:
        """The thread's job description as it was before this batch."""
        if self._label is not None:
            self._label.restore()

    def write(self, df: DataFrame) -> None:
        """Write ``df`` as this batch to the job's output in one fenced commit, then mark the
        batch's files done (fenced). Raises :class:`FencedError` if ownership moved on."""
        output = self.source.output
        if output is None:
            raise RebalancerError(
                f"{self!r}: this job has no output to write to: give it --output, or write the "
                "rows yourself and call batch.commit()"
            )
        self._labelled()
        try:
            landing = output.write(
                df,
                resource=self.resource,
                epoch=self.epoch,
                batch=self.id,
                who=self.source.who,
                guard=self.source.guard,
            )
            self.source.mark_done(self.planned)
        finally:
            self._unlabelled()
        self.outcome = "written" if landing is Landing.COMMITTED else "landed"

    def commit(self) -> None:
        """Mark the batch's files done, fenced, after the pipeline wrote them itself."""
        try:
            self.source.check_owner()
            self.source.mark_done(self.planned)
        finally:
            self._unlabelled()
        self.outcome = "committed"

    def __enter__(self) -> Batch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._unlabelled()
        if exc is None:
            if self.outcome is None:
                self.outcome = "open"
            return False
        if isinstance(exc, FencedError):
            self.outcome = "fenced"
            log.warning("%s: ownership moved on, the batch is left to the new owner: %s", self, exc)
            return True
        self.outcome = "failed"
        return False


def batches(spark: SparkSession, node: RebalancerNode | None = None) -> Iterator[Batch]:
    """One pass over the resources this job owns now (``node``: this driver's node by
    default), yielding the next batch of each resource that has work; see the module
    docstring. A resource found fenced is skipped with a log line; one whose progress record
    is unreadable or whose files cannot be listed is *stuck* (:meth:`AssignedSource.note_stuck`:
    logged once, shown by ``status`` and the metrics) and retried on the next pass, while the
    other resources go on."""
    from rebalancer_spark.spark.session import current_node

    node = node or current_node()
    for src in node.assigned_sources():
        try:
            batch = src.next_batch(spark)
        except FencedError as exc:
            log.warning("%s: ownership moved on before a batch was planned: %s", src, exc)
            continue
        except (SourceError, CorruptStateError) as exc:
            if src.stuck is None:
                log.error("%s is stuck (retried on every pass; the others go on): %s", src, exc)
            src.note_stuck(exc)
            continue
        except BackendUnavailable as exc:
            # The store is restarting or paused: planning is retried on the next pass (the
            # lease ends the job's ownership if the store stays away past it).
            log.warning("%s: no batch planned, the store is unavailable: %s", src, exc)
            continue
        if batch is not None:
            yield batch
