"""Members' writes on what they own: claims, releases, acknowledgements, progress commits.

Every function runs inside a write transaction the caller opened, and re-reads in it what the
write depends on: the target generation and phase for a claim, the claim's session and epoch
for a release or a commit, and the member's lease.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Mapping

from rebalancer_spark.backends.base import Session
from rebalancer_spark.backends.records import parse_count
from rebalancer_spark.backends.sqlite.groups import bump
from rebalancer_spark.backends.sqlite.sessions import alive, require_alive
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.errors import FencedError
from rebalancer_spark.core.model import Phase

__all__ = ["acknowledge", "claim", "commit", "release"]


def claim(
    db: sqlite3.Connection,
    clock: Clock,
    session: Session,
    resources: Collection[str],
    generation: int,
) -> dict[str, int]:
    """:meth:`Backend.claim`: grant what the target at ``generation`` gives ``session`` and
    nobody alive holds, each at the resource's next epoch."""
    group = session.group
    wanted = set(resources)
    granted: dict[str, int] = {}
    require_alive(db, session, clock)
    current, phase = db.execute(
        "SELECT generation, phase FROM groups WHERE name=?", (group,)
    ).fetchone()
    if current != generation or phase != Phase.RUNNING.value:
        return granted
    rows = db.execute(
        "SELECT t.resource_id, o.session_id, o.epoch, m.session_id IS NOT NULL "
        "FROM targets t "
        "LEFT JOIN ownership o ON o.grp=t.grp AND o.resource_id=t.resource_id "
        "LEFT JOIN members m ON m.grp=t.grp AND m.session_id=o.session_id "
        "AND m.expires > ? WHERE t.grp=? AND t.member_id=?",
        (clock.monotonic(), group, session.member_id),
    ).fetchall()
    grants: list[tuple[str, str, str, str, int]] = []
    for rid, holder, stored, holder_alive in rows:
        if rid not in wanted:
            continue
        epoch = (
            0 if stored is None else parse_count(group, f"epoch of {rid!r}", stored, store="SQLite")
        )
        if holder == session.session_id:
            granted[rid] = epoch
        elif holder is None or not holder_alive:
            granted[rid] = epoch + 1
            grants.append((group, rid, session.member_id, session.session_id, granted[rid]))
    if grants:
        db.executemany("INSERT OR REPLACE INTO ownership VALUES (?, ?, ?, ?, ?)", grants)
        bump(db, group)
    return granted


def release(db: sqlite3.Connection, session: Session, claims: Mapping[str, int]) -> None:
    """:meth:`Backend.release`: drop each claim still held by ``session`` at its epoch."""
    changed = 0
    for rid, epoch in claims.items():
        changed += db.execute(
            "UPDATE ownership SET member_id=NULL, session_id=NULL "
            "WHERE grp=? AND resource_id=? AND session_id=? AND epoch=?",
            (session.group, rid, session.session_id, epoch),
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
        holder = "nobody" if row is None or row[0] is None else repr(row[0])
        raise FencedError(
            f"commit for resource {resource!r} by member {session.member_id!r} at "
            f"epoch {epoch} refused: the resource is held by {holder} at epoch "
            f"{row[2] if row else 0}; stop working on it, the new owner resumes from "
            "the last accepted commit"
        )
    if not alive(db, session, clock):
        raise FencedError(
            f"commit for resource {resource!r} by member {session.member_id!r} at "
            f"epoch {epoch} refused: its session lease has lapsed; stop working on it"
        )
    db.execute(
        "INSERT OR REPLACE INTO progress VALUES (?, ?, ?, ?, ?, ?)",
        (session.group, resource, epoch, session.member_id, text, clock.wall()),
    )
