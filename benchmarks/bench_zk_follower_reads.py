"""How often a ZooKeeper read misses a write that was acknowledged before it began, with and
without a ``sync`` first, on a three-server ensemble whose leader is killed and restarted.

    python benchmarks/bench_zk_follower_reads.py                  # 240 s
    python benchmarks/bench_zk_follower_reads.py --seconds 60 --seed 3

Nothing of rebalancer-spark runs here: only kazoo and the servers of ``tests/servers``. Writers
(one client each, on any server) set counters and note each value once its ``set`` returned.
Readers, each with a client pinned to one server, read a counter and compare it with the
highest value acknowledged before the read began: half read plainly, half send a ``sync``
first. Meanwhile the leader is killed with ``-9`` every 0.5 to 3 s and started again 1 to 4 s
later, as the chaos runner does (``--backend zookeeper-ensemble``): a follower that is catching
up serves reads from what it has applied. It prints, per kind, the reads made and how many were
short of an acknowledged value.

Why it is here: ``Backend.progress()`` reads through the handle's shared client, on whichever
server it found; it sends a ``sync`` first so that it holds every commit acknowledged before
the call (docs/backends/zookeeper.md, "Progress"). A member's own reads (its view, its claims)
are ordered behind its own writes on its session's connection, and sync too.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.servers

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry
from tests.servers.zookeeper import Ensemble

COUNTERS = 12
WRITERS = 4
READERS = 6


class Acked:
    """The highest value acknowledged for each counter, with when (``time.time``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[int, list[tuple[float, int]]] = {k: [] for k in range(COUNTERS)}

    def add(self, counter: int, value: int) -> None:
        with self._lock:
            self._values[counter].append((time.time(), value))

    def before(self, counter: int, at: float) -> int:
        with self._lock:
            return max((v for t, v in self._values[counter] if t < at), default=0)

    def count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._values.values())


def _client(hosts: str) -> Any:
    retry = KazooRetry(max_tries=-1, delay=0.05, max_delay=0.2)
    client = KazooClient(hosts=hosts, timeout=2.0, connection_retry=retry)
    client.start(timeout=30)
    return client


def _write(hosts: str, counters: list[int], acked: Acked, stop: threading.Event) -> None:
    client = _client(hosts)
    values = dict.fromkeys(counters, 0)
    try:
        while not stop.is_set():
            for k in counters:
                try:
                    client.set(f"/c/{k}", str(values[k] + 1).encode())
                except Exception:  # a connection lost with the leader: the outcome is unknown
                    stop.wait(0.05)
                    continue
                values[k] += 1
                acked.add(k, values[k])
            stop.wait(0.01)
    finally:
        client.stop()
        client.close()


class Tally:
    """Reads made and reads short of an acknowledged write, per kind of read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = {"read": [0, 0], "sync, then read": [0, 0]}

    def add(self, kind: str, short: bool) -> None:
        with self._lock:
            self.counts[kind][0] += 1
            self.counts[kind][1] += short


def _read(
    port: int, sync: bool, seed: int, acked: Acked, out: Tally, stop: threading.Event
) -> None:
    client = _client(f"127.0.0.1:{port}")
    rng = random.Random(seed)
    kind = "sync, then read" if sync else "read"
    try:
        while not stop.is_set():
            k = rng.randrange(COUNTERS)
            began = time.time()
            need = acked.before(k, began)
            try:
                if sync:
                    client.sync(f"/c/{k}")
                data, _ = client.get(f"/c/{k}")
            except Exception:
                stop.wait(0.05)
                continue
            out.add(kind, int(data) < need)
            stop.wait(0.002)
    finally:
        client.stop()
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # the kills make it complain
    with tempfile.TemporaryDirectory(prefix="bench-zk-follower-reads-") as work:
        ensemble = Ensemble.of_three(Path(work))
        ensemble.start()
        stop = threading.Event()
        acked = Acked()
        out = Tally()
        kills = 0
        threads: list[threading.Thread] = []
        try:
            setup = _client(ensemble.hosts)
            setup.ensure_path("/c")
            for k in range(COUNTERS):
                setup.create(f"/c/{k}", b"0")
            setup.stop()
            setup.close()
            for w in range(WRITERS):
                mine = [k for k in range(COUNTERS) if k % WRITERS == w]
                threads.append(
                    threading.Thread(target=_write, args=(ensemble.hosts, mine, acked, stop))
                )
            for i in range(READERS):
                port = ensemble.servers[i % 3].port
                threads.append(
                    threading.Thread(target=_read, args=(port, i % 2 == 1, i, acked, out, stop))
                )
            for t in threads:
                t.start()
            rng = random.Random(args.seed)
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                time.sleep(rng.uniform(0.5, 3.0))
                leader = ensemble.leader(timeout=60)
                leader.kill()
                kills += 1
                time.sleep(rng.uniform(1.0, 4.0))
                leader.start()
                leader.wait_serving(60)
        finally:
            stop.set()
            for t in threads:
                t.join(30)
            ensemble.close()
    print(f"{args.seconds:g} s, {kills} leader kills, {acked.count()} writes acknowledged")
    for kind, (reads, short) in out.counts.items():
        print(f"  {kind:<16} {reads:>7} reads, {short:>4} short of an acknowledged write")
    return 0


if __name__ == "__main__":
    sys.exit(main())
