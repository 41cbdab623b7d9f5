"""Member processes for tests: start, signal and read the trails of real member processes."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Collection
from pathlib import Path
from typing import Any

from rebalancer_spark.audit import AuditVerdict, verify_table
from rebalancer_spark.backends import Backend, open_backend
from rebalancer_spark.core import audit
from rebalancer_spark.core.errors import BackendError
from rebalancer_spark.core.model import GroupState
from rebalancer_spark.testing import member_process
from tests.support.helpers import wait_for

DIED = "died; it leaves the group"
"""What a member process logs when its member thread died (member/reconciler.py)."""


class MemberProcesses:
    """Starts ``rebalancer_spark.testing.member_process`` processes of one group and ends
    every one of them (by PID) at the end."""

    def __init__(
        self,
        backend_url: str,
        group: str,
        workdir: Path,
        *,
        observer_url: str | None = None,
        **options: object,
    ) -> None:
        self.url = backend_url
        self.observer_url = observer_url or backend_url
        """The URL the test itself reads the group through (e.g. with short timeouts)."""
        self.group = group
        self.workdir = workdir
        self.options = options
        self.procs: dict[str, subprocess.Popen[str]] = {}

    @property
    def audit_path(self) -> Path:
        """The Delta audit table every member process of this group appends to."""
        return self.workdir / "audit"

    def log_path(self, member_id: str) -> Path:
        return self.workdir / f"{member_id}.jsonl"

    def start(self, member_id: str, resources: list[str] | None = None) -> subprocess.Popen[str]:
        cmd = member_process.command(
            self.group,
            self.url,
            member_id,
            self.log_path(member_id),
            resources=resources,
            work_interval=0.02,
            audit=self.audit_path,
            options=self.options,
        )
        stderr = open(self.workdir / f"{member_id}.stderr", "a")  # noqa: SIM115 - owned by proc
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True)
        stderr.close()
        self.procs[member_id] = proc
        self._await_ready(member_id, proc, timeout=30)
        return proc

    def _await_ready(self, member_id: str, proc: subprocess.Popen[str], timeout: float) -> None:
        assert proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                line = proc.stdout.readline()
                if line.strip() == "ready":
                    return
                if not line:
                    break
        raise AssertionError(
            f"member {member_id} did not start within {timeout} s (exit {proc.poll()}); "
            f"stderr: {self.stderr(member_id)[-2000:]}"
        )

    def stderr(self, member_id: str) -> str:
        path = self.workdir / f"{member_id}.stderr"
        return path.read_text() if path.exists() else ""

    def signal(self, member_id: str, sig: signal.Signals) -> None:
        os.kill(self.procs[member_id].pid, sig)

    def stop(self, member_id: str, timeout: float = 30) -> int:
        """Graceful leave (SIGTERM) and wait for the exit code."""
        proc = self.procs.pop(member_id)
        proc.send_signal(signal.SIGTERM)
        return self._reap(proc, timeout)

    def kill(self, member_id: str) -> None:
        proc = self.procs.pop(member_id)
        proc.kill()
        self._reap(proc, 10)

    @staticmethod
    def _reap(proc: subprocess.Popen[str], timeout: float) -> int:
        try:
            return proc.wait(timeout)
        finally:
            if proc.stdout is not None:
                proc.stdout.close()

    def records(self, member_id: str | None = None) -> list[dict[str, Any]]:
        names = [member_id] if member_id else [p.stem for p in self.workdir.glob("*.jsonl")]
        out: list[dict[str, Any]] = []
        for name in names:
            path = self.log_path(name)
            if path.exists():
                for line in path.read_text().splitlines():
                    if line.endswith("}"):  # a line cut by kill -9 is incomplete
                        out.append(json.loads(line))
        return out

    def assert_trail_is_clean(self, *, progress_survives: bool = True) -> list[dict[str, Any]]:
        """No overlapping owners; accepted commits only ever go up; resumption from the last.

        ``progress_survives=False`` is for a store that lost its data (Redis restarted without
        persistence): committed values may start again from zero then, while owners and
        epochs must still never overlap or go back.

        A commit record carries ``started_at`` (request sent) and ``at`` (answer received): the
        store accepted it in between. A process paused while its commit was in flight logs a late
        ``at`` for a commit the store took before the pause, so order is judged by ``started_at``.
        """
        records = self.records()
        owned = [r for r in records if r["kind"] in ("acquired", "released", "lost")]
        intervals = audit.intervals(owned)
        assert audit.overlaps(intervals) == [], "two owners at once"

        # The Delta audit table the members wrote tells the same (events of a process killed
        # with -9 before its writer flushed are missing there, never wrong). Each member
        # appends on its own every 0.2 s, the first time after importing deltalake: a test that
        # ends right after the group settled may read the table before any member wrote, so
        # wait for its first events.
        def flushed() -> AuditVerdict | None:
            # The log's directory may be there a moment before its first commit file.
            if not any((self.audit_path / "_delta_log").glob("*.json")):
                return None
            verdict = verify_table(str(self.audit_path), group=self.group)
            return verdict if verdict.events > 0 else None

        verdict = wait_for(flushed, timeout=30, what="the members' first audit events")
        assert verdict is not None and verdict.ok, verdict and verdict.report()
        commits: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
        for r in records:
            if r["kind"] == "commit" and r["ok"]:
                commits[r["resource"]].append((r["started_at"], r["epoch"], r["value"]))
        for resource, accepted in commits.items():
            accepted.sort()
            values = [v for _, _, v in accepted]
            epochs = [e for _, e, _ in accepted]
            if progress_survives:
                assert values == sorted(values) and len(set(values)) == len(values), resource
            assert epochs == sorted(epochs), (
                f"{resource}: a stale epoch committed after a newer one"
            )
        # No commit that began after another member acquired the resource at a higher epoch was
        # accepted from an older epoch.
        for r in records:
            if r["kind"] == "commit" and r["ok"]:
                newer = [
                    e["at"]
                    for e in owned
                    if e["kind"] == "acquired"
                    and e["resource"] == r["resource"]
                    and e["epoch"] > r["epoch"]
                ]
                assert not newer or r["started_at"] < min(newer), f"stale commit accepted: {r}"
        return records

    def state(self) -> GroupState:
        """The group as the store has it now."""
        with open_backend(self.observer_url) as store:
            return store.state(self.group)

    def wait_stable(
        self,
        members: int,
        timeout: float = 15.0,
        *,
        resources: Collection[str] | None = None,
    ) -> GroupState:
        """Wait until ``members`` live members (not leaving) hold a stable assignment of
        ``resources`` when given. A store that is down (a fault test restarting it) counts as not
        stable yet; the handle is opened again after an error, not for every check.

        Pass ``resources`` whenever the store may lose its data: a group whose resource set is
        not restored yet is briefly "stable" with nothing to own."""
        handle: list[Backend] = []
        wanted = None if resources is None else set(resources)

        def check() -> GroupState | None:
            try:
                if not handle:
                    handle.append(open_backend(self.observer_url))
                state = handle[0].state(self.group)
            except BackendError:
                for h in handle:
                    with contextlib.suppress(BackendError):
                        h.close()
                handle.clear()
                return None
            live = [m for m in state.members.values() if not m.leaving]
            if wanted is not None and set(state.resources) != wanted:
                return None
            return state if len(live) == members and state.is_stable() else None

        what = f"a stable group of {members} members"
        if wanted is not None:
            what += f" owning {len(wanted)} resources"
        try:
            state = wait_for(check, timeout=timeout, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnosis()}") from None
        finally:
            for h in handle:
                h.close()
        assert state is not None
        return state

    def diagnosis(self, tail: int = 12) -> str:
        """What the group and its member processes looked like: the store's view, and each
        member's exit code, last trail records and stderr, for a failure message."""
        lines: list[str] = []
        in_store: set[str] | None = None
        try:
            with contextlib.closing(open_backend(self.observer_url)) as store:
                state = store.state(self.group)
            claimed = Counter(claim.member_id for claim in state.claims.values())
            lines.append(
                f"store: {len(state.resources)} resources, stable={state.is_stable()}, "
                f"members {sorted((m, info.leaving) for m, info in state.members.items())}, "
                f"claims by member {dict(claimed)}"
            )
            in_store = set(state.members)
        except BackendError as exc:
            lines.append(f"store: unreadable ({exc})")
        members = sorted({p.stem for p in self.workdir.glob("*.jsonl")} | set(self.procs))
        # A failure report is cut short: first one line per member, then the members missing
        # from the store or whose thread died in full, then the others.
        died = {m for m in members if DIED in self.stderr(m)}
        missing = set() if in_store is None else set(self.procs) - in_store
        codes = {m: "gone" if m not in self.procs else self.procs[m].poll() for m in members}
        lines += [
            f"{m}: exit {codes[m]}"
            + (" not in the store" if m in missing else "")
            + (" (its member thread died)" if m in died else "")
            for m in members
        ]
        members.sort(key=lambda m: m not in missing | died)
        for member_id in members:
            code = codes[member_id]
            records = self.records(member_id)
            others = [r for r in records if r["kind"] != "commit"]
            commits = [r for r in records if r["kind"] == "commit"]
            last = json.dumps(commits[-1])[:200] if commits else "none"
            lines.append(f"--- {member_id} (exit {code}): {len(commits)} commits, last {last}")
            lines += [json.dumps(r)[:300] for r in others[-tail:]]
            stderr = self.stderr(member_id)
            if member_id in died:  # kazoo's warnings after it would push it out of the tail
                at = stderr.rfind(DIED)
                lines.append(f"--- {member_id} thread death: {stderr[at : at + 3000]}")
            lines.append(f"--- {member_id} stderr: {stderr[-3000:]}")
        return "\n".join(lines)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            self._reap(proc, 10)
        self.procs.clear()
