"""Our backends next to kazoo's SetPartitioner and tooz's partitioner, in one run, on the same
servers: join, graceful leave and crash to a stable assignment.

    python benchmarks/bench_peers.py                 # 4 members x 200 resources, 5 repeats
    python benchmarks/bench_peers.py --quick         # 3 members x 60 resources, 2 repeats
    python benchmarks/bench_peers.py --systems kazoo,tooz --members 4 --resources 1000

Starts one ZooKeeper server (standalone, tickTime 500 ms) and one redis-server (no
persistence) on free ports in a temporary directory, and measures, ``--repeats`` times each:

* ``sqlite``, ``zookeeper``, ``redis``: our member processes, as ``bench_rebalance.py`` does
  (join from the new member's ``started`` record, i.e. after its join write; leave from
  SIGTERM; crash from ``kill -9``), here with no progress commits (``--work-interval`` 1 h) so
  that the store operations counted are the rebalance's own;
* ``kazoo``: ``SetPartitioner(time_boundary=--kazoo-time-boundary)``, one KazooClient each;
* ``tooz``: ``join_partitioned_group`` on tooz's zookeeper driver, one coordinator each.

Peer members run on threads of this process, each with its own ZooKeeper session behind a TCP
proxy (``benchmarks/peers.py``); a peer's join is timed from the moment its client is
connected, its crash is a cut of its proxy (the session then expires at the server, as after
kill -9). Every system uses the same session timeout (``--session-timeout``).

Figures per scenario: median and p95 seconds to a stable assignment; resources moved (between
members present before and after) next to ``assignors.minimum_moves``; resources that were
without an owner, their resource-seconds and the longest gap; imbalance (max - min resources
per member) once stable; double ownership seen (overlapping ownership intervals: count and
seconds); store operations from the event to the stable assignment: ZooKeeper packets
received (``mntr`` ``zk_packets_received``, including every client's pings) or Redis commands
executed (``INFO commandstats``, including those run inside Lua scripts and the lease
renewals). Nobody reads the store to observe meanwhile: our members are observed through their
own trails (timed to the ownership event that completed a balanced, complete, single-owner
split; the store's own "stable" is checked before and after, outside the window), the peers
through their in-memory views. SQLite transactions are not counted (``-``). A tooz group that
cannot settle because of its start-up race (FACTS.md) is reported with the diagnosis, then
rebuilt, rather than waited for.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.servers: the servers
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tests.servers.redis import RedisServer
from tests.servers.zookeeper import ZkServer, free_ports

import bench_rebalance as br
from peers import KazooMember, PeerMember, ToozMember, diagnose
from rebalancer_spark.core import audit
from rebalancer_spark.core.assignors import minimum_moves, moved
from store_counters import RedisCounters, StoreCounters, ZkCounters

SYSTEMS = ("sqlite", "zookeeper", "redis", "kazoo", "tooz")
PEER_SETTLE_TIMEOUT = 40.0
RACE_PATIENCE = 5.0
"""Seconds a tooz diagnosis must persist before the measurement is given up as the race."""


class NotSettled(Exception):
    """A peer group did not reach a stable partition; the message says why."""


# -- store operation counters ----------------------------------------------------------------


class Ops:
    """A store's operation count between two instants: ZooKeeper packets received or Redis
    commands executed (``store_counters``)."""

    def __init__(self, counters: StoreCounters) -> None:
        self.counters = counters

    def snapshot(self) -> Any:
        return self.counters.snapshot()

    def since(self, before: Any) -> float:
        used = self.counters.delta(before, self.counters.snapshot())["ops"]
        assert used is not None
        return used


# -- measurements ------------------------------------------------------------------------------


@dataclass
class Point:
    seconds: float
    moved: int | None = None
    minimum: int | None = None
    imbalance: int | None = None
    ops: float | None = None
    window: tuple[float, float] = (0.0, 0.0)


@dataclass
class Row:
    system: str
    store: str
    scenario: str
    members: str
    points: list[Point] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    unowned: list[br.GapStats] = field(default_factory=list)
    double: list[tuple[int, float]] = field(default_factory=list)


def imbalance(owners: dict[str, set[str]]) -> int:
    sizes = [len(v) for v in owners.values()] or [0]
    return max(sizes) - min(sizes)


def window_stats(
    by_resource: dict[str, list[audit.Interval]], rows: Sequence[Row], killed: bool = False
) -> None:
    """Fill each row's unowned and double-ownership figures from the ownership intervals."""
    gaps = audit.gaps(by_resource)
    double = audit.overlaps(by_resource)
    for row in rows:
        for point in row.points:
            row.unowned.append(br.gap_stats(gaps, point.window))
            start, end = point.window
            inside = [o for o in double if start <= o.second.start <= end]
            row.double.append((len(inside), math.fsum(o.seconds for o in inside)))


