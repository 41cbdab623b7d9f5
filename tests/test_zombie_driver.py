"""Zombie drivers: a spark-submit job SIGSTOPped in the middle of a large batch, past its
lease, on every backend. The other job takes the resource over and commits the batch; then the
zombie resumes, with its Spark write still in flight. The output Delta table must hold every
input row exactly once, its history no data commit of the zombie's epoch after the successor's
(Delta refuses it: docs/spark.md), and the audit must verify (slow: two Spark applications).

The moments: ``planned`` (the batch's plan is committed, nothing written yet) and ``writing``
(Spark is writing the batch's files). The moment between the Delta commit and the progress
commit is milliseconds wide: tests/test_delta_output.py plays it exactly, in one process.
"""

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

GROUP = "zombie"
DIRS, FILES, ROWS = 2, 30, 3000  # one batch of 30 files x 3000 rows per directory
SESSION = 4.0


def _planned(run: SparkJobs, resource: str) -> int | None:
    value = run.store.progress(GROUP, [resource]).get(resource)
    batch = None if value is None or not value.value else value.value.get("batch")
    return None if batch is None else int(batch["id"])


def _writing(output: Path, resource: str) -> bool:
    """Spark has started writing a batch of ``resource`` that is not committed yet."""
    folder = output / f"_resource={resource}"
    return folder.is_dir() and any(
        d.is_dir() and not (d / "_SUCCESS").exists() for d in folder.iterdir()
    )


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("kind", "moment"),
    [("sqlite", "planned"), ("sqlite", "writing"), ("zookeeper", "writing"), ("redis", "writing")],
)
def test_a_driver_paused_mid_batch_past_its_lease_duplicates_and_loses_nothing(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str, moment: str
) -> None:
    from deltalake import DeltaTable

    backend = "" if kind == "sqlite" else str(request.getfixturevalue(f"{kind}_backend_url"))
    ids = generate_landing(tmp_path / "landing", DIRS, FILES, ROWS)
    args = ["--schema", SCHEMA, "--max-files-per-batch", str(FILES), "--poll-interval", "0.2s"]
    run = SparkJobs(tmp_path, GROUP, REPO / "jobs" / "ingest_files.py", args, SESSION, backend)
    output = tmp_path / "output"
    victim_dir = "dir-00"
    try:
        zombie = run.start_job()

        def at_moment() -> bool:
            run.check_alive()
            if moment == "planned":
                return _planned(run, victim_dir) is not None
            return _writing(output, victim_dir)

        wait_for(at_moment, timeout=300, what=f"{victim_dir} {moment}", interval=0.002)
        run.pause(zombie)
        paused_at = time.monotonic()
        successor = run.start_job()

        def successor_done() -> bool:
            run.check_alive()
            return run.driver_pid(successor) is not None and run.committed() == (
                DIRS * FILES,
                True,
            )

        wait_for(successor_done, timeout=300, what="the successor to commit everything")
        assert time.monotonic() - paused_at > SESSION, "the zombie was paused past its lease"
        run.resume(zombie)
        # New input after the zombie woke: the group (zombie rejoined) works on.
        late = tmp_path / "landing" / victim_dir / "part-late.csv"
        late.write_text("late-0,0\nlate-1,1\n")
        ids |= {"late-0", "late-1"}
        wait_for(
            lambda: run.committed() == (DIRS * FILES + 1, True),
            timeout=300,
            what="the late file to be committed",
        )
        codes = {job.name: run.stop(job) for job in list(run.jobs.values())}
    finally:
        run.cleanup()
    table = DeltaTable(str(output))
    rows = Counter(table.to_pyarrow_table(columns=["id"]).column("id").to_pylist())
    history = sorted(table.history(), key=lambda c: int(c["version"]))
    commits = [
        (int(c["rebalancer.epoch"]), c["rebalancer.member_id"], int(c["rebalancer.batch"]))
        for c in history
        if c.get("rebalancer.kind") == "data" and c.get("rebalancer.resource") == victim_dir
    ]
    print(f"\n{kind}/{moment}: data commits of {victim_dir} (epoch, member, batch): {commits}")
    assert set(codes.values()) == {0}, codes
    assert set(rows) == ids and max(rows.values()) == 1, "every row exactly once"
    epochs = [epoch for epoch, _, _ in commits]
    assert epochs == sorted(epochs), "no data commit of a stale epoch after a newer one"
    assert all(member != zombie.name for _, member, batch in commits if batch == 1), (
        "the successor, not the zombie, landed the batch the zombie was working on"
    )
    verdict = verify_table(str(tmp_path / "audit"), group=GROUP)
    assert verdict.ok, verdict.report()
    checked = verify_output(str(tmp_path / "audit"), str(tmp_path / "output"), group=GROUP)
    assert checked.ok, checked.report()
