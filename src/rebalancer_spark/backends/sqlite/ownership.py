"""Members' writes on what they own: claims, releases, acknowledgements, progress commits.

Every write runs inside a write transaction the caller opened, and re-reads in it what the
write depends on: the target generation and phase and each row it grants for a claim, the
claim's session and epoch for a release or a commit, and the member's lease. A claim is found
first in a read transaction (:func:`claimable`, which also returns the grants when nothing is
new), so that the walk of the member's part takes no write lock; :func:`claim` then works,
under the lock, on the ``ownership`` rows found alone, by key: it grants those still free in
one statement that checks and returns them as it writes, and reads the others again (the
target rows cannot have changed: the generation is checked again, and every publication
writes a new one).

The epoch chain: an ``ownership`` row keeps, besides the holder and epoch, ``prev_member``,
``prev_session``, ``freed`` and ``freed_at`` (wall-clock seconds). While the resource is held
they describe the predecessor of the current grant (at ``epoch - 1``); once it is free they
name the last holder (at ``epoch``) and how and when its ownership ended: ``released`` at the
release (or leave) time, or ``expired`` at its lease deadline converted from
``CLOCK_BOOTTIME`` to wall-clock time (:func:`.chain.end_sessions`). A claim reads them in the same
transaction as the grant, so every grant says exactly what it superseded.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

from rebalancer_spark.backends.base import Session, fenced_commit
from rebalancer_spark.backends.records import parse_count
from rebalancer_spark.backends.sqlite.reads import chunks, progress
from rebalancer_spark.backends.sqlite.sessions import alive, require_alive
from rebalancer_spark.backends.sqlite.store.chain import wall_time
from rebalancer_spark.backends.sqlite.store.groups import bump
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.model import Freed, Grant, Phase

__all__ = ["Claimable", "Found", "acknowledge", "claim", "claimable", "commit", "grants", "release"]


_FREED = {f.value: f for f in Freed}


def _freed(value: object) -> Freed | None:
    return _FREED.get(value) if isinstance(value, str) else None


class Found(NamedTuple):
    """One resource a claim grants or returns, as read: its epoch after the claim, what the
    grant supersedes, and whether it is a new grant (False: the session holds it already)."""

    resource: str
    epoch: int
    freed: Freed | None
    prev_member: str | None
    prev_session: str | None
    prev_epoch: int
    freed_at: float | None
    new: bool


_CLAIMABLE = (
    "SELECT t.resource_id, o.member_id, o.session_id, o.epoch, o.prev_member, "
    "o.prev_session, o.freed, o.freed_at, m.expires "
    "FROM targets t "
    "LEFT JOIN ownership o ON o.grp=t.grp AND o.resource_id=t.resource_id "
    "LEFT JOIN members m ON m.grp=t.grp AND m.session_id=o.session_id "
    "WHERE t.grp=? AND t.member_id=? "
    # Rows held by another live session are never granted: left out here, in SQLite's C, so
    # that a member waiting for a few releases does not walk its whole part in Python.
    "AND (o.session_id IS NULL OR o.session_id=? OR m.expires IS NULL OR m.expires<=?)"
)
"""The rows of the session's part of the target that a claim may grant or return."""

_CLAIMABLE_IDS = _CLAIMABLE + " AND t.resource_id IN ({marks})"
"""The rows of :data:`_CLAIMABLE` among given ids: one seek per id in the member's covering
index of the target (368 ids of a part of 6,250: 1 ms instead of the whole part's 10)."""

BY_IDS = 2 / 3
"""A claim of at most this share of the session's part finds its rows by id
(:data:`_CLAIMABLE_IDS`) rather than by walking the part: a seek per id costs about one and a
half times a row of the walk."""

