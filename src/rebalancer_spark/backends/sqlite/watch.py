"""Change notifications for one group, by polling: :class:`SqliteWatch`.

SQLite tells no other process about a change, so the watch polls ``PRAGMA data_version`` on a
connection of its own (a read of shared memory, no disk I/O) every ``poll`` seconds, reads the
group's change counter only when the file changed, and also wakes when the earliest lease of
the group runs out.

A watch focused on :attr:`~rebalancer_spark.backends.base.Interest.COORDINATOR` (a follower
that gives no rejoin grace) wakes only when the group's coordinator row changes (session or
epoch), when the coordinator's member row goes, when its lease runs out, and when the resource
set's version moves (a follower remembers the set, so that it can declare it again into a
store that lost it: :class:`~rebalancer_spark.backends.base.GroupReader`), not for the
claims, releases and joins of a rebalance (in a group of 16, the 15 followers' coordinator
threads woke on every poll of a join that changed the file, each to read the group's head).
Every other interest wakes for every change of the group. The coordinator row is read with
the change counter (but by :attr:`~rebalancer_spark.backends.base.Interest.MEMBER` watches),
so that a watch that narrows compares with what its last wake-up covered; one that widens
reads the change counter again, so a change held back meanwhile wakes the next wait.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from typing import TYPE_CHECKING

from rebalancer_spark.backends.base import Interest, Watch
from rebalancer_spark.backends.sqlite.store.connection import connect, translate

if TYPE_CHECKING:
    from rebalancer_spark.backends.sqlite.backend import SqliteBackend

__all__ = ["SqliteWatch"]

_COORDINATOR = (
    "SELECT g.coord_session, g.coord_epoch, m.expires, g.resources_version FROM groups g "
    "LEFT JOIN members m ON m.grp=g.name AND m.session_id=g.coord_session WHERE g.name=?"
)
"""The group's coordinator (its session, epoch, and lease deadline; None: no member row) and
the version of its resource set."""

_UNSEEN = ("", -1, False, -1)
"""What a watch that has no reading of the coordinator compares its first one with."""


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
        self._coordinator: tuple[str, int, bool, int] = _UNSEEN
        """(session, epoch, whether its member row exists, resource-set version) as last
        read."""
        self._next_expiry: float | None = None
        try:
            self._refresh()
        except sqlite3.Error as exc:
            self._conn.close()
            raise self._translate(exc) from None

    def focus(self, interest: Interest, member_id: str | None = None) -> None:
        before = self.interest
        if interest is not before:
            if before is Interest.COORDINATOR:
                # Widened: compare the change counter with the last one reported, and every
                # lease again, at the next wait.
                self._data_version = -1
                self._next_expiry = None
            elif interest is Interest.COORDINATOR and before is Interest.MEMBER:
                self._coordinator = _UNSEEN  # never read: one spurious wake-up
        super().focus(interest, member_id)

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
        if self.interest is not Interest.MEMBER:
            moved = self._coordinator_changed()
            if self.interest is Interest.COORDINATOR:
                return moved
        row = self._conn.execute(
            "SELECT change_seq FROM groups WHERE name=?", (self._group,)
        ).fetchone()
        seq = -1 if row is None else row[0]
        if self._next_expiry is None or self._next_expiry > self._clock.monotonic():
            self._next_expiry = self._read_next_expiry()
        changed = seq != self._seq
        self._seq = seq
        return changed

    def _coordinator_changed(self) -> bool:
        """Re-read the coordinator (and, focused on it, its lease deadline as the one to wake
        at); True if it changed."""
        row = self._conn.execute(_COORDINATOR, (self._group,)).fetchone()
        session, epoch, expires, version = (None, 0, None, 0) if row is None else row
        now = (session or "", epoch, expires is not None, version)
        focused = self.interest is Interest.COORDINATOR
        if focused and (self._next_expiry is None or self._next_expiry > self._clock.monotonic()):
            ahead = expires is not None and expires > self._clock.monotonic()
            self._next_expiry = expires if ahead else None
        changed = now != self._coordinator
        self._coordinator = now
        return changed

    def _read_next_expiry(self) -> float | None:
        if self.interest is Interest.COORDINATOR:
            return None  # the coordinator's: reported; a renewal is read with the next change
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
