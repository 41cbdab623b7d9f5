"""A group's control record: one row of ``control``, changed by compare-and-set.

Every function runs inside a transaction the caller opened. An update bumps the group's
``change_seq`` in the same transaction, so the group's watches wake.
"""

from __future__ import annotations

import sqlite3

from rebalancer_spark.backends.sqlite.store.groups import bump, ensure_group
from rebalancer_spark.core.control import Control
from rebalancer_spark.core.errors import ControlConflict

__all__ = ["read_control", "update_control"]


def read_control(db: sqlite3.Connection, group: str) -> Control:
    """The group's control record; the default record when none was written."""
    row = db.execute("SELECT version, body FROM control WHERE grp=?", (group,)).fetchone()
    return Control() if row is None else Control.decode(group, row[1], row[0])


def update_control(
    db: sqlite3.Connection, group: str, expected_version: int, control: Control
) -> Control:
    """:meth:`Backend.update_control`, in a write transaction."""
    ensure_group(db, group)
    current = read_control(db, group)
    if current.version != expected_version:
        raise ControlConflict(
            f"the control record of group {group!r} is at version {current.version}, not "
            f"{expected_version} as read: someone changed it meanwhile; read it again and retry"
        )
    stored = Control.decode(group, control.encode(), expected_version + 1)
    db.execute(
        "INSERT INTO control(grp, version, body) VALUES (?, ?, ?) "
        "ON CONFLICT(grp) DO UPDATE SET version=excluded.version, body=excluded.body",
        (group, stored.version, stored.encode()),
    )
    bump(db, group)
    return stored
