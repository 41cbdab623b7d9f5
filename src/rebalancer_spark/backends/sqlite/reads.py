"""Snapshots read in one read transaction: a group's state, a member's view, progress.

Rows are fetched whole before they are checked: a check that raises (corrupt data) must not
leave a half-read statement behind, which would keep the connection's read snapshot open for
as long as anyone holds the exception, so that every later read saw the old data.

Every function runs inside a transaction the caller opened (reads take no write lock). Only live
sessions count: members whose lease ran out, and the claims and coordinator role of those
sessions, are left out even before :func:`~.coordinator.elect` removes them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Iterator
from operator import itemgetter

from rebalancer_spark.backends.base import KeptParts, Session
from rebalancer_spark.backends.records import (
    parse_count,
    parse_member_info,
    parse_phase,
    parse_resource,
)
from rebalancer_spark.backends.sqlite.control import read_control
from rebalancer_spark.backends.sqlite.sessions import require_alive
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.model import (
    Claim,
    CoordinatorRecord,
    GroupHead,
    GroupState,
    MemberRecord,
    Progress,
    Resource,
    ResourceChange,
    Target,
    decode_progress,
    fold_changes,
)
from rebalancer_spark.core.protocols import MemberHead, MemberView

__all__ = [
    "Kept",
    "chunks",
    "head",
    "holders",
    "member_head",
    "member_view",
    "progress",
    "resources",
    "state",
    "target",
]

STORE = "SQLite"
"""How error messages name this store."""

_CHUNK = 500
"""Most resource ids bound in one query."""


_first = itemgetter(0)
"""The first column of a row (the id of a one-column row), in C."""


def chunks(items: list[str]) -> Iterator[list[str]]:
    """``items`` in lists of at most :data:`_CHUNK`, to bind in one query each."""
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


_GROUP_ROW = (
    "SELECT coord_member, coord_session, coord_epoch, generation, target_epoch, "
    "phase, has_target, target_resources_version, resources_version "
    "FROM groups WHERE name=?"
)


def _members(db: sqlite3.Connection, clock: Clock, group: str) -> dict[str, MemberRecord]:
    members: dict[str, MemberRecord] = {}
    for mid, sid, info, acked, leaving, static in db.execute(
        "SELECT member_id, session_id, info, acked, leaving, static FROM members "
        "WHERE grp=? AND expires > ?",
        (group, clock.monotonic()),
    ).fetchall():
        members[mid] = MemberRecord(
            member_id=mid,
            session_id=sid,
            info=parse_member_info(group, mid, info, store=STORE),
            acked_generation=parse_count(
                group, f"acknowledged generation of member {mid!r}", acked, store=STORE
            ),
            leaving=bool(leaving),
            static=bool(static),
        )
    return members


def _count(group: str, row: tuple[object, ...], what: str, i: int) -> int:
    return parse_count(group, what, row[i], store=STORE)


def head(db: sqlite3.Connection, clock: Clock, group: str) -> GroupHead:
    """:meth:`Backend.head`: members, coordinator, control and versions; no resource rows."""
    g = db.execute(_GROUP_ROW, (group,)).fetchone()
    if g is None:
        return GroupHead(group, {}, None, 0, 0, read_control(db, group))
    members = _members(db, clock, group)
    live = {m.session_id for m in members.values()}
    coordinator = (
        CoordinatorRecord(g[0], g[1], _count(group, g, "coordinator epoch", 2))
        if g[1] in live
        else None
    )
    return GroupHead(
        group,
        members,
        coordinator,
        _count(group, g, "resources version", 8),
        _count(group, g, "generation", 3) if g[6] else 0,
        read_control(db, group),
    )


def resources(db: sqlite3.Connection, group: str) -> tuple[int, dict[str, Resource]]:
    """:meth:`Backend.resources`: the resource set and its version."""
    version, rows = resource_rows(db, group)
    return version, {r.id: r for r in build_resources(group, rows)}


def resource_rows(db: sqlite3.Connection, group: str) -> tuple[int, list[tuple[str, object]]]:
    """The resource set's version and its rows as stored (id, weight), not parsed: what a
    follower remembers (:meth:`Backend.remember_resources`)."""
    row = db.execute("SELECT resources_version FROM groups WHERE name=?", (group,)).fetchone()
    if row is None:
        return 0, []
    rows: list[tuple[str, object]] = db.execute(
        "SELECT resource_id, weight FROM resources WHERE grp=?", (group,)
    ).fetchall()
    return _count(group, row, "resources version", 0), rows


def resource_changes(db: sqlite3.Connection, group: str, since: int) -> ResourceChange | None:
    """:meth:`Backend.resource_changes`: the logged changes after ``since`` (``resource_log``,
    written by :func:`.groups.update_resources`), None if the log does not reach back to it."""
    row = db.execute(
        "SELECT resources_version, rlog_from, rlog_upto FROM groups WHERE name=?", (group,)
    ).fetchone()
    if row is None:  # no group yet: its set is empty at version 0
        return ResourceChange(0, 0, {}, frozenset()) if since == 0 else None
    version = _count(group, row, "resources version", 0)
    if not _count(group, row, "resource log start", 1) <= since <= version:
        return None
    if _count(group, row, "resource log end", 2) != version:
        return None  # a process of schema version 5 changed the set without logging it
    rows = db.execute(
        "SELECT resource_id, weight FROM resource_log WHERE grp=? AND version > ? ORDER BY version",
        (group, since),
    )
    put, removed = fold_changes(
        (rid, None if w is None else parse_resource(group, rid, w, store=STORE)) for rid, w in rows
    )
    return ResourceChange(since, version, put, frozenset(removed))


def build_resources(group: str, rows: list[tuple[str, object]]) -> list[Resource]:
    """The resources of rows read by :func:`resource_rows`."""
    return [parse_resource(group, rid, weight, store=STORE) for rid, weight in rows]


def target(db: sqlite3.Connection, group: str) -> Target | None:
    """:meth:`Backend.target`: the current target, whole."""
    g = db.execute(_GROUP_ROW, (group,)).fetchone()
    if g is None or not g[6]:
        return None
    assignment: dict[str, set[str]] = {
        m: set()
        for (m,) in db.execute(
            "SELECT member_id FROM target_members WHERE grp=?", (group,)
        ).fetchall()
    }
    for rid, mid in db.execute(
        "SELECT resource_id, member_id FROM targets WHERE grp=?", (group,)
    ).fetchall():
        assignment.setdefault(mid, set()).add(rid)
    return Target(
        generation=_count(group, g, "generation", 3),
        coordinator_epoch=_count(group, g, "target epoch", 4),
        assignment={m: frozenset(rs) for m, rs in assignment.items()},
        phase=parse_phase(group, g[5], store=STORE),
        resources_version=_count(group, g, "target resources version", 7),
    )


def holders(db: sqlite3.Connection, group: str, sessions: dict[str, str]) -> frozenset[str]:
    """:meth:`Backend.holders`: one indexed probe per session."""
    return frozenset(
        m
        for m, sid in sessions.items()
        if db.execute(
            "SELECT 1 FROM ownership WHERE session_id=? AND grp=? LIMIT 1", (sid, group)
        ).fetchone()
    )


def state(db: sqlite3.Connection, clock: Clock, group: str) -> GroupState:
    """:meth:`Backend.state`: a snapshot of ``group`` with live sessions only."""
    top = head(db, clock, group)
    live_sessions = {m.session_id for m in top.members.values()}
    version, found = resources(db, group)
    claims = {
        rid: Claim(rid, mid, sid, parse_count(group, f"epoch of {rid!r}", epoch, store=STORE))
        for rid, mid, sid, epoch in db.execute(
            "SELECT resource_id, member_id, session_id, epoch FROM ownership "
            "WHERE grp=? AND session_id IS NOT NULL",
            (group,),
        ).fetchall()
        if sid in live_sessions
    }
    return GroupState(
        group,
        top.members,
        top.coordinator,
        found,
        version,
        target(db, group),
        claims,
        top.control,
    )


def member_head(db: sqlite3.Connection, clock: Clock, session: Session) -> MemberHead:
    """:meth:`Backend.member_head`: the group row's target fields, for a live session."""
    require_alive(db, session, clock)
    generation, phase, target_epoch = db.execute(
        "SELECT generation, phase, target_epoch FROM groups WHERE name=?", (session.group,)
    ).fetchone()
    return MemberHead(
        parse_count(session.group, "generation", generation, store=STORE),
        parse_phase(session.group, phase, store=STORE),
        parse_count(session.group, "target epoch", target_epoch, store=STORE),
    )


