"""One resource this job owns now, as something Spark can read and the job can commit.

For a file source (any :class:`~rebalancer_spark.sources.base.FileSource`: a share's
directories, S3 sub-prefixes) the progress of a resource is, with file names relative to the
resource (paths under a directory, keys under a sub-prefix)::

    {"done": ["a.csv", "sub/b.csv"], "batch": {"id": 7, "files": ["c.csv"]} | null, "next": 8}

and reading works in fenced **batches**, which is what makes file processing exactly-once:

1. :meth:`AssignedSource.read` *plans* a batch (the next unprocessed files, at most
   ``max_files_per_batch``) and commits the plan, fenced by the resource epoch, before any data
   is read; if an unfinished batch is already planned (the previous owner died mid-batch), the
   same batch, with the same id and files, is read again instead;
2. the job writes the batch's output to :meth:`AssignedSource.output_path`, a path that depends
   only on the resource and the batch id, replacing whatever is there;
3. :meth:`AssignedSource.commit` marks the batch's files done, fenced again.

A job killed between 2 and 3 leaves the batch planned: the next owner re-runs the very same
files into the very same path, so nothing is duplicated and nothing is lost. A stale owner
cannot plan a batch (the commit is refused) and, if it still writes the batch it had planned,
writes the same data to the same place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from rebalancer_spark.core.errors import CorruptStateError, RebalancerError
from rebalancer_spark.core.model import JsonValue
from rebalancer_spark.sources.base import FileSource, ResourceSource

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["AssignedSource", "FileBatch"]


@dataclass(frozen=True, slots=True)
class FileBatch:
    """The files of one batch of one resource, under a batch id that never changes."""

    id: int
    files: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _FileProgress:
    done: frozenset[str]
    batch: FileBatch | None
    next: int

    @classmethod
    def parse(cls, resource: str, value: JsonValue) -> _FileProgress:
        if value is None:
            return cls(frozenset(), None, 1)
        try:
            batch = value.get("batch")
            return cls(
                frozenset(str(f) for f in value["done"]),
                None if batch is None else FileBatch(int(batch["id"]), tuple(batch["files"])),
                int(value["next"]),
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            raise CorruptStateError(
                f"progress of resource {resource!r} is {str(value)[:120]!r}, not the file "
                'progress {"done": [...], "batch": ..., "next": N} this job writes: was the '
                "group used by another kind of job? Use a new group name"
            ) from None

    def as_json(self, extra: JsonValue = None) -> JsonValue:
        out: dict[str, Any] = {
            "done": sorted(self.done),
            "batch": None
            if self.batch is None
            else {"id": self.batch.id, "files": list(self.batch.files)},
            "next": self.next,
        }
        if extra is not None:
            out["extra"] = extra
        return out


class AssignedSource:
    """A resource owned now by this job, with its epoch; see the module docstring."""

    def __init__(
        self,
        *,
        group: str,
        resource: str,
        epoch: int,
        progress: JsonValue,
        source: ResourceSource | None,
        commit: Callable[[str, JsonValue, int], None],
        before_first_read: Callable[[], None],
        format: str = "csv",
        schema: str | None = None,
        read_options: dict[str, str] | None = None,
        max_files_per_batch: int = 100,
    ) -> None:
        self.group = group
        self.resource = resource
        self.epoch = epoch
        self.progress: JsonValue = progress
        """The last committed progress: the previous owner's at first, then this job's."""
        self._source = source
        self._commit = commit
        self._before_first_read = before_first_read
        self._read_yet = False
        self._format = format
        self._schema = schema
        self._read_options = dict(read_options or {})
        self._max_files = max_files_per_batch

    def __repr__(self) -> str:
        return f"AssignedSource({self.resource!r}, epoch={self.epoch}, group={self.group!r})"

    # -- files ---------------------------------------------------------------------------

    def _files(self) -> FileSource:
        if not isinstance(self._source, FileSource):
            raise RebalancerError(
                f"resource {self.resource!r} has no file source to read from: give the job "
                "--source file:///dir/ or s3://bucket/prefix/, or read the resource yourself and "
                "commit(progress)"
            )
        return self._source

    @property
    def batch(self) -> FileBatch | None:
        """The batch planned and not yet committed, if any."""
        if not isinstance(self._source, FileSource):
            return None
        return _FileProgress.parse(self.resource, self.progress).batch

    def pending_files(self) -> list[str]:
        """Files of the resource that no committed batch processed yet, sorted."""
        done = _FileProgress.parse(self.resource, self.progress).done
        return [f.name for f in self._files().files(self.resource) if f.name not in done]

    def next_batch(self) -> FileBatch | None:
        """The unfinished batch, or a new one planned (and committed, fenced) from the pending
        files; None when there is nothing to read."""
        state = _FileProgress.parse(self.resource, self.progress)
        if state.batch is None and not (pending := self.pending_files()[: self._max_files]):
            return None
        if not self._read_yet:
            self._before_first_read()
            self._read_yet = True
        if state.batch is not None:
            return state.batch
        batch = FileBatch(state.next, tuple(pending))
        self._store(_FileProgress(state.done, batch, state.next + 1).as_json())
        return batch

    def read(self, spark: SparkSession) -> DataFrame | None:
        """The next batch of this resource as a DataFrame, or None when no file is pending.

        Columns: the files' own, then ``_resource`` (the resource id), ``_batch`` (the batch
        id) and ``_file`` (the file's path or URL). Names the group, resource, epoch and batch
        in the Spark job description for the Spark UI."""
        from pyspark.sql import functions as sf

        from rebalancer_spark.spark.reading import BATCH_COLUMN, RESOURCE_COLUMN, load_files

        batch = self.next_batch()
        if batch is None:
            return None
        spark.sparkContext.setJobDescription(
            f"rebalancer group={self.group} resource={self.resource} epoch={self.epoch} "
            f"batch={batch.id} ({len(batch.files)} files)"
        )
        spark.sparkContext.setLocalProperty("spark.rebalancer.resource", self.resource)
        spark.sparkContext.setLocalProperty("spark.rebalancer.epoch", str(self.epoch))
        df = load_files(
            spark,
            self._files(),
            self.resource,
            batch.files,
            format=self._format,
            schema=self._schema,
            options=self._read_options,
        )
        return df.withColumn(RESOURCE_COLUMN, sf.lit(self.resource)).withColumn(
            BATCH_COLUMN, sf.lit(batch.id)
        )

    def output_path(self, root: str) -> str:
        """Where the current batch's output goes: ``root/resource=<id>/batch=<n>``, the same
        for every owner that runs this batch, so a re-run replaces rather than duplicates."""
        batch = self.batch
        if batch is None:
            raise RebalancerError(
                f"resource {self.resource!r} has no batch in progress: call read() first"
            )
        return f"{root.rstrip('/')}/resource={quote(self.resource, safe='')}/batch={batch.id:010d}"

    # -- committing ------------------------------------------------------------------------

    def commit(self, progress: JsonValue = None) -> None:
        """Commit, fenced by this ownership's epoch. For a file source: mark the current batch
        done (``progress`` is kept alongside as ``extra``). Otherwise: store ``progress``.
        Raises :class:`FencedError` once ownership moved on: stop working on the resource."""
        if not isinstance(self._source, FileSource):
            self._store(progress)
            return
        state = _FileProgress.parse(self.resource, self.progress)
        if state.batch is None:
            raise RebalancerError(
                f"resource {self.resource!r} has no batch in progress to commit: call read() "
                "and write its output first"
            )
        done = state.done | frozenset(state.batch.files)
        self._store(_FileProgress(done, None, state.next).as_json(progress))

    def _store(self, value: JsonValue) -> None:
        self._commit(self.resource, value, self.epoch)
        self.progress = value
