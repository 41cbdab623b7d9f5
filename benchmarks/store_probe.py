"""How long a store takes to answer one small read while a benchmark loads it.

    python benchmarks/store_probe.py URL GROUP OUT [--interval 0.05]

Opens its own backend handle on ``URL`` and reads ``GROUP``'s control record
(:meth:`Backend.control`: one small read, whatever the members and resources) every
``--interval`` seconds until it gets SIGTERM or SIGINT; then writes to ``OUT`` a JSON object:
how many reads it made, how many failed (``BackendError``: a timeout, the server gone), and
the longest, the 99th percentile and the median of their times (a failed read's included), in
seconds. ``bench_scale.py`` runs it
during a cell's start-up: a Redis server kept busy by many followers reading a new resource set
at once answered the member that had declared it after its 5 s command timeout (session 27).

What it measures includes this process's own wait for a core on a loaded machine: a long answer
is the store's or the machine's, and the median says how loaded the machine was.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rebalancer_spark.backends import open_backend
from rebalancer_spark.core.errors import BackendError


def summary(answers: list[float], failures: int) -> dict[str, float | int | None]:
    """The figures ``OUT`` holds (None where no read answered)."""
    ordered = sorted(answers)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else None
    return {
        "reads": len(ordered),
        "failures": failures,
        "longest_s": ordered[-1] if ordered else None,
        "p99_s": p99,
        "median_s": statistics.median(ordered) if ordered else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("group")
    parser.add_argument("out", type=Path)
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between reads")
    args = parser.parse_args(argv)
    stop = threading.Event()

    def stopping(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    answers: list[float] = []
    failures = 0
    backend = open_backend(args.url)
    try:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                backend.control(args.group)
            except BackendError:
                failures += 1
            answers.append(time.perf_counter() - started)  # a failure's wait counts too
            stop.wait(args.interval)
    finally:
        backend.close()
        args.out.write_text(json.dumps(summary(answers, failures)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
