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

import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from rebalancer_spark.audit import verify_table
from rebalancer_spark.audit.output_check import verify_output
from rebalancer_spark.testing.spark_demo import SCHEMA, generate_landing
from tests.support.helpers import wait_for
from tests.support.spark_jobs import REPO, SparkJobs

pytestmark = pytest.mark.slow

GROUP = "torture"
JOBS, KILLS = 3, 3
DIRS, FILES, ROWS = 12, 200, 4
SESSION_TIMEOUT = 4.0


@pytest.mark.timeout(600)
def test_jobs_killed_at_random_lose_nothing_and_duplicate_nothing(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    chosen = os.environ.get("TORTURE_SEED") or "456963"
    seed = random.SystemRandom().randrange(10**6) if chosen == "random" else int(chosen)
    rng = random.Random(seed)
    print(f"\ntorture seed {seed} (replay with TORTURE_SEED={seed})")
    began = time.monotonic()
    ids = generate_landing(tmp_path / "landing", DIRS, FILES, ROWS)
    total_files = DIRS * FILES
    args = ["--schema", SCHEMA, "--max-files-per-batch", "100", "--poll-interval", "0.5s",
            "--discovery-interval", "5s"]  # fmt: skip
    run = SparkJobs(tmp_path, GROUP, REPO / "jobs" / "ingest_files.py", args, SESSION_TIMEOUT)
    kills: list[str] = []
    try:
        for _ in range(JOBS):
            run.start_job()

        def progress_at_least(files: int) -> bool:
            run.check_alive()
            return run.committed()[0] >= files

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
            done, idle = run.committed()
            return done == total_files and idle

        wait_for(finished, timeout=300, what="every file to be committed", interval=0.2)
        codes = {job.name: run.stop(job) for job in list(run.jobs.values())}
    finally:
        run.cleanup()
    elapsed = time.monotonic() - began

    table = DeltaTable(str(tmp_path / "output")).to_pyarrow_table(
        columns=["id", "_file", "_resource", "_batch"]
    )
    got = Counter(table.column("id").to_pylist())
    duplicates = sum(n - 1 for n in got.values() if n > 1)
    missing = len(ids - set(got))
    batches_of: dict[str, set[tuple[str, int]]] = {}
    for file, resource, batch in zip(
        table.column("_file").to_pylist(),
        table.column("_resource").to_pylist(),
        table.column("_batch").to_pylist(),
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
    checked = verify_output(str(tmp_path / "audit"), str(tmp_path / "output"), group=GROUP)
    assert checked.ok, checked.report()
