"""Make a store lose a group's state, as a real loss would, for every backend.

* SQLite: the file is replaced by a fresh one under the same name (its WAL and shared-memory
  files go with it), as restoring another copy or re-creating the file would;
* Redis: every key of the group is deleted, as a restart without persistence does;
* ZooKeeper: the whole chroot is deleted (members' ephemeral znodes too), as re-creating it
  does.
"""

from __future__ import annotations

import os
import sqlite3
from urllib.parse import urlsplit


def lose_state(url: str, group: str) -> None:
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = parts.path
        fresh = f"{path}.fresh"
        sqlite3.connect(fresh).close()
        os.replace(fresh, path)
        for suffix in ("-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)
    elif parts.scheme in ("redis", "rediss"):
        import redis

        client = redis.Redis(host=parts.hostname or "127.0.0.1", port=parts.port or 6379)
        try:
            keys = list(client.scan_iter(match=f"rb:{{{group}}}:*", count=1000))
            if keys:
                client.delete(*keys)
        finally:
            client.close()
    elif parts.scheme == "zookeeper":
        from kazoo.client import KazooClient

        client = KazooClient(hosts=parts.netloc, timeout=10)
        client.start(timeout=10)
        try:
            client.delete(parts.path, recursive=True)
        finally:
            client.stop()
            client.close()
    else:
        raise AssertionError(f"no way to lose the state of {url!r}")