# -- our member processes ----------------------------------------------------------------------


QUIET = 3600.0
"""Seconds between progress commits of our members: none during a run."""


def trail_owners(members: Sequence[br.MemberProc]) -> tuple[dict[str, set[str]], float]:
    """Member -> what its own trail says it owns now, and the time of the latest ownership
    event among them."""
    owners: dict[str, set[str]] = {}
    last = 0.0
    for member in members:
        held: set[str] = set()
        for r in br.read_records(member.log):
            kind = r.get("kind")
            if kind == "acquired":
                held.add(str(r["resource"]))
            elif kind in ("released", "lost"):
                held.discard(str(r["resource"]))
            else:
                continue
            last = max(last, float(r["at"]))
        owners[member.member_id] = held
    return owners, last


def trail_settled(
    group: br.Group,
    expected: int,
    resources: set[str],
    timeout: float,
    what: str,
    leaving: br.MemberProc | None = None,
) -> tuple[float, dict[str, set[str]]]:
    """Wait until the members' own trails (not the store: its reads would be counted) show
    every resource owned by exactly one of ``expected`` members, balanced within one; returns
    the time of the ownership event that completed it, and who owns what."""
    deadline = time.monotonic() + timeout
    while True:
        live = [m for m in group.members if m is not leaving]
        if len(live) == expected:
            owners, last = trail_owners(live)
            sizes = [len(v) for v in owners.values()]
            if (
                sum(sizes) == len(resources)
                and set().union(*owners.values()) == resources
                and max(sizes) - min(sizes) <= 1
            ):
                return last, owners
        if time.monotonic() >= deadline:
            raise br.BenchmarkError(f"{what}: the member trails did not settle in {timeout:g} s")
        time.sleep(br.POLL)


