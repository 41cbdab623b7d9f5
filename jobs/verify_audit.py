"""Prove from the Delta audit table that no resource ever had two owners at once and that every
resource's epoch chain is unbroken.

    spark-submit jobs/verify_audit.py --audit PATH [--output TABLE] [--group G] [--tolerance 0.0]
        [--history]
    python jobs/verify_audit.py --audit PATH [--output TABLE] [--group G] [--tolerance 0.0]
        [--history] [--spark]

Prints the ownership history (with ``--history``: a Spark ``show()`` under spark-submit or with
``--spark``, plain lines otherwise), then the verdict, then (with ``--output``) the output
check's verdict (docs/audit.md). Exit status: 0 when no resource had two owners at once, no
link of an epoch chain is broken and the output passed, 1 when a check failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import os
import sys

from pyspark.sql import SparkSession

from rebalancer_spark.audit import history, load_events, read_audit, verify_events
from rebalancer_spark.audit.output_check import verify_output
from rebalancer_spark.core.errors import RebalancerError
from rebalancer_spark.shutdown import exit_process


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verify_audit.py", description=__doc__.split("\n\n", 1)[0]
    )
    parser.add_argument("--audit", required=True, metavar="PATH", help="the audit table's path")
    parser.add_argument("--group", help="verify this group only (default: every group)")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="overlap allowed for clock skew between hosts (default: 0)",
    )
    parser.add_argument(
        "--output", metavar="TABLE", help="also check this output Delta table's commits"
    )
    parser.add_argument("--history", action="store_true", help="print every ownership event")
    parser.add_argument(
        "--spark", action="store_true", help="show the history with Spark (implied by spark-submit)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        events = load_events(args.audit, group=args.group)
        verdict = verify_events(events, tolerance=args.tolerance)
        output = (
            None
            if args.output is None
            else verify_output(args.audit, args.output, group=args.group, tolerance=args.tolerance)
        )
    except (RebalancerError, ValueError) as exc:
        print(f"verify_audit.py: error: {exc}", file=sys.stderr)
        return 2
    if args.history and (args.spark or "PYSPARK_GATEWAY_PORT" in os.environ):
        spark = SparkSession.builder.appName("rebalancer-spark verify-audit").getOrCreate()
        try:
            frame = read_audit(spark, args.audit, group=args.group).orderBy("at", "resource")
            frame.show(max(len(events), 1), truncate=False)
        finally:
            spark.stop()
    elif args.history:
        print("\n".join(history(events)))
    print(verdict.report())
    if output is not None:
        print(output.report())
    return 0 if verdict.ok and (output is None or output.ok) else 1


if __name__ == "__main__":
    exit_process(main())
