"""Chaos until a number of faults: kill -9 and SIGSTOP past the lease of member processes,
store servers restarted and paused, on each backend in turn; the runner itself counts double
ownership from every member's trail.

    nice -n 10 python benchmarks/chaos_runner.py --backend all --faults 1000
    nice -n 10 python benchmarks/chaos_runner.py --backend redis --faults 200 --seed 7

The schedule is the seeded one of ``tests/support/chaos.py`` (at most ``members - 1`` member
faults and one store fault in force at once, a killed member restarted under its static id
once the store dropped its session), run until ``--faults`` faults were injected instead of
for a fixed time, with short sessions (``--session-timeout``, default 1.5 s) and many members
so that faults overlap. The faults:

* every backend: ``kill -9`` of a member or of the coordinator, ``SIGSTOP`` of a member for
  1 to 2 s past its session timeout;
* ZooKeeper (one server started here): the server stopped and started again (``restart``) or
  paused with ``SIGSTOP`` for 0.5 s to the session timeout + 1 s;
* ZooKeeper as a three-server ensemble (``--backend zookeeper-ensemble``, not part of ``all``):
  the leader killed with ``-9`` and started again 1 to 4 s later (a quorum remains; the
  members' connections move to another server and the ensemble elects a new leader);
* Redis (one server started here, no persistence): restarted (its data is lost), paused with
  ``SIGSTOP`` likewise, or its wall clock stepped 0.5 to 3 session timeouts forward or back
  (``redis-clock-step``, where a C compiler builds ``tests/support/clockshift.c``).

With ``--spark-jobs N``, whole Spark drivers are victims too (``tests/support/spark_chaos.py``):
N ``spark-submit jobs/ingest_files.py`` applications of a group of their own, on the same
store, ingest files a feeder keeps writing, while one fault at a time (``--driver-gap`` s apart
on average) kills a whole application with ``-9`` (a new one is started) or stops it with
``SIGSTOP`` past its lease. The run goes on until ``--driver-faults`` such faults were injected
too; then the jobs commit every file and stop, and the output is counted row by row (lost,
duplicated) and checked against the jobs' audit table.

Clock steps go to Redis alone: it is the one store that ends leases by a wall clock (its key
expiry); SQLite leases run on ``CLOCK_BOOTTIME``, ZooKeeper's sessions on its servers'
monotonic clocks and the members' self-fencing on ``time.monotonic``. The step reaches only
the redis-server process (an ``LD_PRELOAD`` library reading a shift file), not the machine.
Overlaps that begin within a session timeout after a forward step are counted apart: the
step ended leases that their members still counted on (docs/operations.md, "Clocks").

The checker is independent of any one member: it reads every member's own JSON-lines trail
(acquired / released / lost with the times the store gave) and counts overlapping ownership
intervals of one resource (``core.audit.overlaps``); it counts lost commits (an acknowledged
commit that the next owner was not handed); and, with ``--audit``, it also verifies the Delta
audit table the members write (off by default: opening it costs each restarted member about a
second of CPU). It prints, per backend, faults injected by kind, double ownership, lost commits
and the time to recover after the last fault.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.*: servers, procs
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tests.servers.redis import RedisServer
from tests.servers.zookeeper import Ensemble, ZkServer, free_ports
from tests.support.chaos import Chaos, ChaosConfig, ChaosReport, NoStoreFaults, StoreFaults
from tests.support.chaos_invariants import (
    count_lost_commits,
    every_resource_committed,
    read_final_progress,
)
from tests.support.chaos_stores import EnsembleFaults, RedisFaults
from tests.support.clockshift import ClockShift
from tests.support.helpers import wait_for
from tests.support.procs import MemberProcesses
from tests.support.spark_chaos import DriverChaos, DriverFigures

from rebalancer_spark.core import audit
from rebalancer_spark.testing import member_process

KINDS = ("sqlite", "zookeeper", "redis")
EXTRA_KINDS = ("zookeeper-ensemble",)
"""Run only when named (not in ``all``): three ZooKeeper servers on two cores are slow."""


@dataclass
class ZkServerFaults:
    """One ZooKeeper server: stopped and started again, or paused with SIGSTOP."""

    server: ZkServer
    session_timeout: float
    name: str = "zookeeper (standalone)"
    kinds: tuple[str, ...] = ("zk-server-restart", "zk-sigstop")
    paused_member_stalls_writers: bool = False
    paused: bool = False

    def inject(self, kind: str, rng: random.Random) -> float:
        assert kind in self.kinds, kind
        if kind == "zk-sigstop":
            self.server.signal(signal.SIGSTOP)
            self.paused = True
        else:
            self.server.stop()
        return rng.uniform(0.5, self.session_timeout + 1.0)

    def heal(self) -> None:
        if self.paused:
            self.server.signal(signal.SIGCONT)
            self.paused = False
        if not self.server.running:
            self.server.start()
        self.server.wait_serving()

    def data_lost(self) -> bool:
        return False


class Members(MemberProcesses):
    """Member processes with the Delta audit table only when asked (``audit``)."""

    def __init__(self, *args: object, audit: bool, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.with_audit = audit

    def start(self, member_id: str, resources: list[str] | None = None) -> subprocess.Popen[str]:
        if self.with_audit:
            return super().start(member_id, resources)

        cmd = member_process.command(
            self.group,
            self.url,
            member_id,
            self.log_path(member_id),
            resources=resources,
            work_interval=0.02,
            options=self.options,
        )
        stderr = open(self.workdir / f"{member_id}.stderr", "a")  # noqa: SIM115 - owned by proc
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True)
        stderr.close()
        self.procs[member_id] = proc
        self._await_ready(member_id, proc, timeout=60)
        return proc


class CountedChaos(Chaos):
    """The schedule of tests/support/chaos.py, ended after ``target`` faults (or
    ``max_seconds``) instead of after a fixed time."""

    def __init__(self, *args: object, target: int, max_seconds: float, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.target = target
        self.max_seconds = max_seconds

    def done(self) -> bool:
        return (
            len(self.faults) >= self.target or time.monotonic() - self.started >= self.max_seconds
        )

    def run(self) -> None:
        gap = self.config.mean_gap
        next_fault = self.started + self.rng.expovariate(1 / gap)
        while not self.done():
            now = time.monotonic()
            for victim, (fault, due) in sorted(self.member_faults.items()):
                if now >= due and not self.heal_member(victim):
                    self.member_faults[victim] = (fault, now + 0.1)
            if self.store_fault is not None and now >= self.store_fault[1]:
                self.heal_store()
            if now >= next_fault:
                store_turn = bool(self.store.kinds) and (
                    self.rng.random() < self.config.store_fault_share
                )
                if store_turn and self.store_fault is None:
                    self.inject_store_fault()
                elif not store_turn and len(self.member_faults) < self.config.members - 1:
                    self.inject_member_fault()
                next_fault = time.monotonic() + self.rng.expovariate(1 / gap)
            wake = [next_fault, *(due for _, due in self.member_faults.values())]
            if self.store_fault is not None:
                wake.append(self.store_fault[1])
            # The schedule's own time between faults: the workload, not synchronisation.
            time.sleep(min(max(min(wake) - time.monotonic(), 0.0), 0.5))
        self.heal_store()
        self.heal_members()


@dataclass
class Figures:
    backend: str
    faults: Counter[str] = field(default_factory=Counter)
    double_ownerships: int = 0
    double_ownerships_clock: int = 0
    """Overlaps that began within a session timeout after a forward step of Redis' clock:
    the step ended leases that their members still counted on (docs/backends/redis.md)."""
    clock_steps: list[int] = field(default_factory=list)
    overlap_examples: list[str] = field(default_factory=list)
    lost_commits: int = 0
    lost_with_store_data: int = 0
    lost_examples: list[str] = field(default_factory=list)
    commits: int = 0
    acquisitions: int = 0
    recovery_s: float = float("nan")
    chaos_s: float = 0.0
    audit_double_ownerships: int | None = None
    drivers: DriverFigures | None = None

    @property
    def ok(self) -> bool:
        return (
            self.double_ownerships == 0
            and self.lost_commits == 0
            and not self.audit_double_ownerships
            and (self.drivers is None or self.drivers.ok)
        )

    def lines(self) -> list[str]:
        total = sum(self.faults.values())
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))
        out = [
            f"{self.backend}: {total} faults in {self.chaos_s:.0f} s "
            f"({total / max(self.chaos_s, 1e-9):.2f}/s): {kinds}",
            f"  double ownership     {self.double_ownerships} (overlapping intervals in the "
            "members' trails)"
            + (
                f" (+ {self.double_ownerships_clock} right after a forward step of the store's "
                "clock: documented)"
                if self.double_ownerships_clock
                else ""
            ),
            f"  lost commits         {self.lost_commits} of {self.commits} acknowledged"
            + (
                f" (+ {self.lost_with_store_data} gone with the store's data)"
                if self.lost_with_store_data
                else ""
            ),
            f"  acquisitions         {self.acquisitions}",
            f"  recovery             {self.recovery_s:.2f} s after the last fault was healed",
        ]
        if self.clock_steps:
            steps = ", ".join(f"{ms / 1000:+.1f}" for ms in self.clock_steps[:12])
            more = " ..." if len(self.clock_steps) > 12 else ""
            out.append(f"  store clock steps    {len(self.clock_steps)}: {steps}{more} s")
        if self.audit_double_ownerships is not None:
            out.append(f"  audit table          {self.audit_double_ownerships} double ownership")
        if self.drivers is not None:
            out += self.drivers.lines()
        out += [f"  OVERLAP {e}" for e in self.overlap_examples]
        out += [f"  LOST {e}" for e in self.lost_examples]
        return out


@contextlib.contextmanager
def store_for(
    kind: str, workdir: Path, session_timeout: float
) -> Iterator[tuple[str, str, StoreFaults]]:
    """(members' URL, observer's URL, the store's faults); servers ended by PID at the end."""
    if kind == "sqlite":
        url = f"sqlite://{workdir / 'groups.db'}?poll=0.005"
        yield url, url, NoStoreFaults()
    elif kind == "zookeeper":
        (port,) = free_ports(1)
        server = ZkServer(workdir / "zk", port)
        server.write_config()
        server.start()
        try:
            server.wait_serving()
            url = f"zookeeper://127.0.0.1:{port}/chaos-{uuid.uuid4().hex[:8]}?connect_timeout=2"
            yield url, url, ZkServerFaults(server, session_timeout)
        finally:
            server.kill()
    elif kind == "zookeeper-ensemble":
        ensemble = Ensemble.of_three(workdir)
        try:
            ensemble.start()
            url = ensemble.url(f"/chaos-{uuid.uuid4().hex[:8]}", query="connect_timeout=2")
            yield url, url, EnsembleFaults(ensemble)
        finally:
            ensemble.close()
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
        known = ", ".join((*KINDS, *EXTRA_KINDS))
        raise SystemExit(f"unknown backend {kind!r}: one of {known} or all")


def run_one(kind: str, args: argparse.Namespace, log: Callable[[str], None]) -> Figures:
    config = ChaosConfig(
        seconds=args.max_seconds,
        seed=args.seed,
        members=args.members,
        resources=args.resources,
        session_timeout=args.session_timeout,
        mean_gap=args.mean_gap,
        store_fault_share=args.store_fault_share,
        recovery_timeout=120.0,
    )
    figures = Figures(kind)
    kept = tempfile.mkdtemp(prefix=f"chaos-runner-{kind}-") if args.keep else None
    if kept is not None:
        log(f"work directory kept: {kept}")
    with (
        contextlib.nullcontext(kept)
        if kept
        else tempfile.TemporaryDirectory(prefix=f"chaos-runner-{kind}-") as tmp,
        store_for(kind, Path(tmp), args.session_timeout) as (url, observer, faults),
    ):
        drivers = None
        if args.spark_jobs:
            drivers = DriverChaos(
                Path(tmp) / "spark", url, f"chaos-{args.seed}", jobs=args.spark_jobs,
                seed=args.seed, mean_gap=args.driver_gap, target=args.driver_faults,
            )  # fmt: skip
        procs = Members(
            url,
            f"chaos-{args.seed}-{uuid.uuid4().hex[:6]}",
            Path(tmp),
            observer_url=observer,
            audit=args.audit,
            session_timeout=args.session_timeout,
            stability_window=0.05,
        )
        try:
            resources = [f"res-{i:03d}" for i in range(args.resources)]
            procs.start("m0", resources)
            for i in range(1, args.members):
                procs.start(f"m{i}")
            procs.wait_stable(args.members, timeout=120, resources=resources)
            report = ChaosReport(faults.name, args.seed, 0, args.members, args.resources, 0)
            chaos = CountedChaos(
                procs, faults, config, report, log, target=args.faults, max_seconds=args.max_seconds
            )
            chaos_wall = time.time()
            if drivers is not None:
                drivers.start()
            chaos.run()
            if drivers is not None:
                target, deadline = args.driver_faults, chaos.started + args.max_seconds
                wait_for(
                    lambda: drivers.fault_count >= target or time.monotonic() > deadline,
                    timeout=args.max_seconds + 60,
                    what=f"{target} faults of Spark drivers",
                )
                drivers.stop_faults()
            figures.chaos_s = time.monotonic() - chaos.started
            healed, healed_wall = time.monotonic(), time.time()
            procs.wait_stable(args.members, timeout=180, resources=resources)
            figures.recovery_s = time.monotonic() - healed
            wait_for(
                lambda: every_resource_committed(procs, resources, since=healed_wall),
                timeout=120,
                what="a commit accepted for every resource after the faults stopped",
            )
            figures.faults = report.faults
            steps = getattr(faults, "steps", [])
            figures.clock_steps = [ms for _, ms in steps]
            forward = [at for at, ms in steps if ms > 0]
            window = args.session_timeout + 1.0
            check(procs, figures, resources, chaos.data_lost_at, chaos_wall, (forward, window))
            if drivers is not None:
                figures.drivers = drivers.finish(forward_steps=forward)
        finally:
            try:
                procs.close()
            finally:
                if drivers is not None:
                    drivers.cleanup()
    return figures


def check(
    procs: MemberProcesses,
    figures: Figures,
    resources: list[str],
    data_lost_at: list[float],
    since: float,
    steps: tuple[list[float], float],
) -> None:
    """The independent checker: every member's trail, read here, and the store's progress.
    An overlap whose later owner started within a session timeout (+ 1 s) after a forward
    step of the store's clock (``steps``: their wall-clock times, and that window) is
    counted apart."""
    final = read_final_progress(procs, resources)
    records = procs.records()
    owned = [r for r in records if r["kind"] in ("acquired", "released", "lost")]
    overlaps = audit.overlaps(audit.intervals(owned))
    forward_steps, window = steps
    stepped = [
        o for o in overlaps if any(0 <= o.second.start - at <= window for at in forward_steps)
    ]
    overlaps = [o for o in overlaps if o not in stepped]
    figures.double_ownerships = len(overlaps)
    figures.double_ownerships_clock = len(stepped)
    figures.overlap_examples = [_overlap(o, since) for o in [*overlaps, *stepped][:5]]
    figures.acquisitions = sum(1 for r in owned if r["kind"] == "acquired" and r["at"] > since)
    figures.commits = sum(1 for r in records if r["kind"] == "commit" and r["ok"])
    lost, documented, examples = count_lost_commits(records, final, data_lost_at)
    figures.lost_commits, figures.lost_with_store_data = lost, documented
    figures.lost_examples = [f"{e} (times: seconds since the epoch)" for e in examples]
    if isinstance(procs, Members) and procs.with_audit:
        from rebalancer_spark.audit import verify_table

        figures.audit_double_ownerships = len(
            verify_table(str(procs.audit_path), group=procs.group).overlaps
        )


def _overlap(o: audit.Overlap, since: float) -> str:
    """One overlap in a line, times in seconds after the schedule's start."""
    a, b = o.first, o.second
    return (
        f"{o.resource}: {a.member_id} (epoch {a.epoch}) {a.start - since:.2f}-{a.end - since:.2f}"
        f" s ({a.closed_by}) and {b.member_id} (epoch {b.epoch}) from {b.start - since:.2f} s:"
        f" {o.seconds:.3f} s shared"
    )


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    known = ", ".join((*KINDS, *EXTRA_KINDS))
    parser.add_argument("--backend", default="all", help=f"all or one of {known}")
    parser.add_argument("--faults", type=int, default=1000, help="faults to inject per backend")
    parser.add_argument("--max-seconds", type=float, default=3600.0, help="per backend")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--members", type=int, default=6)
    parser.add_argument("--resources", type=int, default=24)
    parser.add_argument("--session-timeout", type=float, default=1.5)
    parser.add_argument("--mean-gap", type=float, default=0.15, help="mean s between faults")
    parser.add_argument("--store-fault-share", type=float, default=0.2)
    parser.add_argument("--audit", action="store_true", help="also verify the Delta audit table")
    parser.add_argument(
        "--spark-jobs",
        type=int,
        default=0,
        help="spark-submit ingest jobs as victims too (module docstring)",
    )
    parser.add_argument(
        "--driver-faults",
        type=int,
        default=10,
        help="with --spark-jobs: run until this many driver faults too",
    )
    parser.add_argument(
        "--driver-gap",
        type=float,
        default=8.0,
        help="with --spark-jobs: mean s between driver faults",
    )
    parser.add_argument("--verbose", action="store_true", help="print the schedule as it runs")
    parser.add_argument(
        "--keep", action="store_true", help="keep the work directory (trails, output, logs)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # the faults make it complain
    kinds = list(KINDS) if args.backend == "all" else [args.backend]
    print(
        f"seed {args.seed}, {args.members} members, {args.resources} resources, session "
        f"{args.session_timeout:g} s, mean gap {args.mean_gap:g} s; python {sys.version.split()[0]}"
    )
    failed = False
    for kind in kinds:
        started = time.monotonic()
        figures = run_one(kind, args, print if args.verbose else (lambda _: None))
        print("\n".join(figures.lines()))
        print(f"  wall time            {time.monotonic() - started:.0f} s", flush=True)
        failed = failed or not figures.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
