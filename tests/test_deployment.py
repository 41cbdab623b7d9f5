"""docs/deployment.md, run where it can run here: a Spark standalone master and worker on this
machine, the library and its native dependencies (deltalake, pyarrow) shipped to the executors
in a venv packed with venv-pack and given to ``spark-submit --archives``, and a job with no
``--backend`` on that master refused before it joins anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rebalancer_spark.spark.packages import spark_submit_command
from tests.support.dist import ROOT, build_dist, run

pytestmark = pytest.mark.slow

PROBE = """\
import json, sys
from pyspark.sql import SparkSession

def probe(_):
    import deltalake, pyarrow, rebalancer_spark
    from rebalancer_spark.core.assignors import get_assignor
    yield {"python": sys.executable, "rebalancer_spark": rebalancer_spark.__file__,
           "pyarrow": pyarrow.__version__, "deltalake": deltalake.__version__}

spark = SparkSession.builder.appName("packed-venv-probe").getOrCreate()
seen = spark.sparkContext.parallelize(range(2), 2).mapPartitions(probe).collect()
with open(sys.argv[1], "w") as out:
    json.dump(seen, out)
spark.stop()
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    env.pop("PYTHONPATH", None)  # what is installed, not this checkout
    return env


def test_a_packed_venv_ships_the_library_and_its_native_wheels_to_the_executors(
    standalone: str, tmp_path: Path
) -> None:
    wheel = build_dist(tmp_path / "dist", tmp_path / "src")
    venv = tmp_path / "ship"
    run(sys.executable, "-m", "venv", venv)
    # What the executors need besides Spark: the library and the driver extra (deltalake,
    # pyarrow, pandas); no pyspark, the cluster has it.
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", f"{wheel}[driver]", env=_env())
    archive = tmp_path / "ship.tar.gz"
    run(
        Path(sys.executable).parent / "venv-pack",
        "-p",
        venv,
        "-o",
        archive,
        "-q",
        "--compress-level",
        "0",
    )
    probe, seen = tmp_path / "probe.py", tmp_path / "seen.json"
    probe.write_text(PROBE)
    # No Delta or S3 jars: the probe needs none, and the executors would fetch ~570 MB.
    command = [str(Path(sys.executable).parent / "spark-submit"), "--master", standalone]
    for key, value in {
        "spark.archives": f"{archive}#environment",
        "spark.pyspark.python": "./environment/bin/python",  # executors: the packed one
        "spark.pyspark.driver.python": sys.executable,  # client mode: the local driver
        "spark.cores.max": "2",
        "spark.executor.memory": "512m",
    }.items():
        command += ["--conf", f"{key}={value}"]
    command += [str(probe), str(seen)]
    run(*command, env=_env(), cwd=tmp_path, timeout=300)
    answers = json.loads(seen.read_text())
    assert len(answers) == 2
    for answer in answers:
        assert answer["python"].endswith("/environment/bin/python"), answer
        assert "/environment/" in answer["rebalancer_spark"], answer  # not this checkout
        assert answer["pyarrow"] and answer["deltalake"]


def test_a_job_without_backend_on_a_cluster_master_is_refused_naming_the_fix(
    standalone: str, tmp_path: Path
) -> None:
    (tmp_path / "landing" / "d1").mkdir(parents=True)
    command = spark_submit_command(
        ROOT / "jobs" / "ingest_files.py",
        "--group", "orders",
        "--source", (tmp_path / "landing").as_uri() + "/",
        "--output", str(tmp_path / "out"),
        master=standalone,
        conf={"spark.cores.max": "1", "spark.executor.memory": "512m"},
    )  # fmt: skip
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=300, env=_env()
    )
    said = done.stdout + done.stderr  # spark-submit passes the driver's stderr to stdout
    assert done.returncode == 2, said[-3000:]
    assert f"error: no --backend given on Spark master '{standalone}'" in said
    assert "--backend zookeeper://" in said and "--backend redis://" in said
    assert "joined group" not in said
