"""Ingest throughput: one job, three concurrent jobs of one group, and a plain Spark Structured
Streaming file source, on the same input, each from a cold start to its exit.

    python benchmarks/bench_ingest_throughput.py                     # 6 dirs x 100 files x 100 rows
    python benchmarks/bench_ingest_throughput.py --dirs 12 --files 200 --rows 1000

The input is a file share of ``--dirs`` sub-directories (the resources) of ``--files`` CSV files
of ``--rows`` rows each. Each run starts from an empty output and store:

* ``1 job``: ``spark-submit jobs/ingest_files.py --once`` (SQLite store, fenced Delta output,
  files history), until it exits by itself;
* ``3 jobs``: three such spark-submit applications of one group at once, until the last exits;
* ``structured streaming``: one ``spark-submit`` of a plain query,
  ``readStream.format("csv").load(landing/*/)`` → ``writeStream.format("delta")`` with
  ``trigger(availableNow=True)`` and ``maxFilesPerTrigger`` equal to ``--batch``: Spark's own
  file source (one query, no ownership, no fencing), the baseline.

Each is timed from the launch of its processes to their exit (JVM start included, as a
scheduled run pays it), and its output is read back with delta-rs: every input row exactly
once, or the figure is marked. Files/s and rows/s are the input over that time. On a machine
with few cores, three drivers share them: the figure says what concurrency costs or gains here,
not what a cluster would do.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from rebalancer_spark.spark.packages import spark_submit_command  # noqa: E402

CONF = {"spark.ui.enabled": "false", "spark.driver.memory": "1g"}
STREAMING = """
import sys
from pyspark.sql import SparkSession

landing, output, checkpoint, per_trigger = sys.argv[1:5]
spark = SparkSession.builder.appName("plain-structured-streaming").getOrCreate()
rows = (
    spark.readStream.format("csv").schema("id STRING, value INT")
    .option("maxFilesPerTrigger", int(per_trigger)).load(landing.rstrip("/") + "/*/")
)
query = (
    rows.writeStream.format("delta").option("checkpointLocation", checkpoint)
    .trigger(availableNow=True).start(output)
)
query.awaitTermination()
spark.stop()
"""


def generate(landing: Path, dirs: int, files: int, rows: int) -> int:
    """The input: ``dirs`` x ``files`` CSV files of ``rows`` rows with unique ids."""
    for d in range(dirs):
        folder = landing / f"d{d:03d}"
        folder.mkdir(parents=True)
        for f in range(files):
            body = "".join(f"{d}-{f}-{r},{r}\n" for r in range(rows))
            (folder / f"part-{f:05d}.csv").write_text(body)
    return dirs * files * rows


def environment() -> dict[str, str]:
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src")]),
    }


def run_all(commands: list[list[str]], logs: Path, name: str) -> float:
    """Start every command at once; the seconds until the last exited (each must exit 0)."""
    started = time.monotonic()
    procs = []
    for i, command in enumerate(commands):
        log = (logs / f"{name}-{i}.log").open("wb")
        procs.append((subprocess.Popen(command, stdout=log, stderr=log, env=environment()), log))
    for proc, log in procs:
        code = proc.wait(timeout=3600)
        log.close()
        if code != 0:
            raise SystemExit(f"{name}: a process exited with {code}; see {log.name}")
    return time.monotonic() - started


def count(output: Path) -> tuple[int, int]:
    """(rows, distinct ids) of the Delta table at ``output``."""
    from deltalake import DeltaTable

    ids = DeltaTable(str(output)).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    return len(ids), len(set(ids))


def ours(work: Path, landing: Path, jobs: int, args: argparse.Namespace) -> list[list[str]]:
    run = work / f"jobs-{jobs}"
    run.mkdir()
    group = f"bench-{uuid.uuid4().hex[:6]}"
    commands = []
    for i in range(jobs):
        job_args = [
            "--group", group, "--backend", f"sqlite://{run}/groups.db",
            "--member-id", f"job-{i}", "--source", landing.as_uri() + "/",
            "--output", str(run / "output"), "--schema", "id STRING, value INT",
            "--max-files-per-batch", str(args.batch), "--poll-interval", "0.2",
            "--discovery-interval", "1s", "--once",
        ]  # fmt: skip
        commands.append(
            spark_submit_command(
                REPO / "jobs" / "ingest_files.py", *job_args, master=args.master, conf=CONF
            )
        )
    return commands


def streaming(work: Path, landing: Path, args: argparse.Namespace) -> list[list[str]]:
    run = work / "streaming"
    run.mkdir()
    script = run / "plain_streaming.py"
    script.write_text(STREAMING)
    query_args = [landing.as_uri(), str(run / "output"), str(run / "checkpoint"), str(args.batch)]
    return [spark_submit_command(script, *query_args, master=args.master, conf=CONF)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dirs", type=int, default=6, help="sub-directories (resources)")
    parser.add_argument("--files", type=int, default=100, help="files per directory")
    parser.add_argument("--rows", type=int, default=100, help="rows per file")
    parser.add_argument("--batch", type=int, default=100, help="most files per batch/trigger")
    parser.add_argument("--master", default="local[2]", help="each application's master")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        work = Path(tmp)
        landing = work / "landing"
        total = generate(landing, args.dirs, args.files, args.rows)
        files = args.dirs * args.files
        print(
            f"{args.dirs} dirs x {args.files} files x {args.rows} rows = {files} files, "
            f"{total} rows; batch {args.batch}; master {args.master} per application; "
            f"{os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}"
        )
        print(f"{'run':<22} {'seconds':>8} {'files/s':>8} {'rows/s':>9}  output")
        runs = [
            ("1 job", ours(work, landing, 1, args), work / "jobs-1" / "output"),
            ("3 jobs (one group)", ours(work, landing, 3, args), work / "jobs-3" / "output"),
            ("structured streaming", streaming(work, landing, args), work / "streaming/output"),
        ]
        for name, commands, output in runs:
            seconds = run_all(commands, work, name.split()[0] + name.split()[1])
            rows, distinct = count(output)
            once = rows == distinct == total
            verdict = "exactly once" if once else f"{rows} rows, {distinct} ids"
            print(
                f"{name:<22} {seconds:8.1f} {files / seconds:8.1f} {total / seconds:9.0f}  "
                f"{verdict}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
