"""Members' sessions: joining, renewing the lease, leaving, and the liveness checks that every
write depending on a session makes first.

Every function runs inside a transaction the caller opened (a write transaction for all but
:func:`alive` and :func:`require_alive`). A session is alive while its ``expires`` deadline, on
the injected clock, lies ahead.

The file is one host's store: a deadline is a reading of the joining host's boot clock, so
each session records its host (:func:`~.host.host_id`), :func:`join` refuses a member while
the file holds sessions of another host, and nothing here ends another host's session.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Mapping

from rebalancer_spark.backends.base import Session, expired
from rebalancer_spark.backends.sqlite.store.chain import end_sessions, wall_time
from rebalancer_spark.backends.sqlite.store.groups import bump, ensure_group
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.errors import ConfigurationError, MemberIdInUse
from rebalancer_spark.core.model import Freed

__all__ = ["alive", "join", "leave", "renew", "require_alive", "set_leaving", "update_info"]


def alive(db: sqlite3.Connection, session: Session, clock: Clock) -> bool:
    """True if ``session`` is still in its group and its lease has not run out."""
    row = db.execute(
        "SELECT 1 FROM members WHERE grp=? AND session_id=? AND expires > ?",
        (session.group, session.session_id, clock.monotonic()),
    ).fetchone()
    return row is not None


def require_alive(db: sqlite3.Connection, session: Session, clock: Clock) -> None:
    """Raise :class:`SessionExpired` unless ``session`` is :func:`alive`."""
    if not alive(db, session, clock):
        raise expired(session, "its lease lapsed or it left the group")


def join(
    db: sqlite3.Connection,
    clock: Clock,
    group: str,
    member_id: str,
    *,
    info: Mapping[str, str],
    ttl: float,
    static: bool,
    host: str,
    path: str,
) -> Session:
    """:meth:`Backend.join`: refused while another live session holds ``member_id``, and
    while the file holds any session of a host other than ``host``."""
    _require_one_host(db, host, path)
    ensure_group(db, group)
    now = clock.monotonic()
    row = db.execute(
        "SELECT session_id, expires, info FROM members WHERE grp=? AND member_id=?",
        (group, member_id),
    ).fetchone()
    if row is not None and row[1] > now:
        holder = json.loads(row[2])
        raise MemberIdInUse(
            group,
            member_id,
            host=str(holder.get("host", "?")),
            pid=str(holder.get("pid", "?")),
            lease_left=row[1] - now,
        )
    if row is not None:
        # Its lease ran out: its claims end as expired at that time (see ownership.py).
        end_sessions(db, group, [(row[0], clock.wall() - now + row[1])], Freed.EXPIRED)
        db.execute("DELETE FROM members WHERE grp=? AND member_id=?", (group, member_id))
    session_id = uuid.uuid4().hex
    db.execute(
        "INSERT INTO members(grp, member_id, session_id, info, expires, static, host) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (group, member_id, session_id, json.dumps(dict(info)), now + ttl, int(static), host),
    )
    bump(db, group)
    return Session(group=group, member_id=member_id, session_id=session_id, ttl=ttl)


def _require_one_host(db: sqlite3.Connection, host: str, path: str) -> None:
    """Raise :class:`ConfigurationError` if the file holds sessions of another host."""
    rows = db.execute(
        "SELECT host, grp, member_id FROM members WHERE host NOT IN (?, '') ORDER BY host, grp",
        (host,),
    ).fetchall()
    if not rows:
        return
    other = rows[0][0]
    members = ", ".join(f"{g}/{m}" for h, g, m in rows[:5] if h == other)
    raise ConfigurationError(
        f"SQLite file {path!r} is one host's store and holds sessions of host {other!r} "
        f"(members {members}), while this member runs on host {host!r}: a lease deadline "
        "is a reading of one host's clock, so two hosts cannot share the file. For members "
        "on several hosts use the ZooKeeper (zookeeper://) or Redis (redis://) backend; otherwise "
        f"stop the members on {other!r} first (their sessions end when they leave, or when "
        "that host reboots and opens the file)"
    )


def renew(db: sqlite3.Connection, clock: Clock, session: Session) -> None:
    """:meth:`Backend.renew`: extend a lease that has not yet run out."""
    now = clock.monotonic()
    cur = db.execute(
        "UPDATE members SET expires=? WHERE grp=? AND session_id=? AND expires > ?",
        (now + session.ttl, session.group, session.session_id, now),
    )
    if cur.rowcount == 0:
        raise expired(session, "its lease lapsed before it was renewed", doing="renewing")


def update_info(
    db: sqlite3.Connection, clock: Clock, session: Session, info: Mapping[str, str]
) -> None:
    """:meth:`Backend.update_info`: no change counter bump (info wakes nobody)."""
    require_alive(db, session, clock)
    db.execute(
        "UPDATE members SET info=? WHERE grp=? AND session_id=?",
        (json.dumps(dict(info)), session.group, session.session_id),
    )


def set_leaving(db: sqlite3.Connection, clock: Clock, session: Session) -> None:
    """:meth:`Backend.set_leaving`."""
    require_alive(db, session, clock)
    db.execute(
        "UPDATE members SET leaving=1 WHERE grp=? AND session_id=?",
        (session.group, session.session_id),
    )
    bump(db, session.group)


def leave(db: sqlite3.Connection, clock: Clock, session: Session) -> None:
    """:meth:`Backend.leave`: drop the session, its claims (released now, or expired at its
    deadline if its lease had already run out) and its coordinator role."""
    row = db.execute(
        "SELECT expires FROM members WHERE grp=? AND session_id=?",
        (session.group, session.session_id),
    ).fetchone()
    now = clock.monotonic()
    if row is not None and row[0] <= now:
        ended = [(session.session_id, wall_time(clock, row[0]))]
        end_sessions(db, session.group, ended, Freed.EXPIRED)
    else:
        end_sessions(db, session.group, [(session.session_id, clock.wall())], Freed.RELEASED)
    db.execute(
        "UPDATE groups SET coord_member=NULL, coord_session=NULL WHERE name=? AND coord_session=?",
        (session.group, session.session_id),
    )
    cur = db.execute(
        "DELETE FROM members WHERE grp=? AND session_id=?",
        (session.group, session.session_id),
    )
    if cur.rowcount:
        bump(db, session.group)
