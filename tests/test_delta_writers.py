"""Several jobs committing into one output table on S3 at once lose no acknowledged commit
(moto's S3 server; Spark's plain Delta writer on s3a:// does lose some: docs/spark.md)."""

from __future__ import annotations

import pytest

from rebalancer_spark.testing.delta_writers import count, run_writers
from tests.servers.cloud import ACCESS_KEY, REGION, SECRET_KEY, S3Bucket

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_two_writers_times_100_commits_on_s3_lose_nothing(s3_bucket: S3Bucket) -> None:
    uri = f"s3://{s3_bucket.name}/output"
    options = {
        "AWS_ENDPOINT_URL": s3_bucket.endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
    }
    results = run_writers(uri, options, writers=2, batches=100)
    acknowledged = sum(r.acknowledged for r in results)
    commits, rows = count(uri, options)
    print(f"\n2 writers x 100 batches on S3: acknowledged {acknowledged}, in the log {commits}")
    assert acknowledged == 200
    assert commits == 200 and rows == 2000
