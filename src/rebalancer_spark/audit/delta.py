"""The Delta audit log: an event sink that appends every ownership event to a Delta table.

Use case: give each member ``DeltaAuditLog(path)`` as an event sink; any time later,
:func:`rebalancer_spark.audit.verify_table` proves from that table that no resource ever had two
owners at once, and Spark SQL (or :func:`rebalancer_spark.audit.read_audit`) shows who owned what.

The table is written by ``deltalake`` (delta-rs) from the driver, so it needs no Delta jars, and
it is **append-only**: delta-rs retries blind appends that race with other processes' appends,
which MERGE does not get. One log object owns one writer thread; the member's thread only
enqueues (``__call__`` never blocks on I/O and never raises).

Each batch is committed with an application transaction ``(writer id, batch number)``: when a
commit's outcome is unknown (the store timed out after the commit landed), the retry first asks
the table whether that batch is already in, so a retry never writes a row twice.

The epoch-chain columns (``generation`` … ``moves``, ``seq``, and the lag samples'
``pending_files``, ``pending_bytes`` and ``pending_messages``, see :data:`CHAIN_COLUMNS`) came
later: a table written before them is still an audit table; the first append adds them to its
schema (delta-rs' schema merge, one commit that keeps every row; old rows read them as null).

``seq`` numbers each session's rows 1, 2, … in the order this log accepted them, and batches are
committed in that order: a process killed before its writer flushed loses the *highest* numbers
of its session only, so the verifier tells such a loss from a row removed later (a gap).

The table is created when the log is opened, by one commit without retries: when several
processes open the same new path at once, the losers see the winner's table, check its schema
and use it (delta-rs would otherwise retry a losing create as a second ``CREATE TABLE`` commit
with a new table id). Default tables are reader 1 / writer 2 with no table features, the floor
every Delta reader supports.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal

try:
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
    from deltalake.schema import PrimitiveType, Schema
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"the Delta audit log needs deltalake and pyarrow ({exc}): "
        "pip install 'rebalancer-spark[spark]'"
    ) from exc

from rebalancer_spark.audit.outbox import (
    Orphan,
    Outbox,
    default_outbox_root,
    orphans,
    pending_batches,
    table_dir,
)
from rebalancer_spark.core.errors import ConfigurationError, CorruptStateError
from rebalancer_spark.core.events import OwnershipEvent
from rebalancer_spark.core.urls import redact_url

__all__ = [
    "AUDIT_COLUMNS",
    "CHAIN_COLUMNS",
    "DeltaAuditLog",
    "audit_schema",
    "missing_chain_columns",
    "open_audit_table",
]

log = logging.getLogger("rebalancer_spark.audit")

_UTC_MICROS = pa.timestamp("us", tz="UTC")
# (name, arrow type, nullable), in table order.
_COLUMNS = (
    ("group", pa.string(), False),
    ("resource", pa.string(), False),
    ("member_id", pa.string(), False),
    ("session_id", pa.string(), False),
    ("kind", pa.string(), False),
    ("epoch", pa.int64(), False),
    ("at", _UTC_MICROS, False),
    ("observed_at", _UTC_MICROS, False),
    ("reason", pa.string(), False),
    ("host", pa.string(), True),
    ("pid", pa.int64(), True),
    ("spark_app_id", pa.string(), True),
    # The epoch chain (docs/spark.md, "The audit table"): added to older tables on append.
    ("generation", pa.int64(), True),
    ("coordinator_epoch", pa.int64(), True),
    ("prev_member_id", pa.string(), True),
    ("prev_session_id", pa.string(), True),
    ("prev_epoch", pa.int64(), True),
    ("freed", pa.string(), True),
    ("freed_at", _UTC_MICROS, True),
    ("trigger", pa.string(), True),
    ("moves", pa.int64(), True),
    # The row's number in its session's trail (1, 2, …) in the order this writer accepted it:
    # a writer commits in that order, so a crash loses only the highest numbers of a session,
    # and a number missing below one in the table is a row removed (docs/audit.md).
    ("seq", pa.int64(), True),
    # A ``lag`` row's sample: files and bytes listed and not processed yet (null elsewhere).
    ("pending_files", pa.int64(), True),
    ("pending_bytes", pa.int64(), True),
    # A queue's ``lag`` row: messages ready in the queue and not fetched yet (null elsewhere).
    ("pending_messages", pa.int64(), True),
)
AUDIT_COLUMNS: tuple[str, ...] = tuple(name for name, _, _ in _COLUMNS)
"""The audit table's columns, in order: one row per :class:`OwnershipEvent`."""
CHAIN_COLUMNS: tuple[str, ...] = AUDIT_COLUMNS[12:]
"""The columns a table written before the epoch chain lacks (all nullable)."""

