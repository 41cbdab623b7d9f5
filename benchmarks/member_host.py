"""Member processes for the scale benchmark, where ``member_process``'s command line falls short.

    python benchmarks/member_host.py one --resources-file F -- <member_process arguments>
    python benchmarks/member_host.py threads --group G --backend URL --members m1,m2 \
        --log-dir D [--resources-file F] [--option session_timeout=10]

* ``one``: exactly ``rebalancer_spark.testing.member_process``, with the resource ids read from
  a file (one per line) instead of ``--resources a,b,…``: 100,000 ids do not fit in one
  command-line argument (Linux caps one at 128 KiB).
* ``threads``: several members as threads of this one process, each a
  :class:`~rebalancer_spark.member.Member` with its own backend connection, appending its
  ownership events to ``D/<member id>.jsonl`` in ``member_process``'s trail format. They commit
  no progress. The first member named gets the resource list and starts first; the others then
  start eight at a time. Prints ``ready`` once every member joined; SIGTERM makes them all
  leave gracefully (drain), at once.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from rebalancer_spark.core.config import MemberConfig
from rebalancer_spark.member import Member, default_backend_url
from rebalancer_spark.shutdown import stop_on_signals
from rebalancer_spark.testing import member_process
from rebalancer_spark.testing.member_process import Trail

STARTING_AT_ONCE = 8


def read_ids(path: str) -> list[str]:
    return [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line]


def one(argv: Sequence[str]) -> int:
    args = list(argv)
    if len(args) < 2 or args[0] != "--resources-file":
        print("usage: member_host.py one --resources-file F -- <member_process args>")
        return 2
    ids = read_ids(args[1])
    rest = args[3:] if args[2:3] == ["--"] else args[2:]
    return member_process.main([*rest, "--resources", ",".join(ids)])


def threads(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="member_host.py threads")
    parser.add_argument("--group", required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--members", required=True, help="comma-separated member ids")
    parser.add_argument("--log-dir", required=True, type=Path)
    parser.add_argument("--resources-file", default=None)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    ids = args.members.split(",")
    resources = read_ids(args.resources_file) if args.resources_file else None
    stop = threading.Event()
    stop_on_signals(stop, signal.SIGTERM)
    options: dict[str, object] = dict(o.split("=", 1) for o in args.option)
    with ExitStack() as files:
        members: list[Member] = []
        trails: dict[str, Trail] = {}
        for k, member_id in enumerate(ids):
            stream = files.enter_context(
                (args.log_dir / f"{member_id}.jsonl").open("a", encoding="utf-8")
            )
            config = MemberConfig.from_mapping(
                {**options, "group": args.group, "member_id": member_id, "backend": args.backend},
                default_backend=default_backend_url(),
            )
            trail = trails[member_id] = Trail(stream)
            member = Member(config, resources=resources if k == 0 else None, event_sinks=[trail])
            members.append(member)
        # The first member brings the resource list; the rest join STARTING_AT_ONCE at a time
        # (99 connections opened in the same instant time out on two loaded cores).
        members[0].start()
        with ThreadPoolExecutor(max_workers=STARTING_AT_ONCE) as pool:
            list(pool.map(Member.start, members[1:]))
        for member in members:
            trails[member.member_id].write(
                {"kind": "started", "member_id": member.member_id, "at": time.time()}
            )
        print("ready", flush=True)
        stop.wait()
        with ThreadPoolExecutor(max_workers=len(members)) as pool:
            list(pool.map(Member.stop, members))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["one"]:
        return one(args[1:])
    if args[:1] == ["threads"]:
        return threads(args[1:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
