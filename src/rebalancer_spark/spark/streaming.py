"""One Structured Streaming query per owned resource, handed over with its checkpoint.

::

    node = start(spark, job)
    streams = StreamManager(spark, node, checkpoint_root="/share/checkpoints", output="/lake/x")
    streams.run(stop)                     # until stop is set; resources come and go meanwhile
    spark.stop()                          # drains: every query stops before its resource moves

On the driver, the manager keeps one streaming query running for every resource this job owns
now, and none for any other:

* a resource granted to this job gets a query (started by :meth:`StreamManager.run`'s loop,
  woken by ``on_assigned``), reading the resource's files and checkpointed at
  ``<checkpoint_root>/<group>/<resource>/``, a shared location every job of the group reaches;
* a resource revoked by the target has its query stopped, and waited for, *inside*
  ``on_revoked``: the member releases the claim only after that, so the next owner starts its
  query on the same checkpoint only once this one is stopped;
* when the lease lapses (``on_lost``: self-fencing) every affected query is stopped at once;
* a query that fails on its own while the resource is still owned is restarted from its
  checkpoint after ``poll_interval``.

The default query reads new files of the resource (``job.format``, ``job.schema``,
``job.read_options``, at most ``job.max_files_per_batch`` per micro-batch, sub-directories
included, names starting with ``.`` or ``_`` ignored) with a ``_file`` column and writes each
micro-batch into the job's output: by default the group's Delta table, through the same fenced
commit as the batch loop (:func:`fenced_delta_sink`: micro-batch *n* of the query is batch
*n + 1* of the resource, committed with the resource's epoch, so Delta refuses a stale owner's
micro-batch and never lands one twice); with ``--output-format parquet``, Spark's Parquet file
sink in ``<output>/resource=<id>/`` (:func:`parquet_file_sink`). Read either back with
:func:`read_stream_output`. Give ``start_query`` to run any other query per resource.

Exactly once: Spark's file source and sink with a checkpoint are exactly-once per query: the
offsets of micro-batch *n* are written to the checkpoint before it runs, a restarted query re-runs
an unfinished batch *n* with the same files, and the sink's log (``_spark_metadata``) lists the
files of batch *n* once and only once; readers that go through that log (Spark's reader of a
sink directory, :func:`read_stream_output`) never see the files of an interrupted attempt. The
hand-over keeps that property because two queries never run on one checkpoint at once: the
cooperative protocol grants the resource only once the old owner released it (its query
stopped) or its lease expired (it self-fenced ``safety_margin`` before that). With the Delta
output, the window of an owner paused past its lease in the middle of a micro-batch is closed
too: the new owner fences the table before its query starts, so the paused owner's late commit
is refused. See the Streaming section of docs/spark.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote

from rebalancer_spark.core.errors import RebalancerError
from rebalancer_spark.member import OwnedResource
from rebalancer_spark.sources.base import FileSource
from rebalancer_spark.spark.guard import OwnerGuard
from rebalancer_spark.spark.outputs import DeltaOutput
from rebalancer_spark.spark.session import RebalancerNode

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "ResourceStream",
    "StreamManager",
    "StreamStats",
    "fenced_delta_sink",
    "parquet_file_sink",
    "read_stream_output",
]

log = logging.getLogger("rebalancer_spark.streaming")


@dataclass(frozen=True, slots=True)
class ResourceStream:
    """Everything a query for one owned resource needs: where its input, checkpoint and
    output are, and the epoch it is owned at."""

    group: str
    resource: str
    epoch: int
    location: str
    """Where Spark reads the resource's files (a URL ending in '/')."""
    checkpoint: str
    """``<checkpoint_root>/<group>/<resource>``: the same for every owner, handed over."""
    output: str | None
    """``<output>/resource=<id>``, or None when the job has no output."""
    query_name: str
    trigger_seconds: float
    format: str = "csv"
    schema: str | None = None
    read_options: dict[str, str] = field(default_factory=dict)
    max_files_per_trigger: int = 100

    def read_stream(self, spark: SparkSession) -> DataFrame:
        """The resource's files as a streaming DataFrame, with a ``_file`` column."""
        from pyspark.sql import functions as sf

        reader = (
            spark.readStream.format(self.format)
            .option("recursiveFileLookup", "true")
            .option("maxFilesPerTrigger", str(self.max_files_per_trigger))
            .options(**self.read_options)
        )
        if self.schema:
            reader = reader.schema(self.schema)
        return reader.load(self.location).withColumn("_file", sf.col("_metadata.file_path"))


