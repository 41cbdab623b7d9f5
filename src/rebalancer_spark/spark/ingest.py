"""The reference ingestion loop: every file of every owned resource lands in the output once.

Resources are the directories of a file share or the sub-prefixes of an S3 prefix. The loop is
:func:`~rebalancer_spark.spark.batch.batches` run until ``stop`` is set::

    for batch in batches(spark, node):
        with batch:
            batch.write(batch.read())

Each batch is written to the job's output (by default a Delta table, in one commit fenced by
the resource epoch inside Delta; :mod:`.outputs`) and then committed in the store. A batch
found fenced anywhere is dropped (the new owner re-runs or skips it); a batch whose Spark read
or write fails stays planned and is retried with the same files and batch id; a resource whose
files cannot be listed is retried on the next pass.

With ``once`` (``jobs/ingest_files.py --once``, for a scheduler: Airflow, cron) the loop ends
by itself once the *group* has nothing pending: every resource of the group has an owner whose
last planning found no file pending and no batch open (as the progress records in the store
say), or is stuck. The job then stops as on SIGTERM, draining on the way, so N copies started
together all exit once everything that was there is ingested. :attr:`IngestStats.stuck` says
which resources were stuck at the end (the job then exits 1).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rebalancer_spark.core.errors import RebalancerError
from rebalancer_spark.core.model import Progress
from rebalancer_spark.spark.batch import batches
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
    landed_before: int = 0
    """Batches found already in the output (a previous attempt or owner landed them)."""
    per_resource: dict[str, int] = field(default_factory=dict)
    stuck: dict[str, str] = field(default_factory=dict)
    """With ``once``: the resources stuck when the loop ended, and why."""


def run_ingest(
    spark: SparkSession, node: RebalancerNode, stop: threading.Event, *, once: bool = False
) -> IngestStats:
    """Run the loop until ``stop`` is set (with ``once``: also until the group has nothing
    pending); see the module docstring."""
    stats = IngestStats()
    while not stop.is_set():
        worked = False
        for batch in batches(spark, node):
            if stop.is_set():
                break
            try:
                with batch:
                    batch.write(batch.read())
            except RebalancerError as exc:
                stats.errors += 1
                log.warning("%s: %s; the batch is retried", batch, exc)
                batch.source.note_stuck(exc)
                continue
            except Exception as exc:  # a Spark read or write failed: the batch stays planned
                stats.errors += 1
                if batch.source.stuck is None:
                    log.exception("%s failed; it is retried (same files, same batch id)", batch)
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                batch.source.note_stuck(
                    f"batch {batch.id} fails ({type(exc).__name__}: {first}); fix or replace "
                    f"the file, or `rebalancer-spark progress skip --batch {batch.id}`"
                )
                continue
            if batch.outcome == "fenced":
                stats.fenced += 1
                continue
            worked = True
            stats.batches += 1
            stats.landed_before += batch.outcome == "landed"
            stats.files += len(batch.files)
            stats.per_resource[batch.resource] = stats.per_resource.get(batch.resource, 0) + 1
            log.info(
                "%s epoch %d batch %d: %d files -> %s (%s)",
                batch.resource,
                batch.epoch,
                batch.id,
                len(batch.files),
                node.job.output,
                batch.outcome,
            )
        if not worked:
            if once and _group_done(node, stats):
                log.info("--once: the group has nothing pending; stopping")
                break
            stop.wait(node.job.poll_interval)
    return stats


def _group_done(node: RebalancerNode, stats: IngestStats) -> bool:
    """Whether the source was listed, the assignment of that listing is out, and every
    resource of the group is owned and, by its progress record, has no file pending and no
    batch open, or is stuck (then named in ``stats.stuck``)."""
    from rebalancer_spark.backends import open_backend

    for src in node.assigned_sources():
        try:
            open_batch = src.planned is not None
        except RebalancerError:
            continue  # its record or its batch's plan cannot be read: it is stuck
        if open_batch or (src.stuck is None and src.pending_files()):
            return False
    group = node.member.group
    with open_backend(node.job.member.backend) as store:
        state = store.state(group)
        target = state.target
        names = sorted(state.resources)
        listed = (
            target is not None
            and state.resources_version > 0  # the source was listed
            and target.resources_version == state.resources_version  # and assigned
            and not set(names) - set(state.claims)  # and every resource is owned
        )
        if not listed:
            return False
        progress = store.progress(group, names)
    stuck = _stuck_or_pending(names, progress)
    if stuck is None:
        return False
    stats.stuck = stuck
    return True


def _stuck_or_pending(names: list[str], progress: Mapping[str, Progress]) -> dict[str, str] | None:
    """The stuck resources among ``names``, or None while one of the others has work."""
    from rebalancer_spark.core.status import progress_view

    stuck: dict[str, str] = {}
    for name in names:
        if name not in progress:
            return None  # its owner has not planned yet
        value = progress[name].value
        view = progress_view(name, value)
        if view.stuck is not None:
            stuck[name] = view.stuck
        elif (
            not isinstance(value, dict)
            or value.get("batch") is not None
            or view.pending_files != 0
            or view.pending_more
        ):
            return None
    return stuck
