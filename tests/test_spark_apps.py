"""Several concurrent spark-submit applications in one group (slow: ~1 min each).

They split the directories, one driver is killed with -9, the others take over, every file and
row lands exactly once, and the Delta audit table verifies, on every backend (only --backend
changes). The same scenario runs once on a real Spark standalone cluster (a master and a
worker started here), client mode.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rebalancer_spark.testing.spark_demo import DemoReport, run_demo

pytestmark = pytest.mark.slow


def _check(report: DemoReport, jobs: int) -> None:
    assert len(report.split) == jobs and all(report.split.values()), report.split
    assert report.killed_resources, "the killed job owned nothing"
    survivors = {m: rs for m, rs in report.split_after.items() if m != report.killed}
    assert sorted(r for rs in survivors.values() for r in rs) == sorted(
        r for rs in report.split.values() for r in rs
    )
    assert report.audit_ok, report.audit_report
    assert report.exactly_once, report
    assert set(report.exit_codes.values()) == {0}, report.exit_codes


def test_three_spark_applications_split_survive_a_kill_and_ingest_exactly_once(
    tmp_path: Path, backend_url: str
) -> None:
    """Runs on every backend: only --backend changes."""
    report = run_demo(
        tmp_path,
        backend=backend_url,
        jobs=3,
        dirs=6,
        files=4,
        rows=20,
        session_timeout=4.0,
        say=lambda _: None,
        timeout=300,
    )
    _check(report, 3)


def test_the_same_job_runs_unchanged_on_a_standalone_cluster(
    tmp_path: Path, standalone: str
) -> None:
    report = run_demo(
        tmp_path,
        jobs=2,
        dirs=4,
        files=3,
        rows=10,
        session_timeout=4.0,
        master=standalone,
        say=lambda _: None,
        timeout=300,
    )
    _check(report, 2)
