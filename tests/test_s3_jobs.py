"""Three concurrent ``spark-submit jobs/ingest_s3.py`` applications over one S3 prefix (moto's
server), reading through Spark's ``s3a://`` reader and writing one fenced Delta output table in
the same bucket; one job is killed with -9 mid-way. Every object lands exactly once, the audit
and the output check verify, and Spark's own Delta reader reads both tables (slow)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark.audit import verify_table
from rebalancer_spark.audit.output_check import verify_output
from rebalancer_spark.sources.s3 import S3Source
from rebalancer_spark.sources.s3.spark_read import configure_s3a
from tests.servers.cloud import ACCESS_KEY, REGION, SECRET_KEY, S3Bucket
from tests.support.helpers import read_delta, wait_for
from tests.support.spark_jobs import REPO, SparkJobs

pytestmark = [
    pytest.mark.slow,
    # Spark's collect() leaves its local socket to the garbage collector.
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket.*127.0.0.1:"
        "pytest.PytestUnraisableExceptionWarning"
    ),
]

RESOURCES, FILES, ROWS = 6, 10, 20


@pytest.mark.timeout(1500)
def test_three_s3_jobs_one_killed_land_every_object_once_in_delta(
    spark: Any, s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake import DeltaTable

    for key, value in (("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
                       ("AWS_DEFAULT_REGION", REGION)):  # fmt: skip
        monkeypatch.setenv(key, value)
    ids: set[str] = set()
    names = [f"r{r}" for r in range(RESOURCES)]
    for resource in names:
        for f in range(FILES):
            rows = [f"{resource}-{f}-{i}" for i in range(ROWS)]
            ids.update(rows)
            s3_bucket.put(f"in/{resource}/part-{f:03d}.csv", "".join(f"{i},1\n" for i in rows))
    source = f"s3://{s3_bucket.name}/in/?endpoint_url={s3_bucket.endpoint}"
    output = f"s3a://{s3_bucket.name}/out"
    args = ["--schema", "id STRING, value INT", "--max-files-per-batch", "3",
            "--poll-interval", "0.5s", "--discovery-interval", "2s"]  # fmt: skip
    run = SparkJobs(tmp_path, "s3-jobs", REPO / "jobs" / "ingest_s3.py", args, 6.0,
                    source=source, output=output)  # fmt: skip
    total = RESOURCES * FILES

    def at_least(files: int) -> bool:
        run.check_alive()
        return run.committed(names)[0] >= files

    try:
        jobs = [run.start_job() for _ in range(3)]
        wait_for(lambda: at_least(total // 4), timeout=600, what="a quarter of the objects")
        run.kill(jobs[1])

        def finished() -> bool:
            run.check_alive()
            return run.committed(names) == (total, True)

        wait_for(finished, timeout=600, what="every object committed", interval=0.5)
        codes = {job.name: run.stop(job) for job in list(run.jobs.values())}
    finally:
        run.cleanup()
    options = {"AWS_ENDPOINT_URL": s3_bucket.endpoint, "AWS_ALLOW_HTTP": "true",
               "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
               "AWS_REGION": REGION}  # fmt: skip
    delta_uri = f"s3://{s3_bucket.name}/out"
    got = Counter(
        DeltaTable(delta_uri, storage_options=options)
        .to_pyarrow_table(columns=["id"])
        .column("id")
        .to_pylist()
    )
    assert set(codes.values()) == {0}, codes
    assert set(got) == ids and max(got.values()) == 1, "every object's rows exactly once"
    audit = str(tmp_path / "audit")
    verdict = verify_table(audit, group="s3-jobs")
    assert verdict.ok, verdict.report()
    checked = verify_output(audit, delta_uri, group="s3-jobs", output_storage_options=options)
    assert checked.ok, checked.report()
    # Spark's own readers: the output through s3a and Delta, the audit table through Delta.
    configure_s3a(spark, S3Source(source))
    out = read_delta(spark, output)
    assert out.count() == len(ids)
    assert {r["_resource"] for r in out.select("_resource").distinct().collect()} == set(names)
    assert read_delta(spark, audit).where("kind = 'acquired'").count() >= RESOURCES
