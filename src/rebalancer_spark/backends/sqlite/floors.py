"""A group's identity marker (its incarnation) and lifting resource epochs above a floor.

The marker is a random id written in the group's row when the row is created
(:func:`~.groups.ensure_group`): a file replaced by another, or a group row deleted and created
again, shows another one, which is how the front of :mod:`rebalancer_spark.backends.base` finds
out that the store lost its state. Every function runs inside a transaction the caller opened.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

from rebalancer_spark.backends.sqlite.store.groups import bump, ensure_group

__all__ = ["incarnation", "lift_epochs"]


def incarnation(db: sqlite3.Connection, group: str) -> str | None:
    """The group's marker (None: no such group). Read-only."""
    row = db.execute("SELECT incarnation FROM groups WHERE name=?", (group,)).fetchone()
    return None if row is None else str(row[0])


def lift_epochs(db: sqlite3.Connection, group: str, floors: Mapping[str, int]) -> int:
    """Raise the epoch of each resource nobody holds to its floor (a write transaction). The
    chain columns are cleared: the next grant names no predecessor (as on the other stores,
    the audit bounds the earlier owners by that grant), never the last holder at an epoch it
    did not hold."""
    ensure_group(db, group)
    before = db.total_changes
    db.executemany(
        "INSERT INTO ownership(grp, resource_id, member_id, session_id, epoch) "
        "VALUES (?, ?, NULL, NULL, ?) ON CONFLICT(grp, resource_id) DO UPDATE "
        "SET epoch=excluded.epoch, prev_member=NULL, prev_session=NULL, freed=NULL, "
        "freed_at=NULL "
        "WHERE ownership.session_id IS NULL AND ownership.epoch < excluded.epoch",
        [(group, r, e) for r, e in floors.items()],
    )
    lifted = db.total_changes - before
    if lifted:
        bump(db, group)
    return lifted
