"""Read connections of one backend object, one per thread that reads.

SQLite in WAL mode lets readers run beside the one writer, each on a snapshot, but not on the
same connection: with a single connection, a member's coordinator thread waiting to read the
group (``head``) queued behind its reconciler's claim, which itself may wait for another
process's write lock, and its heartbeat's renewal queued behind both. So reads get a
connection per thread and never wait for this object's writes; the writes keep the one
connection of :class:`~..backend.SqliteBackend` (one writer at a time is all the file allows).

A read begins after every write this object committed, so it sees them all (a WAL snapshot
starts at the newest commit). When the file is replaced under the path (the store lost its
state), :meth:`Readers.reopen` makes every thread open its next read on the new file. Threads
that ended leave their connection behind until the next new reader, which closes them;
:meth:`Readers.close` closes all.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from rebalancer_spark.backends.sqlite.store.connection import connect, translate
from rebalancer_spark.core.errors import BackendUnavailable

__all__ = ["Readers"]


@dataclass
class _Reader:
    conn: sqlite3.Connection
    thread: threading.Thread
    generation: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held while the connection is in use, so that :meth:`Readers.close` from another thread
    never closes it mid-read."""
    closed: bool = False


class Readers:
    """Per-thread read connections to the database at ``path``."""

    def __init__(self, path: str, busy_timeout: float) -> None:
        self._path = path
        self._busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._readers: dict[int, _Reader] = {}
        self._generation = 0
        self._closed = False

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One read transaction (a snapshot) on this thread's connection: ended when the
        block ends; SQLite errors are translated."""
        reader = self._mine()
        with reader.lock:
            if reader.closed:
                raise self._closed_error()
            conn = reader.conn
            try:
                conn.execute("BEGIN")
                yield conn
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise translate(exc, self._path, self._busy_timeout) from None
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def reopen(self) -> None:
        """The file was replaced: every thread's next read opens the new one."""
        with self._lock:
            self._generation += 1

    def close(self) -> None:
        """Close every connection (waiting for reads in progress); reads after this raise
        :class:`BackendUnavailable`. Idempotent."""
        with self._lock:
            self._closed = True
            readers, self._readers = list(self._readers.values()), {}
        for reader in readers:
            _close(reader)

    def _mine(self) -> _Reader:
        me = threading.current_thread()
        stale: list[_Reader] = []
        try:
            with self._lock:
                if self._closed:
                    raise self._closed_error()
                reader = self._readers.get(me.ident or 0)
                if reader is not None and reader.thread is me:
                    if reader.generation == self._generation:
                        return reader
                    stale.append(reader)
                # A new reader: also drop those of threads that ended.
                for ident, other in list(self._readers.items()):
                    if not other.thread.is_alive():
                        stale.append(self._readers.pop(ident))
                try:
                    conn = connect(self._path, self._busy_timeout)
                except sqlite3.Error as exc:
                    raise translate(exc, self._path, self._busy_timeout) from None
                reader = self._readers[me.ident or 0] = _Reader(conn, me, self._generation)
                return reader
        finally:
            for old in stale:
                _close(old)

    def _closed_error(self) -> BackendUnavailable:
        return BackendUnavailable(
            f"the SQLite backend for {self._path!r} was closed: open a new one"
        )


def _close(reader: _Reader) -> None:
    with reader.lock:
        if not reader.closed:
            reader.closed = True
            reader.conn.close()