_MAX_BATCH = 10_000
_FIRST_BACKOFF = 0.1
_MAX_BACKOFF = 5.0
_JOIN_TIMEOUT = 5.0
_REASON_CHARS = 600

_Row = tuple[object, ...]


def audit_schema() -> pa.Schema:
    """The Arrow schema of the audit table (timestamps in microseconds, UTC)."""
    return pa.schema([pa.field(name, kind, nullable=ok) for name, kind, ok in _COLUMNS])


def missing_chain_columns(table: DeltaTable) -> list[str]:
    """The :data:`CHAIN_COLUMNS` the table's schema lacks (a table written before them)."""
    names = {field.name for field in table.schema().fields}
    return [name for name in CHAIN_COLUMNS if name not in names]


def open_audit_table(path: str, storage_options: Mapping[str, str] | None = None) -> DeltaTable:
    """The existing audit table at ``path``, its schema checked (a table without the epoch
    chain's columns passes: see :func:`missing_chain_columns`).

    Raises :class:`ConfigurationError` when there is no Delta table there (or it cannot be
    read) and :class:`CorruptStateError` when the table there is not an audit table."""
    options = dict(storage_options or {})
    try:
        table = DeltaTable(path, storage_options=options or None)
    except TableNotFoundError as exc:
        raise ConfigurationError(
            f"no Delta audit table at {_shown(path)}: {_reason(exc, options)}; pass the path "
            "the members' DeltaAuditLog writes to"
        ) from exc
    except Exception as exc:
        raise ConfigurationError(
            f"cannot read the Delta audit table at {_shown(path)}: {_reason(exc, options)}; "
            "check the path and the storage options (credentials, endpoint)"
        ) from exc
    _check_schema(path, table)
    return table


