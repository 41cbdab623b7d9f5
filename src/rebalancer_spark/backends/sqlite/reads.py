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

from rebalancer_spark.backends.base import Session
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
    GroupState,
    MemberRecord,
    Progress,
    Target,
    decode_progress,
)
from rebalancer_spark.core.protocols import MemberView

__all__ = ["member_view", "progress", "state"]

STORE = "SQLite"
"""How error messages name this store."""

_CHUNK = 500
"""Most resource ids bound in one query."""


def _chunks(items: list[str]) -> Iterator[list[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def state(db: sqlite3.Connection, clock: Clock, group: str) -> GroupState:
    """:meth:`Backend.state`: a snapshot of ``group`` with live sessions only."""
    now = clock.monotonic()
    g = db.execute(
        "SELECT coord_member, coord_session, coord_epoch, generation, target_epoch, "
        "phase, has_target, target_resources_version, resources_version "
        "FROM groups WHERE name=?",
        (group,),
    ).fetchone()
    if g is None:
        return GroupState(group, {}, None, {}, 0, None, {})
    coord_epoch, generation, target_epoch = (
        parse_count(group, what, g[i], store=STORE)
        for what, i in (("coordinator epoch", 2), ("generation", 3), ("target epoch", 4))
    )
    target_version, version = (
        parse_count(group, what, g[i], store=STORE)
        for what, i in (("target resources version", 7), ("resources version", 8))
    )
    members: dict[str, MemberRecord] = {}
    for mid, sid, info, acked, leaving, static in db.execute(
        "SELECT member_id, session_id, info, acked, leaving, static FROM members "
        "WHERE grp=? AND expires > ?",
        (group, now),
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
    live_sessions = {m.session_id for m in members.values()}
    coordinator = CoordinatorRecord(g[0], g[1], coord_epoch) if g[1] in live_sessions else None
    resources = {
        rid: parse_resource(group, rid, weight, store=STORE)
        for rid, weight in db.execute(
            "SELECT resource_id, weight FROM resources WHERE grp=?", (group,)
        ).fetchall()
    }
    target = None
    if g[6]:
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
        target = Target(
            generation=generation,
            coordinator_epoch=target_epoch,
            assignment={m: frozenset(rs) for m, rs in assignment.items()},
            phase=parse_phase(group, g[5], store=STORE),
            resources_version=target_version,
        )
    claims = {
        rid: Claim(rid, mid, sid, parse_count(group, f"epoch of {rid!r}", epoch, store=STORE))
        for rid, mid, sid, epoch in db.execute(
            "SELECT resource_id, member_id, session_id, epoch FROM ownership "
            "WHERE grp=? AND session_id IS NOT NULL",
            (group,),
        ).fetchall()
        if sid in live_sessions
    }
    control = read_control(db, group)
    return GroupState(group, members, coordinator, resources, version, target, claims, control)


def member_view(db: sqlite3.Connection, clock: Clock, session: Session) -> MemberView:
    """:meth:`Backend.member_view`: what ``session`` is given and holds."""
    require_alive(db, session, clock)
    generation, phase, target_epoch = db.execute(
        "SELECT generation, phase, target_epoch FROM groups WHERE name=?", (session.group,)
    ).fetchone()
    target = frozenset(
        r
        for (r,) in db.execute(
            "SELECT resource_id FROM targets WHERE grp=? AND member_id=?",
            (session.group, session.member_id),
        ).fetchall()
    )
    owned = {
        rid: parse_count(session.group, f"epoch of {rid!r}", epoch, store=STORE)
        for rid, epoch in db.execute(
            "SELECT resource_id, epoch FROM ownership WHERE grp=? AND session_id=?",
            (session.group, session.session_id),
        ).fetchall()
    }
    return MemberView(
        parse_count(session.group, "generation", generation, store=STORE),
        parse_phase(session.group, phase, store=STORE),
        target,
        owned,
        parse_count(session.group, "target epoch", target_epoch, store=STORE),
    )


def progress(db: sqlite3.Connection, group: str, resources: Collection[str]) -> dict[str, Progress]:
    """:meth:`Backend.progress`: the last accepted commit of each of ``resources`` that has
    one."""
    out: dict[str, Progress] = {}
    for chunk in _chunks(list(resources)):
        marks = ",".join("?" * len(chunk))
        # Only '?' placeholders are formatted in; every value is bound.
        query = f"SELECT resource_id, epoch, member_id, value FROM progress WHERE grp=? AND resource_id IN ({marks})"  # noqa: S608, E501
        for rid, stored_epoch, mid, value in db.execute(query, (group, *chunk)).fetchall():
            epoch = parse_count(group, f"progress epoch of {rid!r}", stored_epoch, store=STORE)
            out[rid] = Progress(rid, decode_progress(rid, value), epoch, mid)
    return out
