"""The operator in the simulated world: commands that change a group's control record (pause,
drain, pin, imbalance threshold, rebalance) as ``rebalancer-spark`` does, and the check that
every target planned under such a record keeps to it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rebalancer_spark.core.control import Control, ControlMode
from rebalancer_spark.core.errors import BackendUnavailable
from rebalancer_spark.core.model import Target

if TYPE_CHECKING:
    from rebalancer_spark.testing.sim.world import World

__all__ = ["control_breach", "operator_fault", "shapes"]


def shapes(control: Control, present: set[str], resources: set[str]) -> bool:
    """Whether ``control`` changes what the assignor alone would publish for ``present``."""
    return (
        control.mode is ControlMode.PAUSED
        or bool(control.drain & present)
        or any(m in present and r in resources for r, m in control.pins.items())
        or control.imbalance_threshold > 0
    )


def control_breach(
    target: Target, previous: dict[str, set[str]], present: set[str], control: Control
) -> str | None:
    """How a target planned under an operator's control record breaks it, or None: it must
    give no resource twice, nothing to a drained member, pinned resources to their member,
    and move nothing owned while paused."""
    assignment, generation = target.assignment, target.generation
    owners = {r: m for m, rs in assignment.items() for r in rs}
    if sum(len(rs) for rs in assignment.values()) != len(owners):
        return f"generation {generation} gives a resource twice: {assignment}"
    if control.mode is ControlMode.PAUSED:
        held = {r: m for m in sorted(present, reverse=True) for r in previous.get(m, ())}
        for r, m in held.items():
            if r in owners and owners[r] != m:
                return (
                    f"generation {generation} moved {r!r} from {m} to {owners[r]} while the "
                    f"group was paused ({control.describe()})"
                )
        return None
    for m in control.drain & present:
        if assignment.get(m):
            return f"generation {generation} gives drained member {m} {sorted(assignment[m])}"
    for r, m in control.pins.items():
        if m in present and m not in control.drain and r in owners and owners[r] != m:
            return f"generation {generation} gives {r!r}, pinned to {m}, to {owners[r]}"
    return None


def _operate(world: World, change: Callable[[Control], Control], what: str) -> None:
    """An operator's command (``rebalancer-spark pause``, ...): one compare-and-set of the
    control record; retried while the store is down (the fault lasts until it is done)."""
    store = world.store
    try:
        store.update_control(store.control.version, change(store.control), world.now)
    except BackendUnavailable:
        world.lasts_until(world.now + 0.2)
        world.at(world.now + 0.2, lambda: _operate(world, change, what))
        return
    world.log(f"OPERATOR {what}")
    world.notify()


def operator_fault(world: World, live: list[str], resources: list[str]) -> None:
    """Pause, drain a member, pin a resource or set an imbalance threshold, undone up to two
    ttl later; or request a rebalance."""
    rng = world.rng
    undo_at = world.now + rng.uniform(0.1, 2 * world.config.ttl)
    kind = rng.choice(["pause", "drain", "pin", "threshold", "rebalance"])
    undo: tuple[Callable[[Control], Control], str] | None = None
    if kind == "pause":
        _operate(world, Control.pause, "pause")
        undo = (Control.resume, "resume")
    elif kind == "drain" and len(live) > 1:
        member = rng.choice(live)
        _operate(world, lambda c: c.drain_member(member), f"drain {member}")
        undo = (lambda c: c.undrain_members({member}), f"undrain {member}")
    elif kind == "pin" and live and resources:
        member, resource = rng.choice(live), rng.choice(resources)
        _operate(world, lambda c: c.pin(resource, member), f"pin {resource} to {member}")
        undo = (lambda c: c.unpin(resource), f"unpin {resource}")
    elif kind == "threshold":
        _operate(world, lambda c: c.with_threshold(2.0), "imbalance threshold 2")
        undo = (lambda c: c.with_threshold(0.0), "imbalance threshold 0")
    else:
        _operate(world, Control.request_rebalance, "rebalance")
    if undo is not None:
        change, what = undo
        world.lasts_until(undo_at)
        world.at(undo_at, lambda: _operate(world, change, what))
