"""How long the assignors take and how much they move, at the scale the product promises.

    python benchmarks/bench_assignor.py            # 100,000 resources x 100 members
    python benchmarks/bench_assignor.py --quick    # 10,000 x 20, for a smoke run

Prints one row per case: the median wall time over ``--runs`` runs (time.perf_counter), the
resources moved (as counted by ``moved``) and the fewest any count-balanced assignment could
move (``minimum_moves``, defined for equal weights; "-" for the weighted cases), and the
resources handed over to another owner, those of a departed member included. Round robin, the
non-sticky baseline, runs on the same inputs for comparison; "coordinator's plan" is what the
coordinator calls (``control.plan_target`` with the default control record, around sticky).
Resource ids are inserted in a shuffled order so that sorting them costs what it costs on
unsorted input.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Collection, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rebalancer_spark.core.assignors import (
    Assignment,
    Assignor,
    minimum_moves,
    moved,
    round_robin,
    sticky_balanced,
)
from rebalancer_spark.core.control import Control, plan_target


@dataclass(frozen=True)
class Case:
    name: str
    assignor: Assignor
    members: list[str]
    resources: Mapping[str, float]
    previous: Mapping[str, AbstractSet[str]]
    weighted: bool


def build_cases(n_members: int, n_resources: int, seed: int) -> list[Case]:
    rnd = random.Random(seed)
    members = [f"spark-app-{i:03d}" for i in range(n_members)]
    ids = [f"s3://lake/raw/orders/part={i:06d}/" for i in range(n_resources)]
    rnd.shuffle(ids)
    equal = dict.fromkeys(ids, 1.0)
    weighted = {r: rnd.uniform(0.1, 10.0) for r in ids}
    without_last = members[:-1]
    without_middle = members[: n_members // 2] + members[n_members // 2 + 1 :]
    eq_before_join = sticky_balanced(without_last, equal, {})
    eq_full = sticky_balanced(members, equal, {})
    w_before_join = sticky_balanced(without_last, weighted, {})
    w_full = sticky_balanced(members, weighted, {})
    return [
        Case("sticky, from scratch", sticky_balanced, members, equal, {}, False),
        Case("sticky, 1 join", sticky_balanced, members, equal, eq_before_join, False),
        Case("sticky, 1 leave", sticky_balanced, without_middle, equal, eq_full, False),
        Case("sticky weighted, from scratch", sticky_balanced, members, weighted, {}, True),
        Case("sticky weighted, 1 join", sticky_balanced, members, weighted, w_before_join, True),
        Case("sticky weighted, 1 leave", sticky_balanced, without_middle, weighted, w_full, True),
        Case("coordinator's plan, 1 join", _plan, members, equal, eq_before_join, False),
        Case("round_robin, from scratch", round_robin, members, equal, {}, False),
        Case("round_robin, 1 join", round_robin, members, equal, eq_before_join, False),
    ]


def _plan(
    members: Collection[str],
    resources: Mapping[str, float],
    previous: Mapping[str, AbstractSet[str]],
) -> Assignment:
    """The coordinator's plan under the default control record."""
    return plan_target(sticky_balanced, members, resources, previous, Control())


def run(case: Case, runs: int) -> tuple[float, Assignment]:
    times = []
    result: Assignment = {}
    for _ in range(runs):
        start = time.perf_counter()
        result = case.assignor(case.members, case.resources, case.previous)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000.0, result


def handed_over(previous: Mapping[str, AbstractSet[str]], current: Assignment) -> int:
    """Resources whose owner changed, departed owners included: each one stops and restarts."""
    before = {r: m for m, rs in previous.items() for r in rs}
    return sum(1 for m, rs in current.items() for r in rs if before.get(r, m) != m)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="10,000 resources x 20 members")
    parser.add_argument("--runs", type=int, default=7, help="runs per case (median reported)")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    n_members, n_resources = (20, 10_000) if args.quick else (100, 100_000)

    rows = [("case", "members", "resources", "median ms", "moved", "minimum moves", "handed over")]
    for case in build_cases(n_members, n_resources, args.seed):
        ms, result = run(case, args.runs)
        minimum = (
            "-"
            if case.weighted
            else f"{minimum_moves(case.members, case.resources, case.previous):,}"
        )
        rows.append(
            (
                case.name,
                str(len(case.members)),
                f"{len(case.resources):,}",
                f"{ms:.1f}",
                f"{moved(case.previous, result):,}",
                minimum,
                f"{handed_over(case.previous, result):,}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        print("  ".join(cells))
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print(f"\nmedian of {args.runs} runs, Python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
