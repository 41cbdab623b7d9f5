"""How fast a group of real member processes settles after a join, a graceful leave and a crash.

    python benchmarks/bench_rebalance.py                 # 4 members x 200 resources, 5 repeats
    python benchmarks/bench_rebalance.py --quick         # 3 members x 60 resources, 2 repeats
    python benchmarks/bench_rebalance.py --backend zookeeper://127.0.0.1:2181/bench

Starts ``--members`` processes of ``rebalancer_spark.testing.member_process`` in one fresh group
(on a new SQLite file in a temporary directory unless ``--backend`` is given) and measures,
``--repeats`` times each:

* **join**: from the new member's ``started`` record to the first stable state with it;
* **graceful leave**: from SIGTERM to a member to the first stable state without it;
* **crash**: from ``kill -9`` of a member to the first stable state without it, and that minus
  the session timeout (the bar is under 1 s). The store expires a lease ``session_timeout``
  after its last renewal, not after the kill, and renewals come every ``session_timeout / 5``,
  so this figure may be below zero by up to that interval.

A member that leaves or crashes is never the coordinator. After each measurement the group is
brought back to ``--members`` members and left to settle before the next one.

*Stable* is what an observer in this process sees by polling ``Backend.state`` every 5 ms:
``GroupState.is_stable()``, the expected number of live members that are not leaving, and no
claim held by any other member (so that a leaving member that still holds its old share does
not count as settled). Times are wall-clock (``time.time()``), as are the ``at`` fields of the
member logs, so both sides read the same clock on one host.

For each measurement it also prints the resources moved (``assignors.moved`` between the claims
of the stable states before and after) next to ``assignors.minimum_moves``, and the time
resources spent unowned, from the ownership events of every member log (``audit.gaps`` that
start inside the measurement): how many resources, their total unowned seconds and the longest
single gap. A killed member's ownership ends at the kill, not when the next owner starts.
Finally ``audit.overlaps`` over every log of the run gives the double ownerships found (0 is
the only right answer; it is printed, not asserted). Only the Backend contract and member
processes are used, so the same script measures every backend.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rebalancer_spark.backends import Backend, open_backend
from rebalancer_spark.backends.registry import default_store_url
from rebalancer_spark.core import audit
from rebalancer_spark.core.assignors import minimum_moves, moved
from rebalancer_spark.core.errors import BackendError, RebalancerError
from rebalancer_spark.core.model import GroupState
from rebalancer_spark.core.urls import parse_backend_url
from rebalancer_spark.testing import member_process

SRC = Path(__file__).resolve().parents[1] / "src"
POLL = 0.005
"""Seconds between two reads of the group state by the observer."""
READY_TIMEOUT = 30.0
SETTLE_TIMEOUT = 30.0
"""Longest wait for a stable state, on top of the session timeout after a crash."""
EXIT_TIMEOUT = 45.0
"""Longest wait for a member to exit after SIGTERM (its drain may take up to 30 s)."""
KILL_TIMEOUT = 10.0
OWNERSHIP_KINDS = frozenset({"acquired", "released", "lost"})


class BenchmarkError(Exception):
    """The benchmark could not make its measurement; the message says what was awaited."""


@dataclass
class MemberProc:
    """One member process, with a thread that drains its stdout and notes ``ready``."""

    member_id: str
    popen: subprocess.Popen[str]
    log: Path
    stderr: Path
    seen_ready: bool = False
    stdout_done: threading.Event = dataclasses.field(default_factory=threading.Event)

    def drain(self, stream: IO[str]) -> None:
        for line in stream:
            if line.strip() == "ready" and not self.seen_ready:
                self.seen_ready = True
                self.stdout_done.set()
        self.stdout_done.set()

    def stderr_tail(self) -> str:
        text = self.stderr.read_text(errors="replace") if self.stderr.exists() else ""
        return text[-1500:].strip() or "(empty)"


@dataclass(frozen=True)
class Measurement:
    scenario: str
    seconds: float
    moved: int
    minimum: int
    window: tuple[float, float]
    """Wall-clock start and end; gaps that start inside it belong to this measurement."""


@dataclass(frozen=True)
class GapStats:
    resources: int
    resource_seconds: float
    longest: float


class Group:
    """The member processes of one group, and an observer that reads the group's state."""

    def __init__(
        self,
        url: str,
        group: str,
        workdir: Path,
        session_timeout: float,
        *,
        work_interval: float | None = None,
    ) -> None:
        self.url = url
        self.work_interval = work_interval
        """Seconds between a member's progress commits (None: member_process's default)."""
        self.shown_url = parse_backend_url(url).redacted()
        self.group = group
        self.workdir = workdir
        self.session_timeout = session_timeout
        self.members: list[MemberProc] = []
        """Live members, oldest first."""
        self.ended: list[MemberProc] = []
        self.killed: dict[Path, float] = {}
        """Log of each member killed with -9 -> wall-clock time of the kill."""
        self.nonzero_exits: list[tuple[str, int]] = []
        self._count = 0
        self.backend: Backend = open_backend(url)
        """The observer's own connection: only ``state()`` is called on it."""

    # -- processes ----------------------------------------------------------------------------

    def spawn(self, resources: Sequence[str] | None = None) -> MemberProc:
        member_id = self.next_member_id()
        log = self.workdir / f"{member_id}.jsonl"
        cmd = member_process.command(
            self.group,
            self.url,
            member_id,
            log,
            resources=resources,
            work_interval=self.work_interval,
            options={"session_timeout": f"{self.session_timeout:g}"},
        )
        return self.launch(member_id, cmd, log)

    def next_member_id(self) -> str:
        member_id = f"m{self._count}"
        self._count += 1
        return member_id

    def launch(self, member_id: str, cmd: Sequence[str], log: Path) -> MemberProc:
        """Start ``cmd`` as a member process whose trail is ``log``; it counts as live."""
        err = self.workdir / f"{member_id}.stderr"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
        with err.open("w", encoding="utf-8") as stderr:
            popen = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                text=True,
                env=env,
            )
        member = MemberProc(member_id, popen, log, err)
        assert popen.stdout is not None
        threading.Thread(
            target=member.drain, args=(popen.stdout,), name=f"stdout-{member_id}", daemon=True
        ).start()
        self.members.append(member)
        return member

    def await_ready(self, member: MemberProc) -> None:
        if not member.stdout_done.wait(READY_TIMEOUT):
            raise BenchmarkError(
                f"member {member.member_id} did not print 'ready' within {READY_TIMEOUT:g} s "
                f"(backend {self.shown_url}); its stderr: {member.stderr_tail()}"
            )
        if not member.seen_ready:
            code = member.popen.wait(KILL_TIMEOUT)
            raise BenchmarkError(
                f"member {member.member_id} exited with {code} before printing 'ready' "
                f"(backend {self.shown_url}); its stderr: {member.stderr_tail()}"
            )

    def started_at(self, member: MemberProc) -> float:
        for record in read_records(member.log):
            if record.get("kind") == "started":
                return float(record["at"])
        raise BenchmarkError(f"member {member.member_id} wrote no 'started' record in {member.log}")

    def victim(self, state: GroupState) -> MemberProc:
        """The oldest live member that is not the coordinator."""
        coordinator = state.coordinator.member_id if state.coordinator else None
        for member in self.members:
            if member.member_id != coordinator:
                return member
        raise BenchmarkError(f"no member other than the coordinator {coordinator} to stop")

    def terminate(self, member: MemberProc) -> int:
        """SIGTERM (graceful leave) and wait for the exit code."""
        member.popen.send_signal(signal.SIGTERM)
        return self.wait_exit(member)

    def wait_exit(self, member: MemberProc) -> int:
        try:
            code = member.popen.wait(EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise BenchmarkError(
                f"member {member.member_id} did not exit within {EXIT_TIMEOUT:g} s of SIGTERM; "
                f"its stderr: {member.stderr_tail()}"
            ) from None
        self._forget(member)
        if code != 0:
            self.nonzero_exits.append((member.member_id, code))
        return code

    def kill(self, member: MemberProc) -> float:
        """``kill -9``; returns the wall-clock time of the signal."""
        at = time.time()
        member.popen.send_signal(signal.SIGKILL)
        self.killed[member.log] = at
        member.popen.wait(KILL_TIMEOUT)
        self._forget(member)
        return at

    def _forget(self, member: MemberProc) -> None:
        self.members.remove(member)
        self.ended.append(member)

    def close(self) -> None:
        """End every member still running (SIGTERM, then SIGKILL after a deadline)."""
        live = [m for m in self.members if m.popen.poll() is None]
        for member in live:
            member.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15.0
        for member in live:
            try:
                member.popen.wait(max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                print(f"member {member.member_id} ignored SIGTERM; killing it", file=sys.stderr)
                member.popen.send_signal(signal.SIGKILL)
                member.popen.wait(KILL_TIMEOUT)
        self.ended.extend(self.members)
        self.members.clear()
        self.backend.close()

    # -- observing ------------------------------------------------------------------------------

    def settled(
        self, expected: int, timeout: float, what: str, *, leaving: MemberProc | None = None
    ) -> tuple[float, GroupState]:
        """The wall-clock time of the first stable state with ``expected`` active members;
        every member but ``leaving`` must stay alive meanwhile."""
        deadline = time.monotonic() + timeout
        last: GroupState | None = None
        error: BackendError | None = None
        while True:
            try:
                state = self.backend.state(self.group)
            except BackendError as exc:
                error = exc
            else:
                seen = time.time()
                if is_settled(state, expected):
                    return seen, state
                last = state
            for member in self.members:
                code = member.popen.poll()
                if code is not None and member is not leaving:
                    raise BenchmarkError(
                        f"{what}: member {member.member_id} exited with {code} unexpectedly; "
                        f"its stderr: {member.stderr_tail()}"
                    )
            if time.monotonic() >= deadline:
                raise BenchmarkError(
                    f"{what}: no stable state with {expected} active members within "
                    f"{timeout:g} s on {self.shown_url}; last state seen: {describe(last)}"
                    + (f"; last store error: {error}" if error else "")
                    + f"; member logs in {self.workdir}"
                )
            time.sleep(POLL)


def active(state: GroupState) -> set[str]:
    return {m for m, rec in state.members.items() if not rec.leaving}


def is_settled(state: GroupState, expected: int) -> bool:
    members = active(state)
    return (
        len(members) == expected
        and state.is_stable()
        and all(c.member_id in members for c in state.claims.values())
    )


def owners(state: GroupState) -> dict[str, set[str]]:
    """Active member -> the resources it has claimed (possibly none)."""
    out: dict[str, set[str]] = {m: set() for m in active(state)}
    for claim in state.claims.values():
        out.setdefault(claim.member_id, set()).add(claim.resource)
    return out


def describe(state: GroupState | None) -> str:
    if state is None:
        return "none (the store never answered)"
    members = ", ".join(
        f"{m}{' (leaving)' if rec.leaving else ''}" for m, rec in sorted(state.members.items())
    )
    target = state.target
    off_target = 0
    if target is not None:
        want = target.owner_of()
        off_target = sum(1 for r, c in state.claims.items() if want.get(r) != c.member_id)
    return (
        f"members [{members}], coordinator "
        f"{state.coordinator.member_id if state.coordinator else None}, target generation "
        f"{target.generation if target else None} over "
        f"{sorted(target.assignment) if target else []}, {len(state.claims)} of "
        f"{len(state.resources)} resources claimed, {off_target} claims off target"
    )


def moves(before: GroupState, after: GroupState) -> tuple[int, int]:
    previous, current = owners(before), owners(after)
    weights = {r.id: r.weight for r in after.resources.values()}
    return moved(previous, current), minimum_moves(set(current), weights, previous)


# -- the scenarios ------------------------------------------------------------------------------


def measure_join(group: Group, n: int) -> Measurement:
    _, before = group.settled(n, SETTLE_TIMEOUT, "before a join")
    spawned = time.time()
    member = group.spawn()
    seen, after = group.settled(
        n + 1, READY_TIMEOUT + SETTLE_TIMEOUT, f"join of {member.member_id}"
    )
    group.await_ready(member)
    started = group.started_at(member)
    n_moved, n_min = moves(before, after)
    measurement = Measurement("join", seen - started, n_moved, n_min, (spawned, seen))
    group.terminate(member)  # back to n members
    return measurement


def measure_leave(group: Group, n: int) -> Measurement:
    _, before = group.settled(n, SETTLE_TIMEOUT, "before a graceful leave")
    member = group.victim(before)
    signalled = time.time()
    member.popen.send_signal(signal.SIGTERM)
    seen, after = group.settled(
        n - 1, SETTLE_TIMEOUT, f"graceful leave of {member.member_id}", leaving=member
    )
    group.wait_exit(member)
    n_moved, n_min = moves(before, after)
    restore(group)
    return Measurement("graceful leave", seen - signalled, n_moved, n_min, (signalled, seen))


def measure_crash(group: Group, n: int) -> Measurement:
    _, before = group.settled(n, SETTLE_TIMEOUT, "before a crash")
    member = group.victim(before)
    killed = group.kill(member)
    timeout = group.session_timeout + SETTLE_TIMEOUT
    seen, after = group.settled(n - 1, timeout, f"crash (kill -9) of {member.member_id}")
    n_moved, n_min = moves(before, after)
    restore(group)
    return Measurement("crash", seen - killed, n_moved, n_min, (killed, seen))


def restore(group: Group) -> None:
    member = group.spawn()
    group.await_ready(member)


# -- the member logs -------------------------------------------------------------------------


def read_records(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the last line of a process killed with -9 may be cut short
        if isinstance(record, dict):
            out.append(record)
    return out


Intervals = dict[str, list[audit.Interval]]


def ownership(group: Group) -> tuple[Intervals, Intervals]:
    """Intervals as the audit module infers them, and the same with every interval of a killed
    member ended at the kill (the audit can only end it when the next owner starts)."""
    return ownership_of([m.log for m in group.ended], group.killed)


def ownership_of(logs: Iterable[Path], killed: Mapping[Path, float]) -> tuple[Intervals, Intervals]:
    """:func:`ownership` over member trails ``logs``; ``killed``: trail -> time of its kill -9."""
    events: list[dict[str, Any]] = []
    killed_sessions: dict[str, float] = {}
    for log in logs:
        records = [r for r in read_records(log) if r.get("kind") in OWNERSHIP_KINDS]
        events += records
        if log in killed:
            for r in records:
                killed_sessions[str(r["session_id"])] = killed[log]
    by_resource = audit.intervals(events)
    adjusted: Intervals = {}
    for resource, items in by_resource.items():
        adjusted[resource] = [
            dataclasses.replace(item, end=kill, closed_by="killed")
            if (kill := killed_sessions.get(item.session_id)) is not None
            and item.closed_by in ("superseded", "open")
            and item.end > kill
            else item
            for item in items
        ]
    return by_resource, adjusted


def gap_stats(gaps: Iterable[audit.Gap], window: tuple[float, float]) -> GapStats:
    start, end = window
    inside = [g for g in gaps if start <= g.after.end <= end]
    return GapStats(
        len({g.resource for g in inside}),
        math.fsum(g.seconds for g in inside),
        max((g.seconds for g in inside), default=0.0),
    )


# -- the report ------------------------------------------------------------------------------


def p95(values: Sequence[float]) -> float:
    """Nearest-rank 95th percentile."""
    ordered = sorted(values)
    return ordered[max(math.ceil(0.95 * len(ordered)), 1) - 1]


def summarise(
    name: str,
    members: str,
    seconds: Sequence[float],
    found: Sequence[Measurement],
    stats: Sequence[GapStats],
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "scenario": name,
        "members": members,
        "seconds": [round(s, 4) for s in seconds],
        "median_s": statistics.median(seconds),
        "p95_s": p95(seconds),
    }
    if found:
        row |= {
            "moved": [m.moved for m in found],
            "minimum_moves": [m.minimum for m in found],
            "moved_median": statistics.median(m.moved for m in found),
            "minimum_median": statistics.median(m.minimum for m in found),
            "unowned_resources": [s.resources for s in stats],
            "unowned_resource_seconds": [round(s.resource_seconds, 4) for s in stats],
            "longest_gaps_s": [round(s.longest, 4) for s in stats],
            "unowned_resources_median": statistics.median(s.resources for s in stats),
            "unowned_resource_seconds_median": statistics.median(s.resource_seconds for s in stats),
            "longest_gap_max_s": max(s.longest for s in stats),
        }
    return row


def table(rows: Sequence[Mapping[str, Any]], scheme: str, n_resources: int) -> str:
    header = (
        "scenario",
        "backend",
        "members",
        "resources",
        "median s",
        "p95 s",
        "moved / minimum",
        "unowned res.",
        "unowned res-s",
        "longest gap s",
    )
    lines: list[tuple[str, ...]] = [header]
    for row in rows:
        has_moves = "moved_median" in row
        lines.append(
            (
                row["scenario"],
                scheme,
                row["members"],
                f"{n_resources:,}",
                f"{row['median_s']:.3f}",
                f"{row['p95_s']:.3f}",
                f"{row['moved_median']:g} / {row['minimum_median']:g}" if has_moves else "-",
                f"{row['unowned_resources_median']:g}" if has_moves else "-",
                f"{row['unowned_resource_seconds_median']:.2f}" if has_moves else "-",
                f"{row['longest_gap_max_s']:.3f}" if has_moves else "-",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for n, line in enumerate(lines):
        cells = [line[0].ljust(widths[0]), line[1].ljust(widths[1])] + [
            c.rjust(w) for c, w in zip(line[2:], widths[2:], strict=True)
        ]
        out.append("  ".join(cells))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    url = args.backend or default_store_url(str(workdir))
    n, n_resources = args.members, args.resources
    resources = [f"r{i:04d}" for i in range(n_resources)]
    group = Group(url, f"bench-{uuid.uuid4().hex[:10]}", workdir, args.session_timeout)
    found: list[Measurement] = []
    try:
        group.await_ready(group.spawn(resources))
        for _ in range(n - 1):
            group.spawn()
        for member in group.members:
            group.await_ready(member)
        for scenario in (measure_join, measure_leave, measure_crash):
            for _ in range(args.repeats):
                found.append(scenario(group, n))
        group.settled(n, SETTLE_TIMEOUT, "after the last measurement")
    finally:
        group.close()
    by_resource, adjusted = ownership(group)
    gaps = audit.gaps(adjusted)
    double = audit.overlaps(by_resource)
    rows = []
    for name, after in (("join", n + 1), ("graceful leave", n - 1), ("crash", n - 1)):
        chosen = [m for m in found if m.scenario == name]
        stats = [gap_stats(gaps, m.window) for m in chosen]
        rows.append(summarise(name, f"{n}->{after}", [m.seconds for m in chosen], chosen, stats))
    over = [m.seconds - args.session_timeout for m in found if m.scenario == "crash"]
    rows.append(summarise("crash - session timeout", f"{n}->{n - 1}", over, [], []))
    return {
        "backend": parse_backend_url(url).redacted(),
        "scheme": parse_backend_url(url).scheme,
        "members": n,
        "resources": n_resources,
        "repeats": args.repeats,
        "session_timeout_s": args.session_timeout,
        "python": sys.version.split()[0],
        "rows": rows,
        "double_ownerships": len(double),
        "double_ownership_examples": [
            {
                "resource": o.resource,
                "first": f"{o.first.member_id}@{o.first.epoch}",
                "second": f"{o.second.member_id}@{o.second.epoch}",
                "seconds": o.seconds,
            }
            for o in double[:10]
        ],
        "nonzero_exits": group.nonzero_exits,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backend", help="backend URL (default: a new SQLite file in a temp dir)")
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--resources", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5, help="measurements per scenario")
    parser.add_argument("--session-timeout", type=float, default=3.0, help="seconds")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--quick", action="store_true", help="3 members, 60 resources, 2 repeats")
    parser.add_argument("--keep", action="store_true", help="keep the member logs and the db")
    args = parser.parse_args(argv)
    if args.quick:
        args.members, args.resources, args.repeats = 3, 60, 2
    if args.members < 2 or args.resources < 1 or args.repeats < 1:
        parser.error("need --members >= 2, --resources >= 1 and --repeats >= 1")
    if args.backend:
        try:
            parse_backend_url(args.backend)
        except RebalancerError as exc:
            parser.error(str(exc))
    workdir = Path(tempfile.mkdtemp(prefix="bench_rebalance-"))
    try:
        report = run(args, workdir)
    except (BenchmarkError, RebalancerError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        if any(workdir.glob("*.jsonl")):
            print(f"member logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
        return 1
    print(table(report["rows"], report["scheme"], report["resources"]))
    print(
        f"\ndouble ownerships found: {report['double_ownerships']} "
        f"(audit.overlaps over every member log of the run)"
    )
    if report["nonzero_exits"]:
        print(f"members that exited non-zero after SIGTERM: {report['nonzero_exits']}")
    print(
        f"{args.repeats} repeats per scenario, session timeout {args.session_timeout:g} s, "
        f"backend {report['backend']}, Python {report['python']}"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.keep:
        print(f"member logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
