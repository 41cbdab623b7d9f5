"""Chaos on real backends: faults injected, rebalances, double ownerships, lost commits and
time to recover, from the seeded schedule of ``tests/support/chaos.py``.

    python benchmarks/bench_chaos.py --backend all --seconds 60 --seed 1
    python benchmarks/bench_chaos.py --backend redis --seconds 30      # a server of its own
    python benchmarks/bench_chaos.py --backend zookeeper://zk1:2181/chaos --seconds 30

``--backend`` is ``sqlite``, ``zookeeper`` (a 3-server ensemble started here: its leader is
killed), ``zookeeper-standalone`` (one server, stopped and started again), ``redis`` (one
server, restarted without persistence or paused), ``all`` (sqlite, zookeeper, redis), or a
backend URL of a store run elsewhere (member faults only: this script cannot harm that server).
Servers are started on free ports in a temporary directory and ended by their PID. Member
faults (kill -9 then restart under the same static id, kill -9 of the coordinator, SIGSTOP past
the session timeout then SIGCONT) apply everywhere. The figures are printed, and written as
JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.*: the chaos driver
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tests.servers.redis import RedisServer
from tests.servers.zookeeper import Ensemble, ZkServer, free_ports
from tests.support.chaos import ChaosConfig, ChaosReport, NoStoreFaults, StoreFaults, run_chaos
from tests.support.chaos_stores import EnsembleFaults, RedisFaults, StandaloneZkFaults
from tests.support.clockshift import ClockShift
from tests.support.procs import MemberProcesses

KINDS = ("sqlite", "zookeeper", "zookeeper-standalone", "redis")


@contextlib.contextmanager
def store_for(
    kind: str, workdir: Path, session_timeout: float
) -> Iterator[tuple[str, str, StoreFaults]]:
    """(backend URL for the members, URL for the observer, the store's faults)."""
    if kind == "sqlite":
        url = f"sqlite://{workdir / 'groups.db'}?poll=0.005"
        yield url, url, NoStoreFaults()
    elif kind == "zookeeper":
        ensemble = Ensemble.of_three(workdir)
        try:
            ensemble.start()
            url = ensemble.url(query="connect_timeout=2")
            yield url, url, EnsembleFaults(ensemble)
        finally:
            ensemble.close()
    elif kind == "zookeeper-standalone":
        (port,) = free_ports(1)
        server = ZkServer(workdir / "zk", port)
        server.write_config()
        server.start()
        try:
            server.wait_serving()
            url = f"zookeeper://127.0.0.1:{port}/chaos-{uuid.uuid4().hex[:8]}?connect_timeout=2"
            yield url, url, StandaloneZkFaults(server, session_timeout)
        finally:
            server.kill()
    elif kind == "redis":
        # Its wall clock steps too (redis-clock-step) where a C compiler can build the shim.
        redis = RedisServer(workdir / "redis", clock=ClockShift.create(workdir / "redis-clock"))
        redis.start()
        try:
            url = redis.url()
            yield url, url + "?timeout=1&connect_timeout=1", RedisFaults(redis, session_timeout)
        finally:
            redis.stop()
    else:
        name = kind.split("://", 1)[0] + " (member faults only)"
        yield (
            kind,
            kind,
            NoStoreFaults(name, paused_member_stalls_writers=kind.startswith("sqlite")),
        )


def run_one(kind: str, args: argparse.Namespace, seed: int) -> ChaosReport:
    config = ChaosConfig(
        seconds=args.seconds,
        seed=seed,
        members=args.members,
        resources=args.resources,
        session_timeout=args.session_timeout,
        mean_gap=args.mean_gap,
    )
    with tempfile.TemporaryDirectory(prefix=f"chaos-{kind.split(':', maxsplit=1)[0]}-") as tmp:
        workdir = Path(tmp)
        with store_for(kind, workdir, args.session_timeout) as (url, observer, faults):
            procs = MemberProcesses(
                url,
                f"chaos-{seed}-{uuid.uuid4().hex[:6]}",
                workdir,
                observer_url=observer,
                session_timeout=args.session_timeout,
                stability_window=0.05,
            )
            log = print if args.verbose else (lambda _: None)
            try:
                report = run_chaos(procs, faults, config, log=log)
            finally:
                procs.close()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="all", help=f"all, {', '.join(KINDS)} or a URL")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long faults go on")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--resources", type=int, default=24)
    parser.add_argument("--session-timeout", type=float, default=3.0)
    parser.add_argument("--mean-gap", type=float, default=1.0, help="mean s between faults")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--verbose", action="store_true", help="print the schedule as it runs")
    args = parser.parse_args(argv)
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # the faults make it complain
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    kinds = ["sqlite", "zookeeper", "redis"] if args.backend == "all" else [args.backend]
    print(f"seed {seed} (replay with --seed {seed}); python {sys.version.split()[0]}")
    reports = []
    failed = False
    for kind in kinds:
        started = time.monotonic()
        report = run_one(kind, args, seed)
        reports.append(report)
        print("\n".join(report.lines()))
        print(f"  wall time            {time.monotonic() - started:.1f} s\n")
        if report.double_ownerships_trail or report.double_ownerships_audit:
            failed = True
        if report.chain_faults or not report.chain_checked:
            failed = True
            print(f"  CHAIN: {report.chain_examples or 'no grant carried the chain'}")
        if report.lost_commits:
            failed = True
            print(f"  LOST: {report.lost_examples}")
    if args.json is not None:
        args.json.write_text(json.dumps([r.as_dict() for r in reports], indent=2, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