class DeltaAuditLog:
    """An :data:`~rebalancer_spark.core.events.EventSink` appending events to a Delta table.

    Opening it creates the table at ``path`` if there is none (an unwritable path raises
    :class:`ConfigurationError`) and refuses a table of another schema
    (:class:`CorruptStateError`, nothing written). Events are batched for up to
    ``flush_interval`` seconds. A failed write is logged, kept in :attr:`last_error` and
    retried with a capped backoff; it never reaches the member calling the sink.

    Every accepted event is first kept in a local *outbox* file (:mod:`.outbox`; ``outbox``
    is its root directory, default ``$REBALANCER_HOME/audit-outbox``; ``False``: none), so
    that events not yet in the table when the process is killed, or when :meth:`close` gives
    up on a table that cannot be written, are written, in order, by the next audit log opened
    on the same table from this host (it does so first, in its writer thread). The events
    waiting to be written are :attr:`backlog`.
    """

    def __init__(
        self,
        path: str,
        *,
        flush_interval: float = 0.2,
        storage_options: Mapping[str, str] | None = None,
        outbox: str | os.PathLike[str] | Literal[False] | None = None,
    ) -> None:
        if not math.isfinite(flush_interval) or flush_interval < 0:
            raise ConfigurationError(
                f"flush_interval {flush_interval!r} is not a number of seconds >= 0; use 0.2"
            )
        self._path = path
        self._options = dict(storage_options or {})
        self._interval = flush_interval
        self._evolve = _create_or_check(path, self._options)
        """The table lacks the chain columns: the next append merges them into its schema."""
        self._writer_id = f"rebalancer-spark-audit-{uuid.uuid4().hex}"
        self._outbox_dir: Path | None = None
        self._outbox: Outbox | None = None
        if outbox is not False:
            root = default_outbox_root() if outbox is None else Path(outbox)
            self._outbox_dir = table_dir(root, path)
            try:
                self._outbox = Outbox(self._outbox_dir, self._writer_id)
            except OSError as exc:
                raise ConfigurationError(
                    f"cannot keep the audit outbox in {self._outbox_dir}: {exc}; set "
                    "$REBALANCER_HOME (or DeltaAuditLog's outbox=) to a writable directory"
                ) from exc
        self._kept = 0
        """The highest row number kept in the outbox."""
        self._cond = threading.Condition()
        self._pending: deque[tuple[float, int, _Row]] = deque()
        """(accepted at, row number, row) of the rows not in the table yet."""
        self._seqs: dict[str, int] = {}
        """The last ``seq`` given to each session's rows."""
        self._accepted = 0
        self._written = 0
        self._flush_target = 0
        self._batches = 0  # committed batches: the application transaction's version
        self._last_error: str | None = None
        self._stopping = False
        self._abandon = False
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"audit-writer {_shown(path)}", daemon=True
        )
        self._thread.start()

    @property
    def path(self) -> str:
        return self._path

    @property
    def last_error(self) -> str | None:
        """The latest write failure, or None once a later write succeeded."""
        with self._cond:
            return self._last_error

    @property
    def backlog(self) -> int:
        """How many accepted events are not in the table yet."""
        with self._cond:
            return self._accepted - self._written

    @property
    def outbox(self) -> Path | None:
        """This log's outbox file (None without an outbox)."""
        return None if self._outbox is None else self._outbox.path

    @property
    def written(self) -> int:
        """How many events are durably in the table."""
        with self._cond:
            return self._written

    def __call__(self, event: OwnershipEvent) -> None:
        """Enqueue ``event`` as its session's next row (``seq``); never blocks on I/O, never
        raises (a bad event is logged and takes no number)."""
        self.emit_many((event,))

    def emit_many(self, events: Sequence[OwnershipEvent]) -> None:
        """Enqueue ``events`` in order, under one hold of the lock (see :meth:`__call__`)."""
        with self._cond:
            if self._stopping:
                for event in events:
                    log.warning(
                        "audit log %s is closed; event dropped: %r", _shown(self._path), event
                    )
                return
            now = time.monotonic()
            for event in events:
                # A row of no session (a stuck resource or a lag sample noted while the member
                # had none: the store was away) belongs to no session's trail: no number, or
                # the rows of every process would share session "" and repeat each other's
                # numbers.
                seq = self._seqs.get(event.session_id, 0) + 1 if event.session_id else None
                try:
                    row = _row(event, seq)
                except Exception as exc:
                    log.error("audit event dropped, it cannot be stored: %s (%r)", exc, event)
                    continue
                if seq is not None:
                    self._seqs[event.session_id] = seq
                self._accepted += 1
                self._pending.append((now, self._accepted, row))
            self._cond.notify_all()

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until every event enqueued before this call is in the table; False when that
        did not happen within ``timeout`` seconds."""
        with self._cond:
            target = self._accepted
            if self._written >= target:
                return True
            self._flush_target = max(self._flush_target, target)
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._written >= target, timeout=timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Flush (for up to ``timeout`` seconds), then stop the writer thread. Idempotent.
        Events still unwritten after ``timeout`` stay in the outbox (without one they are
        dropped), and the count is logged."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._stopping = True
            self._cond.notify_all()
        flushed = self.flush(timeout)
        if not flushed:
            with self._cond:
                self._abandon = True  # the writer keeps what it has not kept yet, then ends
                self._cond.notify_all()
        self._thread.join(_JOIN_TIMEOUT)
        if not flushed:
            with self._cond:
                lost, kept = self._accepted - self._written, self._kept >= self._accepted
            log.error(
                "audit log %s closed with %d events not written (last error: %s); %s",
                _shown(self._path),
                lost,
                self.last_error,
                f"they are kept in {self.outbox} and written by the next audit log opened on "
                "this table from this host"
                if kept and self._outbox is not None
                else "those not kept in an outbox are lost",
            )
        if self._outbox is not None and not self._thread.is_alive():
            self._outbox.close(delete=flushed)

    def __enter__(self) -> DeltaAuditLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DeltaAuditLog({_shown(self._path)!r}, written={self.written})"

    # -- the writer thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._replay()
        except BaseException:  # also a delta-rs panic (pyo3's PanicException)
            # The orphans stay where they are for the next log; this log's own rows go on.
            log.exception("audit outboxes of %s could not be replayed", _shown(self._path))
        failures = 0
        uncertain = False  # the last attempt failed: its commit may have landed all the same
        in_doubt = 0  # the size of that attempt: a retry must carry exactly the same rows
        while True:
            with self._cond:
                due = self._next_batch_due()
                fresh = [(i, row) for _, i, row in self._pending if i > self._kept]
                size = in_doubt if uncertain else _MAX_BATCH
                batch = list(itertools.islice(self._pending, size)) if due else []
                number = self._batches + 1
            self._keep(fresh)
            if due is None:
                return  # stopped: whatever is not in the table is in the outbox
            if not batch:
                continue
            rows = [row for _, _, row in batch]
            try:
                if self._outbox is not None:
                    self._outbox.begin(number, batch[-1][1])
                if not (uncertain and self._committed(self._writer_id, number)):
                    self._append(rows, number)
            except BaseException as exc:  # also a delta-rs panic (pyo3's PanicException)
                failures += 1
                uncertain, in_doubt = True, len(batch)
                delay = min(_MAX_BACKOFF, _FIRST_BACKOFF * 2 ** (failures - 1))
                message = (
                    f"appending {len(batch)} events to the Delta audit table at "
                    f"{_shown(self._path)} failed ({failures} in a row): "
                    f"{_reason(exc, self._options)}"
                )
                log.warning("%s; retrying in %.1f s", message, delay)
                with self._cond:
                    self._last_error = message
                    abandoned = self._cond.wait_for(lambda: self._abandon, timeout=delay)
                    fresh = [(i, row) for _, i, row in self._pending if i > self._kept]
                if abandoned:
                    self._keep(fresh)
                    return
                continue
            if failures:
                log.info("audit table %s written again", _shown(self._path))
            failures, uncertain = 0, False
            with self._cond:
                for _ in batch:
                    self._pending.popleft()
                self._batches = number
                self._written += len(batch)
                self._last_error = None
                self._cond.notify_all()

    def _keep(self, fresh: Sequence[tuple[int, _Row]]) -> None:
        """Keep newly accepted rows in the outbox (a failing disk: go on without it)."""
        if not fresh or self._outbox is None:
            return
        try:
            self._outbox.keep(fresh)
        except OSError as exc:
            log.error(
                "audit outbox %s cannot be written (%s): events not yet in the table are "
                "now lost if this process ends",
                self._outbox.path,
                exc,
            )
            self._outbox.close(delete=False)
            self._outbox = None
            return
        with self._cond:
            self._kept = fresh[-1][0]

    def _replay(self) -> None:
        """Write the rows of outboxes whose writers are gone (killed, or closed while the
        table could not be written), each under its own writer's application transaction."""
        if self._outbox_dir is None:
            return
        for orphan in orphans(self._outbox_dir):
            try:
                self._replay_one(orphan)
            except BaseException as exc:  # also a delta-rs panic (pyo3's PanicException)
                log.warning(
                    "audit outbox %s of a writer that is gone could not be written to %s (%s); "
                    "the next audit log opened on this table tries again",
                    orphan.path,
                    _shown(self._path),
                    _reason(exc, self._options),
                )
                orphan.close(delete=False)

    def _replay_one(self, orphan: Orphan) -> None:
        table = DeltaTable(self._path, storage_options=self._options or None)
        committed = table.transaction_version(orphan.writer_id) or 0
        written = 0
        for number, rows in pending_batches(orphan, committed):
            orphan.note(number, max(i for i, _ in orphan.rows))
            full = [(*row, *[None] * (len(AUDIT_COLUMNS) - len(row))) for row in rows]
            self._append(full, number, writer_id=orphan.writer_id)
            written += len(rows)
        orphan.close(delete=True)
        if written:
            log.warning(
                "audit table %s: wrote %d events that writer %s (a process that ended) had "
                "kept in its outbox",
                _shown(self._path),
                written,
                orphan.writer_id,
            )

    def _next_batch_due(self) -> bool | None:
        """Wait (holding the condition) until a batch is due (True), rows are to be kept in
        the outbox (False), or the writer stops (None)."""
        while True:
            if self._abandon:
                return None
            if self._pending:
                due = self._pending[0][0] + self._interval
                now = time.monotonic()
                if self._stopping or self._flush_target > self._written or now >= due:
                    return True
                if self._outbox is not None and self._pending[-1][1] > self._kept:
                    return False
                self._cond.wait(due - now)
            elif self._stopping:
                return None
            else:
                self._cond.wait()

    def _append(
        self, rows: Sequence[Sequence[object]], number: int, *, writer_id: str | None = None
    ) -> None:
        data = pa.Table.from_pylist(
            [dict(zip(AUDIT_COLUMNS, row, strict=True)) for row in rows], schema=audit_schema()
        )
        write_deltalake(
            self._path,
            data,
            mode="append",
            schema_mode="merge" if self._evolve else None,
            storage_options=self._options or None,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id=writer_id or self._writer_id, version=number)]
            ),
        )
        self._evolve = False

    def _committed(self, writer_id: str, number: int) -> bool:
        table = DeltaTable(self._path, storage_options=self._options or None)
        done = table.transaction_version(writer_id)
        return done is not None and done >= number