StartQuery = Callable[["SparkSession", ResourceStream], "StreamingQuery"]


def parquet_file_sink(spark: SparkSession, stream: ResourceStream) -> StreamingQuery:
    """The default query: the resource's new files to Parquet in ``stream.output``."""
    if stream.output is None:
        raise RebalancerError(
            f"resource {stream.resource!r}: the default streaming query needs an output "
            "directory: give the job --output PATH, or StreamManager(start_query=...)"
        )
    return (
        stream.read_stream(spark)
        .writeStream.format("parquet")
        .queryName(stream.query_name)
        .option("checkpointLocation", stream.checkpoint)
        .option("path", stream.output)
        .trigger(processingTime=f"{stream.trigger_seconds} seconds")
        .start()
    )


def fenced_delta_sink(node: RebalancerNode) -> StartQuery:
    """The default query with a Delta output: each micro-batch of the resource's new files is
    committed into ``node.output`` by :class:`~.outputs.DeltaOutput` (micro-batch *n* as batch
    *n + 1*, fenced by the resource epoch). The table is fenced at the new epoch before the
    query starts, so a previous owner paused in the middle of a micro-batch cannot commit it
    afterwards; a micro-batch that landed already (the previous owner's, before the fence) is
    skipped when the checkpoint makes this query run it again."""
    output = node.output
    if not isinstance(output, DeltaOutput):
        raise RebalancerError(
            f"the fenced Delta sink needs a Delta output, got {output!r}: give the job --output "
            "PATH (with --output-format delta, the default)"
        )
    session = node.member.session
    who = {
        "member_id": node.member.member_id,
        "session_id": "" if session is None else session.session_id,
    }

    def start(spark: SparkSession, stream: ResourceStream) -> StreamingQuery:
        guard = OwnerGuard(node.member, stream.resource, stream.epoch)

        def write(df: DataFrame, batch_id: int) -> None:
            output.write(df, resource=stream.resource, epoch=stream.epoch, batch=batch_id + 1,
                         who=who, guard=guard)  # fmt: skip

        guard.check()
        output.fence(stream.resource, stream.epoch, who)
        return (
            stream.read_stream(spark)
            .writeStream.foreachBatch(write)
            .queryName(stream.query_name)
            .option("checkpointLocation", stream.checkpoint)
            .trigger(processingTime=f"{stream.trigger_seconds} seconds")
            .start()
        )

    return start


@dataclass(slots=True)
class StreamStats:
    """What one manager did."""

    started: int = 0
    stopped: int = 0
    """Queries stopped, for any reason."""
    lost: int = 0
    """Of those, stopped without a release: the lease lapsed or the store dropped the claim."""
    failed: int = 0
    per_resource: dict[str, int] = field(default_factory=dict)
    """Queries started per resource."""


def checkpoint_path(root: str, group: str, resource: str) -> str:
    """``root/group/resource`` (each part %-quoted), the same on every member."""
    return f"{root.rstrip('/')}/{quote(group, safe='')}/{quote(resource, safe='')}"


