"""Reference job: ingest the files of a shared directory, split between the jobs of a group.

    spark-submit jobs/ingest_files.py --group orders --source file:///landing/orders/ \\
        --output /lake/bronze/orders --audit /lake/audit/ownership [--backend URL] ...

Each sub-directory of --source is a resource; every file lands in --output exactly once, under
resource=<dir>/batch=<n>/. SIGTERM (or Ctrl-C) drains this job's directories to the others
and stops. With --once the job stops by itself once the group has nothing pending (for a
scheduler: exit 0, or 1 when a resource is stuck; docs/spark.md). Exit 3 when the Spark JVM
died under it, 4 when its member thread failed (the member left the group for good; restart
the job). `--help` lists every
option; they may also come from spark.rebalancer.* conf keys or a TOML file
(conf/rebalancer.example.toml).
"""

from __future__ import annotations

import argparse
import sys

from rebalancer_spark.shutdown import exit_process
from rebalancer_spark.spark.ingest import run_ingest
from rebalancer_spark.spark.jobs import JobContext, job_main


def options(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--once",
        action="store_true",
        help="process what is pending, then stop once the whole group has nothing pending "
        "(exit 0; 1 if a resource is stuck): for a scheduled run",
    )


def loop(ctx: JobContext) -> str | tuple[str, int]:
    once = bool(ctx.args.once)
    stats = run_ingest(ctx.spark, ctx.node, ctx.stop, once=once)
    summary = f"{stats.batches} batches, {stats.files} files, {stats.fenced} fenced"
    if stats.stuck:
        stuck = "; ".join(f"{r}: {why}" for r, why in stats.stuck.items())
        return f"{summary}; stuck: {stuck}", 1
    return summary


def main(argv: list[str]) -> int:
    return job_main(argv, "ingest_files.py", loop, schemes=("file",), add_arguments=options)


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))