def run_ours(
    kind: str, url: str, ops: Ops | None, args: argparse.Namespace, workdir: Path
) -> list[Row]:
    """Our member processes; each scenario is timed to the ownership event that completed a
    balanced, complete, single-owner split in the members' trails, with the store's own idea
    of stable (``bench_rebalance``'s observer) checked before and after, outside the window
    in which store operations are counted."""
    n, ttl = args.members, args.session_timeout
    resources = [f"r{i:04d}" for i in range(args.resources)]
    wanted = set(resources)
    workdir.mkdir(parents=True, exist_ok=True)
    group = br.Group(url, f"peers-{uuid.uuid4().hex[:8]}", workdir, ttl, work_interval=QUIET)
    rows = {
        s: Row(kind, "ours", s, f"{n}->{m}")
        for s, m in (("join", n + 1), ("graceful leave", n - 1), ("crash", n - 1))
    }
    timeout = br.SETTLE_TIMEOUT + ttl

    def measure(row: Row, expected: int, act: Callable[[], tuple[float, br.MemberProc | None]],
                leaving: bool = False) -> br.MemberProc | None:  # fmt: skip
        group.settled(n, timeout, f"before {row.scenario}")
        _, before = trail_settled(group, n, wanted, timeout, f"before {row.scenario}")
        c0 = ops.snapshot() if ops else None
        start, member = act()
        seen, after = trail_settled(
            group, expected, wanted, br.READY_TIMEOUT + timeout, row.scenario,
            leaving=member if leaving else None,
        )  # fmt: skip
        used = ops.since(c0) if ops else None
        group.settled(expected, timeout, f"after {row.scenario}", leaving=member)
        weights = dict.fromkeys(resources, 1.0)
        row.points.append(
            Point(
                seen - start,
                moved(before, after),
                minimum_moves(set(after), weights, before),
                imbalance(after),
                used,
                (start, seen),
            )
        )
        return member

    def join() -> tuple[float, br.MemberProc | None]:
        member = group.spawn()
        group.await_ready(member)
        return group.started_at(member), member

    def leave() -> tuple[float, br.MemberProc | None]:
        victim = group.victim(group.backend.state(group.group))
        at = time.time()
        victim.popen.send_signal(signal.SIGTERM)
        return at, victim

    def crash() -> tuple[float, br.MemberProc | None]:
        victim = group.victim(group.backend.state(group.group))
        return group.kill(victim), None

    try:
        group.await_ready(group.spawn(resources))
        for _ in range(n - 1):
            group.spawn()
        for member in group.members:
            group.await_ready(member)
        for _ in range(args.repeats):
            joined = measure(rows["join"], n + 1, join)
            assert joined is not None
            group.terminate(joined)
            leaver = measure(rows["graceful leave"], n - 1, leave, leaving=True)
            assert leaver is not None
            group.wait_exit(leaver)
            br.restore(group)
            measure(rows["crash"], n - 1, crash)
            br.restore(group)
        group.settled(n, timeout, "after the last measurement")
    finally:
        group.close()
    _, adjusted = br.ownership(group)
    window_stats(adjusted, list(rows.values()))
    return list(rows.values())


# -- the peers ----------------------------------------------------------------------------------


class PeerGroup:
    def __init__(
        self, system: str, make: Callable[[str], PeerMember], items: Sequence[str]
    ) -> None:
        self.system = system
        self.make = make
        self.items = set(items)
        self.members: list[PeerMember] = []
        self.gone: list[PeerMember] = []
        self._count = 0

    def live(self) -> list[PeerMember]:
        return [m for m in self.members if not m.dead]

    def add(self) -> PeerMember:
        member = self.make(f"p{self._count}")
        self._count += 1
        self.members.append(member)
        member.start()
        return member

    def owners(self) -> dict[str, set[str]]:
        return {m.name: set(m.owned) for m in self.live()}

    def is_settled(self, expected: int) -> bool:
        live = self.live()
        if len(live) != expected or not all(m.settled for m in live):
            return False
        names = {m.name for m in live}
        if any((ring := m.ring_view()) is not None and ring != names for m in live):
            return False
        owned = [m.owned for m in live]
        return sum(len(o) for o in owned) == len(self.items) and set().union(*owned) == self.items

    def settled(
        self, expected: int, timeout: float, what: str
    ) -> tuple[float, dict[str, set[str]]]:
        deadline = time.monotonic() + timeout
        doubt_since: float | None = None
        while True:
            if self.is_settled(expected):
                return time.time(), self.owners()
            now = time.monotonic()
            why = diagnose(self.live())
            doubt_since = (doubt_since or now) if why else None
            if why and doubt_since is not None and now - doubt_since > RACE_PATIENCE:
                raise NotSettled(f"{what}: {why}")
            if now >= deadline:
                owned = sorted((m.name, len(m.owned), m.settled) for m in self.live())
                errors = [e for m in self.live() for e in m.errors[-2:]]
                raise NotSettled(
                    f"{what}: no stable partition within {timeout:g} s; (member, items, "
                    f"settled): {owned}; errors: {errors[:4]}"
                )
            time.sleep(br.POLL)

    def retire(self, member: PeerMember) -> None:
        self.members.remove(member)
        self.gone.append(member)

    def intervals(self) -> dict[str, list[audit.Interval]]:
        out: dict[str, list[audit.Interval]] = {}
        for m in self.members + self.gone:
            for i in m.all_intervals():
                out.setdefault(i.resource, []).append(i)
        return out

    def close(self) -> None:
        for m in self.members:
            m.close()
        for m in self.gone:
            m.close()


