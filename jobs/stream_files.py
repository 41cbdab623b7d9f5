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

import sys

from rebalancer_spark.core.errors import RebalancerError
from rebalancer_spark.shutdown import exit_process
from rebalancer_spark.spark.job_config import JobConfig
from rebalancer_spark.spark.jobs import JobContext, job_main
from rebalancer_spark.spark.streaming import StreamManager


def check(job: JobConfig) -> None:
    if job.checkpoint_root is None:
        raise RebalancerError(
            "stream_files.py needs --checkpoint-root PATH, on storage every job of the group "
            "reaches at the same path"
        )


def loop(ctx: JobContext) -> str:
    assert ctx.job.checkpoint_root is not None  # check() ran
    streams = StreamManager(
        ctx.spark, ctx.node, checkpoint_root=ctx.job.checkpoint_root, output=ctx.output
    )
    stats = streams.run(ctx.stop)
    return f"{stats.started} queries started, {stats.stopped} stopped, {stats.failed} failed"


def main(argv: list[str]) -> int:
    return job_main(argv, "stream_files.py", loop, schemes=("file",), check=check)


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))
