"""What a ZooKeeper claim and release of many resources cost the server and the client, with
and without a claim znode per resource, side by side on one server.

    python benchmarks/bench_zk_claim_writes.py                   # 2,000 resources, 5 rounds
    python benchmarks/bench_zk_claim_writes.py --resources 10000 --batch 500

Until session 30 a claim created an ephemeral ``claims/<id>`` of the claimer's session beside
the ``set`` of ``epochs/<id>``, and a release deleted it beside the ``set`` that marks the record
released; now the record alone says who holds a resource (docs/backends/zookeeper.md,
"Claims"). This script starts a ZooKeeper server the way the benchmarks do (``tests/servers``,
the benchmark JVM), writes one record per resource, then times both layouts alternately, as the
backend sends them: multi-ops of ``--batch`` resources, two in flight, through one kazoo client
(the member's session), the records of the size a grant writes. It prints milliseconds per
claim and per release of all the resources, each round and the median.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.servers
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kazoo.client import KazooClient
from tests.servers.zookeeper import SERVER_JVM, ZkServer, free_ports

RECORD = (
    b'{"epoch":2,"member":"member-0003","prev":{"at":1764412345.123,"freed":"released",'
    b'"member":"member-0001","session":"1000a3f4c2b0003"},"session":"1000a3f4c2b0007"}'
)
CLAIM = b'{"epoch":2,"member":"member-0003","session":"1000a3f4c2b0007"}'
IN_FLIGHT = 2


def timed(client: Any, ids: list[str], batch: int, kind: str, znodes: bool) -> float:
    """Milliseconds to claim (``kind`` "claim") or release every id, ``batch`` per multi-op,
    :data:`IN_FLIGHT` requests out at a time; ``znodes``: the layout with claim znodes."""
    started = time.perf_counter()
    pending: list[Any] = []
    for start in range(0, len(ids), batch):
        tx = client.transaction()
        for r in ids[start : start + batch]:
            if znodes and kind == "claim":
                tx.create(f"/g/claims/{r}", CLAIM, ephemeral=True)
            elif znodes:
                tx.delete(f"/g/claims/{r}")
            tx.set_data(f"/g/epochs/{r}", RECORD)
        pending.append(tx.commit_async())
        if len(pending) >= IN_FLIGHT:
            pending.pop(0).get()
    for request in pending:
        request.get()
    return (time.perf_counter() - started) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--resources", type=int, default=2000, help="resources claimed")
    parser.add_argument("--batch", type=int, default=250, help="resources per multi-op")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, the layouts alternated")
    args = parser.parse_args(argv)
    if min(args.resources, args.batch, args.rounds) < 1:
        parser.error("--resources, --batch and --rounds take whole numbers of at least 1")
    workdir = Path(tempfile.mkdtemp(prefix="bench-zk-claims-"))
    server = ZkServer(workdir, free_ports(1)[0], jvm=SERVER_JVM)
    server.write_config()
    server.start()
    client = KazooClient(hosts=f"127.0.0.1:{server.port}")
    try:
        server.wait_serving()
        client.start()
        client.ensure_path("/g/claims")
        ids = [f"r{i:07d}" for i in range(args.resources)]
        for start in range(0, len(ids), args.batch):
            tx = client.transaction()
            for r in ids[start : start + args.batch]:
                tx.create(f"/g/epochs/{r}", RECORD)
            tx.commit()
        figures: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for znodes in (True, False):
                layout = "with claim znodes" if znodes else "records only"
                for kind in ("claim", "release"):
                    ms = timed(client, ids, args.batch, kind, znodes)
                    figures.setdefault(f"{kind:7} {layout}", []).append(ms)
    finally:
        client.stop()
        client.close()
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{args.resources:,} resources, {args.batch} per multi-op, {IN_FLIGHT} in flight, ms:")
    for name, values in figures.items():
        rounds = ", ".join(f"{v:.0f}" for v in values)
        print(f"  {name:32} median {statistics.median(values):6.1f}   ({rounds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
