"""Members' writes on what they own: claims, releases, acknowledgements, progress commits.

Every function runs inside a write transaction the caller opened, and re-reads in it what the
write depends on: the target generation and phase for a claim, the claim's session and epoch
for a release or a commit, and the member's lease.

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

from rebalancer_spark.backends.base import Session, fenced_commit
from rebalancer_spark.backends.records import parse_count
from rebalancer_spark.backends.sqlite.reads import progress
from rebalancer_spark.backends.sqlite.sessions import alive, require_alive
from rebalancer_spark.backends.sqlite.store.chain import wall_time
from rebalancer_spark.backends.sqlite.store.groups import bump
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.model import Freed, Grant, Phase

__all__ = ["acknowledge", "claim", "commit", "release"]


_FREED = {f.value: f for f in Freed}


def _freed(value: object) -> Freed | None:
    return _FREED.get(value) if isinstance(value, str) else None


def claim(
    db: sqlite3.Connection,
    clock: Clock,
    session: Session,
    resources: Collection[str],
    generation: int,
) -> dict[str, Grant]:
    """:meth:`Backend.claim`: grant what the target at ``generation`` gives ``session`` and
    nobody alive holds, each at the resource's next epoch, with what it superseded and the
    progress it hands over."""
    group = session.group
    wanted = set(resources)
    require_alive(db, session, clock)
    current, phase = db.execute(
        "SELECT generation, phase FROM groups WHERE name=?", (group,)
    ).fetchone()
    if current != generation or phase != Phase.RUNNING.value:
        return {}
    now = clock.monotonic()
    rows = db.execute(
        "SELECT t.resource_id, o.member_id, o.session_id, o.epoch, o.prev_member, "
        "o.prev_session, o.freed, o.freed_at, m.expires "
        "FROM targets t "
        "LEFT JOIN ownership o ON o.grp=t.grp AND o.resource_id=t.resource_id "
        "LEFT JOIN members m ON m.grp=t.grp AND m.session_id=o.session_id "
        "WHERE t.grp=? AND t.member_id=? "
        # Rows held by another live session are never granted: left out here, in SQLite's C,
        # so that a member waiting for a few releases does not walk its whole part each time.
        "AND (o.session_id IS NULL OR o.session_id=? OR m.expires IS NULL OR m.expires<=?)",
        (group, session.member_id, session.session_id, now),
    ).fetchall()
    # (resource, epoch, freed, prev member, prev session, prev epoch, freed at, new grant?)
    found: list[tuple[str, int, Freed | None, str | None, str | None, int, float | None, bool]] = []
    for rid, member, holder, stored, p_member, p_session, freed, freed_at, expires in rows:
        if rid not in wanted:
            continue
        epoch = (
            0 if stored is None else parse_count(group, f"epoch of {rid!r}", stored, store="SQLite")
        )
        if holder == session.session_id:
            found.append(
                (rid, epoch, _freed(freed), p_member, p_session, epoch - 1, freed_at, False)
            )
        elif holder is not None and expires is not None and expires > now:
            continue  # a live holder
        elif stored is None:
            found.append((rid, 1, Freed.NEW, None, None, 0, None, True))
        elif holder is not None:
            # Its session expired; the row was not freed yet (nobody ended it): end it now.
            at = wall_time(clock, expires) if expires is not None else clock.wall()
            found.append((rid, epoch + 1, Freed.EXPIRED, member, holder, epoch, at, True))
        else:
            found.append(
                (rid, epoch + 1, _freed(freed), p_member, p_session, epoch, freed_at, True)
            )
    if not found:
        return {}
    # Handed over with the grant, read in the same transaction.
    handed = progress(db, group, [f[0] for f in found])
    granted: dict[str, Grant] = {}
    grants: list[tuple[object, ...]] = []
    for rid, epoch, freed, p_member, p_session, p_epoch, freed_at, new in found:
        granted[rid] = Grant(epoch, freed, p_member, p_session, p_epoch, freed_at, handed.get(rid))
        if new:
            grants.append(
                (
                    group,
                    rid,
                    session.member_id,
                    session.session_id,
                    epoch,
                    p_member,
                    p_session,
                    None if freed is None else freed.value,
                    freed_at,
                )
            )
    if grants:
        db.executemany(
            "INSERT OR REPLACE INTO ownership(grp, resource_id, member_id, session_id, epoch, "
            "prev_member, prev_session, freed, freed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            grants,
        )
        bump(db, group)
    return granted


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
