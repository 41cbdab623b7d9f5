"""A user pipeline written only against the documented API (tests/pipelines/filtered_ingest.py,
with its own ``--min-value`` flag) under spark-submit: jobs join, leave and are killed with -9
while it works, and the fenced Delta output still holds every kept row exactly once (slow)."""

from __future__ import annotations

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

DIRS, FILES, ROWS = 6, 60, 4
MIN_VALUE = 2


@pytest.mark.timeout(600)
def test_a_user_pipeline_survives_joins_leaves_and_kills_with_exactly_once_output(
    tmp_path: Path,
) -> None:
    from deltalake import DeltaTable

    ids = generate_landing(tmp_path / "landing", DIRS, FILES, ROWS)
    total = DIRS * FILES
    args = ["--schema", SCHEMA, "--max-files-per-batch", "20", "--poll-interval", "0.5s",
            "--min-value", str(MIN_VALUE), "--log-format", "json"]  # fmt: skip
    run = SparkJobs(tmp_path, "pipeline", REPO / "tests" / "pipelines" / "filtered_ingest.py", args)
    codes: dict[str, int] = {}
    began = time.monotonic()

    def at_least(files: int) -> bool:
        run.check_alive()
        return run.committed()[0] >= files

    try:
        first, second = run.start_job(), run.start_job()
        wait_for(lambda: at_least(total // 5), timeout=300, what="a fifth of the files done")
        run.start_job()  # a join
        wait_for(lambda: at_least(total * 2 // 5), timeout=300, what="two fifths done")
        codes[first.name] = run.stop(first)  # a graceful leave
        wait_for(lambda: at_least(total * 3 // 5), timeout=300, what="three fifths done")
        run.kill(second)  # a crash
        run.start_job()

        def finished() -> bool:
            run.check_alive()
            done, idle = run.committed()
            return done == total and idle

        wait_for(finished, timeout=300, what="every file committed", interval=0.2)
        logs = {job.name: job.log for job in run.jobs.values()}
        for job in list(run.jobs.values()):
            codes[job.name] = run.stop(job)
    finally:
        run.cleanup()
    table = DeltaTable(str(tmp_path / "output")).to_pyarrow_table(
        columns=["id", "value", "doubled", "_resource", "_batch"]
    )
    got = Counter(table.column("id").to_pylist())
    kept = {i for i in ids if int(i.rsplit("-", 1)[1]) >= MIN_VALUE}
    print(
        f"\nuser pipeline: {run.started} jobs, {len(ids)} rows in, {table.num_rows} out, "
        f"{time.monotonic() - began:.0f} s"
    )
    assert set(codes.values()) == {0}, codes
    assert set(got) == kept, f"missing {len(kept - set(got))}, extra {len(set(got) - kept)}"
    assert max(got.values()) == 1, "a row landed twice"
    values, doubled = table.column("value").to_pylist(), table.column("doubled").to_pylist()
    assert all(v * 2 == d for v, d in zip(values, doubled, strict=True))
    verdict = verify_table(str(tmp_path / "audit"), group="pipeline")
    assert verdict.ok, verdict.report()
    checked = verify_output(str(tmp_path / "audit"), str(tmp_path / "output"), group="pipeline")
    assert checked.ok, checked.report()
    assert any('"group": "pipeline"' in path.read_text() for path in logs.values()), (
        "--log-format json works in a user pipeline"
    )
