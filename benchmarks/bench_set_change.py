"""What a change of a large resource set costs its readers: the changes alone against the set
whole, side by side in one run, on every backend.

    python benchmarks/bench_set_change.py                      # 100,000 ids, 20 followers
    python benchmarks/bench_set_change.py --resources 10000 --followers 8 --repeats 5

A group's set of ``--resources`` ids is declared once; ``--followers`` backend handles (each
its own connection, as the members of separate jobs are) remember it whole, and one coordinator
handle keeps it (``Backend.resources``). Then, ``--repeats`` times, a listing adds ``--added``
new ids and drops as many (``update_resources(replace=...)``, as discovery writes it), and each
follower remembers the new set, one after the other, alternately by its changes
(``remember_resources(group, since)``: what a follower does since session 29) and whole
(``remember_resources(group)``: what every follower did before), each way after a change of
its own; so does the coordinator (``resources(group, known)`` against ``resources(group)``),
and so does the writer (``update_resources(group, replace=..., known=...)``, the set it wrote
last as its ``known``: what the coordinator's listing does since session 29, against the
listing alone).

Printed per backend and way: the median and the longest time of one follower's read, the
coordinator's read, and what the store's own counters saw for all the followers' reads
together (``store_counters.py``: Redis commands and bytes sent, ZooKeeper packets and bytes
received; SQLite has no counter of reads), and the writer's ``update_resources`` time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.servers
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench_scale import Servers, counters_for
from rebalancer_spark.backends import open_backend
from rebalancer_spark.core.model import Resource
from store_counters import StoreCounters

WAYS = ("changes", "whole")


def _ids(first: int, count: int) -> list[Resource]:
    return [Resource(f"s3://bucket/prefix-{i:07d}/") for i in range(first, first + count)]


def _measure(
    url: str, counters: StoreCounters | None, args: argparse.Namespace
) -> dict[str, dict[str, list[float]]]:
    group = f"set-change-{uuid.uuid4().hex[:8]}"
    writer = open_backend(url)
    coordinator = open_backend(url)
    followers = [open_backend(url) for _ in range(args.followers)]
    handles = [writer, coordinator, *followers]
    try:
        listing = _ids(0, args.resources)
        version = writer.update_resources(group, replace=listing)
        previous = listing
        kept = coordinator.resources(group)
        versions = [f.remember_resources(group) for f in followers]
        out: dict[str, dict[str, list[float]]] = {
            w: {"follower s": [], "coordinator s": [], "writer s": []} for w in WAYS
        }
        nxt = args.resources
        for r in range(args.repeats):
            for way in WAYS if r % 2 == 0 else reversed(WAYS):
                listing = listing[args.added :] + _ids(nxt, args.added)
                nxt += args.added
                known = (version, {r.id: r for r in previous}) if way == "changes" else None
                t0 = time.perf_counter()
                version = writer.update_resources(group, replace=listing, known=known)
                out[way]["writer s"].append(time.perf_counter() - t0)
                previous = listing
                before = counters.snapshot() if counters else None
                for k, f in enumerate(followers):
                    t0 = time.perf_counter()
                    since = versions[k] if way == "changes" else None
                    versions[k] = f.remember_resources(group, since)
                    out[way]["follower s"].append(time.perf_counter() - t0)
                    assert versions[k] == version, (versions[k], version)
                if counters is not None and before is not None:
                    for name, value in counters.delta(before, counters.snapshot()).items():
                        if value is not None:
                            out[way].setdefault(f"all followers: {name}", []).append(value)
                t0 = time.perf_counter()
                kept = coordinator.resources(group, kept if way == "changes" else None)
                out[way]["coordinator s"].append(time.perf_counter() - t0)
                assert kept[0] == version and len(kept[1]) == args.resources
        remembered = {r.id for r in followers[-1].epochs.resources(group)}
        assert remembered == {r.id for r in listing}, "a follower remembers another set"
        return out
    finally:
        for h in handles:
            h.close()


def _show(backend: str, figures: dict[str, dict[str, list[float]]]) -> None:
    for way in WAYS:
        parts = []
        for name, values in figures[way].items():
            if name.endswith(" s"):
                parts.append(
                    f"{name[:-2]} median {statistics.median(values) * 1000:.1f} ms "
                    f"(max {max(values) * 1000:.1f})"
                )
            else:
                parts.append(f"{name} median {statistics.median(values):,.0f}")
        print(f"{backend:10} {way:8} " + "; ".join(parts), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backends", default="sqlite,zookeeper,redis")
    parser.add_argument("--resources", type=int, default=100_000)
    parser.add_argument("--followers", type=int, default=20)
    parser.add_argument("--added", type=int, default=10, help="ids added and dropped per change")
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args(argv)
    print(
        f"{args.resources:,} ids, {args.followers} followers, {args.added} ids added and "
        f"{args.added} dropped per change, {args.repeats} changes per way",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench_set_change-") as tmp:
        servers = Servers(Path(tmp))
        try:
            for backend in args.backends.split(","):
                url_of: Callable[[], str] = (
                    (lambda: f"sqlite://{tmp}/groups.db")
                    if backend == "sqlite"
                    else (lambda b=backend: servers.url(b))  # type: ignore[misc]
                )
                url = url_of()
                _show(backend, _measure(url, counters_for(url), args))
        finally:
            servers.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
