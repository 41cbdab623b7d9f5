"""Replay seeds of the simulator::

    python -m rebalancer_spark.testing.sim --seed 42 --protocol cooperative -v
    python -m rebalancer_spark.testing.sim --seeds 0:2000 --protocol global_barrier

Exits 1 if any seed breaks an invariant, printing each failure with its replay command.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from rebalancer_spark.core.config import ProtocolName
from rebalancer_spark.testing.sim.world import SimConfig, simulate


def _seeds(text: str) -> range:
    first, _, last = text.partition(":")
    return range(int(first), int(last)) if last else range(int(first), int(first) + 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rebalancer_spark.testing.sim")
    parser.add_argument("--seed", type=int, help="run this one seed")
    parser.add_argument("--seeds", default="0:100", help="a range FIRST:END (default 0:100)")
    parser.add_argument(
        "--protocol", choices=[p.value for p in ProtocolName], default="cooperative"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print the event trace")
    args = parser.parse_args(argv)
    seeds = range(args.seed, args.seed + 1) if args.seed is not None else _seeds(args.seeds)
    config = SimConfig(protocol=ProtocolName(args.protocol))
    started = time.monotonic()
    failed = 0
    for seed in seeds:
        result = simulate(seed, config, trace=args.verbose)
        if args.verbose:
            print("\n".join(result.trace))
            print("faults:", ", ".join(sorted(result.faults)))
        if result.violation is not None:
            failed += 1
            print(result.violation)
    print(
        f"{len(seeds)} seeds of {args.protocol} in {time.monotonic() - started:.1f} s: "
        f"{failed} failed"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
