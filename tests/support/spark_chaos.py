"""Whole Spark drivers as chaos victims, with the output counted row by row.

``spark-submit jobs/ingest_files.py`` applications of a group of their own, on the chaos run's
store, ingest a file share that a feeder keeps writing new files into (each file written under a
temporary name, then renamed). While they work, one fault at a time hits a driver that has
joined, at exponential gaps:

* ``driver-kill9``: ``kill -9`` of the whole application (its Python driver, where the member
  lives, and its JVM), as when a host or container dies; a new application is started in its
  place at once (its member joins while the dead one's session runs out);
* ``driver-sigstop``: ``SIGSTOP`` of the whole application for its session timeout plus 1 to
  3 s, then ``SIGCONT``: a zombie that wakes after others took its resources over, possibly in
  the middle of a batch's write.

At the end the feeder stops, the jobs are given the time to commit every file, then are stopped
with SIGTERM, and the checker (this module, not the jobs) counts:

* rows: every id written by the feeder against the ids in the output Delta table: lost (never
  in the output) and duplicated (in it more than once);
* double ownership: overlapping ownership intervals in the Delta audit table the jobs write
  (``verify_table``, which judges them with the store's lease expiries), and the output check
  (``verify_output``: every data commit of the output inside an ownership interval of its
  resource at its epoch, no batch twice).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rebalancer_spark.core.errors import RebalancerError
from rebalancer_spark.spark.file_history import HISTORY_DIR, PLANS_SUFFIX
from rebalancer_spark.testing.spark_demo import SCHEMA
from tests.support.helpers import wait_for
from tests.support.spark_jobs import REPO, Job, SparkJobs

__all__ = ["DriverChaos", "DriverFigures"]

_GROUP_SUFFIX = "-spark"
_LONG = "landing-file-named-at-length-so-that-a-backlog-batch-has-its-plan-in-the-table"
"""With names this long, a batch of 25 files or more no longer fits inline in the progress
record: the first batches, and backlogs a paused or killed driver leaves, go through the plans
table."""


@dataclass
class DriverFigures:
    """What the Spark drivers went through, and what the checker counted."""

    faults: Counter[str] = field(default_factory=Counter)
    jobs_started: int = 0
    unexpected_exits: list[str] = field(default_factory=list)
    files: int = 0
    rows_in: int = 0
    rows_out: int = 0
    lost: int = 0
    duplicated: int = 0
    audit_double_ownerships: int = 0
    audit_double_ownerships_clock: int = 0
    """Overlaps in the drivers' audit that began right after a forward step of the store's
    clock (documented: docs/operations.md, "Clocks")."""
    audit_ok: bool = False
    output_check: str = "not run"
    stop_codes: dict[str, int] = field(default_factory=dict)
    target: int = 0
    """The driver faults asked for."""
    fault_errors: list[str] = field(default_factory=list)
    """Faults that could not be injected (the victim was gone already)."""
    plans: int = 0
    """Batches whose file list went to the plans table (appends to it)."""
    unfinished: str = ""
    """Why the drivers were stopped before every row had landed (empty: they had)."""

    @property
    def ok(self) -> bool:
        return (
            sum(self.faults.values()) >= self.target
            and not self.unfinished
            and not self.unexpected_exits
            and set(self.stop_codes.values()) <= {0}
            and self.lost == 0
            and self.duplicated == 0
            and self.audit_double_ownerships == 0
            and self.audit_ok
            and self.output_check == "ok"
        )

    def lines(self) -> list[str]:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        out = [
            f"  spark drivers        {sum(self.faults.values())} faults ({kinds}), "
            f"{self.jobs_started} applications started",
            f"  rows                 {self.rows_in} written to {self.files} files, "
            f"{self.rows_out} in the output: lost {self.lost}, duplicated {self.duplicated}; "
            f"{self.plans} batches planned through the plans table",
            f"  drivers' audit       {self.audit_double_ownerships} double ownership"
            + (
                f" (+ {self.audit_double_ownerships_clock} right after a forward step of the "
                "store's clock)"
                if self.audit_double_ownerships_clock
                else ""
            )
            + f" ({'verifies' if self.audit_ok else 'DOES NOT VERIFY'}); output check: "
            f"{self.output_check}",
        ]
        if self.unexpected_exits:
            out.append(f"  driver exits         {'; '.join(self.unexpected_exits)}")
        if self.unfinished:
            out.append(f"  UNFINISHED           {self.unfinished}")
        if self.fault_errors:
            out.append(f"  faults not injected  {'; '.join(self.fault_errors[:5])}")
        if set(self.stop_codes.values()) - {0}:
            out.append(f"  stop codes           {self.stop_codes}")
        return out


class DriverChaos:
    """``jobs`` spark-submit ingest applications of ``group + "-spark"`` on ``backend``, fed
    and faulted as the module docstring says; :meth:`start`, then :meth:`stop_faults`, then
    :meth:`finish`, and :meth:`cleanup` in any case."""

    def __init__(
        self,
        workdir: Path,
        backend: str,
        group: str,
        *,
        jobs: int,
        seed: int,
        target: int = 0,
        session_timeout: float = 6.0,
        mean_gap: float = 8.0,
        dirs: int = 6,
        rows_per_file: int = 5,
        files_per_second: float = 4.0,
    ) -> None:
        self.workdir = workdir
        self.group = group + _GROUP_SUFFIX
        self.jobs = jobs
        self.rng = random.Random(seed)
        self.session_timeout = session_timeout
        self.mean_gap = mean_gap
        self.dirs = dirs
        self.rows_per_file = rows_per_file
        self.files_per_second = files_per_second
        self.figures = DriverFigures(target=target)
        self.ids: set[str] = set()
        self._files = 0
        self._lock = threading.Lock()
        self._stop_faults = threading.Event()
        self._stop_feed = threading.Event()
        self._threads: list[threading.Thread] = []
        (workdir / "landing").mkdir(parents=True, exist_ok=True)
        args = ["--schema", SCHEMA, "--max-files-per-batch", "40", "--poll-interval", "0.3s",
                "--discovery-interval", "5s"]  # fmt: skip
        self.run = SparkJobs(
            workdir, self.group, REPO / "jobs" / "ingest_files.py", args, session_timeout, backend
        )

    # -- the input ---------------------------------------------------------------------------

    def _write_file(self) -> None:
        with self._lock:
            n = self._files
            self._files += 1
        folder = self.workdir / "landing" / f"dir-{n % self.dirs:02d}"
        folder.mkdir(exist_ok=True)
        ids = [f"f{n:06d}-{r}" for r in range(self.rows_per_file)]
        name = f"{_LONG}-f{n:06d}.csv"
        tmp = folder / f".{name}.tmp"
        tmp.write_text("".join(f"{i},{r}\n" for r, i in enumerate(ids)))
        os.rename(tmp, folder / name)
        with self._lock:
            self.ids.update(ids)

    def _feed(self) -> None:
        while not self._stop_feed.wait(1 / self.files_per_second):
            self._write_file()

    # -- the faults --------------------------------------------------------------------------

    def _joined(self) -> list[Job]:
        jobs = [j for j in self.run.jobs.values() if j.proc.poll() is None]
        return sorted((j for j in jobs if self.run.driver_pid(j) is not None), key=lambda j: j.name)

    def _gone(self, job: Job) -> bool:
        """Whether ``job`` ended on its own: its spark-submit process, or its Python driver."""
        if job.proc.poll() is not None:
            return True
        if job.driver_pid is None:
            return False
        try:
            os.kill(job.driver_pid, 0)
        except ProcessLookupError:
            return True
        return False

    def _replace_exited(self) -> None:
        for job in list(self.run.jobs.values()):
            if self._gone(job):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(job.proc.pid, signal.SIGKILL)  # a JVM left behind
                job.proc.wait(60)
                lines = [ln for ln in job.tail(60).splitlines() if " WARN " not in ln]
                self.figures.unexpected_exits.append(
                    f"{job.name} exited with {job.proc.returncode}: {' | '.join(lines[-6:])[-700:]}"
                )
                del self.run.jobs[job.name]
                self._start_job()

    def _start_job(self) -> None:
        self.run.start_job()
        self.figures.jobs_started += 1

    def _fault(self) -> None:
        while not self._stop_faults.wait(self.rng.expovariate(1 / self.mean_gap)):
            try:
                self._replace_exited()
                live = self._joined()
            except RebalancerError:  # the store is down or paused (a store fault): later
                continue
            if not live:
                continue
            victim = self.rng.choice(live)
            try:
                self._inject(victim)
            except (ProcessLookupError, subprocess.TimeoutExpired, AssertionError) as exc:
                self.figures.fault_errors.append(f"{victim.name}: {exc!r}")

    def _inject(self, victim: Job) -> None:
        if self.rng.random() < 0.5:
            self.run.kill(victim)
            self.figures.faults["driver-kill9"] += 1
            self._start_job()
            return
        self.run.pause(victim)
        self.figures.faults["driver-sigstop"] += 1
        try:
            # The schedule's own pause: past the lease, then the zombie wakes up.
            time.sleep(self.session_timeout + self.rng.uniform(1.0, 3.0))
        finally:
            self.run.resume(victim)

    # -- the run -----------------------------------------------------------------------------

    def start(self) -> None:
        for _ in range(40 * self.dirs):  # a first batch of 40 per directory: through the plans
            self._write_file()
        for _ in range(self.jobs):
            self._start_job()
        for target in (self._feed, self._fault):
            thread = threading.Thread(target=target, name=f"driver-chaos-{target.__name__}")
            thread.start()
            self._threads.append(thread)

    @property
    def fault_count(self) -> int:
        return sum(self.figures.faults.values())

    def stop_faults(self) -> None:
        """No new fault; a paused driver is resumed (the fault thread ends its pause first)."""
        self._stop_faults.set()
        self._threads[1].join()
        self._replace_exited()

    def finish(self, timeout: float = 600.0, forward_steps: Sequence[float] = ()) -> DriverFigures:
        """Stop feeding, wait until every file is committed, stop the jobs, count.
        ``forward_steps``: wall-clock times at which the store's clock was stepped forward;
        an audit overlap that begins within a driver session (+ 1 s) after one is counted
        apart (the step ended leases their drivers still counted on)."""
        from deltalake import DeltaTable

        from rebalancer_spark.audit import verify_table
        from rebalancer_spark.audit.output_check import verify_output

        self._stop_feed.set()
        self._threads[0].join()
        total = self._files
        output = str(self.workdir / "output")

        def landed() -> bool:
            # Not the progress records' file counts: a store that lost its data (Redis
            # restarted without persistence) starts them again from nothing.
            self._replace_exited()
            if not self.run.committed()[1]:
                return False  # a batch is open somewhere
            ids = DeltaTable(output).to_pyarrow_table(columns=["id"]).column("id")
            return len(self.ids - set(ids.to_pylist())) == 0

        try:
            wait_for(landed, timeout=timeout, what=f"every row of {total} files", interval=1.0)
        except AssertionError as exc:  # counted below: the figures say what is missing
            self.figures.unfinished = str(exc)[:300]
        # A replacement started by the last fault may still be starting its JVM: it stops
        # once it has joined (SIGTERM goes to its Python driver).
        wait_for(
            lambda: all(self.run.driver_pid(j) is not None for j in self.run.jobs.values()),
            timeout=180,
            what="every driver started to join its group",
        )
        self._replace_exited()
        for job in list(self.run.jobs.values()):
            try:
                self.figures.stop_codes[job.name] = self.run.stop(job)
            except ProcessLookupError:  # its driver ended between the look and the signal
                self._replace_exited()
        f = self.figures
        f.files, f.rows_in = total, len(self.ids)
        ids = DeltaTable(str(self.workdir / "output")).to_pyarrow_table(columns=["id"])
        got = Counter(ids.column("id").to_pylist())
        f.rows_out = sum(got.values())
        f.lost = len(self.ids - set(got))
        f.duplicated = sum(n - 1 for n in got.values() if n > 1)
        plans = self.workdir / "output" / f"{HISTORY_DIR}{PLANS_SUFFIX}"
        if plans.exists():
            history = DeltaTable(str(plans)).history()
            f.plans = sum(1 for c in history if c.get("operation") == "WRITE")
        audit = str(self.workdir / "audit")
        verdict = verify_table(audit, group=self.group)
        window = self.session_timeout + 1.0
        stepped = [
            o
            for o in verdict.overlaps
            if any(0 <= o.second.start - at <= window for at in forward_steps)
        ]
        f.audit_double_ownerships = len(verdict.overlaps) - len(stepped)
        f.audit_double_ownerships_clock = len(stepped)
        f.audit_ok = verdict.ok or (
            len(stepped) == len(verdict.overlaps) and not verdict.chain_faults
        )
        checked = verify_output(audit, str(self.workdir / "output"), group=self.group)
        # A failure shows the verdict's violations (which rule, which commit, which grant),
        # not only its first line: the run's directory is gone by the time anyone reads it.
        f.output_check = "ok" if checked.ok else checked.report()[:4000]
        return f

    def cleanup(self) -> None:
        self._stop_faults.set()
        self._stop_feed.set()
        for thread in self._threads:
            thread.join()
        self.run.cleanup()