def run_peer(system: str, zk: ZkServer, ops: Ops, args: argparse.Namespace) -> list[Row]:
    n, ttl = args.members, args.session_timeout
    items = [f"r{i:04d}" for i in range(args.resources)]
    rows = {
        s: Row(system, "zookeeper", s, label)
        for s, label in (
            ("start together", f"0->{n}"),
            ("join", f"{n}->{n + 1}"),
            ("graceful leave", f"{n}->{n - 1}"),
            ("crash", f"{n}->{n - 1}"),
        )
    }
    groups: list[PeerGroup] = []

    def fresh() -> PeerGroup:
        tag = uuid.uuid4().hex[:8]
        if system == "kazoo":

            def make(name: str) -> PeerMember:
                return KazooMember(name, zk.port, items, ttl, path=f"/kazoo-{tag}",
                                   time_boundary=args.kazoo_time_boundary)  # fmt: skip
        else:

            def make(name: str) -> PeerMember:
                return ToozMember(name, zk.port, items, ttl, group=f"tooz-{tag}".encode())

        group = PeerGroup(system, make, items)
        groups.append(group)
        return group

    def build() -> PeerGroup:
        """n members, one at a time (joining together is the race measured separately)."""
        group = fresh()
        for k in range(n):
            group.add()
            group.settled(k + 1, PEER_SETTLE_TIMEOUT + ttl, f"{system} set-up")
        return group

    timeout = PEER_SETTLE_TIMEOUT + ttl
    for _ in range(args.repeats):
        together = fresh()
        started = time.time()
        try:
            for _k in range(n):
                together.add()
            seen, owners = together.settled(n, timeout, "start together")
            rows["start together"].points.append(
                Point(seen - started, imbalance=imbalance(owners), window=(started, seen))
            )
        except NotSettled as exc:
            rows["start together"].failures.append(str(exc))
        finally:
            together.close()
    group = build()
    try:
        for scenario in ("join", "graceful leave", "crash"):
            for _ in range(args.repeats):
                try:
                    before = group.settled(n, timeout, f"before {scenario}")[1]
                    c0 = ops.snapshot()
                    if scenario == "join":
                        member = group.add()
                        start, expected = member.joined_at, n + 1
                    elif scenario == "graceful leave":
                        member = group.live()[0]
                        start, expected = time.time(), n - 1
                        member.leave()
                        group.retire(member)
                    else:
                        member = group.live()[0]
                        start, expected = member.crash(), n - 1
                        group.retire(member)
                    seen, after = group.settled(expected, timeout, scenario)
                    used = ops.since(c0)
                    weights = dict.fromkeys(items, 1.0)
                    point = Point(
                        seen - start,
                        moved(before, after),
                        minimum_moves(set(after), weights, before),
                        imbalance(after),
                        used,
                        (start, seen),
                    )
                    rows[scenario].points.append(point)
                    if scenario == "join":
                        member.leave()
                        group.retire(member)
                    else:
                        group.add()
                except NotSettled as exc:
                    rows[scenario].failures.append(str(exc))
                    group.close()
                    group = build()
        group.settled(n, timeout, "after the last measurement")
    except NotSettled as exc:
        rows["crash"].failures.append(f"could not rebuild the group: {exc}")
    finally:
        for g in groups:
            g.close()
    spans: dict[str, list[audit.Interval]] = {}
    for k, g in enumerate(groups):  # item names repeat across groups: keep them apart
        for resource, items_ in g.intervals().items():
            spans[f"{k}:{resource}"] = items_
    window_stats(spans, list(rows.values()))
    return list(rows.values())


# -- the report ----------------------------------------------------------------------------------


def _med(values: Sequence[float | int | None], fmt: str) -> str:
    got = [v for v in values if v is not None]
    return format(statistics.median(got), fmt) if got else "-"


