"""The audit log's outbox: rows accepted but not yet known to be in the Delta table, kept in a
local file so that neither a killed process nor a table that cannot be written loses them.

Use case: :class:`~rebalancer_spark.audit.delta.DeltaAuditLog` appends every row it accepts to
its own outbox file before it tries the table, and notes each batch it is about to commit. A
log that closes with everything written deletes its file. A file whose writer is gone (the
process was killed, or closed while the table could not be written) is an *orphan*: the next
audit log opened on the same table from the same host commits its rows, in order, under the
dead writer's own application transaction, so a batch the dead writer had committed after all
is never written twice (see :func:`pending_batches`).

One directory per table (a hash of its path) under the outbox root; one file per writer,
``<writer id>.jsonl``, held with an exclusive ``flock`` while its writer lives: a file whose
lock can be taken has no writer. A writer creates its file as ``.<writer id>.new``, locks it and
only then renames it, so no scan ever sees a live writer's file unlocked. A process killed in
between leaves an empty ``.<writer id>.new``, which no scan reads as an outbox: the scan
deletes it once it is empty, unlocked and older than :data:`STALE_NEW` (a live writer holds
that name for the microseconds between its open and its lock). Lines are JSON:

* ``{"i": 7, "row": [...]}``: the writer's 7th accepted row (the audit table's columns);
* ``{"batch": 3, "upto": 7}``: the writer is about to commit batch 3, rows up to 7.

A torn last line (the process died while writing it) is ignored: its row was never reported
as kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = [
    "STALE_NEW",
    "Orphan",
    "Outbox",
    "default_outbox_root",
    "orphans",
    "pending_batches",
    "table_dir",
]

log = logging.getLogger("rebalancer_spark.audit")

Row = list[object]


def default_outbox_root() -> Path:
    """``$REBALANCER_HOME/audit-outbox`` (default ``~/.local/state/rebalancer-spark``)."""
    home = os.environ.get("REBALANCER_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "state", "rebalancer-spark"
    )
    return Path(home).absolute() / "audit-outbox"


def table_dir(root: Path, table: str) -> Path:
    """The outbox directory of the table at ``table`` (a local path made absolute first)."""
    key = table if "://" in table else os.path.abspath(table)
    return root / hashlib.sha256(key.encode()).hexdigest()[:24]


class Outbox:
    """One live writer's outbox file (created, and locked, at once)."""

    def __init__(self, directory: Path, writer_id: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{writer_id}.jsonl"
        # Created under a name the orphan scan does not read, locked, and only then renamed:
        # opened under its own name, the file would be, for a moment, an unlocked outbox that
        # another process's scan takes for an orphan (and this writer's lock then fails).
        fresh = directory / f".{writer_id}.new"
        self._file: IO[str] = open(fresh, "a", encoding="utf-8")  # noqa: SIM115
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(fresh, self.path)
            _sync_directory(directory)  # the name, too, survives a power loss
        except BaseException:
            self._file.close()
            with contextlib.suppress(FileNotFoundError):
                fresh.unlink()
            raise

    def keep(self, rows: Sequence[tuple[int, Sequence[object]]]) -> None:
        """Append accepted rows (numbered by the writer from 1) and make them durable."""
        self._write("".join(_line({"i": i, "row": list(row)}) for i, row in rows))

    def begin(self, batch: int, upto: int) -> None:
        """Note that batch ``batch`` (the rows up to ``upto``) is about to be committed."""
        self._write(_line({"batch": batch, "upto": upto}))

    def _write(self, text: str) -> None:
        if text:
            self._file.write(text)
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self, *, delete: bool) -> None:
        """Release the file; ``delete`` it when every row in it is in the table."""
        if self._file.closed:
            return
        if delete:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._file.close()


