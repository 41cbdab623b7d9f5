""":class:`SqliteBackend`: one connection, one transaction per call of the Backend contract.

Each method opens a transaction with :meth:`SqliteBackend._transaction` (``BEGIN IMMEDIATE``
for writes, its lock waited for by :func:`.connection.begin_write`; a plain ``BEGIN`` for
reads) and hands the connection to the function that does
the work, in :mod:`.sessions`, :mod:`.coordinator`, :mod:`.groups`, :mod:`.ownership` or
:mod:`.reads`. The design is in the package docstring (:mod:`rebalancer_spark.backends.sqlite`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Collection, Iterator, Mapping
from typing import ClassVar

from rebalancer_spark.backends.base import (
    Backend,
    Capability,
    KeptParts,
    Session,
    TargetChange,
    expired,
)
from rebalancer_spark.backends.sqlite import control as _control
from rebalancer_spark.backends.sqlite import (
    coordinator,
    floors,
    ownership,
    reads,
    sessions,
)
from rebalancer_spark.backends.sqlite.host import host_id
from rebalancer_spark.backends.sqlite.store import groups, schema
from rebalancer_spark.backends.sqlite.store.connection import (
    OPTIONS,
    begin_write,
    open_database,
    positive,
    translate,
)
from rebalancer_spark.backends.sqlite.watch import SqliteWatch
from rebalancer_spark.core.clock import Clock, SystemClock
from rebalancer_spark.core.control import Control
from rebalancer_spark.core.errors import BackendUnavailable, SessionExpired
from rebalancer_spark.core.model import (
    CoordinatorRecord,
    Grant,
    GroupHead,
    GroupState,
    Phase,
    Progress,
    Resource,
    ResourceChange,
    Target,
)
from rebalancer_spark.core.protocols import MemberHead, MemberView
from rebalancer_spark.core.urls import BackendUrl

__all__ = ["SqliteBackend"]

_WRITE = "BEGIN IMMEDIATE"
"""Takes the file's write lock at once, so a transaction never fails half-way for it."""
_READ = "BEGIN"
"""A snapshot: takes no write lock."""


