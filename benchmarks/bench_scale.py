"""How the cost of a rebalance grows with the resources and the members, on every backend.

    python benchmarks/bench_scale.py            # 1,000 and 10,000 x 4 and 16, every backend
    python benchmarks/bench_scale.py --quick    # 1,000 x 4, one repeat, every backend
    python benchmarks/bench_scale.py --backends sqlite --resources 100000 --members 16 \
        --cell-limit 1800
    python benchmarks/bench_scale.py --backend redis://127.0.0.1:6379/0 --backends redis

For each backend (``sqlite``: a new file per cell in a temporary directory; ``zookeeper`` and
``redis``: a server that this script starts on a free port the way ``tests/servers`` do, unless
``--backend URL`` names one) and each cell, resources x members, it starts the members, waits
for the first complete assignment, then measures ``--repeats`` times each: a join, a graceful
leave (SIGTERM: drain) and a crash (``kill -9``), each to the next stable assignment.

Members: up to 16, each a process of ``rebalancer_spark.testing.member_process`` (the first
through ``benchmarks/member_host.py one``, which hands it the resource list from a file: 100,000
ids do not fit in one command-line argument); beyond 16, all but two are threads of
``member_host.py threads`` processes of at most 25 threads each (``--host-threads``), and the
member that leaves or crashes and the one that joins are processes (two processes, so that one
of them is not the coordinator whichever member holds the role). The table says which
(``p``/``t``). Members commit no progress (as in ``bench_peers.py``): the store operations
counted are the rebalance's own, lease renewals and pings included.

*Stable* is read from the members' own trails, not from the store (its reads would be counted
and, at 100,000 resources, would load the machine): every resource owned by exactly one of the
expected members and their counts within one of each other, timed to the trail event that
completed it; the store's own view (``bench_rebalance.is_settled``) is checked before each
measurement, outside its window. A join is timed from the new member's ``started`` record (after
its join write), a leave from SIGTERM, a crash from ``kill -9``; ``crash - session timeout``
subtracts ``--session-timeout`` as ``bench_rebalance.py`` does. The first complete assignment is
timed from the start of the first member process. With threads, the host whose first member
declares the resources starts last, once every other member joined: the first target with
resources then covers the whole group, as when a group of jobs starts before its source is
listed.

During the first assignment, ``store_probe.py`` (a process of its own) reads the group's
control record every 50 ms and the cell's last line gives the longest, 99th percentile and
median time of those small reads, failed ones included: how long the store kept a member
waiting while the group started (75 followers reading a new set of 100,000 at once kept a
Redis server past its 5 s command timeout in session 27). The probe waits for a core like any
member on this 2-core machine: the median says how loaded it was.

Per measurement also: resources moved next to ``assignors.minimum_moves``; resources without an
owner inside the window (count, longest gap, from the trails' ownership intervals, a killed
member's ending at the kill); store operations and bytes in the window (``store_counters.py``
says what each server counts and what SQLite cannot); member CPU seconds in the window (utime +
stime from /proc of every member process alive at its end: the threads' host included, the
member that left or crashed not). Per cell: the store's size once assigned, and double
ownerships over every trail of the cell (0 is the only right answer; printed, not asserted).

A cell that does not finish within ``--cell-limit`` seconds prints ``did not settle within N s``
with the step it was at, and the run goes on with the next cell. The trails and the store of a
cell that did not finish, moved more than the minimum or saw a double ownership are kept (the
last line names the directory and why), the others removed unless ``--keep``. Each cell's
table goes to stderr as soon as it ends (and ``--json`` is rewritten), the tables per backend
to stdout at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.servers: the servers
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tests.servers.redis import RedisServer
from tests.servers.zookeeper import SERVER_JVM, ZkServer, free_ports

import bench_rebalance as br
from rebalancer_spark.core import audit
from rebalancer_spark.core.assignors import minimum_moves, moved
from rebalancer_spark.core.errors import RebalancerError
from rebalancer_spark.core.model import GroupState
from rebalancer_spark.testing import member_process
from scale_report import Cell, Point, cell_json, table
from store_counters import (
    CounterError,
    RedisCounters,
    SqliteCounters,
    StoreCounters,
    ZkCounters,
)

BACKENDS = ("sqlite", "zookeeper", "redis")
PROCESS_LIMIT = 16
"""Up to this many members, each is a process; beyond it, threads of host processes."""

HOST_THREADS = 25
"""The most member threads one host process runs: 99 threads of one process (one interpreter
lock, 200 connections) left ZooKeeper renewals unanswered for 10 s at 100,000 resources."""
QUIET = 3600.0
"""Seconds between progress commits of a member: none during a run."""
HOST = Path(__file__).resolve().parent / "member_host.py"
PROBE = Path(__file__).resolve().parent / "store_probe.py"
TRAIL_POLL = 0.05
"""Seconds between two reads of the trails. The times measured are the trails' own event
times, so this sets how soon the harness notices, not what it measures; reading 100 trails
every 20 ms (each opened and closed) took a tenth of a core of this 2-core machine during a
100,000 x 100 join, away from the members measured (session 22)."""
STORE_POLL = 0.05
TRAIL_KIND = re.compile(rb'"kind": "([a-z]+)"')
"""A trail line's kind: its first match. Keys are sorted (``member_process.event_line``,
``handed_line``) and only numbers and strings come before ``kind``, where a quote is escaped,
so nothing can look like the key before it: a ``handed`` line's progress (after its kind,
and not escaped: a JSON value) may hold ``"kind": "acquired"``, which a search for the
ownership kinds alone would find (``tests/test_bench_scale_trail.py``)."""
OWNERSHIP_KINDS = frozenset({b"acquired", b"released", b"lost"})
TRAIL_AT = re.compile(rb'"at": ([-+.0-9eE]+)')
"""The first key of every trail line."""
TRAIL_RESOURCE = re.compile(rb'"resource": ("(?:[^"\\]|\\.)*")')
"""An event line's resource: only numbers and escaped strings come before it."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class CellTimeout(Exception):
    """The cell ran past its limit; the message says at which step."""


