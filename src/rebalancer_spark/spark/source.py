"""One resource this job owns now: its epoch, its progress, and the planning of its batches.

For a file source (any :class:`~rebalancer_spark.sources.base.FileSource`: a share's
directories, S3 sub-prefixes) the progress of a resource is a record of constant size
(:mod:`.file_progress`: a watermark, where the next listing starts, the open batch, counts),
and the names of the files processed are rows of the group's file history
(:mod:`.file_history`, a Delta table next to the output). This job keeps, in memory, the
history of the names its listings can return (all of them with ``order=none``; those above the
listing floor with ``order=name``), read once when it takes the resource over.

A file listed again with another fingerprint (size and modification time, or ETag) than its
history row has was rewritten under the same name. The source's ``on_change`` option says what
then happens: ``ignore`` appends a history row with the new fingerprint, so the change is
reported once, and the file is not read again; ``reread`` plans the file in the next batch,
once per change, fenced like any batch. Either way the job logs a warning, counts it in the
member's metrics and in ``changed_files``. A change is seen only where the listing looks:
everywhere with ``order=none``, above the floor with ``order=name``.

Work goes in **batches** (:class:`~rebalancer_spark.spark.batch.Batch`), which is what makes
file processing exactly-once:

1. :meth:`AssignedSource.next_batch` *plans* a batch (the next unprocessed files, at most
   ``max_files_per_batch``) and commits the plan, fenced by the resource epoch, before any data
   is read; if an unfinished batch is already planned (the previous owner died mid-batch), the
   same batch, with the same id and files, is taken again instead — after *fencing* the output
   (a Delta table then refuses the previous owner's late commit of it) and asking the output
   whether it landed already (then only its history and progress are committed);
2. the batch's rows are written to the output in one fenced commit (:mod:`.outputs`);
3. the batch's files are appended to the file history (idempotent: a batch the history holds
   already is not appended again) and then marked done in the store, fenced again.

A job killed between 2 and 3 leaves the batch planned: the next owner finds it landed (Delta)
or re-runs the very same files into the very same place (Parquet), so nothing is duplicated and
nothing is lost. A stale owner cannot plan a batch (the store refuses), cannot land one (the
table refuses), and its progress commit is refused; its late history append can only repeat
rows that are true (the batch's files never change once planned).

For any other source (a static list, or a resource the pipeline reads itself),
:meth:`AssignedSource.commit` stores the pipeline's own progress, fenced.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from rebalancer_spark.core.errors import (
    ConfigurationError,
    CorruptStateError,
    RebalancerError,
)
from rebalancer_spark.core.model import JsonValue
from rebalancer_spark.sources.base import FileEntry, FileSource, ResourceSource
from rebalancer_spark.spark.file_history import FileHistory, HistoryEntry
from rebalancer_spark.spark.file_progress import FileBatch, FileProgress, parse
from rebalancer_spark.spark.guard import Owner, OwnerGuard
from rebalancer_spark.spark.progress_requests import ControlRequests, ProgressRequest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from rebalancer_spark.spark.batch import Batch
    from rebalancer_spark.spark.outputs import Output

__all__ = ["AssignedSource", "FileBatch", "ReadSettings"]

log = logging.getLogger("rebalancer_spark.ingest")


@dataclass(frozen=True, slots=True)
class ReadSettings:
    """How a job reads its files: Spark reader format, schema, options, batch size."""

    format: str = "csv"
    schema: str | None = None
    options: Mapping[str, str] | None = None
    max_files_per_batch: int = 100


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
        owner: Owner,
        before_first_read: Callable[[], None],
        who: Mapping[str, str],
        output: Output | None = None,
        read: ReadSettings | None = None,
        changed: Callable[[int, str], None] | None = None,
        history: FileHistory | None = None,
        clock: Callable[[], float] = time.time,
        watch: Callable[[str, int, str | None, tuple[int, int] | None], None] | None = None,
        event: Callable[[str, str, int, str], None] | None = None,
        requests: ControlRequests | None = None,
    ) -> None:
        """``owner`` (the job's :class:`~rebalancer_spark.member.Member`) says whether the job
        still owns the resource and holds it through each output commit (:attr:`guard`).
        ``watch(resource, epoch, stuck, pending)`` is told, after each planning or
        failure, why the resource is stuck (None: it is not) and its lag (files, bytes; None:
        unknown): the node shows them in the member's metrics and samples the lag into the
        audit table (:mod:`.lag`). ``event(kind, resource, epoch, reason)`` is
        told when the resource gets stuck (``stuck``) and when an operator's request is applied
        (``progress``): the node records them in the audit table. ``requests`` holds the
        operators' progress requests (:mod:`.progress_requests`; None: none are taken).
        ``changed(count, action)`` is told of
        processed files found rewritten under the same name (``action``: ``ignored`` or
        ``reread``), after the progress recorded them: the node counts them in the metrics."""
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
        self.guard = OwnerGuard(owner, resource, epoch)
        """This job's ownership of the resource at this epoch, as the output's writers ask
        it (:mod:`.guard`)."""
        self._before_first_read = before_first_read
        self._changed = changed
        self._first = True
        self._ids_checked = False
        """Whether the output's highest batch id was read (once per ownership)."""
        self._history = history
        self._clock = clock
        self._known: dict[str, HistoryEntry] | None = None
        """The history of the names a listing may return, read on first use."""
        self._known_floor: str | None = None
        self._prints: dict[str, str] = {}
        self._plan: FileBatch | None = None
        """The open batch whose list the plans table keeps, as saved or read back."""
        self._watch = watch
        self._event = event
        self._requests = requests
        self._looked = False
        """Whether this owner has looked for requests yet (its first look reads the store)."""
        self.stuck: str | None = None
        """Why this job cannot make progress on the resource now (None: it can)."""
        """Fingerprints of the open batch's files as this job listed them."""

    def __repr__(self) -> str:
        return f"AssignedSource({self.resource!r}, epoch={self.epoch}, group={self.group!r})"

    # -- ownership -------------------------------------------------------------------------

    def owned(self) -> bool:
        """Whether this job still owns the resource at this epoch, from memory (False once the
        local lease deadline passed: a paused driver stops here)."""
        return self.guard.owned()

    def check_owner(self) -> None:
        """Raise :class:`FencedError` unless :meth:`owned`: call it before any side effect."""
        self.guard.check()

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
        return self.state().batch

    def state(self) -> FileProgress:
        """The last committed progress of this file resource, parsed, with the files of an
        open batch that the plans table keeps read back (once)."""
        state = parse(self.resource, self.progress)
        batch = state.batch
        if batch is None or not batch.unread:
            return state
        if self._plan is None or (self._plan.id, self._plan.plan) != (batch.id, batch.plan):
            assert batch.plan is not None
            files, versions = self.history().load_plan(self.resource, batch.id, batch.plan)
            read = FileBatch(batch.id, files, versions, plan=batch.plan, count=batch.count)
            if len(files) != batch.count or read.digest() != batch.plan:
                raise CorruptStateError(
                    f"the open batch {batch.id} of resource {self.resource!r} keeps its "
                    f"{batch.count} files in the plans table {self.history().plans_uri} (plan "
                    f"{batch.plan}), which holds {len(files)} files for it with digest "
                    f"{read.digest() if files else '-'}: was that table removed or vacuumed "
                    "early? The batch's files are unknown now: `rebalancer-spark progress reset "
                    "--after WATERMARK` (the watermark `progress show` prints) reads every file "
                    "above it again, those of this batch among them"
                )
            self._plan = read
        return replace(state, batch=self._plan)

    def _planned(self, batch: FileBatch) -> FileBatch:
        """``batch`` as the record names it: inline, or saved to the plans table first when
        its list is too long for the record."""
        if not batch.too_long():
            return batch
        digest = batch.digest()
        self.history().save_plan(
            self.resource, batch.id, digest, self.epoch, batch.files, batch.versions
        )
        self._plan = replace(batch, plan=digest, count=len(batch.files))
        return self._plan

    def history(self) -> FileHistory:
        """The group's file history (next to the output unless one was given)."""
        if self._history is None:
            if self.output is None:
                raise RebalancerError(
                    f"resource {self.resource!r} is read in file batches, whose history lives "
                    "next to the job's output: give the job --output, or --files-history PATH"
                )
            uri, options = self.output.history_location()
            self._history = FileHistory(uri, self.group, storage_options=options)
        return self._history

    def _floor(self, state: FileProgress) -> str | None:
        return state.floor if self.files_source().order == "name" else None

    def _known_names(self, state: FileProgress) -> dict[str, HistoryEntry]:
        """The history above the listing floor, read once, then kept up to date here."""
        floor = self._floor(state)
        if self._known is None:
            loaded = self.history().load(self.resource, after=floor)
            self._known = {k: v for k, v in loaded.items() if not state.disregards(k, v.batch)}
            self._known_floor = floor
            for name in state.legacy_done:
                self._known.setdefault(name, HistoryEntry(0, state.legacy_versions.get(name, "")))
        elif floor != self._known_floor and floor is not None:
            self._known = {k: v for k, v in self._known.items() if k > floor}
            self._known_floor = floor
        return self._known

    def listed(self) -> list[FileEntry]:
        """The files a listing returns now: every file with ``order=none``; with
        ``order=name`` those above the floor, in name order, only as many as the next batch
        needs (plus those the history holds above the floor)."""
        return self._list(self.state())[0]

    def _list(self, state: FileProgress) -> tuple[list[FileEntry], bool]:
        """(:meth:`listed`, whether it is the whole listing)."""
        source = self.files_source()
        if source.order != "name":
            return source.files(self.resource), True
        known = self._known_names(state)
        limit = self.read_settings.max_files_per_batch + len(known) + 1
        found = source.files(self.resource, after=self._floor(state), limit=limit)
        return found, len(found) < limit

    def pending(self, listed: list[FileEntry] | None = None) -> list[FileEntry]:
        """Files listed now that no committed batch processed yet (nor the open one), sorted."""
        state = self.state()
        known = self._known_names(state)
        open_files = set() if state.batch is None else set(state.batch.files)
        listed = self.listed() if listed is None else listed
        return [f for f in listed if f.name not in known and f.name not in open_files]

    def pending_files(self) -> list[str]:
        """Names of :meth:`pending`."""
        return [f.name for f in self.pending()]

    def next_batch(self, spark: SparkSession) -> Batch | None:
        """The batch to work on now, or None when nothing is pending: the unfinished batch
        (after fencing the output and skipping it if it landed), or a new one planned and
        committed (fenced) from the pending files. Raises :class:`FencedError` when ownership
        moved on (nothing was planned then)."""
        from rebalancer_spark.spark.batch import Batch

        self.check_owner()
        try:
            state = self.state()
        except CorruptStateError:
            state = self._recover()  # raises again unless an operator asked for a reset
        if state.legacy:
            state = self._migrate(state)
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
        state = self._take_request(state)
        if state.batch is None:
            listed, complete = self._list(state)
            changed = self._take_changes(state, listed)
            state = self.state()
            every = changed + self.pending(listed)
            pending = every[: self.read_settings.max_files_per_batch]
            rest = every[len(pending) :]
            lag = (len(rest), sum(f.size for f in rest), not complete)
            self.stuck = None
            if self._watch is not None:
                lagging = (len(every), sum(f.size for f in every))
                self._watch(self.resource, self.epoch, None, lagging)
            if not pending:
                if state.pending != lag or state.stuck is not None:
                    self._store(replace(state, pending=lag, stuck=None).as_json())
                return None
            self._start_work()
            names = tuple(f.name for f in pending)
            self._prints = {f.name: f.fingerprint for f in pending}
            keep = self.files_source().on_change == "reread"
            ident = self._next_id(state)
            batch = self._planned(FileBatch(ident, names, dict(self._prints) if keep else {}))
            counted = len({f.name for f in changed} & set(names))
            self._store(
                replace(
                    state,
                    batch=batch,
                    next=ident + 1,
                    changed_files=state.changed_files + counted,
                    pending=lag,
                    stuck=None,
                ).as_json()
            )
            if counted:
                self._report(changed[:counted], "reread", state)
            state = self.state()
        assert state.batch is not None
        return Batch(self, spark, state.batch)

    def _request(self, applied: str | None) -> tuple[str, ProgressRequest] | None:
        """The operator's request left for this resource (its text, and it), if any and not
        ``applied`` already (that one is removed from the control record); a text that is not
        a request is logged and removed."""
        if self._requests is None:
            return None
        text = self._requests.pending(self.resource, fresh=not self._looked)
        self._looked = True
        if text is None:
            return None
        where = f"the request for resource {self.resource!r} in the control record"
        try:
            request = ProgressRequest.decode(text, where)
        except ConfigurationError as exc:
            log.error("%s: %s; it is removed", self, exc)
            self._take(text)
            return None
        if request.id == applied:
            self._take(text)  # applied by a predecessor that had no time to remove it
            return None
        return text, request

    def _take(self, text: str) -> None:
        """Remove the request ``text`` from the control record; a store that refuses now
        leaves it there: the progress record says it was applied, so it is only taken later."""
        assert self._requests is not None
        try:
            self._requests.taken(self.resource, text)
        except RebalancerError as exc:
            log.warning("%s: the applied request stays in the control record for now: %s",
                        self, exc)  # fmt: skip

    def _applied(self, text: str, request: ProgressRequest, what: str) -> None:
        log.warning("%s: applied the operator's request %s (%s, by %s)", self, request.id,
                    what, request.by)  # fmt: skip
        if self._event is not None:
            self._event("progress", self.resource, self.epoch, f"{what} (by {request.by})")
        self._take(text)

    def _take_request(self, state: FileProgress) -> FileProgress:
        """Apply an operator's request (:mod:`.progress_requests`), fenced like any commit:
        ``skip`` of the open batch at once, the others between batches."""
        found = self._request(state.request)
        if found is None:
            return state
        text, request = found
        self.check_owner()
        if request.action == "skip" and request.batch is not None:
            if state.batch is None or state.batch.id != request.batch:
                log.warning("%s: %s ignored: batch %s is not open (open: %s)", self,
                            request.describe(), request.batch,
                            None if state.batch is None else state.batch.id)  # fmt: skip
            else:
                self.mark_done(state.batch)
        elif state.batch is not None:
            return state  # after the open batch
        elif request.action == "skip" and request.file is not None:
            rows = [(request.file, "")]
            batch = max(state.next - 1, 0)
            self.history().append(self.resource, batch, self.epoch, rows, transaction=False)
            self._known_names(state)[request.file] = HistoryEntry(batch, "", self._clock())
        elif request.action == "reset":
            after = request.after
            marks: tuple[tuple[float, str], ...] = ()
            self._store(replace(state, reset=(after, state.next), floor=after, watermark=after,
                                marks=marks, stuck=None, request=request.id).as_json())  # fmt: skip
            self._known = None  # read again, without the disregarded rows
        if self.state().request != request.id:  # a skip: noted right after what it changed
            self._store(replace(self.state(), request=request.id).as_json())
        self._applied(text, request, request.describe())
        return self.state()

    def _recover(self) -> FileProgress:
        """Replace an unreadable progress record when an operator asked for a reset: a new
        record whose batch ids go on above every batch the output and the history hold (so
        none is mistaken for one that landed); raises the record's error otherwise."""
        found = self._request(None)
        if found is None or found[1].action != "reset":
            self.state()  # raises the record's error
        assert found is not None
        text, request = found
        self.check_owner()
        landed = None if self.output is None else self.output.landed(self.resource)
        after = max(landed or 0, self.history().recorded_batch(self.resource)) + 1
        fresh = FileProgress(next=after, reset=(request.after, after), floor=request.after,
                             watermark=request.after, request=request.id)  # fmt: skip
        self._plan = None
        self._store(fresh.as_json())
        self._known = None
        self._applied(text, request, f"{request.describe()}, replacing an unreadable record")
        return self.state()

    def note_stuck(self, error: BaseException | str) -> None:
        """Record that this resource cannot make progress now (its progress record is
        unreadable, its listing or a read fails): in memory, in the metrics and, when the
        record is readable and the error new, in the record (fenced), which ``status`` shows.
        The next successful planning clears it."""
        text = " ".join(str(error).split())[:400]
        if text != self.stuck and self._event is not None:
            self._event("stuck", self.resource, self.epoch, text)
        self.stuck = text
        if self._watch is not None:
            self._watch(self.resource, self.epoch, text, None)
        try:
            state = parse(self.resource, self.progress)
        except RebalancerError:
            return  # an unreadable record is its own evidence: it is not overwritten
        if state.stuck == text or not self.owned():
            return
        try:
            self._store(replace(state, stuck=text).as_json())
        except RebalancerError as exc:
            log.info("%s: cannot record that it is stuck: %s", self, exc)

    def _next_id(self, state: FileProgress) -> int:
        """The id of the batch to plan: the record's, unless the output holds that one or a
        later one already (checked once per ownership): then the record was lost or is
        older than the output (a store that lost its data starts every record again), and
        reusing an id would take the new batch for landed, its rows never written."""
        if self._ids_checked or self.output is None:
            return state.next
        held = self.output.highest_batch(self.resource)
        self._ids_checked = True
        if held < state.next:
            return state.next
        log.warning(
            "%s: the output holds batch %d already while the progress record would plan batch "
            "%d (the record was lost, or is older than the output): batch ids go on from %d",
            self,
            held,
            state.next,
            held + 1,
        )
        return held + 1

    def _start_work(self) -> None:
        if self._first:
            self._before_first_read()
            self._first = False

    def _migrate(self, state: FileProgress) -> FileProgress:
        """Move the names of a record of the earlier format to the history (batch 0), then
        commit the record in the current format, fenced."""
        self.check_owner()
        known = self._known_names(state)
        rows = [(n, state.legacy_versions.get(n, "")) for n in sorted(state.legacy_done)]
        if rows:
            self.history().append(self.resource, 0, self.epoch, rows, transaction=False)
        self._store(replace(state, legacy_done=frozenset(), legacy_versions={}).as_json())
        log.info(
            "%s: progress of the earlier format (%d names) moved to the file history %s",
            self,
            len(rows),
            self.history().uri,
        )
        for name, fp in rows:
            known[name] = HistoryEntry(0, fp)
        return self.state()

    def _take_changes(self, state: FileProgress, listed: list[FileEntry]) -> list[FileEntry]:
        """Compare the listed files with the fingerprints of the processed ones: record the
        missing fingerprints (records of earlier versions, batches taken over), and handle files
        rewritten under the same name by the source's ``on_change`` (module docstring). Returns
        the files to read again (``reread``), changed ones first."""
        known = self._known_names(state)
        missing: list[FileEntry] = []
        changed: list[FileEntry] = []
        for entry in listed:
            seen = known.get(entry.name)
            if seen is None:
                continue
            if not seen.fingerprint:
                missing.append(entry)
            elif seen.fingerprint != entry.fingerprint:
                changed.append(entry)
        reread = self.files_source().on_change == "reread"
        record = missing if reread else missing + changed
        if record:
            self.check_owner()
            batch = max(state.next - 1, 0)
            rows = [(e.name, e.fingerprint) for e in record]
            self.history().append(self.resource, batch, self.epoch, rows, transaction=False)
            for entry in record:
                known[entry.name] = HistoryEntry(batch, entry.fingerprint, self._clock())
        if changed and not reread:
            self._store(replace(state, changed_files=state.changed_files + len(changed)).as_json())
            self._report(changed, "ignored", state)
            return []
        return changed

    def _report(self, changed: list[FileEntry], action: str, state: FileProgress) -> None:
        known = self._known or {}
        for entry in changed:
            before = known.get(entry.name)
            log.warning(
                "%s: %s was rewritten under the same name after it was processed (%s, now "
                "%s); on_change=%s: %s",
                self,
                entry.name,
                "?" if before is None else before.fingerprint,
                entry.fingerprint,
                "reread" if action == "reread" else "ignore",
                "it is read again in a new batch"
                if action == "reread"
                else "it is not read again (add ?on_change=reread to the source to read it)",
            )
        if changed and self._changed is not None:
            self._changed(len(changed), action)

    def _skip_landed(self, state: FileProgress, landed: int | None) -> FileProgress:
        if state.batch is None or landed is None or landed < state.batch.id:
            return state
        log.info(
            "%s: batch %d already landed in the output; committing its progress only",
            self,
            state.batch.id,
        )
        self.mark_done(state.batch)
        return self.state()

    def mark_done(self, batch: FileBatch, extra: JsonValue = None) -> None:
        """Append ``batch``'s files to the history, then commit them as processed, fenced
        (``extra``: kept alongside)."""
        state = self.state()
        if state.batch is None or state.batch.id != batch.id:
            raise RebalancerError(
                f"resource {self.resource!r}: batch {batch.id} is not the batch in progress "
                f"({None if state.batch is None else state.batch.id}): it was committed already"
            )
        self.check_owner()
        prints = {**self._prints, **state.batch.versions}
        rows = [(name, prints.get(name, "")) for name in state.batch.files]
        self.history().append(self.resource, batch.id, self.epoch, rows)
        now = self._clock()
        lookback = self.files_source().lookback if self.files_source().order == "name" else None
        after = state.done(state.batch, now, lookback)
        self._store(replace(after, extra=extra).as_json())
        if self._watch is not None and after.pending is not None:
            # What the planning left for later batches is the lag now: a resource whose last
            # batch landed reads caught up at once, not only at its next planning.
            self._watch(self.resource, self.epoch, None, after.pending[:2])
        known = self._known_names(state)
        floor = self._floor(after)
        for name, fp in rows:
            if floor is None or name > floor:
                known[name] = HistoryEntry(batch.id, fp, now)
        self._prints = {}

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