_BY_KEY = (
    "SELECT o.resource_id, o.member_id, o.session_id, o.epoch, o.prev_member, "
    "o.prev_session, o.freed, o.freed_at, m.expires "
    "FROM ownership o "
    "LEFT JOIN members m ON m.grp=o.grp AND m.session_id=o.session_id "
    "WHERE o.grp=? AND o.resource_id IN ({marks})"
)
"""The columns of :data:`_CLAIMABLE` for the ``ownership`` rows of given resources, found by
the table's primary key. Not through ``targets``: given a list of ids, SQLite chose to walk a
covering index of the group's whole target (100,000 rows) once per chunk of ids, 130 ms for a
claim of 5,900 rows instead of 12."""

_GRANT = (
    "INSERT INTO ownership(grp, resource_id, member_id, session_id, epoch, prev_member, "
    "prev_session, freed, freed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT(grp, resource_id) DO UPDATE SET member_id=excluded.member_id, "
    "session_id=excluded.session_id, epoch=excluded.epoch, prev_member=excluded.prev_member, "
    "prev_session=excluded.prev_session, freed=excluded.freed, freed_at=excluded.freed_at"
)
"""A grant: the row is updated in place when the resource was owned before (a replace would
delete it and insert it again under a new row id, in the table and in both its indexes)."""


_GRANT_FREE = (
    "UPDATE ownership SET member_id=?, session_id=?, epoch=epoch+1 "
    "WHERE grp=? AND resource_id IN ({marks}) AND session_id IS NULL "
    "AND typeof(epoch)='integer' AND epoch >= 0 "
    "RETURNING resource_id, epoch, prev_member, prev_session, freed, freed_at"
)
"""A grant of the free rows among given ids (released, or freed when their session ended),
in one statement per chunk, returning each grant's link of the chain: a free row already
names its last holder, how and when that ownership ended, which the grant keeps. A free row
whose epoch is not a count is left to :func:`_claim_by_key`, which names it as corrupt. One
statement per 500 ids, not one per row, and no read before it: for 5,886 released rows on
an idle machine, 21 ms instead of 10.5 ms of reading and 22 ms of writing."""

_RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)
"""``RETURNING`` came with SQLite 3.35; with an older library every row takes the path of
:func:`_claim_by_key` (the same grants, more time under the lock)."""


class Claimable(NamedTuple):
    """What :func:`claimable` found: the resources a claim may grant or return, and their
    grants when the session holds every one of them already (nothing to write), else None."""

    resources: list[str]
    held: dict[str, Grant] | None


def claimable(
    db: sqlite3.Connection,
    clock: Clock,
    session: Session,
    resources: Collection[str],
    generation: int,
    part: int | None = None,
) -> Claimable:
    """What a claim of ``resources`` at ``generation`` may grant or return, read in a snapshot
    (no write lock), so that the write transaction of :func:`claim` re-reads only these rows,
    and judges them there. ``part``: the size of the session's part of the target at
    ``generation``, if known; a claim of a small share of it (:data:`BY_IDS`: the 368 a leave
    gives each of 16 members, the rest of a newcomer's part) looks its ids up, any other
    walks the whole part. When the session holds every one already, their grants are read
    here (with their progress): a claim with nothing new takes no write lock."""
    require_alive(db, session, clock)
    if not _running(db, session.group, generation):
        return Claimable([], {})
    wanted = set(resources)
    args = (session.group, session.member_id, session.session_id, clock.monotonic())
    if part is not None and len(wanted) <= part * BY_IDS:
        rows = []
        for chunk in chunks(sorted(wanted)):
            # Only '?' placeholders are formatted in; every value is bound.
            query = _CLAIMABLE_IDS.format(marks=",".join("?" * len(chunk)))
            rows += db.execute(query, (*args, *chunk)).fetchall()
    else:
        rows = [row for row in db.execute(_CLAIMABLE, args).fetchall() if row[0] in wanted]
    ids = [row[0] for row in rows]
    if any(row[2] != session.session_id for row in rows):
        return Claimable(ids, None)
    return Claimable(ids, grants(db, session, _found(clock, session, wanted, rows)))


