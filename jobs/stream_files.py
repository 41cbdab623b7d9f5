"""Streaming job: one Structured Streaming query per owned directory of a shared file source.

    spark-submit jobs/stream_files.py --group orders --source file:///landing/orders/ \\
        --output /lake/bronze/orders --checkpoint-root /share/checkpoints/ \\
        --schema 'id STRING, value INT' [--audit PATH] [--backend URL] ...

Each sub-directory of --source is a resource. While this job owns one, a query streams its new
files to --output/resource=<dir>/ (Parquet, Spark's file sink), checkpointed at
--checkpoint-root/<group>/<dir>/; when the resource moves, the query stops before the next
owner resumes from the same checkpoint. The job keeps running while resources come and go.
SIGTERM (or Ctrl-C) drains this job's directories to the others and stops. `--help` lists
every option; --poll-interval is the micro-batch trigger, --max-files-per-batch the most files
per micro-batch.
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
from rebalancer_spark.spark.options import parse_command_line, resolve, spark_conf_options
from rebalancer_spark.spark.session import start
from rebalancer_spark.spark.streaming import StreamManager


def main(argv: list[str]) -> int:
    command_line = parse_command_line(argv, prog="stream_files.py")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = SparkSession.builder.appName("rebalancer-stream-files").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        job = resolve(
            command_line,
            spark_conf_options(spark.sparkContext.getConf().getAll()),
            default_backend=default_backend_url(),
        )
        if job.source is None or job.output is None or job.checkpoint_root is None:
            raise RebalancerError(
                "stream_files.py needs --source file:///dir/, --output PATH and "
                "--checkpoint-root PATH (shared by every job of the group)"
            )
        print(job.describe(), flush=True)
        node = start(spark, job)
        streams = StreamManager(spark, node, checkpoint_root=job.checkpoint_root, output=job.output)
    except RebalancerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        spark.stop()
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"member {node.member.member_id} of group {job.member.group} streaming", flush=True)
    try:
        stats = streams.run(stop)
    finally:
        spark.stop()  # drains and leaves the group first (each query stops before its release)
    print(
        f"member {node.member.member_id} stopped: {stats.started} queries started, "
        f"{stats.stopped} stopped, {stats.failed} failed",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))
