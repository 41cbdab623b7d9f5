"""The file torture test: concurrent spark-submit jobs killed with -9 at random moments.

Three ``jobs/ingest_files.py`` applications share a few thousand small CSV files spread over
12 directories of a file share, on the SQLite backend. While they work, a job chosen at random
is killed with ``kill -9`` (its Python driver, where the member lives, then its JVM) whenever
the committed work passes a random fraction, and a new job is started in its place. At the end
every input record is in the output exactly once, no file was committed in two batches, and the
Delta audit table proves that no directory ever had two owners at once.

The randomness is seeded: ``TORTURE_SEED=N`` replays a run (the kill points, not Spark's
timing), ``TORTURE_SEED=random`` draws a new seed; the test command runs a fixed one. The seed
and the figures are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rebalancer_spark.audit import verify_table
from rebalancer_spark.backends import Backend, open_backend
from rebalancer_spark.sources.files import FileShareSource
from rebalancer_spark.spark.packages import spark_submit_command
from rebalancer_spark.testing.spark_demo import SCHEMA, generate_landing
from tests.helpers import JOB_CONF, wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
GROUP = "torture"
JOBS, KILLS = 3, 3
DIRS, FILES, ROWS = 12, 200, 4
SESSION_TIMEOUT = 4.0


@dataclass
class _Job:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    driver_pid: int | None = None

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class _Run:
    workdir: Path
    backend: str
    store: Backend
    env: dict[str, str]
    jobs: dict[str, _Job] = field(default_factory=dict)
    started: int = 0

    def start_job(self) -> _Job:
        self.started += 1
        name = f"job-{self.started}"
        landing = (self.workdir / "landing").resolve()
        cmd = spark_submit_command(
            REPO / "jobs" / "ingest_files.py",
            "--group", GROUP, "--backend", self.backend, "--member-id", name,
            "--source", landing.as_uri() + "/", "--output", str(self.workdir / "output"),
            "--audit", str(self.workdir / "audit"), "--schema", SCHEMA,
            "--max-files-per-batch", "100", "--poll-interval", "0.5s",
            "--discovery-interval", "5s",
            conf={**JOB_CONF, "spark.rebalancer.session-timeout": f"{SESSION_TIMEOUT}s"},
        )  # fmt: skip
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            # A session of its own: the JVM and the Python driver it starts share a process
            # group that the test can end as one.
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        self.jobs[name] = job = _Job(name, proc, log)
        return job

    def check_alive(self) -> None:
        for job in self.jobs.values():
            if job.proc.poll() is not None:
                raise AssertionError(f"{job.name} exited with {job.proc.returncode}:\n{job.tail()}")

    def driver_pid(self, job: _Job) -> int | None:
        if job.driver_pid is None:
            record = self.store.state(GROUP).members.get(job.name)
            if record is not None:
                job.driver_pid = int(record.info["pid"])
        return job.driver_pid

    def kill(self, job: _Job) -> None:
        pid = self.driver_pid(job)
        assert pid is not None, f"{job.name} never joined the group"
        os.kill(pid, signal.SIGKILL)  # the Python driver first: the member lives there
        os.killpg(job.proc.pid, signal.SIGKILL)  # then its spark-submit JVM
        job.proc.wait(60)
        del self.jobs[job.name]

    def cleanup(self) -> None:
        for job in self.jobs.values():
            # the JVM and the Python driver it started: the process group of the job
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait(60)
        self.jobs.clear()
        self.store.close()


def _committed(store: Backend, source: FileShareSource) -> tuple[int, bool]:
    """How many input files are committed, and whether no batch is left planned."""
    resources = [r.id for r in source.discover()]
    progress = store.progress(GROUP, resources)
    done, idle = 0, True
    for resource in resources:
        value = progress[resource].value if resource in progress else None
        if not value:
            idle = False
            continue
        done += len(value["done"])
        idle = idle and value.get("batch") is None
    return done, idle


@pytest.mark.timeout(600)
def test_jobs_killed_at_random_lose_nothing_and_duplicate_nothing(tmp_path: Path) -> None:
    import pyarrow.dataset as ds

    chosen = os.environ.get("TORTURE_SEED") or "456963"
    seed = random.SystemRandom().randrange(10**6) if chosen == "random" else int(chosen)
    rng = random.Random(seed)
    print(f"\ntorture seed {seed} (replay with TORTURE_SEED={seed})")
    began = time.monotonic()
    ids = generate_landing(tmp_path / "landing", DIRS, FILES, ROWS)
    total_files = DIRS * FILES
    source = FileShareSource((tmp_path / "landing").resolve().as_uri() + "/")
    backend = f"sqlite://{tmp_path.resolve()}/groups.db"
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    run = _Run(tmp_path, backend, open_backend(backend), env)
    kills: list[str] = []
    try:
        for _ in range(JOBS):
            run.start_job()

        def progress_at_least(files: int) -> bool:
            run.check_alive()
            return _committed(run.store, source)[0] >= files

        # Kill moments: when the committed work passes random fractions of the whole.
        for fraction in sorted(rng.uniform(0.05, 0.7) for _ in range(KILLS)):
            files = int(fraction * total_files)
            wait_for(
                lambda: progress_at_least(files),  # noqa: B023 - called before files changes
                timeout=300,
                what=f"{fraction:.0%} of the files to be committed",
                interval=0.05,
            )
            live = [j for j in run.jobs.values() if run.driver_pid(j) is not None]
            victim = rng.choice(sorted(live, key=lambda j: j.name))
            run.kill(victim)
            kills.append(f"{victim.name} at {fraction:.0%}")
            run.start_job()

        def finished() -> bool:
            run.check_alive()
            done, idle = _committed(run.store, source)
            return done == total_files and idle

        wait_for(finished, timeout=300, what="every file to be committed", interval=0.2)
        for job in list(run.jobs.values()):
            pid = run.driver_pid(job)
            assert pid is not None, f"{job.name} never joined:\n{job.tail()}"
            os.kill(pid, signal.SIGTERM)
        codes = {job.name: job.proc.wait(120) for job in run.jobs.values()}
        run.jobs.clear()
    finally:
        run.cleanup()
    elapsed = time.monotonic() - began

    table = ds.dataset(str(tmp_path / "output"), format="parquet", partitioning="hive").to_table(
        columns=["id", "_file", "resource", "batch"]
    )
    got = Counter(table.column("id").to_pylist())
    duplicates = sum(n - 1 for n in got.values() if n > 1)
    missing = len(ids - set(got))
    batches_of: dict[str, set[tuple[str, int]]] = {}
    for file, resource, batch in zip(
        table.column("_file").to_pylist(),
        table.column("resource").to_pylist(),
        table.column("batch").to_pylist(),
        strict=True,
    ):
        batches_of.setdefault(str(file), set()).add((str(resource), int(batch)))
    verdict = verify_table(str(tmp_path / "audit"), group=GROUP)
    print(
        f"torture seed {seed}: {len(kills)} kills ({', '.join(kills)}), {run.started} jobs "
        f"started, {total_files} files in {DIRS} directories, {len(ids)} records, "
        f"duplicates={duplicates}, missing={missing}, files in several batches="
        f"{sum(1 for b in batches_of.values() if len(b) > 1)}, output files="
        f"{len(batches_of)}, audit {'ok' if verdict.ok else 'FAILED'}, {elapsed:.0f} s"
    )
    assert set(codes.values()) == {0}, codes
    assert len(kills) == KILLS
    assert duplicates == 0 and missing == 0, f"seed {seed}: {duplicates=} {missing=}"
    assert len(batches_of) == total_files
    assert all(len(b) == 1 for b in batches_of.values()), f"seed {seed}: a file in two batches"
    assert set(got) == ids
    assert verdict.ok, verdict.report()
