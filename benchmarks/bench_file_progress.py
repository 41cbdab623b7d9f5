"""Progress of a file resource at 1,000,000 files: record size, planning/committing throughput,
and the cost of picking up one new file, without Spark.

    nice -n 10 python benchmarks/bench_file_progress.py                 # 1,000,000 files
    nice -n 10 python benchmarks/bench_file_progress.py --files 20000   # a quick run
    nice -n 10 python benchmarks/bench_file_progress.py --spark --files 20000  # with Spark

It writes ``--files`` empty files into one resource of a file share (``--per-dir`` per
directory, ``d/h0000/f00000000``: names that sort by arrival), joins a group on SQLite with one
member, and runs the planning and committing of every batch exactly as the ingest job does
(:meth:`AssignedSource.next_batch`, then :meth:`AssignedSource.mark_done`: the plan and the
progress committed, fenced, in the store; the files appended to the file history, a Delta
table) — only the Spark read and the output write are left out (``tests/test_spark_ingest.py``
and ``tests/test_file_progress.py`` cover them with Spark). It prints:

* files/s planned and committed, and the largest progress record the store held (bytes);
* exactly once: rows in the history, distinct names, and the files on disk (all equal);
* with every file processed, one new file: the time of the listing with ``order=name`` (starts
  after the floor) and of a full listing (``order=none``), and what each returned.

With ``--spark`` it runs the real ingest instead (``run_ingest(once=True)``: Spark reads each
batch, one row per file, and writes it to a Delta output), watching the largest progress record
in the store while it runs, and checks the output holds every row once.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rebalancer_spark.core.config import MemberConfig
from rebalancer_spark.core.model import encode_progress
from rebalancer_spark.member import Member
from rebalancer_spark.sources.files import FileShareSource
from rebalancer_spark.spark.file_history import FileHistory
from rebalancer_spark.spark.source import AssignedSource, ReadSettings


def _write_files(root: Path, count: int, per_dir: int) -> float:
    start = time.perf_counter()
    for i in range(count):
        folder = root / f"h{i // per_dir:05d}"
        if i % per_dir == 0:
            folder.mkdir(parents=True)
        os.close(os.open(folder / f"f{i:08d}", os.O_CREAT | os.O_WRONLY, 0o644))
    return time.perf_counter() - start


def _source(
    member: Member,
    source: FileShareSource,
    history: FileHistory,
    batch: int,
    progress: Any = None,
) -> Any:
    deadline = time.monotonic() + 30
    while (owned := member.owns("d")) is None:
        if time.monotonic() > deadline:
            raise SystemExit("the member did not get the resource within 30 s")
        time.sleep(0.05)

    session = member.session
    return AssignedSource(
        group=member.group,
        resource="d",
        epoch=owned.epoch,
        progress=owned.progress if progress is None else progress,
        source=source,
        commit=lambda r, v, e: member.commit(r, v, epoch=e),
        owner=member,
        before_first_read=lambda: None,
        who={"member_id": member.member_id, "session_id": session.session_id if session else ""},
        read=ReadSettings(max_files_per_batch=batch),
        history=history,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--per-dir", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=200, help="max files per batch")
    parser.add_argument("--dir", help="work directory (default: a new temporary one)")
    parser.add_argument("--spark", action="store_true", help="the real ingest, with Spark")
    args = parser.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-file-progress-"))
    try:
        if args.spark:
            run_spark(work, args.files, args.per_dir, args.batch)
        else:
            run(work, args.files, args.per_dir, args.batch)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


def run_spark(work: Path, files: int, per_dir: int, batch: int) -> None:
    """The real ingest of ``files`` one-row CSV files by one job, once."""
    import threading

    import deltalake
    from pyspark.sql import SparkSession

    from rebalancer_spark.backends import open_backend
    from rebalancer_spark.spark.ingest import run_ingest
    from rebalancer_spark.spark.options import JobConfig
    from rebalancer_spark.spark.session import start

    landing = work / "landing" / "d"
    t0 = time.perf_counter()
    for i in range(files):
        folder = landing / f"h{i // per_dir:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{i:08d}.csv").write_text(f"r{i},{i}\n")
    print(f"wrote {files:,} one-row files in {time.perf_counter() - t0:.1f} s")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]").appName("bench-file-progress")
        .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    backend = f"sqlite://{work / 'groups.db'}"
    job = JobConfig(
        member=MemberConfig(group="bench", backend=backend, member_id="job-1",
                            session_timeout=30.0, stability_window=0.02),
        source=f"{(work / 'landing').as_uri()}/?order=name", output=str(work / "out"),
        schema="id STRING, value LONG", max_files_per_batch=batch, poll_interval=0.05,
        discovery_interval=5.0,
    )  # fmt: skip
    node = start(spark, job)
    largest = [0]
    done = threading.Event()

    def watch() -> None:
        with open_backend(backend) as store:
            while not done.wait(0.2):
                for p in store.progress("bench", ["d"]).values():
                    largest[0] = max(largest[0], len(encode_progress("d", p.value).encode()))

    watcher = threading.Thread(target=watch)
    watcher.start()
    t0 = time.perf_counter()
    try:
        stats = run_ingest(spark, node, threading.Event(), once=True)
    finally:
        took = time.perf_counter() - t0
        done.set()
        watcher.join()
        node.stop()
    rows = deltalake.DeltaTable(str(work / "out")).to_pyarrow_table(columns=["id"])
    ids = rows.column("id").to_pylist()
    print(
        f"Spark ingest of {files:,} files in {stats.batches:,} batches of up to {batch}: "
        f"{took:.1f} s, {files / took:,.0f} files/s; largest progress record seen "
        f"{largest[0]} bytes; output: {len(ids):,} rows, {len(set(ids)):,} distinct"
    )
    spark.stop()


def run(work: Path, files: int, per_dir: int, batch: int) -> None:
    landing = work / "landing"
    took = _write_files(landing / "d", files, per_dir)
    print(f"wrote {files:,} empty files in {took:.1f} s ({per_dir} per directory)")
    config = MemberConfig(
        group="bench", backend=f"sqlite://{work / 'groups.db'}", member_id="m1",
        session_timeout=30.0, stability_window=0.02,
    )  # fmt: skip
    member = Member(config, resources=["d"]).start()
    try:
        source = FileShareSource(f"{landing.as_uri()}/?order=name")
        history = FileHistory(str(work / "history"), "bench")
        src = _source(member, source, history, batch)
        largest, batches = 0, 0
        start = time.perf_counter()
        while (planned := src.next_batch(None)) is not None:
            largest = max(largest, len(encode_progress("d", src.progress).encode()))
            src.mark_done(planned.planned)
            largest = max(largest, len(encode_progress("d", src.progress).encode()))
            batches += 1
            if batches % 500 == 0:
                rate = batches * batch / (time.perf_counter() - start)
                print(f"  {batches:,} batches, {src.progress['files']:,} files, {rate:,.0f}/s")
        took = time.perf_counter() - start
        done = int(src.progress["files"])
        print(
            f"planned and committed {done:,} files in {batches:,} batches of up to {batch}: "
            f"{took:.1f} s, {done / took:,.0f} files/s; largest progress record {largest} bytes"
        )
        import deltalake

        table = deltalake.DeltaTable(str(work / "history")).to_pyarrow_table(columns=["name"])
        names = table.column("name").to_pylist()
        print(
            f"exactly once: {len(names):,} history rows, {len(set(names)):,} distinct names, "
            f"{files:,} files on disk"
        )
        last = landing / "d" / f"h{(files - 1) // per_dir:05d}"
        (last / f"f{files:08d}").touch()
        t0 = time.perf_counter()
        new = src.pending()
        t_name = time.perf_counter() - t0
        t0 = time.perf_counter()
        every = source.files("d")
        t_full = time.perf_counter() - t0
        print(
            f"one new file after {done:,}: order=name listing found {[f.name for f in new]} in "
            f"{t_name * 1000:.1f} ms; a full listing (order=none) lists {len(every):,} files in "
            f"{t_full * 1000:.0f} ms"
        )
        for what, record in (("the record its grant carries", src.progress),
                             ("no record: the whole history", None)):  # fmt: skip
            t0 = time.perf_counter()
            history = FileHistory(str(work / "history"), "bench")
            fresh = _source(member, source, history, batch, record)
            again = fresh.pending()
            took = (time.perf_counter() - t0) * 1000
            print(
                f"a new owner's first listing ({what}): {len(again)} pending, "
                f"{[f.name for f in again][:1]} first, in {took:.0f} ms"
            )
    finally:
        member.stop(drain=False)


if __name__ == "__main__":
    main()
