"""A group's row, its change counter and its resource set.

Every function runs inside a transaction the caller opened. ``change_seq`` counts the changes a
:class:`~rebalancer_spark.backends.sqlite.watch.SqliteWatch` must report; lease renewals and
progress commits do not bump it.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Collection

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
) -> int:
    """:meth:`Backend.update_resources`, in a write transaction."""
    ensure_group(db, group)
    current = dict(
        db.execute("SELECT resource_id, weight FROM resources WHERE grp=?", (group,)).fetchall()
    )
    wanted = dict(current) if replace is None else {r.id: r.weight for r in replace}
    wanted.update({r.id: r.weight for r in add})
    for rid in remove:
        wanted.pop(rid, None)
    if wanted != current:
        db.executemany(
            "DELETE FROM resources WHERE grp=? AND resource_id=?",
            [(group, r) for r in current.keys() - wanted.keys()],
        )
        db.executemany(
            "INSERT OR REPLACE INTO resources VALUES (?, ?, ?)",
            [(group, r, w) for r, w in wanted.items() if current.get(r) != w],
        )
        db.execute(
            "UPDATE groups SET resources_version = resources_version + 1 WHERE name=?",
            (group,),
        )
        bump(db, group)
    (version,) = db.execute(
        "SELECT resources_version FROM groups WHERE name=?", (group,)
    ).fetchone()
    return int(version)
