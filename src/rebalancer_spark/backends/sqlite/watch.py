"""Change notifications for one group, by polling: :class:`SqliteWatch`.

SQLite tells no other process about a change, so the watch polls ``PRAGMA data_version`` on a
connection of its own (a read of shared memory, no disk I/O) every ``poll`` seconds, reads the
counters of its interest only when the file changed, and also wakes when the earliest lease of
the group runs out (a lease event, which every interest covers).

What wakes whom (:meth:`Watch.focus`): :attr:`Interest.ALL` reads the group's ``change_seq``
(every change); a member's reconciler (:attr:`Interest.MEMBER`) the ``wakes`` counters of
what every member acts on and of the releases its target is given; a follower's coordinator
thread (:attr:`Interest.SUCCESSION`) the counter of joins, leaves, elections and resignations
(:mod:`.store.groups`). At 16 members a join's two dozen writes used to wake all 33 watches of
the group, each of whose threads then read the store. A change of interest reports at the
next wait what the old interest had not reported yet, and a change once unless it narrows
from every change (as Redis and ZooKeeper wake once when an interest widens). Writers from
before these counters (an older version of this library, during a rolling upgrade) bump only
``change_seq``: a focused watch then sees their changes at its owner's next periodic look.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from typing import TYPE_CHECKING

from rebalancer_spark.backends.base import Interest, Watch
from rebalancer_spark.backends.sqlite.store.connection import connect, translate
from rebalancer_spark.backends.sqlite.store.groups import MEMBERS, SUCCESSION, released_to

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
        self._seen: object = None
        """The counters of the interest as last read."""
        self._report = False
        """A change to report at the next wait (one seen, or a wider interest, at a focus)."""
        self._next_expiry: float | None = None
        try:
            self._refresh()
        except sqlite3.Error as exc:
            self._conn.close()
            raise self._translate(exc) from None

    def _translate(self, exc: BaseException) -> Exception:
        return translate(exc, self._backend.path, self._backend.busy_timeout)

    def focus(self, interest: Interest, member_id: str | None = None) -> None:
        try:
            missed = self._refresh()  # a change of the interest so far, not reported yet
            widens = self.interest is not Interest.ALL and (interest, member_id) != (
                self.interest,
                self.member_id,
            )
            super().focus(interest, member_id)
            self._data_version = -1
            self._refresh()  # the counters of the new interest, as they are now
        except sqlite3.Error as exc:
            raise self._translate(exc) from None
        self._report = self._report or missed or widens

    def _refresh(self) -> bool:
        """Re-read the counters of the interest and the next lease deadline if the file
        changed; True if they moved. A deadline that has passed is kept until :meth:`wait`
        reports it: other writes (renewals, commits) must not hide an expiry."""
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        if version == self._data_version:
            return False
        self._data_version = version
        seen = self._counters()
        if self._next_expiry is None or self._next_expiry > self._clock.monotonic():
            self._next_expiry = self._read_next_expiry()
        changed = seen != self._seen
        self._seen = seen
        return changed

    def _counters(self) -> object:
        """What the interest counts, as stored now (see the module docstring)."""
        if self.interest is Interest.ALL:
            row = self._conn.execute(
                "SELECT change_seq FROM groups WHERE name=?", (self._group,)
            ).fetchone()
            return -1 if row is None else row[0]
        if self.interest is Interest.SUCCESSION:
            kinds = (SUCCESSION, SUCCESSION)
        else:
            own = MEMBERS if self.member_id is None else released_to(self.member_id)
            kinds = (MEMBERS, own)
        return tuple(
            self._conn.execute(
                "SELECT kind, seq FROM wakes WHERE grp=? AND kind IN (?, ?) ORDER BY kind",
                (self._group, *kinds),
            ).fetchall()
        )

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
        if self._report:
            self._report = False
            return True
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
