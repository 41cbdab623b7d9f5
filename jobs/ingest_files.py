"""Reference job: ingest the files of a shared directory, split between the jobs of a group.

    spark-submit jobs/ingest_files.py --group orders --source file:///landing/orders/ \\
        --output /lake/bronze/orders --audit /lake/audit/ownership [--backend URL] ...

Each sub-directory of --source is a resource; every file lands in --output exactly once, under
resource=<dir>/batch=<n>/. SIGTERM (or Ctrl-C) drains this job's directories to the others
and stops. `--help` lists every option; they may also come from spark.rebalancer.* conf keys
or a TOML file (conf/rebalancer.example.toml).
"""

from __future__ import annotations

import sys

from rebalancer_spark.shutdown import exit_process
from rebalancer_spark.spark.ingest import run_ingest
from rebalancer_spark.spark.jobs import JobContext, job_main


def loop(ctx: JobContext) -> str:
    stats = run_ingest(ctx.spark, ctx.node, ctx.stop)
    return f"{stats.batches} batches, {stats.files} files, {stats.fenced} fenced"


def main(argv: list[str]) -> int:
    return job_main(argv, "ingest_files.py", loop, schemes=("file",))


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))