def _create_or_check(path: str, options: dict[str, str]) -> bool:
    """Create the table, or check the one there; True if it lacks the chain columns."""
    try:
        return bool(missing_chain_columns(open_audit_table(path, options)))
    except ConfigurationError as exc:
        if not isinstance(exc.__cause__, TableNotFoundError):
            raise
    try:
        DeltaTable.create(
            path,
            audit_schema(),
            mode="ignore",
            storage_options=options or None,
            # One attempt only: a loser of a race to create must not commit a second
            # CREATE TABLE (delta-rs would retry it as version 1 with a new table id).
            commit_properties=CommitProperties(max_commit_retries=0),
        )
    except Exception as exc:
        if not _lost_create_race(exc):
            raise ConfigurationError(
                f"cannot create the Delta audit table at {_shown(path)}: "
                f"{_reason(exc, options)}; give a path (or storage options) this process can "
                "write, such as a directory on a local or shared disk or s3://bucket/prefix "
                "with write permission"
            ) from exc
        log.debug("lost the race to create %s: %s", _shown(path), _reason(exc, options))
    try:
        return bool(missing_chain_columns(open_audit_table(path, options)))
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"cannot create the Delta audit table at {_shown(path)}: the table is still "
            f"unreadable after creating it ({exc}); give a path (or storage options) this "
            "process can write and read"
        ) from exc