def claim(
    db: sqlite3.Connection,
    clock: Clock,
    session: Session,
    resources: Collection[str],
    generation: int,
) -> list[Found]:
    """:meth:`Backend.claim`, in the write transaction, of the rows :func:`claimable` found
    (``resources``, in the session's part of the target at ``generation``): grant what nobody
    alive holds, each at the resource's next epoch, with what it superseded; what the session
    holds now (granted here or before), for :func:`grants` to read the progress of after the
    write lock is let go. The write lock is held for what is claimed, not for the session's
    whole part: the free rows are granted by :data:`_GRANT_FREE`, which returns what they
    superseded as it writes them; every other row is read again here, by its key, and judged
    (a holder whose lease ran out, this session's own, a resource never owned)."""
    require_alive(db, session, clock)
    if not _running(db, session.group, generation):
        return []  # a new target: its rows may give these resources to someone else
    group = session.group
    found: list[Found] = []
    for chunk in chunks(sorted(resources)) if _RETURNING else ():
        # Only '?' placeholders are formatted in; every value is bound.
        query = _GRANT_FREE.format(marks=",".join("?" * len(chunk)))
        granted = db.execute(query, (session.member_id, session.session_id, group, *chunk))
        found += (
            Found(rid, epoch, _freed(freed), p_member, p_session, epoch - 1, freed_at, True)
            for rid, epoch, p_member, p_session, freed, freed_at in granted.fetchall()
        )
    wrote = bool(found)
    if len(found) < len(resources):
        done = {f.resource for f in found}
        judged = _claim_by_key(db, clock, session, [r for r in resources if r not in done])
        wrote = wrote or any(f.new for f in judged)
        found += judged
    if wrote:
        bump(db, group)
    return found


def _claim_by_key(
    db: sqlite3.Connection, clock: Clock, session: Session, resources: list[str]
) -> list[Found]:
    """The rows of :func:`claim` that were not free: each read again by its key, granted if
    its holder's lease ran out or it was never owned, returned if this session holds it."""
    group = session.group
    stored: dict[str, Any] = {}
    for chunk in chunks(sorted(resources)):
        # Only '?' placeholders are formatted in; every value is bound.
        query = _BY_KEY.format(marks=",".join("?" * len(chunk)))
        stored.update((row[0], row) for row in db.execute(query, (group, *chunk)).fetchall())
    never_owned = (None,) * 8
    rows = [stored.get(r) or (r, *never_owned) for r in sorted(resources)]
    found = _found(clock, session, set(resources), rows)
    granted = [
        (
            group,
            f.resource,
            session.member_id,
            session.session_id,
            f.epoch,
            f.prev_member,
            f.prev_session,
            None if f.freed is None else f.freed.value,
            f.freed_at,
        )
        for f in found
        if f.new
    ]
    if granted:
        db.executemany(_GRANT, granted)
    return found


def _running(db: sqlite3.Connection, group: str, generation: int) -> bool:
    """Whether the group's target is still at ``generation``, in the running phase."""
    current, phase = db.execute(
        "SELECT generation, phase FROM groups WHERE name=?", (group,)
    ).fetchone()
    return bool(current == generation and phase == Phase.RUNNING.value)


