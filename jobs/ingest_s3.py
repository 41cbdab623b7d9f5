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

import logging
import signal
import sys
import threading

from pyspark.sql import SparkSession

from rebalancer_spark.core.errors import RebalancerError
from rebalancer_spark.member import default_backend_url
from rebalancer_spark.shutdown import exit_process
from rebalancer_spark.spark.ingest import run_ingest
from rebalancer_spark.spark.options import parse_command_line, resolve, spark_conf_options
from rebalancer_spark.spark.session import start


def main(argv: list[str]) -> int:
    command_line = parse_command_line(argv, prog="ingest_s3.py")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for noisy in ("py4j", "botocore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    spark = SparkSession.builder.appName("rebalancer-ingest-s3").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        job = resolve(
            command_line,
            spark_conf_options(spark.sparkContext.getConf().getAll()),
            default_backend=default_backend_url(),
        )
        if job.source is None or not job.source.startswith("s3://") or job.output is None:
            raise RebalancerError(
                "ingest_s3.py needs --source s3://bucket/prefix/ and --output PATH "
                "(for a file share use jobs/ingest_files.py)"
            )
        print(job.describe(), flush=True)
        node = start(spark, job)
    except RebalancerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        spark.stop()
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"member {node.member.member_id} of group {job.member.group} running", flush=True)
    stats = run_ingest(spark, node, job.output, stop)
    spark.stop()  # drains and leaves the group first
    print(
        f"member {node.member.member_id} stopped: {stats.batches} batches, {stats.files} "
        f"objects, {stats.rows} rows, {stats.fenced} fenced",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))