Kept = KeptParts[tuple[int, frozenset[str]]]
"""The generation of the target and the part of it that :func:`member_view` last returned to
a session."""


def member_view(
    db: sqlite3.Connection, clock: Clock, session: Session, kept: Kept, *, claims: bool
) -> MemberView:
    """:meth:`Backend.member_view`: what ``session`` is given and, if ``claims``, holds.

    The part of the target is read as a change where it can be: a part kept (in ``kept``)
    from generation ``g`` is brought up to date with this member's moves since ``g`` alone:
    the target rows given to it after ``g`` (each row carries the generation that wrote it)
    and the ids the away log says were taken from it after ``g`` (``target_away``, written by
    every publication: see coordinator.publish). When the log does not cover every generation
    since ``g`` (``away_since``, ``away_upto``), the part is read whole. A member's read per
    rebalance then follows its own moves: not the size of its part, nor what moved between
    the others."""
    require_alive(db, session, clock)
    generation, phase, target_epoch, since, upto = db.execute(
        "SELECT generation, phase, target_epoch, away_since, away_upto FROM groups WHERE name=?",
        (session.group,),
    ).fetchone()
    generation = parse_count(session.group, "generation", generation, store=STORE)
    logged = since if upto == generation and isinstance(since, int) else None
    target = _part(db, session, generation, logged, kept.get(session))
    kept.keep(session, (generation, target))
    return MemberView(
        generation,
        parse_phase(session.group, phase, store=STORE),
        target,
        _owned(db, session) if claims else None,
        parse_count(session.group, "target epoch", target_epoch, store=STORE),
    )