def _found(clock: Clock, session: Session, wanted: set[str], rows: list[Any]) -> list[Found]:
    """The rows of :data:`_CLAIMABLE` or :data:`_BY_KEY` among ``wanted``, as what a claim
    grants or returns."""
    group, now = session.group, clock.monotonic()
    found: list[Found] = []
    sid = session.session_id
    for rid, member, holder, stored, p_member, p_session, freed, freed_at, expires in rows:
        if rid not in wanted:
            continue
        if stored is None:
            epoch = 0
        elif type(stored) is int and stored >= 0:
            epoch = stored
        else:
            epoch = parse_count(group, f"epoch of {rid!r}", stored, store="SQLite")  # raises
        if holder == sid:
            found.append(
                Found(rid, epoch, _freed(freed), p_member, p_session, epoch - 1, freed_at, False)
            )
        elif holder is not None and expires is not None and expires > now:
            continue  # a live holder
        elif stored is None:
            found.append(Found(rid, 1, Freed.NEW, None, None, 0, None, True))
        elif holder is not None:
            # Its session expired; the row was not freed yet (nobody ended it): end it now.
            at = wall_time(clock, expires) if expires is not None else clock.wall()
            found.append(Found(rid, epoch + 1, Freed.EXPIRED, member, holder, epoch, at, True))
        else:
            found.append(
                Found(rid, epoch + 1, _freed(freed), p_member, p_session, epoch, freed_at, True)
            )
    return found


def grants(db: sqlite3.Connection, session: Session, found: list[Found]) -> dict[str, Grant]:
    """The :class:`Grant` of each of ``found`` (held by ``session``), with the progress it
    hands over. It may be read after the claim's write transaction: once the claim holds a
    resource, only its holder's commits are accepted, and this one has made none yet. A
    progress at a later epoch than the grant's (the session lapsed meanwhile and a successor
    committed) is not handed over: this session never works on that resource."""
    handed = progress(db, session.group, [f.resource for f in found])
    out: dict[str, Grant] = {}
    for f in found:
        given = handed.get(f.resource)
        out[f.resource] = Grant(
            f.epoch,
            f.freed,
            f.prev_member,
            f.prev_session,
            f.prev_epoch,
            f.freed_at,
            None if given is None or given.epoch > f.epoch else given,
        )
    return out


def release(
    db: sqlite3.Connection, clock: Clock, session: Session, claims: Mapping[str, int]
) -> None:
    """:meth:`Backend.release`: drop each claim still held by ``session`` at its epoch, the
    row keeping who released it and when."""
    now = clock.wall()
    changed = db.executemany(
        "UPDATE ownership SET prev_member=member_id, prev_session=session_id, "
        "freed='released', freed_at=?, member_id=NULL, session_id=NULL "
        "WHERE grp=? AND resource_id=? AND session_id=? AND epoch=?",
        [(now, session.group, rid, session.session_id, epoch) for rid, epoch in claims.items()],
    ).rowcount
    if changed:
        bump(db, session.group)


def acknowledge(db: sqlite3.Connection, session: Session, generation: int) -> None:
    """:meth:`Backend.acknowledge`: record that ``session`` reached ``generation``."""
    cur = db.execute(
        "UPDATE members SET acked=? WHERE grp=? AND session_id=? AND acked < ?",
        (generation, session.group, session.session_id, generation),
    )
    if cur.rowcount:
        bump(db, session.group)


def commit(
    db: sqlite3.Connection,
    clock: Clock,
    session: Session,
    resource: str,
    epoch: int,
    text: str,
) -> None:
    """:meth:`Backend.commit` of the encoded progress ``text``: refused unless ``session``
    still holds ``resource`` at ``epoch`` and its lease has not lapsed."""
    row = db.execute(
        "SELECT member_id, session_id, epoch FROM ownership WHERE grp=? AND resource_id=?",
        (session.group, resource),
    ).fetchone()
    if row is None or row[1] != session.session_id or row[2] != epoch:
        holder = None if row is None or row[0] is None else str(row[0])
        raise fenced_commit(
            session, resource, epoch, holder=holder, current_epoch=row[2] if row else 0
        )
    if not alive(db, session, clock):
        raise fenced_commit(session, resource, epoch, why="its session lease has lapsed")
    db.execute(
        "INSERT OR REPLACE INTO progress VALUES (?, ?, ?, ?, ?, ?)",
        (session.group, resource, epoch, session.member_id, text, clock.wall()),
    )
