"""A group's row, its change counter and its resource set.

Every function runs inside a transaction the caller opened. ``change_seq`` counts the changes a
:class:`~rebalancer_spark.backends.sqlite.watch.SqliteWatch` must report; lease renewals and
progress commits do not bump it.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Collection

from rebalancer_spark.backends.base import RESOURCE_LOG_VERSIONS, resource_log_limit
from rebalancer_spark.core.model import Resource

__all__ = ["bump", "ensure_group", "update_resources"]


def ensure_group(db: sqlite3.Connection, group: str) -> None:
    """Create the row of ``group`` if it has none yet, with a new incarnation id (the
    group's identity marker, see :mod:`.floors`)."""
    db.execute(
        "INSERT OR IGNORE INTO groups(name, incarnation) VALUES (?, ?)",
        (group, uuid.uuid4().hex),
    )


def bump(db: sqlite3.Connection, group: str) -> None:
    """Count one change of ``group``: its watches wake."""
    db.execute("UPDATE groups SET change_seq = change_seq + 1 WHERE name=?", (group,))


def update_resources(
    db: sqlite3.Connection,
    group: str,
    *,
    replace: Collection[Resource] | None,
    add: Collection[Resource],
    remove: Collection[str],
    base: int | None = None,
) -> tuple[int, bool]:
    """:meth:`Backend.update_resources`, in a write transaction: the set's version after it,
    and whether it changed the set. With ``base`` (the version ``add`` and ``remove`` are the
    exact change from, to ``replace``) and the set still at it, only the change is written:
    the set is not read."""
    ensure_group(db, group)
    if base is not None and replace is not None:
        (at,) = db.execute("SELECT resources_version FROM groups WHERE name=?", (group,)).fetchone()
        if at == base:
            put = [(r.id, r.weight) for r in add]
            gone = list(remove)
            if not put and not gone:
                return base, False
            return _write(db, group, put, gone, len(replace)), True
    current = dict(
        db.execute("SELECT resource_id, weight FROM resources WHERE grp=?", (group,)).fetchall()
    )
    wanted = dict(current) if replace is None else {r.id: r.weight for r in replace}
    wanted.update({r.id: r.weight for r in add})
    for rid in remove:
        wanted.pop(rid, None)
    if wanted == current:
        (version,) = db.execute(
            "SELECT resources_version FROM groups WHERE name=?", (group,)
        ).fetchone()
        return int(version), False
    gone = list(current.keys() - wanted.keys())
    put = [(r, w) for r, w in wanted.items() if current.get(r) != w]
    return _write(db, group, put, gone, len(wanted)), True


def _write(
    db: sqlite3.Connection, group: str, put: list[tuple[str, float]], gone: list[str], size: int
) -> int:
    """Write a change of the set (of ``size`` resources after it): its rows, the next
    version, its log; the version."""
    db.executemany(
        "DELETE FROM resources WHERE grp=? AND resource_id=?", [(group, r) for r in gone]
    )
    db.executemany(
        "INSERT OR REPLACE INTO resources VALUES (?, ?, ?)", [(group, r, w) for r, w in put]
    )
    db.execute("UPDATE groups SET resources_version = resources_version + 1 WHERE name=?", (group,))
    bump(db, group)
    (version,) = db.execute(
        "SELECT resources_version FROM groups WHERE name=?", (group,)
    ).fetchone()
    _log(db, group, int(version), put, gone, size)
    return int(version)


def _log(
    db: sqlite3.Connection,
    group: str,
    version: int,
    put: list[tuple[str, float]],
    gone: list[str],
    size: int,
) -> None:
    """Log the change that made ``version`` (weight NULL: removed), then drop the oldest
    changes beyond :data:`RESOURCE_LOG_VERSIONS` or :func:`resource_log_limit` ids; a change
    larger than the limit empties the log. Every change after ``rlog_from`` up to
    ``rlog_upto`` is logged."""
    limit = resource_log_limit(size)
    (upto,) = db.execute("SELECT rlog_upto FROM groups WHERE name=?", (group,)).fetchone()
    db.execute("UPDATE groups SET rlog_upto=? WHERE name=?", (version, group))
    if len(put) + len(gone) > limit or upto != version - 1:
        # Too large to log, or the log has a hole (a process of schema version 5 changed the
        # set without logging it): the log starts again after this change.
        db.execute("DELETE FROM resource_log WHERE grp=?", (group,))
        db.execute("UPDATE groups SET rlog_from=? WHERE name=?", (version, group))
        return
    db.executemany(
        "INSERT INTO resource_log VALUES (?, ?, ?, ?)",
        [(group, version, r, w) for r, w in put] + [(group, version, r, None) for r in gone],
    )
    counts = db.execute(
        "SELECT version, count(*) FROM resource_log WHERE grp=? GROUP BY version "
        "ORDER BY version DESC",
        (group,),
    ).fetchall()
    total = 0
    for kept, (logged, n) in enumerate(counts):
        total += n
        if kept >= RESOURCE_LOG_VERSIONS or total > limit:
            db.execute("DELETE FROM resource_log WHERE grp=? AND version <= ?", (group, logged))
            db.execute(
                "UPDATE groups SET rlog_from=max(rlog_from, ?) WHERE name=?", (logged, group)
            )
            return
