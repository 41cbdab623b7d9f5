"""A deterministic simulator of the rebalance protocols; see docs/simulation.md."""

from rebalancer_spark.testing.sim.member import MemberBugs
from rebalancer_spark.testing.sim.store import StoreBugs
from rebalancer_spark.testing.sim.world import (
    SimConfig,
    SimResult,
    Violation,
    replay_command,
    simulate,
)

__all__ = [
    "MemberBugs",
    "SimConfig",
    "SimResult",
    "StoreBugs",
    "Violation",
    "replay_command",
    "simulate",
]