class TrailFile:
    """A member's JSON-lines trail, read incrementally: what it owns now, per its events."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: BinaryIO | None = None
        """Kept open once it exists: each poll reads what was appended since."""
        self.tail = b""
        self.owned: set[str] = set()
        self.last = 0.0
        """Wall-clock time of its latest ownership event."""

    def poll(self) -> None:
        if self.file is None:
            try:
                self.file = self.path.open("rb")
            except FileNotFoundError:
                return
        data = self.file.read()
        if not data:
            return
        lines = (self.tail + data).split(b"\n")
        self.tail = lines.pop()
        for line in lines:
            # Only the ownership lines, and of them only three fields: a join's 6,000
            # "handed" lines and the other fields of the 12,000 events took the json module
            # 0.1-0.2 s of this process's CPU, on the cores the members were measured on.
            kind = TRAIL_KIND.search(line)
            if kind is None or kind[1] not in OWNERSHIP_KINDS:
                continue
            at, resource = TRAIL_AT.search(line), TRAIL_RESOURCE.search(line)
            if at is None or resource is None:
                continue  # not a complete trail line
            rid = resource[1]
            text = json.loads(rid) if b"\\" in rid else rid[1:-1].decode("ascii")
            if kind[1] == b"acquired":
                self.owned.add(text)
            else:
                self.owned.discard(text)
            self.last = max(self.last, float(at[1]))

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class Run:
    """One cell: its members, their trails, and the measurements."""

    def __init__(
        self,
        url: str,
        counters: StoreCounters | None,
        cell: Cell,
        args: argparse.Namespace,
        workdir: Path,
    ) -> None:
        self.url = url
        self.counters = counters
        self.cell = cell
        self.ttl: float = args.session_timeout
        self.limit: float = args.cell_limit
        self.host_threads: int = args.host_threads
        self.deadline = time.monotonic() + self.limit
        self.step = "start"
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.group = br.Group(
            url, f"scale-{uuid.uuid4().hex[:8]}", workdir, self.ttl, work_interval=QUIET
        )
        self.ids = [f"r{i:06d}" for i in range(cell.resources)]
        self.wanted = set(self.ids)
        self.resources_file = workdir / "resources.txt"
        self.resources_file.write_text("\n".join(self.ids) + "\n", encoding="utf-8")
        self.trails: dict[str, TrailFile] = {}
        self.live: list[str] = []
        """Member ids expected in the next stable state, oldest first."""
        self.proc: dict[str, br.MemberProc] = {}
        """Member id -> the process it runs in (the host, for threads)."""
        self.probe: subprocess.Popen[bytes] | None = None
        """``store_probe.py``, while the first assignment is under way."""

    # -- time ---------------------------------------------------------------------------------

    def remaining(self) -> float:
        left: float = self.deadline - time.monotonic()
        if left <= 0:
            raise CellTimeout(f"did not settle within {self.limit:g} s (at: {self.step})")
        return left

    # -- members ------------------------------------------------------------------------------

    def spawn(self, *, first: bool = False) -> str:
        member_id = self.group.next_member_id()
        log = self.workdir / f"{member_id}.jsonl"
        cmd = member_process.command(
            self.group.group,
            self.url,
            member_id,
            log,
            work_interval=QUIET,
            options={"session_timeout": f"{self.ttl:g}"},
        )
        if first:  # [python, -m, module, args...] -> the host hands it the resource list
            cmd = [sys.executable, str(HOST), "one", "--resources-file",
                   str(self.resources_file), "--", *cmd[3:]]  # fmt: skip
        self.proc[member_id] = self.group.launch(member_id, cmd, log)
        self.trails[member_id] = TrailFile(log)
        self.live.append(member_id)
        return member_id

    def spawn_threads(self, count: int, *, first: bool) -> br.MemberProc:
        """A host process of ``count`` member threads; the first host declares the resources."""
        ids = [self.group.next_member_id() for _ in range(count)]
        name = f"host-{ids[0]}"
        cmd = [
            sys.executable, str(HOST), "threads", "--group", self.group.group,
            "--backend", self.url, "--members", ",".join(ids), "--log-dir", str(self.workdir),
            "--option", f"session_timeout={self.ttl:g}",
        ]  # fmt: skip
        if first:
            cmd += ["--resources-file", str(self.resources_file)]
        host = self.group.launch(name, cmd, self.workdir / f"{name}.jsonl")
        for member_id in ids:
            self.proc[member_id] = host
            self.trails[member_id] = TrailFile(self.workdir / f"{member_id}.jsonl")
            self.live.append(member_id)
        return host

    def start_probe(self) -> None:
        """Time a small read of the store every 50 ms until :meth:`stop_probe`."""
        out = self.workdir / "probe.json"
        cmd = [sys.executable, str(PROBE), self.url, self.group.group, str(out)]
        self.probe = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)

    def stop_probe(self) -> dict[str, float | int | None]:
        """Stop the probe; its figures (empty if it was not running or wrote none)."""
        probe, self.probe = self.probe, None
        if probe is None:
            return {}
        probe.terminate()
        try:
            probe.wait(timeout=30)
        except subprocess.TimeoutExpired:
            probe.kill()
            probe.wait()
            return {}
        out = self.workdir / "probe.json"
        return json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}

    def await_ready(self, proc: br.MemberProc) -> None:
        while not proc.stdout_done.wait(min(self.remaining(), 1.0)):
            pass
        if not proc.seen_ready:
            code = proc.popen.wait(br.KILL_TIMEOUT)
            raise br.BenchmarkError(
                f"member {proc.member_id} exited with {code} before printing 'ready'; "
                f"its stderr: {proc.stderr_tail()}"
            )

    def victim(self, state: GroupState) -> str:
        """The oldest live member that is a process of its own and not the coordinator."""
        coordinator = state.coordinator.member_id if state.coordinator else None
        for member_id in self.live:
            if self.proc[member_id].member_id == member_id and member_id != coordinator:
                return member_id
        raise br.BenchmarkError(f"no process member other than the coordinator {coordinator}")

    def cpu(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for proc in self.group.members:
            seconds = cpu_seconds(proc.popen.pid)
            if seconds is not None:
                out[proc.popen.pid] = seconds
        return out

    # -- observing ------------------------------------------------------------------------------

    def settled(
        self, what: str, leaving: br.MemberProc | None = None
    ) -> tuple[float, dict[str, set[str]]]:
        """Wait until the trails of the live members show a complete, single-owner split
        balanced within one; the time of the event that completed it, and who owns what."""
        self.step = what
        total = len(self.wanted)
        while True:
            trails = [self.trails[m] for m in self.live]
            for trail in trails:
                trail.poll()
            sizes = [len(t.owned) for t in trails]
            if (
                sum(sizes) == total
                and max(sizes) - min(sizes) <= 1
                and set().union(*(t.owned for t in trails)) == self.wanted
            ):
                return max(t.last for t in trails), {
                    m: set(self.trails[m].owned) for m in self.live
                }
            for proc in self.group.members:
                code = proc.popen.poll()
                if code is not None and proc is not leaving:
                    raise br.BenchmarkError(
                        f"{what}: member {proc.member_id} exited with {code} unexpectedly; "
                        f"its stderr: {proc.stderr_tail()}"
                    )
            time.sleep(min(TRAIL_POLL, self.remaining()))

    def store_settled(self, what: str) -> GroupState:
        """The store's own view agrees: stable, with the live members and no stray claim."""
        self.step = what
        last: str = "no answer"
        while True:
            try:
                state = self.group.backend.state(self.group.group)
            except RebalancerError as exc:
                last = str(exc)
            else:
                if br.is_settled(state, len(self.live)):
                    return state
                last = br.describe(state)[:300]
            if self.remaining() <= STORE_POLL:
                raise CellTimeout(
                    f"did not settle within {self.limit:g} s (at: {what}; store: {last})"
                )
            time.sleep(STORE_POLL)

    # -- measurements -------------------------------------------------------------------------

    def measure(
        self, scenario: str, act: Callable[[GroupState], tuple[float, br.MemberProc | None]]
    ) -> br.MemberProc | None:
        _, before = self.settled(f"before {scenario}")
        state = self.store_settled(f"store stable before {scenario}")
        snap = self.counters.snapshot() if self.counters else None
        cpu0 = self.cpu()
        start, proc = act(state)
        leaving = proc if scenario == "graceful leave" else None
        seen, after = self.settled(scenario, leaving)
        if scenario == "join":
            assert proc is not None
            self.await_ready(proc)
            start = self.group.started_at(proc)
        figures = self.counters.delta(snap, self.counters.snapshot()) if self.counters else {}
        cpu1 = self.cpu()
        cpu = math.fsum(v - cpu0.get(pid, 0.0) for pid, v in cpu1.items())
        weights = dict.fromkeys(self.ids, 1.0)
        self.cell.points.append(
            Point(scenario, seen - start, moved(before, after),
                  minimum_moves(set(after), weights, before), (start, seen), figures, cpu)
        )  # fmt: skip
        return proc

    def join(self, state: GroupState) -> tuple[float, br.MemberProc | None]:
        member_id = self.spawn()
        return time.time(), self.proc[member_id]

    def leave(self, state: GroupState) -> tuple[float, br.MemberProc | None]:
        member_id = self.victim(state)
        proc = self.proc[member_id]
        at = time.time()
        proc.popen.send_signal(signal.SIGTERM)
        self.live.remove(member_id)
        return at, proc

    def crash(self, state: GroupState) -> tuple[float, br.MemberProc | None]:
        member_id = self.victim(state)
        proc = self.proc[member_id]
        self.live.remove(member_id)
        return self.group.kill(proc), None

    def restore(self) -> None:
        self.step = "restore a member"
        self.await_ready(self.proc[self.spawn()])

    def run(self, repeats: int) -> None:
        n = self.cell.members
        snap = self.counters.snapshot() if self.counters else None
        size0 = self.counters.size(self.group.group) if self.counters else {}
        started = time.time()
        self.start_probe()
        if self.cell.threads:
            per = self.host_threads
            sizes = [per] * (self.cell.threads // per)
            sizes += [self.cell.threads % per] if self.cell.threads % per else []
            # The host that declares the resources starts once every other member joined, so
            # that the first target with resources covers the group: a first host awaited
            # alone got the whole set while the others were starting (session 18's collapsed
            # ZooKeeper 100,000 x 100 starts had first targets of 17 to 55 members). This alone
            # did not end the collapses; the followers' reads of the whole set were what starved
            # the lease renewals (docs/benchmarks.md, session 19).
            procs = [self.spawn_threads(size, first=False) for size in sizes[1:]]
            procs += [self.proc[self.spawn()] for _ in range(n - self.cell.threads)]
            for proc in procs:
                self.await_ready(proc)
            procs = [self.spawn_threads(sizes[0], first=True)]
        else:
            self.await_ready(self.proc[self.spawn(first=True)])
            procs = [self.proc[self.spawn()] for _ in range(n - 1)]
        for proc in procs:
            self.await_ready(proc)
        seen, _ = self.settled("first complete assignment")
        self.cell.first_assignment = seen - started
        self.cell.first_probe = self.stop_probe()
        if self.counters:
            self.cell.first_store = self.counters.delta(snap, self.counters.snapshot())
            size1 = self.counters.size(self.group.group)
            # A ZooKeeper server's figures are server-wide (earlier cells' groups included).
            base = size0 if isinstance(self.counters, ZkCounters) else {}
            self.cell.size = {k: v - (base.get(k) or 0.0) if v is not None else None
                              for k, v in size1.items()}  # fmt: skip
        for _ in range(repeats):
            joined = self.measure("join", self.join)
            assert joined is not None
            self.step = "the joined member leaves"
            self.live.remove(joined.member_id)
            self.group.terminate(joined)
            left = self.measure("graceful leave", self.leave)
            assert left is not None
            self.group.wait_exit(left)
            self.restore()
            self.measure("crash", self.crash)
            self.restore()
        self.settled("after the last measurement")

    def finish(self) -> None:
        """Stop every member; then the unowned figures and double ownerships from the trails."""
        if self.probe is not None:  # the start-up failed: what the store's answers were
            self.cell.first_probe = self.stop_probe()
        self.group.close()
        for trail in self.trails.values():
            trail.close()
        logs = [t.path for t in self.trails.values()]
        by_resource, adjusted = br.ownership_of(logs, self.group.killed)
        gaps = audit.gaps(adjusted)
        for point in self.cell.points:
            point.unowned = br.gap_stats(gaps, point.window)
        self.cell.double = len(audit.overlaps(by_resource))


# -- backends and servers ------------------------------------------------------------------------


def counters_for(url: str) -> StoreCounters | None:
    """Counters for a store given by URL, when it is on this host (else None: not counted)."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return None  # per cell: SqliteCounters on the cell's own file
    host = parts.netloc.rsplit("@", 1)[-1].split(",")[0]
    name, _, port = host.partition(":")
    if name not in ("127.0.0.1", "localhost"):
        return None
    if parts.scheme == "zookeeper":
        return ZkCounters(int(port or 2181))
    if parts.scheme == "redis":
        db = int(parts.path.strip("/") or 0)
        return RedisCounters(int(port or 6379), name, db)
    return None


class Servers:
    """The ZooKeeper and Redis servers this run starts (only those it needs)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.zk: ZkServer | None = None
        self.redis: RedisServer | None = None

    def url(self, backend: str) -> str:
        if backend == "zookeeper":
            if self.zk is None:
                (port,) = free_ports(1)
                self.zk = ZkServer(self.workdir / "zookeeper", port, jvm=SERVER_JVM)
                self.zk.write_config()
                self.zk.start()
                self.zk.wait_serving()
            return f"zookeeper://127.0.0.1:{self.zk.port}/scale-{uuid.uuid4().hex[:8]}"
        if self.redis is None:
            self.redis = RedisServer(self.workdir / "redis")
            self.redis.start()
        return self.redis.url()

    def close(self) -> None:
        if self.redis is not None:
            self.redis.stop()
        if self.zk is not None:
            self.zk.stop()


def run_cell(
    backend: str, base_url: str | None, servers: Servers, resources: int, members: int,
    args: argparse.Namespace, workdir: Path,
) -> Cell:  # fmt: skip
    # Two process members: the leave and the crash need one that is not the coordinator.
    threads = members - 2 if members > PROCESS_LIMIT else 0
    cell = Cell(backend, resources, members, threads)
    celldir = workdir / f"{backend}-{resources}x{members}"
    if backend == "sqlite":
        db = celldir / "groups.db"
        url = base_url or f"sqlite://{db}"
        counters: StoreCounters | None = SqliteCounters(Path(urlsplit(url).path))
    else:
        url = base_url or servers.url(backend)
        counters = counters_for(url)
    run = Run(url, counters, cell, args, celldir)
    try:
        run.run(args.repeats)
    except CellTimeout as exc:
        cell.failure = str(exc)
    except (br.BenchmarkError, RebalancerError, CounterError, subprocess.TimeoutExpired) as exc:
        text = str(exc)
        cell.failure = f"failed: {text if len(text) < 600 else text[:200] + ' … ' + text[-400:]}"
    finally:
        run.finish()
    return cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated subset")
    parser.add_argument("--backend", action="append", default=[], metavar="URL",
                        help="use this store for its scheme instead of starting one")  # fmt: skip
    parser.add_argument("--resources", default="1000,10000", help="comma-separated counts")
    parser.add_argument("--members", default="4,16", help="comma-separated counts (>= 2)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per scenario")
    parser.add_argument("--session-timeout", type=float, default=10.0, help="seconds")
    parser.add_argument("--cell-limit", type=float, default=600.0, help="seconds per cell")
    parser.add_argument("--quick", action="store_true", help="1,000 x 4, one repeat")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--keep", action="store_true", help="keep the trails and the stores")
    parser.add_argument("--host-threads", type=int, default=HOST_THREADS,
                        help="most member threads per host process")  # fmt: skip
    args = parser.parse_args(argv)
    if args.quick:
        args.resources, args.members, args.repeats = "1000", "4", 1
    try:
        sizes = [int(s) for s in args.resources.split(",") if s.strip()]
        counts = [int(s) for s in args.members.split(",") if s.strip()]
    except ValueError:
        parser.error("--resources and --members take comma-separated whole numbers")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown or min(counts) < 2 or min(sizes) < 1 or args.repeats < 1 or args.host_threads < 1:
        parser.error(f"unknown backends {unknown} (known: {', '.join(BACKENDS)}), or "
                     "members < 2, resources < 1, repeats < 1 or host threads < 1")  # fmt: skip
    given = {urlsplit(u).scheme.replace("rediss", "redis"): u for u in args.backend}
    workdir = Path(tempfile.mkdtemp(prefix="bench_scale-"))
    servers = Servers(workdir)
    cells: list[Cell] = []
    try:
        for backend in backends:
            for resources in sizes:
                for members in counts:
                    began = time.monotonic()
                    print(f"{backend} {resources:,} x {members} ...", file=sys.stderr, flush=True)
                    cell = run_cell(backend, given.get(backend), servers, resources, members,
                                    args, workdir)  # fmt: skip
                    cells.append(cell)
                    took = time.monotonic() - began
                    # Each cell's figures as soon as it ends, in case a later cell never does.
                    print(f"  {took:.0f} s\n{table([cell], args.session_timeout)}",
                          file=sys.stderr, flush=True)  # fmt: skip
                    if args.json:
                        args.json.write_text(json.dumps([cell_json(c) for c in cells], indent=2))
    finally:
        servers.close()
    for backend in backends:
        print(f"\n{backend}")
        print(table([c for c in cells if c.backend == backend], args.session_timeout))
    print(
        f"\n{args.repeats} repeats, session timeout {args.session_timeout:g} s, cell limit "
        f"{args.cell_limit:g} s; members: p = processes, Nt = threads of host processes "
        f"of at most {args.host_threads} each; "
        f"store ops = ZooKeeper packets received / Redis commands (Lua's inner calls included), "
        f"bytes in/out at the server, pages = SQLite pages and log frames changed; servers "
        f"started here: ZooKeeper 3.8 standalone (tickTime 500 ms), redis-server without "
        f"persistence; Python {sys.version.split()[0]}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    if args.keep:
        print(f"trails and stores kept in {workdir}")
        return 0
    kept = []
    for cell in cells:
        celldir = workdir / f"{cell.backend}-{cell.resources}x{cell.members}"
        why = cell.anomalous
        if why is None:
            shutil.rmtree(celldir, ignore_errors=True)
        else:
            kept.append(f"{celldir} ({why})")
    if kept:
        # What went wrong is in the members' own trails: keep them for a look.
        print("trails and stores kept, for a look: " + "; ".join(kept))
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
