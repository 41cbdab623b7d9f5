"""``spark-submit jobs/ingest_files.py`` refuses overlapping paths before anything runs: exit 2,
one line naming both paths, and no store, output or audit written (slow: a Spark application
per case)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rebalancer_spark.spark.packages import spark_submit_command
from tests.support.helpers import JOB_CONF

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, *, output: Path, audit: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = spark_submit_command(
        REPO / "jobs" / "ingest_files.py",
        "--group", "paths", "--backend", f"sqlite://{tmp_path}/groups.db",
        "--source", f"file://{tmp_path}/landing/", "--output", str(output),
        "--audit", str(audit),
        conf=JOB_CONF,
    )  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, check=False)


def _written(tmp_path: Path) -> list[str]:
    """Everything under tmp_path except the landing files the test put there."""
    return sorted(
        str(p.relative_to(tmp_path))
        for p in tmp_path.rglob("*")
        if p.relative_to(tmp_path).parts[:2] != ("landing", "a")
        and str(p.relative_to(tmp_path)) != "landing"
    )


@pytest.mark.timeout(600)
def test_spark_job_refuses_overlapping_paths_with_exit_2_and_writes_nothing(
    tmp_path: Path,
) -> None:
    tmp_path = tmp_path.resolve()
    (tmp_path / "landing" / "a").mkdir(parents=True)
    (tmp_path / "landing" / "a" / "x.csv").write_text("1,2\n")
    cases = [
        (tmp_path / "lake", tmp_path / "lake", "are the same location"),
        (tmp_path / "landing" / "out", tmp_path / "audit", "--output lies inside --source"),
    ]
    for output, audit, words in cases:
        done = _run(tmp_path, output=output, audit=audit)
        said = done.stdout + done.stderr  # spark-submit passes the driver's stderr to stdout
        errors = [line for line in said.splitlines() if line.startswith("error: ")]
        assert done.returncode == 2, said[-3000:]
        assert len(errors) == 1, said[-3000:]
        assert words in errors[0] and f"--output {output}" in errors[0], errors[0]
        assert "--audit" in errors[0] or "--source" in errors[0], errors[0]
        assert _written(tmp_path) == [], f"{words}: {_written(tmp_path)}"