def table(rows: Sequence[Row]) -> str:
    header = ("system", "scenario", "members", "n", "median s", "p95 s", "moved / min",
              "unowned res.", "unowned res-s", "longest gap s", "max-min", "double (n / s)",
              "store ops")  # fmt: skip
    lines: list[tuple[str, ...]] = [header]
    for row in rows:
        secs = [p.seconds for p in row.points]
        has = bool(secs)
        lines.append((
            row.system, row.scenario, row.members,
            f"{len(secs)}" + (f" ({len(row.failures)} failed)" if row.failures else ""),
            f"{statistics.median(secs):.3f}" if has else "-",
            f"{br.p95(secs):.3f}" if has else "-",
            f"{_med([p.moved for p in row.points], 'g')} / "
            f"{_med([p.minimum for p in row.points], 'g')}",
            _med([u.resources for u in row.unowned], "g"),
            _med([u.resource_seconds for u in row.unowned], ".2f"),
            format(max((u.longest for u in row.unowned), default=0.0), ".3f") if has else "-",
            _med([p.imbalance for p in row.points], "g"),
            f"{sum(d[0] for d in row.double)} / {math.fsum(d[1] for d in row.double):.2f}",
            _med([p.ops for p in row.points], ".0f"),
        ))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for k, line in enumerate(lines):
        cells = [c.ljust(w) for c, w in zip(line[:3], widths[:3], strict=True)]
        cells += [c.rjust(w) for c, w in zip(line[3:], widths[3:], strict=True)]
        out.append("  ".join(cells).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--resources", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--session-timeout", type=float, default=3.0)
    parser.add_argument("--kazoo-time-boundary", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="3 members, 60 resources, 2 repeats")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.members, args.resources, args.repeats = 3, 60, 2
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or args.members < 2:
        parser.error(f"unknown systems {unknown} (known: {', '.join(SYSTEMS)}) or members < 2")
    workdir = Path(tempfile.mkdtemp(prefix="bench_peers-"))
    (zk_port,) = free_ports(1)
    zk = ZkServer(workdir / "zookeeper", zk_port)
    redis_server = RedisServer(workdir / "redis")
    rows: list[Row] = []
    try:
        zk.write_config()
        zk.start()
        zk.wait_serving()
        redis_server.start()
        zk_ops, redis_ops = Ops(ZkCounters(zk_port)), Ops(RedisCounters(redis_server.port))
        for system in systems:
            started = time.monotonic()
            print(f"measuring {system} ...", file=sys.stderr, flush=True)
            if system == "sqlite":
                url = f"sqlite://{workdir / 'groups.db'}"
                rows += run_ours(system, url, None, args, workdir / system)
            elif system == "zookeeper":
                url = f"zookeeper://127.0.0.1:{zk_port}/peers-{uuid.uuid4().hex[:8]}"
                rows += run_ours(system, url, zk_ops, args, workdir / system)
            elif system == "redis":
                rows += run_ours(system, redis_server.url(), redis_ops, args, workdir / system)
            else:
                rows += run_peer(system, zk, zk_ops, args)
            print(f"  {system}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    except (br.BenchmarkError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        redis_server.stop()
        zk.stop()
    print(table(rows))
    failures = [(r.system, r.scenario, f) for r in rows for f in r.failures]
    for system, scenario, failure in failures:
        print(f"{system} / {scenario}: {failure}")
    print(
        f"\n{args.members} members, {args.resources} resources, {args.repeats} repeats, session "
        f"timeout {args.session_timeout:g} s, kazoo time_boundary {args.kazoo_time_boundary:g} s; "
        f"ZooKeeper 3.8 standalone (tickTime 500 ms), redis-server without persistence; "
        f"Python {sys.version.split()[0]}"
    )
    if args.json:
        args.json.write_text(json.dumps([_row_json(r) for r in rows], indent=2) + "\n")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _row_json(row: Row) -> dict[str, Any]:
    return {
        "system": row.system, "scenario": row.scenario, "members": row.members,
        "seconds": [p.seconds for p in row.points], "moved": [p.moved for p in row.points],
        "minimum": [p.minimum for p in row.points], "imbalance": [p.imbalance for p in row.points],
        "store_ops": [p.ops for p in row.points],
        "unowned": [[u.resources, u.resource_seconds, u.longest] for u in row.unowned],
        "double": row.double, "failures": row.failures,
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
