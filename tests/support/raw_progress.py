"""Writing a resource's progress record as raw bytes, bypassing the backend, on each backend:
what an operator's mistake or a foreign writer leaves behind."""

from __future__ import annotations

import sqlite3
from urllib.parse import urlsplit


def write_raw_progress(url: str, group: str, resource: str, raw: str) -> None:
    """Overwrite the stored progress record of ``resource`` (it must have one) with ``raw``."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        with sqlite3.connect(parts.path) as db:
            changed = db.execute(
                "UPDATE progress SET value = ? WHERE grp = ? AND resource_id = ?",
                (raw, group, resource),
            ).rowcount
        assert changed == 1, "no progress row to overwrite"
    elif parts.scheme == "zookeeper":
        from kazoo.client import KazooClient

        from rebalancer_spark.backends.zookeeper.store.layout import GroupPaths

        client = KazooClient(hosts=parts.netloc)
        client.start(timeout=10)
        try:
            client.set(GroupPaths(parts.path.rstrip("/"), group).progress(resource), raw.encode())
        finally:
            client.stop()
            client.close()
    elif parts.scheme == "redis":
        import redis

        from rebalancer_spark.backends.redis.store.keys import prefix

        client = redis.Redis.from_url(url.split("?", maxsplit=1)[0])
        try:
            assert client.hexists(prefix(group) + "progress", resource)
            client.hset(prefix(group) + "progress", resource, raw)
        finally:
            client.close()
    else:
        raise AssertionError(f"no raw writer for {url}")
