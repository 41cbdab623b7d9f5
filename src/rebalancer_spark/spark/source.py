"""One resource this job owns now: its epoch, its progress, and the planning of its batches.

For a file source (any :class:`~rebalancer_spark.sources.base.FileSource`: a share's
directories, S3 sub-prefixes) the progress of a resource is, with file names relative to the
resource (paths under a directory, keys under a sub-prefix)::

    {"done": ["a.csv", "sub/b.csv"], "batch": {"id": 7, "files": ["c.csv"]} | null, "next": 8,
     "versions": {"a.csv": "120:1732...", ...}, "changed_files": 0}

``versions`` holds the :attr:`~rebalancer_spark.sources.base.FileEntry.fingerprint` (size and
modification time, or ETag) each done file had when it was planned (a planned batch carries its
files' fingerprints too), and ``changed_files`` counts the done files found listed again with
another fingerprint (rewritten under the same name). The source's ``on_change`` option says
what then happens: ``ignore`` records the new fingerprint so the change is reported once, and
the file is not read again; ``reread`` takes the file out of ``done``, so the next batch plans
it, once per change, fenced like any batch. Either way the job logs a warning and counts it in
the member's metrics. Both keys are optional: a record written before them (no ``versions``)
is read as it is, and its done files get their fingerprints recorded the first time they are
listed, without counting as changed.

and work goes in **batches** (:class:`~rebalancer_spark.spark.batch.Batch`), which is what
makes file processing exactly-once:

1. :meth:`AssignedSource.next_batch` *plans* a batch (the next unprocessed files, at most
   ``max_files_per_batch``) and commits the plan, fenced by the resource epoch, before any data
   is read; if an unfinished batch is already planned (the previous owner died mid-batch), the
   same batch, with the same id and files, is taken again instead — after *fencing* the output
   (a Delta table then refuses the previous owner's late commit of it) and asking the output
   whether it landed already (then only its progress is committed);
2. the batch's rows are written to the output in one fenced commit (:mod:`.outputs`);
3. the batch's files are marked done, fenced again.

A job killed between 2 and 3 leaves the batch planned: the next owner finds it landed (Delta)
or re-runs the very same files into the very same place (Parquet), so nothing is duplicated and
nothing is lost. A stale owner cannot plan a batch (the store refuses), cannot land one (the
table refuses), and its progress commit is refused.

For any other source (a static list, or a resource the pipeline reads itself),
:meth:`AssignedSource.commit` stores the pipeline's own progress, fenced.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from rebalancer_spark.core.errors import CorruptStateError, FencedError, RebalancerError
from rebalancer_spark.core.model import JsonValue
from rebalancer_spark.sources.base import FileEntry, FileSource, ResourceSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from rebalancer_spark.spark.batch import Batch
    from rebalancer_spark.spark.outputs import Output

__all__ = ["AssignedSource", "FileBatch", "ReadSettings"]

log = logging.getLogger("rebalancer_spark.ingest")


@dataclass(frozen=True, slots=True)
class FileBatch:
    """The files of one batch of one resource, under a batch id that never changes, and the
    fingerprints they had when the batch was planned (empty in records of earlier versions)."""

    id: int
    files: tuple[str, ...]
    versions: Mapping[str, str] = field(default_factory=dict, compare=False)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "files": list(self.files)}
        if self.versions:
            out["versions"] = dict(sorted(self.versions.items()))
        return out


@dataclass(frozen=True, slots=True)
class ReadSettings:
    """How a job reads its files: Spark reader format, schema, options, batch size."""

    format: str = "csv"
    schema: str | None = None
    options: Mapping[str, str] | None = None
    max_files_per_batch: int = 100


@dataclass(frozen=True, slots=True)
class _FileProgress:
    done: frozenset[str]
    batch: FileBatch | None
    next: int
    versions: Mapping[str, str] = field(default_factory=dict)
    changed_files: int = 0

    @classmethod
    def parse(cls, resource: str, value: JsonValue) -> _FileProgress:
        if value is None:
            return cls(frozenset(), None, 1)
        try:
            batch = value.get("batch")
            return cls(
                frozenset(str(f) for f in value["done"]),
                None
                if batch is None
                else FileBatch(
                    int(batch["id"]), tuple(batch["files"]), _versions(batch.get("versions"))
                ),
                int(value["next"]),
                _versions(value.get("versions")),
                int(value.get("changed_files", 0)),
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
            "batch": None if self.batch is None else self.batch.as_json(),
            "next": self.next,
        }
        if self.versions:
            out["versions"] = {k: self.versions[k] for k in sorted(self.versions)}
        if self.changed_files:
            out["changed_files"] = self.changed_files
        if extra is not None:
            out["extra"] = extra
        return out


def _versions(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError("versions is not a mapping")
    return {str(k): str(v) for k, v in value.items()}


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
        owns: Callable[[str, int], bool],
        before_first_read: Callable[[], None],
        who: Mapping[str, str],
        output: Output | None = None,
        read: ReadSettings | None = None,
        changed: Callable[[int, str], None] | None = None,
    ) -> None:
        """``changed(count, action)`` is told of processed files found rewritten under the
        same name (``action``: ``ignored`` or ``reread``), after the progress recorded them:
        the node counts them in the member's metrics."""
        self.group = group
        self.resource = resource
        self.epoch = epoch
        self.progress: JsonValue = progress
        """The last committed progress: the previous owner's at first, then this job's."""
        self.output = output
        self.read_settings = read or ReadSettings()
        self.who = dict(who)
        self._source = source
        self._commit = commit
        self._owns = owns
        self._before_first_read = before_first_read
        self._changed = changed
        self._first = True

    def __repr__(self) -> str:
        return f"AssignedSource({self.resource!r}, epoch={self.epoch}, group={self.group!r})"

    # -- ownership -------------------------------------------------------------------------

    def owned(self) -> bool:
        """Whether this job still owns the resource at this epoch, from memory (False once the
        local lease deadline passed: a paused driver stops here)."""
        return self._owns(self.resource, self.epoch)

    def check_owner(self) -> None:
        """Raise :class:`FencedError` unless :meth:`owned`: call it before any side effect."""
        if not self.owned():
            raise FencedError(
                f"resource {self.resource!r} is no longer owned by this job at epoch "
                f"{self.epoch} (it moved, or this job's lease lapsed): stop working on it"
            )

    # -- files -----------------------------------------------------------------------------

    def files_source(self) -> FileSource:
        """The file source this resource is read from."""
        if not isinstance(self._source, FileSource):
            raise RebalancerError(
                f"resource {self.resource!r} has no file source to read from: give the job "
                "--source file:///dir/ or s3://bucket/prefix/, or read the resource yourself and "
                "commit(progress)"
            )
        return self._source

    @property
    def planned(self) -> FileBatch | None:
        """The batch planned and not yet committed, if any."""
        if not isinstance(self._source, FileSource):
            return None
        return _FileProgress.parse(self.resource, self.progress).batch

    def pending_files(self) -> list[str]:
        """Files of the resource that no committed batch processed yet, sorted."""
        done = _FileProgress.parse(self.resource, self.progress).done
        return [f.name for f in self.files_source().files(self.resource) if f.name not in done]

    def next_batch(self, spark: SparkSession) -> Batch | None:
        """The batch to work on now, or None when nothing is pending: the unfinished batch
        (after fencing the output and skipping it if it landed), or a new one planned and
        committed (fenced) from the pending files. Raises :class:`FencedError` when ownership
        moved on (nothing was planned then)."""
        from rebalancer_spark.spark.batch import Batch

        self.check_owner()
        state = _FileProgress.parse(self.resource, self.progress)
        if self._first and state.batch is not None:
            self._start_work()  # the predecessor may still be writing this batch: fence
            landed = (
                None
                if self.output is None
                else self.output.fence(self.resource, self.epoch, self.who)
            )
            state = self._skip_landed(state, landed)
        elif state.batch is not None and self.output is not None:
            state = self._skip_landed(state, self.output.landed(self.resource))
        if state.batch is None:
            listed = self.files_source().files(self.resource)
            state = self._take_changes(state, listed)
            pending = [f for f in listed if f.name not in state.done]
            pending = pending[: self.read_settings.max_files_per_batch]
            if not pending:
                return None
            self._start_work()
            names = tuple(f.name for f in pending)
            batch = FileBatch(state.next, names, {f.name: f.fingerprint for f in pending})
            self._store(replace(state, batch=batch, next=state.next + 1).as_json())
            state = _FileProgress.parse(self.resource, self.progress)
        assert state.batch is not None
        return Batch(self, spark, state.batch)

    def _start_work(self) -> None:
        if self._first:
            self._before_first_read()
            self._first = False

    def _take_changes(self, state: _FileProgress, listed: list[FileEntry]) -> _FileProgress:
        """Compare the listed files with the fingerprints of the done ones: record the missing
        fingerprints (records of earlier versions), and handle files rewritten under the same
        name by the source's ``on_change`` (see the module docstring). Commits, fenced, only
        when something is new; warns and counts after the commit."""
        versions = dict(state.versions)
        changed: list[FileEntry] = []
        for entry in listed:
            if entry.name not in state.done:
                continue
            seen = versions.get(entry.name)
            if seen is None:
                versions[entry.name] = entry.fingerprint
            elif seen != entry.fingerprint:
                changed.append(entry)
        if not changed and versions == state.versions:
            return state
        self.check_owner()
        reread = self.files_source().on_change == "reread"
        done = state.done
        if reread:
            done = done - {e.name for e in changed}
            for entry in changed:
                del versions[entry.name]
        else:
            versions.update((e.name, e.fingerprint) for e in changed)
        self._store(
            replace(
                state,
                done=done,
                versions=versions,
                changed_files=state.changed_files + len(changed),
            ).as_json()
        )
        action = "reread" if reread else "ignored"
        for entry in changed:
            log.warning(
                "%s: %s was rewritten under the same name after it was processed (%s, now "
                "%s); on_change=%s: %s",
                self,
                entry.name,
                state.versions[entry.name],
                entry.fingerprint,
                "reread" if reread else "ignore",
                "it is read again in a new batch"
                if reread
                else "it is not read again (add ?on_change=reread to the source to read it)",
            )
        if changed and self._changed is not None:
            self._changed(len(changed), action)
        return _FileProgress.parse(self.resource, self.progress)

    def _skip_landed(self, state: _FileProgress, landed: int | None) -> _FileProgress:
        if state.batch is None or landed is None or landed < state.batch.id:
            return state
        log.info(
            "%s: batch %d already landed in the output; committing its progress only",
            self,
            state.batch.id,
        )
        self.mark_done(state.batch)
        return _FileProgress.parse(self.resource, self.progress)

    def mark_done(self, batch: FileBatch, extra: JsonValue = None) -> None:
        """Commit ``batch``'s files as processed, fenced (``extra``: kept alongside)."""
        state = _FileProgress.parse(self.resource, self.progress)
        if state.batch is None or state.batch.id != batch.id:
            raise RebalancerError(
                f"resource {self.resource!r}: batch {batch.id} is not the batch in progress "
                f"({None if state.batch is None else state.batch.id}): it was committed already"
            )
        done = state.done | frozenset(batch.files)
        versions = {**state.versions, **state.batch.versions}
        self._store(replace(state, done=done, batch=None, versions=versions).as_json(extra))

    # -- committing ------------------------------------------------------------------------

    def commit(self, progress: JsonValue = None) -> None:
        """Store ``progress`` for a resource that is not read in file batches (a static list,
        or a resource the pipeline reads itself), fenced by this ownership's epoch. Raises
        :class:`FencedError` once ownership moved on: stop working on the resource then."""
        if isinstance(self._source, FileSource):
            raise RebalancerError(
                f"resource {self.resource!r} is read in file batches: commit a batch with "
                "batch.write(df) (or batch.commit() after writing it yourself), not the source"
            )
        self._store(progress)

    def _store(self, value: JsonValue) -> None:
        self._commit(self.resource, value, self.epoch)
        self.progress = value
