"""Change notifications for one group, by polling: :class:`SqliteWatch`.

SQLite tells no other process about a change, so the watch polls ``PRAGMA data_version`` on a
connection of its own (a read of shared memory, no disk I/O) every ``poll`` seconds, reads the
group's change counter only when the file changed, and also wakes when the earliest lease of
the group runs out.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from typing import TYPE_CHECKING

from rebalancer_spark.backends.base import Watch
from rebalancer_spark.backends.sqlite.store.connection import connect, translate

if TYPE_CHECKING:
    from rebalancer_spark.backends.sqlite.backend import SqliteBackend

__all__ = ["SqliteWatch"]


class SqliteWatch(Watch):
    """Polls ``PRAGMA data_version`` on its own connection; see the module docstring."""

    def __init__(self, backend: SqliteBackend, group: str) -> None:
        self._backend = backend
        self._group = group
        self._clock = backend._clock
        self._closed = threading.Event()
        try:
            self._conn = connect(backend.path, backend.busy_timeout)
        except sqlite3.Error as exc:
            raise self._translate(exc) from None
        self._data_version = -1
        self._seq = -1
        self._next_expiry: float | None = None
        try:
            self._refresh()
        except sqlite3.Error as exc:
            self._conn.close()
            raise self._translate(exc) from None

    def _translate(self, exc: BaseException) -> Exception:
        return translate(exc, self._backend.path, self._backend.busy_timeout)

    def _refresh(self) -> bool:
        """Re-read the change counter and the next lease deadline if the file changed; True if
        the group changed. A deadline that has passed is kept until :meth:`wait` reports it:
        other writes (renewals, commits) must not hide an expiry."""
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        if version == self._data_version:
            return False
        self._data_version = version
        row = self._conn.execute(
            "SELECT change_seq FROM groups WHERE name=?", (self._group,)
        ).fetchone()
        seq = -1 if row is None else row[0]
        if self._next_expiry is None or self._next_expiry > self._clock.monotonic():
            self._next_expiry = self._read_next_expiry()
        changed = seq != self._seq
        self._seq = seq
        return changed

    def _read_next_expiry(self) -> float | None:
        value: float | None = self._conn.execute(
            "SELECT min(expires) FROM members WHERE grp=? AND expires > ?",
            (self._group, self._clock.monotonic()),
        ).fetchone()[0]
        return value

    def wait(self, timeout: float) -> bool:
        # How long to block is real time; whether a lease ran out is judged on the store clock.
        deadline = time.monotonic() + timeout
        poll = self._backend.poll_interval
        while not self._closed.is_set():
            try:
                changed = self._refresh()
                now = self._clock.monotonic()
                if self._next_expiry is not None and now >= self._next_expiry:
                    self._next_expiry = self._read_next_expiry()
                    return True
            except sqlite3.Error as exc:
                raise self._translate(exc) from None
            if changed:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            pause = min(poll, left)
            if self._next_expiry is not None:
                pause = min(pause, max(self._next_expiry - now, 0.0))
            self._closed.wait(pause)
        return True

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
