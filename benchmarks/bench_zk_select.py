"""What one wait of a kazoo connection loop costs: kazoo's ``selector_select`` against the
backend's ``poll_select``, side by side in one process.

    python benchmarks/bench_zk_select.py                    # 3 rounds of 20,000 calls each
    python benchmarks/bench_zk_select.py --calls 100000 --rounds 5

Each kazoo client runs a connection thread that waits on its socket and a wake-up socket once
per packet it sends or receives; in a 100-member group every member's session has one. Here the
two functions are called alternately on a socket pair with data waiting (so no call blocks), the
way the connection loop calls them (two sockets to read), and the microseconds per call printed,
each round's figure and the median.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kazoo.handlers.utils import selector_select

from rebalancer_spark.backends.zookeeper.store.client import poll_select


def per_call(select: Callable[..., Any], rlist: list[socket.socket], calls: int) -> float:
    """Microseconds per call of ``select(rlist, [], [], 0.5)``."""
    started = time.perf_counter()
    for _ in range(calls):
        select(rlist, [], [], 0.5)
    return (time.perf_counter() - started) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=20_000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, alternated")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.rounds < 1:
        parser.error("--calls and --rounds take whole numbers of at least 1")
    a, b = socket.socketpair()
    wake, waker = socket.socketpair()
    b.send(b"x")  # a stays readable: every call returns at once
    kazoo, ours = "selector_select (kazoo)", "poll_select"
    figures: dict[str, list[float]] = {kazoo: [], ours: []}
    try:
        for _ in range(args.rounds):
            figures[kazoo].append(per_call(selector_select, [a, wake], args.calls))
            figures[ours].append(per_call(poll_select, [a, wake], args.calls))
    finally:
        for sock in (a, b, wake, waker):
            sock.close()
    for name, values in figures.items():
        rounds = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name:24s} median {statistics.median(values):6.1f} us per call  ({rounds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