def _owned(db: sqlite3.Connection, session: Session) -> dict[str, int]:
    """Resource id → epoch of every claim ``session`` holds."""
    rows = db.execute(
        "SELECT resource_id, epoch FROM ownership WHERE grp=? AND session_id=?",
        (session.group, session.session_id),
    ).fetchall()
    owned = {rid: epoch for rid, epoch in rows if type(epoch) is int and epoch >= 0}
    if len(owned) < len(rows):  # raise on the first epoch that is not a count
        for rid, epoch in rows:
            parse_count(session.group, f"epoch of {rid!r}", epoch, store=STORE)
    return owned


def _part(
    db: sqlite3.Connection,
    session: Session,
    generation: int,
    logged: int | None,
    kept: tuple[int, frozenset[str]] | None,
) -> frozenset[str]:
    """``session``'s part of the target at ``generation``: ``kept`` (generation, part) brought
    up to date with its moves since, when the away log covers every generation after
    ``logged`` up to ``generation`` (None: it does not reach ``generation``), or read whole."""
    group, me = session.group, session.member_id
    if kept is not None:
        at, part = kept
        if at == generation:
            return part
        if logged is not None and logged <= at < generation:
            away = db.execute(
                "SELECT resource_id FROM target_away WHERE grp=? AND member_id=? AND gen > ?",
                (group, me, at),
            ).fetchall()
            given = db.execute(
                "SELECT resource_id FROM targets WHERE grp=? AND member_id=? AND gen > ?",
                (group, me, at),
            ).fetchall()
            if not away and not given:
                return part
            # A resource taken away and given back since is in both: given wins.
            return part.difference(map(_first, away)).union(map(_first, given))
    return frozenset(
        r
        for (r,) in db.execute(
            "SELECT resource_id FROM targets WHERE grp=? AND member_id=?", (group, me)
        ).fetchall()
    )


def progress(db: sqlite3.Connection, group: str, resources: Collection[str]) -> dict[str, Progress]:
    """:meth:`Backend.progress`: the last accepted commit of each of ``resources`` that has
    one."""
    out: dict[str, Progress] = {}
    for chunk in chunks(list(resources)):
        marks = ",".join("?" * len(chunk))
        # Only '?' placeholders are formatted in; every value is bound.
        query = f"SELECT resource_id, epoch, member_id, value FROM progress WHERE grp=? AND resource_id IN ({marks})"  # noqa: S608, E501
        for rid, stored_epoch, mid, value in db.execute(query, (group, *chunk)).fetchall():
            epoch = parse_count(group, f"progress epoch of {rid!r}", stored_epoch, store=STORE)
            out[rid] = Progress(rid, decode_progress(rid, value), epoch, mid)
    return out
