"""What Spark's Delta and S3 jars cost: the fetch, and a SparkSession's start-up with them.

    python benchmarks/bench_spark_jars.py            # 3 runs of each start-up
    python benchmarks/bench_spark_jars.py --runs 1

Prints the time of ``python -m rebalancer_spark.spark.packages fetch`` when the cache is full
(the first fetch is timed by the set-up and printed by the same command), then, over
``--runs`` rounds of fresh Python processes (the cases interleaved, so that the load of a
shared machine weighs on each alike), the median wall time from before
``SparkSession.builder`` to the end of one small query, for a session (local[2], UI off):

* ``plain``: pyspark alone (no Delta, no s3a);
* ``spark.jars``: the fetched jars by path, as :func:`packages.spark_conf` gives them;
* ``spark.jars.packages``: the same coordinates resolved by Ivy from the filled cache at every
  start (what ``configure_spark_with_delta_pip`` and ``--packages`` do);

and, for the two sessions with Delta, the time to then write and read back a 10-row Delta
table (the first Delta use of a process: class loading included).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rebalancer_spark.spark import packages

_SESSION = """\
import sys, time
started = time.perf_counter()
from pyspark.sql import SparkSession
builder = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
for item in sys.argv[2:]:
    key, _, value = item.partition("=")
    builder = builder.config(key, value)
spark = builder.getOrCreate()
assert spark.range(10).count() == 10
up = time.perf_counter()
delta = 0.0
if sys.argv[1] == "delta":
    spark.range(10).write.format("delta").save(sys.argv[0] + ".table")
    assert spark.read.format("delta").load(sys.argv[0] + ".table").count() == 10
    delta = time.perf_counter() - up
print(up - started, delta)
spark.stop()
"""


def _start(tmp: Path, n: int, what: str, conf: dict[str, str]) -> tuple[float, float]:
    script = tmp / f"session-{n}.py"
    script.write_text(_SESSION)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    args = [f"{k}={v}" for k, v in conf.items()]
    done = subprocess.run(
        [sys.executable, str(script), what, *args],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    up, delta = done.stdout.strip().splitlines()[-1].split()
    return float(up), float(delta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    packages.fetch()
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "rebalancer_spark.spark.packages", "fetch"],
        check=True,
        capture_output=True,
    )
    print(f"fetch, cache full: {time.perf_counter() - started:.2f} s")
    delta_conf = {k: v for k, v in packages.spark_conf().items() if k != "spark.jars"}
    by_packages = {
        "spark.jars.packages": ",".join(packages.PACKAGES),
        "spark.jars.ivy": str(packages.ivy_dir()),
        **delta_conf,
    }
    cases = [
        ("plain", "range", {}),
        ("spark.jars", "delta", packages.spark_conf()),
        ("spark.jars.packages", "delta", by_packages),
    ]
    ups: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    deltas: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    with tempfile.TemporaryDirectory(prefix="bench-jars-") as tmp:
        n = 0
        for _ in range(args.runs):
            for name, what, conf in cases:
                n += 1
                up, delta = _start(Path(tmp), n, what, conf)
                ups[name].append(up)
                deltas[name].append(delta)
    print(f"{'session':22} {'start-up s':>10} {'runs':>18} {'Delta write+read s':>19}")
    for name, what, _ in cases:
        shown = " ".join(f"{t:.1f}" for t in ups[name])
        shown_delta = f"{statistics.median(deltas[name]):.1f}" if what == "delta" else "-"
        print(f"{name:22} {statistics.median(ups[name]):10.1f} {shown:>18} {shown_delta:>19}")


if __name__ == "__main__":
    main()