class StreamManager:
    """Keeps one streaming query per resource this job owns; see the module docstring."""

    def __init__(
        self,
        spark: SparkSession,
        node: RebalancerNode,
        *,
        checkpoint_root: str,
        output: str | None = None,
        start_query: StartQuery | None = None,
        trigger_seconds: float | None = None,
    ) -> None:
        if not isinstance(node.source, FileSource):
            raise RebalancerError(
                f"streaming needs a file source to read each resource from, got "
                f"{node.job.source!r}: give the job --source file:///dir/"
            )
        if node.source.on_change == "reread":
            raise RebalancerError(
                f"source {node.job.source!r} asks on_change=reread, which streaming cannot do: "
                "Spark's file stream reads each path once; remove the option, or use the batch "
                "job (jobs/ingest_files.py) to re-read rewritten files"
            )
        inferred = spark.conf.get("spark.sql.streaming.schemaInference", "false") == "true"
        if node.job.schema is None and not inferred:
            raise RebalancerError(
                f"a streaming read of {node.job.format} files needs a schema: give the job "
                "--schema 'col TYPE, ...' (or set spark.sql.streaming.schemaInference=true)"
            )
        self.spark = spark
        self.node = node
        self.source: FileSource = node.source
        self.checkpoint_root = checkpoint_root
        self.output = output
        self.stats = StreamStats()
        if start_query is None:
            delta = node.job.output_format == "delta" and node.job.output is not None
            start_query = fenced_delta_sink(node) if delta else parquet_file_sink
        self._start_query = start_query
        self._trigger = node.job.poll_interval if trigger_seconds is None else trigger_seconds
        self._lock = threading.Lock()  # held while a query starts or stops
        self._queries: dict[tuple[str, int], StreamingQuery] = {}
        self._ended: set[tuple[str, int]] = set()  # revoked or lost: never start again
        self._retry_at: dict[tuple[str, int], float] = {}
        self._wake = threading.Event()
        node.listen(on_assigned=self._assigned, on_revoked=self._stop_owned, on_lost=self._lost)

    # -- the loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> StreamStats:
        """Start and stop queries as resources come and go, until ``stop`` is set; then stop
        every query of this manager and return what it did."""
        try:
            while not stop.is_set():
                self.reconcile()
                self._wake.wait(self.node.job.poll_interval)
                self._wake.clear()
        finally:
            self.close()
        return self.stats

    def reconcile(self) -> None:
        """One pass: stop queries of resources no longer owned, note failed ones, start
        queries for owned resources that have none."""
        member = self.node.member
        owned = {o.resource: o for o in member.assigned()}
        with self._lock:
            for key, query in list(self._queries.items()):
                if not self.node.owns(*key):
                    # Not released through on_revoked (that stops the query first): the lease
                    # lapsed or the claim was dropped; stop now rather than wait for on_lost.
                    self._stop(key, "no longer owned", lost=True)
                elif not query.isActive:
                    self._queries.pop(key)
                    self.stats.failed += 1
                    self._retry_at[key] = time.monotonic() + self.node.job.poll_interval
                    log.warning(
                        "[%s] query of %s (epoch %d) ended: %s; restarting it from its checkpoint",
                        member.member_id,
                        key[0],
                        key[1],
                        query.exception(),
                    )
            self._ended = {k for k in self._ended if k[0] in owned and owned[k[0]].epoch == k[1]}
        for o in owned.values():
            key = (o.resource, o.epoch)
            if key in self._queries or key in self._ended:
                continue
            if time.monotonic() < self._retry_at.get(key, 0.0):
                continue
            self.node.flush_audit()  # the acquisition is audited before the first read
            with self._lock:
                if key in self._queries or key in self._ended or not self.node.owns(*key):
                    continue
                self._begin(o)

    def queries(self) -> dict[str, StreamingQuery]:
        """The running query of each resource, by resource id."""
        with self._lock:
            return {r: q for (r, _), q in self._queries.items()}

    def close(self) -> None:
        """Stop every query of this manager (and wait for each)."""
        with self._lock:
            for key in list(self._queries):
                self._stop(key, "the job stops")

    # -- starting and stopping (under the lock) --------------------------------------------

    def _begin(self, owned: OwnedResource) -> None:
        group, resource, key = self.node.member.group, owned.resource, (owned.resource, owned.epoch)
        try:
            stream = self._stream(owned)
            self.spark.sparkContext.setJobDescription(
                f"rebalancer group={group} resource={resource} epoch={owned.epoch} (stream)"
            )
            query = self._start_query(self.spark, stream)
        except Exception:  # a bad resource, a Spark error: the next pass tries again
            self.stats.failed += 1
            self._retry_at[key] = time.monotonic() + self.node.job.poll_interval
            log.exception("[%s] cannot start the query of %s; retrying", group, resource)
            return
        self._queries[key] = query
        self._retry_at.pop(key, None)
        self.stats.started += 1
        self.stats.per_resource[resource] = self.stats.per_resource.get(resource, 0) + 1
        log.info(
            "[%s] %s epoch %d: query started, checkpoint %s",
            self.node.member.member_id,
            resource,
            owned.epoch,
            stream.checkpoint,
        )

    def _stream(self, owned: OwnedResource) -> ResourceStream:
        group, resource, output, job = (
            self.node.member.group,
            owned.resource,
            self.output,
            self.node.job,
        )
        return ResourceStream(
            group=group,
            resource=resource,
            epoch=owned.epoch,
            location=self.source.location(resource),
            checkpoint=checkpoint_path(self.checkpoint_root, group, resource),
            output=None
            if output is None
            else f"{output.rstrip('/')}/resource={quote(resource, safe='')}",
            query_name=f"rebalancer {group} {resource} epoch {owned.epoch}",
            trigger_seconds=self._trigger,
            format=job.format,
            schema=job.schema,
            read_options=dict(job.read_options),
            max_files_per_trigger=job.max_files_per_batch,
        )

    def _stop(self, key: tuple[str, int], why: str, *, lost: bool = False) -> None:
        self._ended.add(key)
        query = self._queries.pop(key, None)
        if query is None:
            return
        try:
            query.stop()  # returns once the query's thread has ended
        except Exception:
            log.exception("stopping the query of %s raised; it is stopped", key[0])
        self.stats.stopped += 1
        self.stats.lost += lost
        log.info("%s epoch %d: query stopped (%s)", key[0], key[1], why)

    # -- member callbacks (on the member thread) --------------------------------------------

    def _assigned(self, owned: Sequence[OwnedResource]) -> None:
        self._wake.set()

    def _stop_owned(self, owned: Sequence[OwnedResource]) -> None:
        with self._lock:
            for o in owned:
                self._stop((o.resource, o.epoch), "revoked")

    def _lost(self, owned: Sequence[OwnedResource]) -> None:
        with self._lock:
            for o in owned:
                why = "lost: the lease lapsed or the store dropped the claim"
                self._stop((o.resource, o.epoch), why, lost=True)
        self._wake.set()


