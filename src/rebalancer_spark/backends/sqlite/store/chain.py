"""How a claim ends in the ``ownership`` table: the row keeps its last holder and how and when
that holder stopped (``freed``, ``freed_at`` in wall-clock seconds), for the next grant to name.

Runs inside the caller's write transaction; see :mod:`.ownership` for the columns.
"""

from __future__ import annotations

import sqlite3

from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.model import Freed

__all__ = ["end_sessions", "wall_time"]


def wall_time(clock: Clock, deadline: float) -> float:
    """A lease deadline on the monotonic clock as wall-clock seconds."""
    return clock.wall() - clock.monotonic() + deadline


def end_sessions(
    db: sqlite3.Connection,
    group: str,
    ended: list[tuple[str, float]],
    freed: Freed,
) -> None:
    """Free the claims of the sessions ``ended`` (session id, wall-clock time it ended), each
    row keeping who held it and how and when that ended (``freed``)."""
    db.executemany(
        "UPDATE ownership SET prev_member=member_id, prev_session=session_id, freed=?, "
        "freed_at=?, member_id=NULL, session_id=NULL WHERE grp=? AND session_id=?",
        [(freed.value, at, group, sid) for sid, at in ended],
    )
