"""A user pipeline written only against the documented API (docs/spark.md, "Inside the
driver"): its own flag next to ours, batches of the files this job owns, a transformation,
the fenced Delta output. The tests run it under joins, leaves and kills.

    spark-submit tests/pipelines/filtered_ingest.py --group g --source file:///landing/ \\
        --output /lake/bronze --min-value 2 [every other rebalancer option]
"""

from __future__ import annotations

import argparse
import sys

from rebalancer_spark.shutdown import exit_process
from rebalancer_spark.spark import JobContext, batches, job_main


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--min-value", type=int, default=0, help="keep rows with value >= this")


def loop(ctx: JobContext) -> str:
    written = 0
    while not ctx.stop.is_set():
        worked = False
        for batch in batches(ctx.spark, ctx.node):
            with batch:
                df = batch.read().where(f"value >= {int(ctx.args.min_value)}")
                batch.write(df.withColumn("doubled", df["value"] * 2))
            worked = worked or batch.outcome in ("written", "landed")
            written += batch.outcome == "written"
        if not worked:
            ctx.stop.wait(ctx.job.poll_interval)
    return f"{written} batches written"


if __name__ == "__main__":
    exit_process(
        job_main(
            sys.argv[1:], "filtered_ingest.py", loop, schemes=("file",), add_arguments=add_arguments
        )
    )
