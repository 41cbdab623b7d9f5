"""Whether the Redis server keeps the groups' state across a restart (for ``status``).

``CONFIG GET appendonly appendfsync save``: without persistence a restart loses every group's
leases, claims, epochs and progress. Epochs still never go backwards (members that ran lift them
into the new incarnation, docs/backends/redis.md), but progress is lost and a paused old member
can overlap a new owner until it notices; with AOF and ``appendfsync always`` nothing that was
acknowledged is lost.
"""

from __future__ import annotations

from typing import Any

import redis

__all__ = ["persistence_warnings"]

_FIX = "run Redis with appendonly yes and appendfsync always (docs/backends/redis.md)"


def persistence_warnings(client: Any, shown: str) -> list[str]:
    """The warnings about the persistence of the server ``client`` talks to."""
    try:
        config = dict(client.config_get("appendonly", "appendfsync", "save"))
    except redis.exceptions.RedisError as exc:
        return [
            f"cannot tell whether Redis at {shown} persists its data (CONFIG GET refused: "
            f"{exc}); if it does not, a restart loses the groups' state: {_FIX}"
        ]
    aof = str(config.get("appendonly", "no")) == "yes"
    fsync = str(config.get("appendfsync", ""))
    save = str(config.get("save", "")).strip()
    if not aof and not save:
        return [
            f"Redis at {shown} persists nothing (appendonly no, save ''): a restart loses "
            f"every group's leases, claims and progress; {_FIX}"
        ]
    if not aof:
        return [
            f"Redis at {shown} persists by RDB snapshots only (save '{save}'): a restart goes "
            f"back to the last snapshot (commits and grants made since are lost); {_FIX}"
        ]
    if fsync != "always":
        return [
            f"Redis at {shown} has appendfsync {fsync}: a crash can lose the last second of "
            f"writes (commits, grants); {_FIX}"
        ]
    return []
