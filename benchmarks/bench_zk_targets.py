"""What publishing a target and reading it cost on ZooKeeper, whole against as a delta.

    python benchmarks/bench_zk_targets.py                      # 100,000 x 100, 10,000 x 4
    python benchmarks/bench_zk_targets.py --cells 100000x100 --repeats 5

For each cell, resources x members, in one process against one ZooKeeper server started here
(the benchmarks' JVM, :data:`tests.servers.zookeeper.SERVER_JVM`): a coordinator publishes the
first target (whole), then a join of one more member (the sticky moves: 1/(N+1) of the
resources) and, separately, the same join with no previous target handed over (whole, as a new
coordinator writes it). Printed per publication: bytes the server received (``mntr``), the
time ``publish`` took (median of ``--repeats``), and what the joining member then
reads for its view: bytes received by its session's connection, and the time of its first
``member_view``; then what an old member reads, having read the generation before.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.servers
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tests.servers.zookeeper import SERVER_JVM, ZkServer, free_ports

from rebalancer_spark.backends import open_backend
from rebalancer_spark.backends.base import Backend, Session
from rebalancer_spark.backends.zookeeper import ZookeeperBackend
from rebalancer_spark.core.model import Phase, Resource, Target
from store_counters import mntr


def _bytes_in(port: int) -> int:
    return int(mntr(port)["zk_bytes_received_count"])


@contextmanager
def _server() -> Iterator[int]:
    with tempfile.TemporaryDirectory(prefix="bench_zk_targets-") as tmp:
        (port,) = free_ports(1)
        server = ZkServer(Path(tmp) / "zk", port, jvm=SERVER_JVM)
        server.write_config()
        server.start()
        try:
            server.wait_serving()
            yield port
        finally:
            server.stop()


def _read_bytes(store: Backend, session: Session) -> Callable[[], int]:
    """Bytes of the answers the session's own connection received from now on."""
    assert isinstance(store, ZookeeperBackend)
    hosted = store._sessions.get(session.session_id)
    assert hosted is not None
    handler = hosted.client._connection
    total = [0]
    read = handler._read

    def counted(length: int, timeout: float) -> Any:
        total[0] += length
        return read(length, timeout)

    handler._read = counted
    return lambda: total[0]


def _sticky_join(assignment: dict[str, list[str]], newcomer: str) -> dict[str, list[str]]:
    """Each member gives the newcomer its last 1/(N+1): the minimum moves of a join."""
    n = len(assignment) + 1
    out = {m: rs[: len(rs) - len(rs) // n] for m, rs in assignment.items()}
    out[newcomer] = [r for rs in assignment.values() for r in rs[len(rs) - len(rs) // n :]]
    return out


def measure(port: int, resources: int, members: int, repeats: int) -> list[str]:
    url = f"zookeeper://127.0.0.1:{port}/bench-{uuid.uuid4().hex[:8]}"
    ids = [f"s3://lake/raw/orders/{i:06d}/" for i in range(resources)]
    names = [f"m{k:03d}" for k in range(members)]
    before = {m: ids[k::members] for k, m in enumerate(names)}
    after = _sticky_join(before, "new")
    moved = sum(map(len, before.values())) - sum(len(after[m]) for m in names)
    lines = [f"{resources:,} x {members} (join: {moved:,} moved)"]
    with open_backend(url) as store:
        group = "g"
        coordinator = store.join(group, names[0], info={}, ttl=30, static=False)
        record = store.elect(coordinator)
        assert record is not None
        version = store.update_resources(group, replace=[Resource(r) for r in ids])
        old_member = store.join(group, names[1], info={}, ttl=30, static=False)
        newcomer = store.join(group, "new", info={}, ttl=30, static=False)
        for label, handed in (("whole", False), ("delta", True)):
            times: list[float] = []
            sent: list[int] = []
            view_bytes: list[int] = []
            view_times: list[float] = []
            old_bytes: list[int] = []
            for _ in range(repeats):
                first: Target = store.publish(
                    coordinator, record.epoch, before, phase=Phase.RUNNING,
                    resources_version=version,
                )  # fmt: skip
                store.member_view(old_member)  # the old member read the generation before
                b0, t0 = _bytes_in(port), time.perf_counter()
                store.publish(
                    coordinator, record.epoch, after, phase=Phase.RUNNING,
                    resources_version=version, previous=first if handed else None,
                )  # fmt: skip
                times.append(time.perf_counter() - t0)
                sent.append(_bytes_in(port) - b0)
                counter = _read_bytes(store, newcomer)
                t0 = time.perf_counter()
                part = store.member_view(newcomer).target
                view_times.append(time.perf_counter() - t0)
                view_bytes.append(counter())
                assert part == frozenset(after["new"])
                counter = _read_bytes(store, old_member)
                assert store.member_view(old_member).target == frozenset(after[names[1]])
                old_bytes.append(counter())
            lines.append(
                f"  {label:5}  publish {statistics.median(times):.3f} s, "
                f"{statistics.median(sent) / 1e3:,.1f} kB to the server; "
                f"newcomer's view {statistics.median(view_times):.3f} s, "
                f"{statistics.median(view_bytes) / 1e3:,.1f} kB read; an old member's view "
                f"{statistics.median(old_bytes) / 1e3:,.1f} kB read"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", default="100000x100,10000x4", help="RESOURCESxMEMBERS,…")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cells = [tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")]
    with _server() as port:
        for resources, members in cells:
            for line in measure(port, resources, members, args.repeats):
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
