"""Reference job: ingest the objects under an S3 prefix, split between the jobs of a group.

    spark-submit jobs/ingest_s3.py --group orders \\
        --source 's3://lake/raw/orders/?region=eu-west-1' \\
        --output /lake/bronze/orders --audit /lake/audit/ownership [--backend URL] ...

Each sub-prefix of --source is a resource; every object lands in --output exactly once, under
resource=<sub-prefix>/batch=<n>/. Another S3 endpoint (MinIO, Ceph): add
``?endpoint_url=http://host:9000``. Credentials come from the boto3 chain (AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance role) or ``?profile=NAME``, never the URL.
Where hadoop-aws is on Spark's classpath the executors read ``s3a://`` paths; elsewhere the
driver reads each batch with pyarrow (docs/sources.md). SIGTERM (or Ctrl-C) drains this job's
prefixes to the others and stops. `--help` lists every option.
"""

from __future__ import annotations

import sys

from rebalancer_spark.shutdown import exit_process
from rebalancer_spark.spark.ingest import run_ingest
from rebalancer_spark.spark.jobs import JobContext, job_main


def loop(ctx: JobContext) -> str:
    stats = run_ingest(ctx.spark, ctx.node, ctx.stop)
    return f"{stats.batches} batches, {stats.files} objects, {stats.fenced} fenced"


def main(argv: list[str]) -> int:
    return job_main(argv, "ingest_s3.py", loop, schemes=("s3",))


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))
