"""Progress of a file resource at 1,000,000 files: record size, planning/committing throughput,
and the cost of picking up one new file, without Spark.

    nice -n 10 python benchmarks/bench_file_progress.py                 # 1,000,000 files
    nice -n 10 python benchmarks/bench_file_progress.py --files 20000   # a quick run

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


def _source(member: Member, source: FileShareSource, history: FileHistory, batch: int) -> Any:
    deadline = time.monotonic() + 30
    while (owned := member.owns("d")) is None:
        if time.monotonic() > deadline:
            raise SystemExit("the member did not get the resource within 30 s")
        time.sleep(0.05)

    def owns(r: str, epoch: int) -> bool:
        now = member.owns(r)
        return now is not None and now.epoch == epoch

    session = member.session
    return AssignedSource(
        group=member.group,
        resource="d",
        epoch=owned.epoch,
        progress=owned.progress,
        source=source,
        commit=lambda r, v, e: member.commit(r, v, epoch=e),
        owns=owns,
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
    args = parser.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-file-progress-"))
    try:
        run(work, args.files, args.per_dir, args.batch)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


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
        t0 = time.perf_counter()
        fresh = _source(member, source, FileHistory(str(work / "history"), "bench"), batch)
        again = fresh.pending()
        print(
            f"a new owner's first listing (history read above the floor): "
            f"{[f.name for f in again]} in {(time.perf_counter() - t0) * 1000:.0f} ms"
        )
    finally:
        member.stop(drain=False)


if __name__ == "__main__":
    main()