def _lost_create_race(exc: Exception) -> bool:
    """Whether ``exc`` says another process created the table first: "Failed to commit
    transaction: 0" on a local disk, "version 0 already exists" on some object stores
    (delta-rs issue 3505), "A Delta Lake table already exists" after a late existence check."""
    return isinstance(exc, CommitFailedError) or (
        isinstance(exc, DeltaError) and "already exists" in str(exc)
    )


def _check_schema(path: str, table: DeltaTable) -> None:
    expected = {field.name: field for field in Schema.from_arrow(audit_schema()).fields}
    found = {field.name: field for field in table.schema().fields}
    problems = []
    missing = [name for name in expected if name not in found and name not in CHAIN_COLUMNS]
    if missing:
        problems.append(f"missing columns {', '.join(missing)}")
    unexpected = [name for name in found if name not in expected]
    if unexpected:
        problems.append(f"unexpected columns {', '.join(unexpected)}")
    for name, want in expected.items():
        have = found.get(name)
        if have is None:
            continue
        if have.type != want.type:
            problems.append(f"column {name} is {_type(have.type)}, expected {_type(want.type)}")
        elif want.nullable and not have.nullable:
            problems.append(f"column {name} is NOT NULL, expected nullable")
    if problems:
        raise CorruptStateError(
            f"the Delta table at {_shown(path)} is not a rebalancer-spark audit table: "
            f"{'; '.join(problems)}. Nothing was written to it; give the audit log a path of "
            "its own (a new directory), or move that table away"
        )


def _row(event: OwnershipEvent, seq: int | None) -> _Row:
    info = event.info
    return (
        event.group,
        event.resource,
        event.member_id,
        event.session_id,
        str(event.kind),
        int(event.epoch),
        _micros(event.at, "at"),
        _micros(event.observed_at, "observed_at"),
        event.reason,
        info.get("host"),
        _pid(info.get("pid")),
        info.get("spark_app_id"),
        event.generation,
        event.coordinator_epoch,
        event.prev_member_id,
        event.prev_session_id,
        event.prev_epoch,
        event.freed,
        None if event.freed_at is None else _micros(event.freed_at, "freed_at"),
        event.trigger,
        event.moves,
        seq,
        event.pending_files,
        event.pending_bytes,
        event.pending_messages,
    )


def _pid(value: object) -> int | None:
    try:
        return int(str(value)) if value is not None else None
    except ValueError:
        return None


def _micros(seconds: float, what: str) -> int:
    if not math.isfinite(seconds):
        raise ValueError(f"{what} {seconds!r} is not a time in epoch seconds")
    return round(seconds * 1_000_000)


def _type(kind: object) -> str:
    return kind.type if isinstance(kind, PrimitiveType) else str(kind)


def _shown(path: str) -> str:
    return redact_url(path)


def _reason(exc: BaseException, options: Mapping[str, str]) -> str:
    """The error's message on one line, with any storage option's value cut out (keys,
    tokens)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    for value in options.values():
        if len(value) >= 4:
            text = text.replace(value, "***")
    return redact_url(text)[:_REASON_CHARS]
