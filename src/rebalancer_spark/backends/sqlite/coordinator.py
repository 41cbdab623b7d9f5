"""The coordinator's writes: election, publishing a target, resigning.

Every function runs inside a write transaction the caller opened. The coordinator epoch lives
in the group's row; :func:`require_coordinator` re-reads it (and the caller's lease) in the same
transaction as the write it guards, so a deposed coordinator changes nothing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Mapping

from rebalancer_spark.backends.base import Session, TargetChange, fenced_coordinator
from rebalancer_spark.backends.records import parse_count
from rebalancer_spark.backends.sqlite.sessions import alive
from rebalancer_spark.backends.sqlite.store.chain import end_sessions, wall_time
from rebalancer_spark.backends.sqlite.store.groups import bump
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.model import CoordinatorRecord, Freed, Phase, Target

__all__ = ["AWAY_KEPT", "elect", "publish", "require_coordinator", "resign"]

AWAY_KEPT = 16
"""Generations the away log keeps: a member whose last view is older reads its part whole."""


def elect(
    db: sqlite3.Connection, clock: Clock, session: Session, host: str
) -> CoordinatorRecord | None:
    """:meth:`Backend.elect`: first end the expired sessions of the group (only ``host``'s:
    another host's lease deadlines are readings of another clock), then keep a live
    coordinator or make ``session`` the next one at a higher epoch."""
    group = session.group
    now = clock.monotonic()
    if not alive(db, session, clock):
        return None
    expired = db.execute(
        "SELECT session_id, expires FROM members WHERE grp=? AND expires <= ? AND host IN (?, '')",
        (group, now, host),
    ).fetchall()
    # Their claims end as expired at their lease deadlines, as wall-clock times.
    end_sessions(db, group, [(sid, wall_time(clock, at)) for sid, at in expired], Freed.EXPIRED)
    for sid, _ in expired:
        db.execute("DELETE FROM members WHERE grp=? AND session_id=?", (group, sid))
    if expired:
        bump(db, group)
    member, sid, epoch = db.execute(
        "SELECT coord_member, coord_session, coord_epoch FROM groups WHERE name=?",
        (group,),
    ).fetchone()
    if (
        sid is not None
        and db.execute(
            "SELECT 1 FROM members WHERE grp=? AND session_id=?", (group, sid)
        ).fetchone()
    ):
        return CoordinatorRecord(member, sid, epoch)
    epoch += 1
    db.execute(
        "UPDATE groups SET coord_member=?, coord_session=?, coord_epoch=? WHERE name=?",
        (session.member_id, session.session_id, epoch, group),
    )
    bump(db, group)
    return CoordinatorRecord(session.member_id, session.session_id, epoch)


def require_coordinator(db: sqlite3.Connection, clock: Clock, session: Session, epoch: int) -> None:
    """Raise :class:`FencedError` unless ``session`` is the live coordinator at ``epoch``."""
    member, sid, current = db.execute(
        "SELECT coord_member, coord_session, coord_epoch FROM groups WHERE name=?",
        (session.group,),
    ).fetchone()
    if current != epoch or sid != session.session_id or not alive(db, session, clock):
        raise fenced_coordinator(session, epoch, holder=member, current_epoch=current)


def publish(
    db: sqlite3.Connection,
    clock: Clock,
    session: Session,
    epoch: int,
    assignment: Mapping[str, Collection[str]],
    *,
    phase: Phase,
    resources_version: int,
    change: TargetChange | None = None,
) -> Target:
    """:meth:`Backend.publish`: write only the rows of the target that changed, each with the
    new generation, and log per member the ids taken away from it (``target_away``); from
    ``change`` when the stored target is still its base generation (no read of the target),
    else from a comparison with the stored rows.

    The away log lets a member's view read its own moves alone (reads.member_view). It
    covers the generations after ``groups.away_since`` up to ``groups.away_upto``: a
    publication after one that logged nothing (a file of schema version 4, or a process of
    that version still publishing into a migrated file) starts the log again at its own
    generation, and each publication drops the generations older than :data:`AWAY_KEPT`."""
    group = session.group
    require_coordinator(db, clock, session, epoch)
    stored, has_target, since, upto = db.execute(
        "SELECT generation, has_target, away_since, away_upto FROM groups WHERE name=?", (group,)
    ).fetchone()
    generation = parse_count(group, "generation", stored, store="SQLite") + 1
    if change is not None and has_target and stored == change.base:
        moved_to = {r: m for m, rs in change.added.items() for r in rs}
        gone = [(group, r) for rs in change.removed.values() for r in rs if r not in moved_to]
        changed = [(group, r, m, generation) for r, m in moved_to.items()]
        away = [(group, m, generation, r) for m, rs in change.removed.items() for r in rs]
    else:
        gone, changed, away = _compare(db, group, assignment, generation)
    db.executemany("DELETE FROM targets WHERE grp=? AND resource_id=?", gone)
    db.executemany("INSERT OR REPLACE INTO targets VALUES (?, ?, ?, ?)", changed)
    db.execute("DELETE FROM target_members WHERE grp=?", (group,))
    db.executemany("INSERT INTO target_members VALUES (?, ?)", [(group, m) for m in assignment])
    oldest = generation - AWAY_KEPT
    db.execute("DELETE FROM target_away WHERE grp=? AND gen <= ?", (group, oldest))
    db.executemany("INSERT OR REPLACE INTO target_away VALUES (?, ?, ?, ?)", away)
    since = max(since if upto == generation - 1 else generation - 1, oldest)
    # target_since: what a view of schema version 4 reads by (a deleted row leaves no trace
    # in targets), kept up for such a process while one still runs beside this one.
    db.execute(
        "UPDATE groups SET generation=?, target_epoch=?, phase=?, has_target=1, "
        "target_resources_version=?, target_since=CASE WHEN ? THEN ? ELSE target_since END, "
        "away_since=?, away_upto=? WHERE name=?",
        (
            generation,
            epoch,
            phase.value,
            resources_version,
            bool(gone),
            generation,
            since,
            generation,
            group,
        ),
    )
    bump(db, group)
    return Target(
        generation=generation,
        coordinator_epoch=epoch,
        assignment={m: frozenset(rs) for m, rs in assignment.items()},
        phase=phase,
        resources_version=resources_version,
    )


def _compare(
    db: sqlite3.Connection,
    group: str,
    assignment: Mapping[str, Collection[str]],
    generation: int,
) -> tuple[list[tuple[str, str]], list[tuple[str, str, str, int]], list[tuple[str, str, int, str]]]:
    """The target rows to delete and to write (at ``generation``), and the away log's rows,
    against what the table holds."""
    current: dict[str, str] = dict(
        db.execute("SELECT resource_id, member_id FROM targets WHERE grp=?", (group,)).fetchall()
    )
    wanted = {r: m for m, rs in assignment.items() for r in rs}
    gone = [(group, r) for r in current.keys() - wanted.keys()]
    changed = [(group, r, m, generation) for r, m in wanted.items() if current.get(r) != m]
    away = [(group, m, generation, r) for r, m in current.items() if wanted.get(r) != m]
    return gone, changed, away


def resign(db: sqlite3.Connection, session: Session, epoch: int) -> None:
    """:meth:`Backend.resign`: step down if still the coordinator at ``epoch``."""
    cur = db.execute(
        "UPDATE groups SET coord_member=NULL, coord_session=NULL "
        "WHERE name=? AND coord_session=? AND coord_epoch=?",
        (session.group, session.session_id, epoch),
    )
    if cur.rowcount:
        bump(db, session.group)