def read_stream_output(spark: SparkSession, output: str) -> DataFrame | None:
    """Every row the default queries committed under ``output``, each once, with a
    ``resource`` column; None if nothing was committed yet.

    A Delta output is read with Spark's Delta reader. For a Parquet output, each
    ``resource=<id>/`` directory is read through its sink log (``_spark_metadata``), so
    files left by an interrupted attempt of a micro-batch are not read. (Reading ``output``
    as one partitioned table would list those files too.) ``output`` is a local or mounted
    path (or a ``file:`` URL): the ``resource=`` directories are listed with ``os``."""
    import os
    from urllib.parse import unquote, urlsplit

    from pyspark.sql import functions as sf

    root = unquote(urlsplit(output).path) if output.startswith("file:") else output
    if os.path.isdir(os.path.join(root, "_delta_log")):
        table = spark.read.format("delta").load(output)
        return table.withColumn("resource", sf.col("_resource")) if table.take(1) else None
    frames: list[DataFrame] = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        path = os.path.join(root, name)
        log_dir = os.path.join(path, "_spark_metadata")
        if not name.startswith("resource=") or not os.path.isdir(log_dir):
            continue
        if not any(not n.startswith((".", "_")) for n in os.listdir(log_dir)):
            continue  # no micro-batch committed yet
        resource = unquote(name.removeprefix("resource="))
        frames.append(spark.read.parquet(path).withColumn("resource", sf.lit(resource)))
    if not frames:
        return None
    out = frames[0]
    for frame in frames[1:]:
        out = out.unionByName(frame)
    return out