class SqliteBackend(Backend):
    """The embedded backend; see :mod:`rebalancer_spark.backends.sqlite`."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.DURABLE})
    options: ClassVar[Mapping[str, str]] = OPTIONS

    def __init__(self, url: BackendUrl, *, clock: Clock | None = None) -> None:
        super().__init__(url)
        self._clock: Clock = clock or SystemClock()
        self.path = url.path
        self.poll_interval = url.option("poll", positive("poll"), 0.02)
        self.busy_timeout = url.option("busy_timeout", positive("busy_timeout"), 10.0)
        self.host = host_id()
        self._lock = threading.RLock()
        self._parts: reads.Kept = KeptParts()
        """Each session's part of the target as its last view read it (reads.member_view)."""
        self._conn = open_database(self.path, self.busy_timeout)
        self._file = _file_id(self.path)
        self._closed = False
        self._initialise()

    # -- connection handling -------------------------------------------------------------

    def _initialise(self) -> None:
        with self._transaction(_READ) as db:
            if schema.is_ready(db, self.host):
                return
        with self._transaction(_WRITE) as db:
            schema.initialise(db, self.path, self.host)

    @contextlib.contextmanager
    def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
        """One transaction started with ``begin`` (:data:`_WRITE` or :data:`_READ`): committed
        if the block ends normally, rolled back otherwise; SQLite errors are translated."""
        with self._lock:
            self._check_open()
            conn = self._conn
            try:
                if begin == _WRITE:
                    begin_write(conn, self.busy_timeout)
                else:
                    conn.execute(begin)
                yield conn
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise translate(exc, self.path, self.busy_timeout) from None
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def _check_open(self) -> None:
        if self._closed:
            raise BackendUnavailable(
                f"the SQLite backend for {self.path!r} was closed: open a new one"
            )

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    # -- sessions ------------------------------------------------------------------------

    def _join(
        self, group: str, member_id: str, *, info: dict[str, str], ttl: float, static: bool
    ) -> Session:
        with self._transaction(_WRITE) as db:
            return sessions.join(
                db,
                self._clock,
                group,
                member_id,
                info=info,
                ttl=ttl,
                static=static,
                host=self.host,
                path=self.path,
            )

    def _renew(self, session: Session) -> None:
        self._check_replaced(session)
        with self._transaction(_WRITE) as db:
            sessions.renew(db, self._clock, session)

    def _check_replaced(self, session: Session) -> None:
        """A file replaced under the path (moved over, deleted and created again) is another
        store: this handle moves to the new file, and the session, kept in the old one, is
        over (the member stops its work at once and rejoins; see backends/base.py)."""
        now = _file_id(self.path)
        if now is None or now == self._file:
            return
        with self._lock:
            if _file_id(self.path) != self._file:
                self._conn.close()
                self._conn = open_database(self.path, self.busy_timeout)
                self._file = _file_id(self.path)
        self._initialise()
        raise expired(
            session,
            f"the database file {self.path!r} was replaced by another one (the store lost its "
            "state)",
            doing="renewing",
        )

    def _incarnation(self, group: str) -> str | None:
        with self._transaction(_READ) as db:
            return floors.incarnation(db, group)

    def _lift_epochs(self, group: str, lift: dict[str, int]) -> int:
        with self._transaction(_WRITE) as db:
            return floors.lift_epochs(db, group, lift)

    def _update_info(self, session: Session, info: dict[str, str]) -> None:
        with self._transaction(_WRITE) as db:
            sessions.update_info(db, self._clock, session, info)

    def _set_leaving(self, session: Session) -> None:
        with self._transaction(_WRITE) as db:
            sessions.set_leaving(db, self._clock, session)

    def _leave(self, session: Session) -> None:
        with self._transaction(_WRITE) as db:
            sessions.leave(db, self._clock, session)
        self._parts.forget(session)

    # -- reading ---------------------------------------------------------------------------

    def _state(self, group: str) -> GroupState:
        with self._transaction(_READ) as db:
            return reads.state(db, self._clock, group)

    def _member_view(self, session: Session, claims: bool) -> MemberView:
        try:
            with self._transaction(_READ) as db:
                return reads.member_view(db, self._clock, session, self._parts, claims=claims)
        except SessionExpired:
            self._parts.forget(session)
            raise

    def _member_head(self, session: Session) -> MemberHead:
        with self._transaction(_READ) as db:
            return reads.member_head(db, self._clock, session)

    def _head(self, group: str) -> GroupHead:
        with self._transaction(_READ) as db:
            return reads.head(db, self._clock, group)

    def _control(self, group: str) -> Control:
        with self._transaction(_READ) as db:
            return _control.read_control(db, group)

    def _resources(self, group: str) -> tuple[int, dict[str, Resource]]:
        with self._transaction(_READ) as db:
            return reads.resources(db, group)

    def _remember_resources(self, group: str) -> int:
        with self._transaction(_READ) as db:
            version, rows = reads.resource_rows(db, group)
        if rows:  # built only if a store that lost the group needs it declared again
            self.epochs.keep_resources(group, version, lambda: reads.build_resources(group, rows))
        return version

    def _resource_changes(self, group: str, since: int) -> ResourceChange | None:
        with self._transaction(_READ) as db:
            return reads.resource_changes(db, group, since)

    def _target(self, group: str) -> Target | None:
        with self._transaction(_READ) as db:
            return reads.target(db, group)

    def _holders(self, group: str, sessions: dict[str, str]) -> frozenset[str]:
        with self._transaction(_READ) as db:
            return reads.holders(db, group, sessions)

    def _progress(self, group: str, resources: list[str]) -> dict[str, Progress]:
        with self._transaction(_READ) as db:
            return reads.progress(db, group, resources)

    def _watch(self, group: str) -> SqliteWatch:
        return SqliteWatch(self, group)

    # -- coordinator ---------------------------------------------------------------------------

    def _elect(self, session: Session) -> CoordinatorRecord | None:
        with self._transaction(_WRITE) as db:
            return coordinator.elect(db, self._clock, session, self.host)

    def _publish(
        self,
        session: Session,
        epoch: int,
        assignment: dict[str, list[str]],
        *,
        phase: Phase,
        resources_version: int,
        change: TargetChange | None,
    ) -> Target:
        with self._transaction(_WRITE) as db:
            return coordinator.publish(
                db,
                self._clock,
                session,
                epoch,
                assignment,
                phase=phase,
                resources_version=resources_version,
                change=change,
            )

    def _resign(self, session: Session, epoch: int) -> None:
        with self._transaction(_WRITE) as db:
            coordinator.resign(db, session, epoch)

    # -- resources -------------------------------------------------------------------------

    def _update_resources(
        self,
        group: str,
        *,
        replace: Collection[Resource] | None,
        add: Collection[Resource],
        remove: list[str],
        base: int | None,
    ) -> tuple[int, bool]:
        with self._transaction(_WRITE) as db:
            return groups.update_resources(
                db, group, replace=replace, add=add, remove=remove, base=base
            )

    # -- operator control ------------------------------------------------------------------

    def _update_control(self, group: str, expected_version: int, control: Control) -> Control:
        with self._transaction(_WRITE) as db:
            return _control.update_control(db, group, expected_version, control)

    # -- ownership ---------------------------------------------------------------------------

    def _claim(self, session: Session, resources: list[str], generation: int) -> dict[str, Grant]:
        # What may be granted is found in a snapshot, without the file's write lock: the write
        # transaction re-reads those rows alone, so that a member walking a part of thousands
        # of resources does not keep every other member from releasing meanwhile.
        kept = self._parts.get(session)
        part = len(kept[1]) if kept is not None and kept[0] == generation else None
        with self._transaction(_READ) as db:
            found = ownership.claimable(db, self._clock, session, resources, generation, part)
            if found.held is not None:
                return found.held
        with self._transaction(_WRITE) as db:
            held = ownership.claim(db, self._clock, session, found.resources, generation)
        if not held:
            return {}
        # The progress handed over, and the grants built, after the write lock is let go:
        # the releases of the same rebalance wait for that lock (about a third of a claim of
        # 6,000 resources was spent holding it for this).
        with self._transaction(_READ) as db:
            return ownership.grants(db, session, held)

    def _release(self, session: Session, claims: dict[str, int]) -> None:
        with self._transaction(_WRITE) as db:
            ownership.release(db, self._clock, session, claims)

    def _acknowledge(self, session: Session, generation: int) -> None:
        with self._transaction(_WRITE) as db:
            ownership.acknowledge(db, session, generation)

    def _commit(self, session: Session, resource: str, epoch: int, text: str) -> None:
        with self._transaction(_WRITE) as db:
            ownership.commit(db, self._clock, session, resource, epoch, text)


def _file_id(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path``; None if there is none (or no such file)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
