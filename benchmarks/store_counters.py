"""What a store did between two instants, as its own server counts it, and how big a group is.

* ZooKeeper: the ``mntr`` four-letter word (the test servers whitelist every four-letter word;
  their admin server is off): packets received and sent, bytes received (``mntr`` has no
  bytes-sent counter), for the whole server, every client's pings included; size: the server's
  ``zk_approximate_data_size`` and ``zk_znode_count``.
* Redis: ``INFO commandstats`` (calls, commands run inside Lua scripts included) and
  ``INFO stats`` (commands processed, network bytes in and out), for the whole server; size:
  ``MEMORY USAGE`` summed over the group's keys (``rb:{group}:*``).
* SQLite: no server counts anything, and a trace callback sees only this process's statements,
  not the members'. What is measured instead: pages of the database file and frames of its
  write-ahead log that differ between the two instants (a page rewritten with the same bytes,
  or a log frame overwritten twice in between, is not seen: a lower bound of pages written);
  size: the database file and its log together (the whole file: one group per file here).

Each ``snapshot()`` is cheap enough to take around every rebalance; ``delta(a, b)`` names each
figure, ``None`` where the store has no such counter.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.servers

from tests.servers.zookeeper import four_letter

Figures = dict[str, float | None]


class StoreCounters(Protocol):
    def snapshot(self) -> Any: ...

    def delta(self, before: Any, after: Any) -> Figures: ...

    def size(self, group: str) -> Figures: ...


class CounterError(Exception):
    """A store did not answer with the counter asked for."""


def mntr(port: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in four_letter(port, "mntr").splitlines():
        key, _, value = line.partition("\t")
        out[key] = value
    if "zk_packets_received" not in out:
        raise CounterError(
            f"ZooKeeper on port {port} gave no mntr figures: is 'mntr' in "
            f"4lw.commands.whitelist of its zoo.cfg?"
        )
    return out


@dataclass(frozen=True)
class ZkCounters:
    port: int

    def snapshot(self) -> dict[str, str]:
        return mntr(self.port)

    def delta(self, before: dict[str, str], after: dict[str, str]) -> Figures:
        def d(key: str) -> float:
            return float(int(after[key]) - int(before[key]))

        return {
            "ops": d("zk_packets_received"),
            "packets_sent": d("zk_packets_sent"),
            "bytes_in": d("zk_bytes_received_count"),
            "bytes_out": None,
        }

    def size(self, group: str) -> Figures:
        figures = mntr(self.port)
        return {
            "bytes": float(figures["zk_approximate_data_size"]),
            "znodes": float(figures["zk_znode_count"]),
        }


class RedisCounters:
    def __init__(self, port: int, host: str = "127.0.0.1", db: int = 0) -> None:
        import redis

        self.client = redis.Redis(host=host, port=port, db=db)

    def snapshot(self) -> dict[str, float]:
        stats: dict[str, Any] = self.client.info("stats")
        calls: dict[str, Any] = self.client.info("commandstats")
        return {
            "ops": float(sum(int(v["calls"]) for v in calls.values())),
            "commands": float(stats["total_commands_processed"]),
            "bytes_in": float(stats["total_net_input_bytes"]),
            "bytes_out": float(stats["total_net_output_bytes"]),
        }

    def delta(self, before: dict[str, float], after: dict[str, float]) -> Figures:
        return {k: after[k] - before.get(k, 0.0) for k in after}

    def size(self, group: str) -> Figures:
        keys, total = 0, 0
        for key in self.client.scan_iter(match=f"rb:{{{group}}}:*", count=1000):
            keys += 1
            total += int(self.client.memory_usage(key) or 0)
        return {"bytes": float(total), "keys": float(keys)}


@dataclass(frozen=True)
class SqliteFiles:
    pages: dict[str, list[bytes]]
    """File name -> a digest per page (per frame for the write-ahead log)."""


class SqliteCounters:
    def __init__(self, path: Path) -> None:
        self.path = path

    def _digests(self, path: Path, header: int, unit: int) -> list[bytes]:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        return [
            hashlib.blake2b(data[i : i + unit], digest_size=8).digest()
            for i in range(header, len(data), unit)
        ]

    def page_size(self) -> int:
        with self.path.open("rb") as f:
            head = f.read(18)
        size = int.from_bytes(head[16:18], "big") if len(head) == 18 else 4096
        return 65536 if size == 1 else size or 4096

    def snapshot(self) -> SqliteFiles:
        page = self.page_size()
        wal = self.path.with_name(self.path.name + "-wal")
        return SqliteFiles(
            {
                "db": self._digests(self.path, 0, page),
                "wal": self._digests(wal, 32, 24 + page),
            }
        )

    def delta(self, before: SqliteFiles, after: SqliteFiles) -> Figures:
        changed = 0
        for name, pages in after.pages.items():
            old = before.pages.get(name, [])
            changed += sum(1 for i, p in enumerate(pages) if i >= len(old) or old[i] != p)
        return {"pages": float(changed), "ops": None}

    def size(self, group: str) -> Figures:
        wal = self.path.with_name(self.path.name + "-wal")
        files = [p for p in (self.path, wal) if p.exists()]
        return {"bytes": float(sum(os.path.getsize(p) for p in files))}
