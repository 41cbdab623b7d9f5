"""Reference job: ingest the files of a shared directory, split between the jobs of a group.

    spark-submit jobs/ingest_files.py --group orders --source file:///landing/orders/ \\
        --output /lake/bronze/orders --audit /lake/audit/ownership [--backend URL] ...

Each sub-directory of --source is a resource; every file lands in --output exactly once, under
resource=<dir>/batch=<n>/. SIGTERM (or Ctrl-C) drains this job's directories to the others
and stops. `--help` lists every option; they may also come from spark.rebalancer.* conf keys
or a TOML file (conf/rebalancer.example.toml).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

from pyspark.sql import SparkSession

from rebalancer_spark.core.errors import RebalancerError
from rebalancer_spark.member import default_backend_url
from rebalancer_spark.member.logfields import configure_logging
from rebalancer_spark.shutdown import exit_process
from rebalancer_spark.spark.ingest import run_ingest
from rebalancer_spark.spark.options import parse_command_line, resolve, spark_conf_options
from rebalancer_spark.spark.session import start


def main(argv: list[str]) -> int:
    command_line = parse_command_line(argv, prog="ingest_files.py")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = SparkSession.builder.appName("rebalancer-ingest-files").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        job = resolve(
            command_line,
            spark_conf_options(spark.sparkContext.getConf().getAll()),
            default_backend=default_backend_url(),
        )
        configure_logging(job.log_format)
        logging.getLogger("py4j").setLevel(logging.WARNING)
        if job.source is None or job.output is None:
            raise RebalancerError("ingest_files.py needs --source file:///dir/ and --output PATH")
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
        f"files, {stats.rows} rows, {stats.fenced} fenced",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))