@dataclass
class Orphan:
    """An outbox file whose writer is gone, locked by the caller until :meth:`close`."""

    path: Path
    writer_id: str
    rows: list[tuple[int, Row]] = field(default_factory=list)
    begun: list[tuple[int, int]] = field(default_factory=list)
    """(batch, upto) notes, in file order."""
    handle: IO[str] | None = None

    def note(self, batch: int, upto: int) -> None:
        """Note, in the orphan's own file, a batch the replay is about to commit."""
        assert self.handle is not None
        self.handle.write(_line({"batch": batch, "upto": upto}))
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.begun.append((batch, upto))

    def close(self, *, delete: bool) -> None:
        if delete:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def orphans(directory: Path) -> Iterator[Orphan]:
    """The outbox files in ``directory`` that no live writer holds, read and locked, oldest
    first; a file another process replays or writes right now is skipped. Stale files of
    writers killed before their first rename are deleted (:func:`_remove_stale_new`)."""
    if not directory.is_dir():
        return
    _remove_stale_new(directory)
    dated: list[tuple[float, Path]] = []
    for path in directory.glob("*.jsonl"):
        with contextlib.suppress(FileNotFoundError):  # replayed and deleted since the listing
            dated.append((path.stat().st_mtime, path))
    for _, path in sorted(dated):
        try:
            handle = open(path, "r+", encoding="utf-8")  # noqa: SIM115
        except FileNotFoundError:
            continue  # replayed and deleted meanwhile
        except OSError as exc:
            log.warning(
                "audit outbox %s cannot be opened (%s); skipped: move it away if it is not an "
                "outbox file",
                path,
                exc,
            )
            continue
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        except OSError as exc:
            handle.close()
            log.warning("audit outbox %s cannot be locked (%s); skipped", path, exc)
            continue
        if not path.exists():  # replayed by another process between the open and the lock
            handle.close()
            continue
        orphan = Orphan(path, path.name.removesuffix(".jsonl"), handle=handle)
        try:
            _read(orphan, handle)
            handle.seek(0, os.SEEK_END)
        except (OSError, ValueError) as exc:  # unreadable, or not UTF-8 text
            handle.close()
            log.warning(
                "audit outbox %s cannot be read (%s); skipped: move it away if it is not an "
                "outbox file",
                path,
                exc,
            )
            continue
        yield orphan


STALE_NEW = 60.0
"""Seconds after which an empty, unlocked ``.<writer id>.new`` in an outbox directory is a
dead writer's (see the module docstring) and deleted by the next scan."""


def _remove_stale_new(directory: Path, *, now: float | None = None) -> None:
    """Delete the ``.<writer id>.new`` files of writers killed between creating and renaming
    their outbox: empty, older than :data:`STALE_NEW`, and not locked by anyone (checked
    while holding the lock, so a writer that locked it meanwhile keeps it)."""
    now = time.time() if now is None else now
    for path in directory.glob(".*.new"):
        try:
            info = path.stat()
            if info.st_size or now - info.st_mtime < STALE_NEW:
                continue
            handle = open(path, "rb")  # noqa: SIM115
        except OSError:
            continue  # gone meanwhile, or not ours to open: left as it is
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(handle.fileno()).st_size == 0:
                path.unlink()
                log.info("audit outbox: removed %s, left by a writer killed at its start", path)
        except OSError:
            pass  # locked by a writer, or removed by another scan
        finally:
            handle.close()


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _read(orphan: Orphan, handle: IO[str]) -> None:
    for number, text in enumerate(handle, start=1):
        try:
            line = json.loads(text)
            if "row" in line:
                orphan.rows.append((int(line["i"]), list(line["row"])))
            else:
                orphan.begun.append((int(line["batch"]), int(line["upto"])))
        except (ValueError, KeyError, TypeError):
            # Only a last line can be torn; a torn row was never reported as kept.
            log.warning("audit outbox %s: line %d is not a record; skipped", orphan.path, number)


def pending_batches(orphan: Orphan, committed: int) -> list[tuple[int, list[Row]]]:
    """The rows of ``orphan`` still to commit, as (batch number, rows), given the highest batch
    number the table holds for its writer (``committed``; 0 for none). Rows up to the
    ``upto`` of the last noted batch at or below ``committed`` are in the table already."""
    done = max((upto for batch, upto in orphan.begun if batch <= committed), default=0)
    rest = [row for i, row in sorted(orphan.rows, key=lambda r: r[0]) if i > done]
    return [(committed + 1, rest)] if rest else []


def _line(record: dict[str, object]) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"
