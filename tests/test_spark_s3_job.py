"""``spark-submit jobs/ingest_s3.py`` against moto's S3: every object lands once (slow)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rebalancer_spark.backends import Backend, open_backend
from rebalancer_spark.spark.packages import spark_submit_command
from tests.servers.cloud import ACCESS_KEY, REGION, SECRET_KEY, S3Bucket
from tests.support.helpers import JOB_CONF, wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
RESOURCES = ("r1", "r2")


@pytest.fixture
def job_store(tmp_path: Path) -> Iterator[tuple[str, Backend]]:
    url = f"sqlite://{tmp_path}/groups.db"
    store = open_backend(url)
    yield url, store
    store.close()


def _all_done(store: Backend, group: str, names: dict[str, set[str]]) -> bool:
    progress = store.progress(group, list(names))
    for resource, files in names.items():
        value = progress[resource].value if resource in progress else None
        if not isinstance(value, dict) or value.get("batch") is not None:
            return False
        if value.get("files") != len(files):
            return False
    return True


def test_spark_submit_ingest_s3_lands_every_object_once(
    s3_bucket: S3Bucket, tmp_path: Path, job_store: tuple[str, Backend]
) -> None:
    backend, store = job_store
    ids: set[str] = set()
    names: dict[str, set[str]] = {}
    for resource in RESOURCES:
        for f in range(3):
            rows = [f"{resource}-{f}-{r}" for r in range(4)]
            ids.update(rows)
            s3_bucket.put(f"in/{resource}/part-{f}.csv", "".join(f"{i},1\n" for i in rows))
            names.setdefault(resource, set()).add(f"part-{f}.csv")
    output, log = tmp_path / "out", tmp_path / "job.log"
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_DEFAULT_REGION": REGION,
    }
    cmd = spark_submit_command(
        REPO / "jobs" / "ingest_s3.py",
        "--group", "s3-job", "--backend", backend, "--member-id", "s3-job-1",
        "--source", f"s3://{s3_bucket.name}/in/?endpoint_url={s3_bucket.endpoint}",
        "--output", str(output), "--schema", "id STRING, value INT",
        "--max-files-per-batch", "2", "--poll-interval", "0.5s", "--discovery-interval", "2s",
        conf=JOB_CONF,
    )  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:

        def done() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the job exited with {proc.returncode}:\n{log.read_text()}")
            return _all_done(store, "s3-job", names)

        try:
            wait_for(done, timeout=300, what="every object committed", interval=0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nthe job's log ends:\n{log.read_text()[-4000:]}") from None
        pid = int(store.state("s3-job").members["s3-job-1"].info["pid"])
        os.kill(pid, signal.SIGTERM)  # the Python driver: drain, leave, stop Spark
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    from deltalake import DeltaTable

    table = DeltaTable(str(output)).to_pyarrow_table(columns=["id", "_resource"])
    got = table.column("id").to_pylist()
    assert sorted(got) == sorted(ids), "every row exactly once"
    assert set(table.column("_resource").to_pylist()) == set(RESOURCES)
    assert "stopped: 4 batches, 6 objects, 0 fenced" in log.read_text()
    assert SECRET_KEY not in log.read_text()
    # the job read through Spark's s3a:// reader (hadoop-aws given by spark_submit_command),
    # not through the driver's pyarrow fallback
    assert f"s3a://{s3_bucket.name}/ is read by Spark with the endpoint" in log.read_text()
    assert "pyarrow (the fallback)" not in log.read_text()
