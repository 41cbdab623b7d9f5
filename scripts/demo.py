"""The demo: three concurrent spark-submit jobs in one group on the embedded SQLite backend.

Run it through scripts/demo.sh, which sets everything up first.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from rebalancer_spark.shutdown import exit_process
from rebalancer_spark.testing.spark_demo import run_demo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default="demo-output", help="fresh directory for the run")
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--dirs", type=int, default=12)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--backend", default=None, help="default: an SQLite file in --workdir")
    args = parser.parse_args()
    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    report = run_demo(
        workdir, jobs=args.jobs, dirs=args.dirs, files=args.files, backend=args.backend
    )
    shutil.rmtree(workdir / "spark-local", ignore_errors=True)  # the killed job's scratch
    print(f"\nlogs of every job in {workdir / 'logs'}; output in {workdir / 'output'}")
    return 0 if report.audit_ok and report.exactly_once else 1


if __name__ == "__main__":
    exit_process(main())
