"""Make a store lose a group's state, as a real loss would, for every backend.

* SQLite: the file is replaced by a fresh one under the same name (its WAL and shared-memory
  files go with it), as restoring another copy or re-creating the file would;
* Redis: every key of the group is deleted, as a restart without persistence does;
* ZooKeeper: the whole chroot is deleted (members' ephemeral znodes too), as re-creating it
  does. Members keep writing while the tree goes, so a recursive delete can find a node that
  gained a child after its children were listed (``NotEmptyError``); the delete is tried again
  until the chroot is gone, within a deadline.
"""

from __future__ import annotations

import os
import sqlite3
import time
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
        from kazoo.exceptions import NoNodeError, NotEmptyError

        client = KazooClient(hosts=parts.netloc, timeout=10)
        client.start(timeout=10)
        deadline = time.monotonic() + 30.0
        try:
            while True:
                try:
                    client.delete(parts.path, recursive=True)
                    break
                except NoNodeError:
                    break
                except NotEmptyError:
                    if time.monotonic() > deadline:
                        raise AssertionError(
                            f"members kept writing under {parts.path!r} for 30 s: "
                            "the chroot could not be deleted"
                        ) from None
        finally:
            client.stop()
            client.close()
    else:
        raise AssertionError(f"no way to lose the state of {url!r}")
