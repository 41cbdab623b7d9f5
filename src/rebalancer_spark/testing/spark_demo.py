"""Several concurrent ``spark-submit`` jobs in one group: the README's demo and the slow test.

:func:`run_demo` generates a landing directory (one sub-directory per resource, CSV files in
each), starts N ``spark-submit jobs/ingest_files.py`` applications in one group on a backend
(the embedded SQLite file by default), shows the split, kills one driver with ``kill -9`` in
the middle of the work, shows the take-over, waits until every file is committed, stops the
others gracefully, and then proves the result: the ownership history and the verifier's verdict
from the Delta audit table, and a check that every input row and file landed exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from rebalancer_spark.audit.output_check import verify_output
from rebalancer_spark.backends import Backend, open_backend
from rebalancer_spark.core.model import GroupState
from rebalancer_spark.sources import FileSource, open_source
from rebalancer_spark.spark.packages import spark_submit_command

__all__ = ["DemoReport", "run_demo"]

T = TypeVar("T")
SCHEMA = "id STRING, value INT"


@dataclass(slots=True)
class DemoReport:
    """What the demo saw and proved."""

    files: int = 0
    rows: int = 0
    split: dict[str, list[str]] = field(default_factory=dict)
    killed: str = ""
    killed_resources: list[str] = field(default_factory=list)
    takeover_seconds: float = 0.0
    split_after: dict[str, list[str]] = field(default_factory=dict)
    duplicate_rows: int = 0
    missing_rows: int = 0
    files_in_several_batches: int = 0
    files_missing: int = 0
    audit_ok: bool = False
    audit_report: str = ""
    history: list[str] = field(default_factory=list)
    exit_codes: dict[str, int] = field(default_factory=dict)

    @property
    def exactly_once(self) -> bool:
        return not (
            self.duplicate_rows
            or self.missing_rows
            or self.files_in_several_batches
            or self.files_missing
        )


def _wait(check: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)  # polling a store from outside the group, between checks


def generate_landing(root: Path, dirs: int, files: int, rows: int) -> set[str]:
    """``root/dir-NN/part-NNN.csv`` files of ``id,value`` rows; returns every id."""
    ids: set[str] = set()
    for d in range(dirs):
        folder = root / f"dir-{d:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        for f in range(files):
            lines = []
            for r in range(rows):
                ident = f"{d:02d}-{f:03d}-{r:04d}"
                ids.add(ident)
                lines.append(f"{ident},{r}")
            (folder / f"part-{f:03d}.csv").write_text("\n".join(lines) + "\n")
    return ids


class _Job:
    """One spark-submit application of the group."""

    def __init__(self, name: str, cmd: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _split(state: GroupState) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {m: [] for m in state.members}
    for resource, claim in sorted(state.claims.items()):
        out.setdefault(claim.member_id, []).append(resource)
    return out


def run_demo(
    workdir: Path,
    *,
    jobs: int = 3,
    dirs: int = 12,
    files: int = 8,
    rows: int = 50,
    backend: str | None = None,
    session_timeout: float = 6.0,
    master: str = "local[1]",
    say: Callable[[str], None] = print,
    timeout: float = 600.0,
) -> DemoReport:
    """Run the scenario in ``workdir`` (created fresh); see the module docstring."""
    report = DemoReport()
    workdir.mkdir(parents=True, exist_ok=True)
    landing = workdir / "landing"
    (workdir / "logs").mkdir(exist_ok=True)
    backend = backend or f"sqlite://{workdir.resolve()}/groups.db"
    ids = generate_landing(landing, dirs, files, rows)
    report.files, report.rows = dirs * files, len(ids)
    say(f"generated {dirs} directories x {files} files x {rows} rows in {landing}")
    demo = _Demo(workdir, backend, report, say, timeout)
    try:
        demo.start_jobs(jobs, session_timeout, master)
        demo.kill_one(jobs, session_timeout)
        demo.finish()
    finally:
        demo.close()
    _judge(report, workdir, ids, say)
    return report


class _Demo:
    """The running jobs of the scenario and the store they share."""

    group = "demo"

    def __init__(
        self,
        workdir: Path,
        backend: str,
        report: DemoReport,
        say: Callable[[str], None],
        timeout: float,
    ) -> None:
        self.workdir = workdir
        self.backend = backend
        self.report = report
        self.say = say
        self.timeout = timeout
        self.running: dict[str, _Job] = {}
        self.source_url = (workdir / "landing").resolve().as_uri() + "/"
        self.store = open_backend(backend)

    def start_jobs(self, jobs: int, session_timeout: float, master: str) -> None:
        repo = Path(__file__).resolve().parents[3]
        env = {
            **os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable
        }  # fmt: skip
        for i in range(1, jobs + 1):
            name = f"job-{i}"
            cmd = spark_submit_command(
                repo / "jobs" / "ingest_files.py",
                "--group", self.group, "--backend", self.backend, "--member-id", name,
                "--source", self.source_url, "--output", str(self.workdir / "output"),
                "--audit", str(self.workdir / "audit"), "--schema", SCHEMA,
                "--max-files-per-batch", "2", "--poll-interval", "0.5s",
                "--discovery-interval", "5s",
                master=master,
                conf={
                    "spark.ui.enabled": "false", "spark.driver.memory": "512m",
                    "spark.cores.max": "1", "spark.executor.memory": "512m",
                    "spark.rebalancer.session-timeout": f"{session_timeout}s",
                    # Spark's scratch space (a copy of every jar) in the demo's directory: the
                    # job the demo kills never removes its own.
                    "spark.local.dir": str(self.workdir.resolve() / "spark-local"),
                },
            )  # fmt: skip
            self.running[name] = _Job(name, cmd, self.workdir / "logs" / f"{name}.log", env)
            self.say(f"started {name}: spark-submit jobs/ingest_files.py --group {self.group} ...")
        state = _wait(
            lambda: self.live(jobs), self.timeout, f"{jobs} jobs to join and split the work"
        )
        self.report.split = _split(state)
        self.say(f"\nthe split ({len(state.resources)} directories, {jobs} jobs):")
        for member, resources in sorted(self.report.split.items()):
            self.say(f"  {member}: {', '.join(resources)}")

    def live(self, count: int) -> GroupState | None:
        """The group once ``count`` jobs are in it and it is stable; a job that exited fails."""
        for job in self.running.values():
            if job.proc.poll() is not None:
                raise RuntimeError(f"{job.name} exited with {job.proc.returncode}:\n{job.tail()}")
        state = self.store.state(self.group)
        active = [m for m in state.members.values() if not m.leaving]
        return state if len(active) == count and state.is_stable() else None

    def kill_one(self, jobs: int, session_timeout: float) -> None:
        """kill -9 a job's driver once it committed some batches; time the others' takeover."""
        report, victim = self.report, f"job-{min(2, jobs)}"
        _wait(
            lambda: _committed_batches(self.store, self.group, victim) >= 2,
            self.timeout,
            f"{victim} to commit some batches",
        )
        report.killed = victim
        report.killed_resources = report.split.get(victim, [])
        pid = int(self.store.state(self.group).members[victim].info["pid"])
        os.kill(pid, signal.SIGKILL)  # the Python driver, where the member lives
        killed_at = time.monotonic()
        victim_job = self.running.pop(victim)
        victim_job.proc.kill()  # and its spark-submit JVM
        victim_job.proc.wait(60)
        self.say(
            f"\nkill -9 {victim} (driver pid {pid}), which owned "
            f"{len(report.killed_resources)} directories"
        )
        state = _wait(lambda: self.live(jobs - 1), self.timeout, "the others to take over")
        report.takeover_seconds = time.monotonic() - killed_at
        report.split_after = _split(state)
        self.say(
            f"taken over in {report.takeover_seconds:.1f} s (session timeout "
            f"{session_timeout:g} s):"
        )
        for member, resources in sorted(report.split_after.items()):
            self.say(f"  {member}: {', '.join(resources)}")

    def finish(self) -> None:
        """Wait until every file is committed, then stop the jobs gracefully."""
        source = open_source(self.source_url)
        assert isinstance(source, FileSource)
        _wait(
            lambda: _all_committed(self.store, self.group, source),
            self.timeout,
            "every file to be committed",
        )
        self.say("\nevery file committed; stopping the jobs gracefully (SIGTERM)")
        for name, job in self.running.items():
            record = self.store.state(self.group).members.get(name)
            if record is not None:
                os.kill(int(record.info["pid"]), signal.SIGTERM)
            self.report.exit_codes[name] = job.proc.wait(timeout=120)
        self.running.clear()

    def close(self) -> None:
        for job in self.running.values():
            job.proc.kill()
            job.proc.wait(30)
        self.store.close()


def _judge(report: DemoReport, workdir: Path, ids: set[str], say: Callable[[str], None]) -> None:
    """Read the audit and output tables: the history, both verdicts, exactly once."""
    from rebalancer_spark.audit import history, load_events, verify_events

    audit, output = workdir / "audit", workdir / "output"
    events = load_events(str(audit), group=_Demo.group)
    report.history = history(events)
    verdict = verify_events(events)
    checked = verify_output(str(audit), str(output), group=_Demo.group)
    report.audit_ok = verdict.ok and checked.ok
    report.audit_report = f"{verdict.report()}\n{checked.report()}"
    _check_output(report, output, ids, workdir / "landing")
    say("\nownership history (Delta audit table):")
    for line in report.history:
        say(f"  {line}")
    say(f"\n{report.audit_report}")
    say(
        f"\nexactly once: {report.rows} rows in, duplicates {report.duplicate_rows}, missing "
        f"{report.missing_rows}; {report.files} files in, in several batches "
        f"{report.files_in_several_batches}, missing {report.files_missing} -> "
        f"{'OK' if report.exactly_once else 'FAILED'}"
    )


def _committed_batches(store: Backend, group: str, member: str) -> int:
    state = store.state(group)
    mine = [r for r, c in state.claims.items() if c.member_id == member]
    progress = store.progress(group, mine)
    return sum(int(p.value.get("next", 1)) - 1 for p in progress.values() if p.value)


def _all_committed(store: Backend, group: str, source: FileSource) -> bool:
    resources = [r.id for r in source.discover()]
    progress = store.progress(group, resources)
    for resource in resources:
        value = progress[resource].value if resource in progress else None
        if not value or value.get("batch") is not None:
            return False
        if value.get("files") != len(source.files(resource)):
            return False
    return True


def _check_output(report: DemoReport, output: Path, ids: set[str], landing: Path) -> None:
    from deltalake import DeltaTable

    table = DeltaTable(str(output)).to_pyarrow_table(columns=["id", "_file", "_resource", "_batch"])
    got = Counter(table.column("id").to_pylist())
    report.duplicate_rows = sum(n - 1 for n in got.values() if n > 1)
    report.missing_rows = len(ids - set(got))
    batches_per_file: dict[str, set[tuple[str, int]]] = {}
    for file, resource, batch in zip(
        table.column("_file").to_pylist(),
        table.column("_resource").to_pylist(),
        table.column("_batch").to_pylist(),
        strict=True,
    ):
        batches_per_file.setdefault(str(file), set()).add((str(resource), int(batch)))
    report.files_in_several_batches = sum(1 for b in batches_per_file.values() if len(b) > 1)
    inputs = {p.resolve().as_uri() for p in landing.rglob("*.csv")}
    seen = {f.replace("file:///", "file:/") for f in batches_per_file}
    report.files_missing = len({u.replace("file:///", "file:/") for u in inputs} - seen)
