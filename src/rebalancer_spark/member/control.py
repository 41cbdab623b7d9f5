"""Operator control of a group, from any process: pause, resume, rebalance, drain, pin.

Use case (what ``rebalancer-spark pause|resume|rebalance|reset|drain|pin|...`` run)::

    with open_backend(url) as backend:
        ops = GroupControl(backend, "orders", actor="alice@ops1")
        ops.pause()                                  # ownership frozen
        ops.drain("job-3")                           # job-3 gets nothing from now on
        ops.wait_drained("job-3", timeout=60)        # True once it owns nothing

Every change is a read of the group's control record, one pure transition
(:mod:`rebalancer_spark.core.control`) and a compare-and-set write; a write that lost a race
with another operator (or the coordinator) is retried on the new record. Changes that make no
sense in the group's present state are refused with :class:`ControlRefused` (a
:class:`RebalancerError` whose message says why and what to do).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rebalancer_spark.backends.base import Backend
from rebalancer_spark.core.clock import Clock, SystemClock
from rebalancer_spark.core.control import Control, ControlMode
from rebalancer_spark.core.errors import ConfigurationError, ControlConflict, RebalancerError
from rebalancer_spark.core.model import GroupState, validate_group

__all__ = ["ControlRefused", "DrainProgress", "GroupControl"]

_ATTEMPTS = 20
_WAIT_SLICE = 0.5


class ControlRefused(RebalancerError):
    """The group's present state refuses the change (a rebalance or drain while paused)."""


@dataclass(frozen=True, slots=True)
class DrainProgress:
    """Where a drain stands: ``done`` once the member owns nothing (or left the group)."""

    member: str
    owned: int
    """Resources the member still owns or (while present) is still given by the target."""
    present: bool

    @property
    def done(self) -> bool:
        return self.owned == 0


class GroupControl:
    """Changes one group's control record through ``backend``; see the module docstring."""

    def __init__(
        self, backend: Backend, group: str, *, actor: str = "", clock: Clock | None = None
    ) -> None:
        self._backend = backend
        self.group = validate_group(group)
        self._actor = actor
        self._clock: Clock = clock or SystemClock()

    def state(self) -> GroupState:
        return self._backend.state(self.group)

    def control(self) -> Control:
        """The control record alone: one small read, whatever the group's size."""
        return self._backend.control(self.group)

    def change(
        self, what: str, transition: Callable[[GroupState], Control | None]
    ) -> tuple[Control, bool]:
        """Apply ``transition`` (None: nothing to change) to the latest record; return the
        record after it and whether anything was written."""
        for _ in range(_ATTEMPTS):
            state = self.state()
            proposed = transition(state)
            if proposed is None:
                return state.control, False
            by = f" by {self._actor}" if self._actor else ""
            proposed = proposed.noted(self._clock.wall(), f"{what}{by}")
            try:
                return self._backend.update_control(
                    self.group, state.control.version, proposed
                ), True
            except ControlConflict:
                continue
        raise ControlRefused(
            f"the control record of group {self.group!r} changed during each of {_ATTEMPTS} "
            f"attempts to {what}: someone keeps changing it; try again"
        )

    # -- the transitions ----------------------------------------------------------------------

    def pause(self) -> tuple[Control, bool]:
        return self.change("pause", lambda s: None if _paused(s) else s.control.pause())

    def resume(self) -> tuple[Control, bool]:
        return self.change("resume", lambda s: s.control.resume() if _paused(s) else None)

    def rebalance(self) -> tuple[Control, bool]:
        def transition(state: GroupState) -> Control:
            if _paused(state):
                raise ControlRefused(
                    f"group {self.group!r} is paused, so a rebalance would move nothing: run "
                    f"'rebalancer-spark resume --group {self.group}' first"
                )
            return state.control.request_rebalance()

        return self.change("rebalance", transition)

    def reset(self) -> tuple[Control, bool]:
        def transition(state: GroupState) -> Control | None:
            c = state.control
            default = Control(rebalance_requests=c.rebalance_requests, version=c.version)
            return None if _settings(c) == _settings(default) else c.reset()

        return self.change("reset", transition)

    def set_threshold(self, threshold: float) -> tuple[Control, bool]:
        Control(imbalance_threshold=threshold)  # refuses a bad value before any read

        def transition(state: GroupState) -> Control | None:
            same = state.control.imbalance_threshold == threshold
            return None if same else state.control.with_threshold(threshold)

        return self.change(f"imbalance threshold {threshold:g}", transition)

    def drain(self, member: str) -> tuple[Control, bool]:
        def transition(state: GroupState) -> Control | None:
            if _paused(state):
                raise ControlRefused(
                    f"group {self.group!r} is paused, so member {member!r} cannot be drained "
                    f"(nothing moves): run 'rebalancer-spark resume --group {self.group}' first"
                )
            if member not in state.members:
                raise ConfigurationError(
                    f"member {member!r} is not a live member of group {self.group!r} "
                    f"(live: {', '.join(sorted(state.members)) or 'none'}): give the id that "
                    "'rebalancer-spark members' shows"
                )
            if member in state.control.drain:
                return None
            others = {
                m for m, rec in state.members.items() if not rec.leaving and m != member
            } - state.control.drain
            if not others:
                raise ControlRefused(
                    f"member {member!r} is the last member of group {self.group!r} that may own "
                    "resources: draining it would leave every resource without an owner; start "
                    f"another job first, or undrain one ('rebalancer-spark undrain MEMBER "
                    f"--group {self.group}')"
                )
            return state.control.drain_member(member)

        return self.change(f"drain {member}", transition)

    def request_progress(self, resource: str, request: str) -> tuple[Control, bool]:
        """Leave ``request`` (JSON text, :mod:`rebalancer_spark.spark.progress_requests`) for
        the owner of ``resource``, replacing one it has not applied yet."""

        def transition(state: GroupState) -> Control | None:
            same = state.control.requests.get(resource) == request
            return None if same else state.control.with_request(resource, request)

        return self.change(f"progress request on {resource}", transition)

    def take_request(self, resource: str, request: str) -> bool:
        """Remove ``request`` once the owner of ``resource`` applied it, reading only the
        control record; False when the record holds another request for it now (left for
        the owner's next pass) or none."""
        for _ in range(_ATTEMPTS):
            control = self.control()
            proposed = control.without_request(resource, request)
            if proposed is None:
                return False
            by = f" by {self._actor}" if self._actor else ""
            proposed = proposed.noted(self._clock.wall(), f"progress request on {resource} "
                                      f"applied{by}")  # fmt: skip
            try:
                self._backend.update_control(self.group, control.version, proposed)
            except ControlConflict:
                continue
            return True
        raise ControlRefused(
            f"the control record of group {self.group!r} changed during each of {_ATTEMPTS} "
            f"attempts to remove the applied progress request on {resource!r}: try again"
        )

    def undrain(self, member: str) -> tuple[Control, bool]:
        def transition(state: GroupState) -> Control | None:
            drained = member in state.control.drain
            return state.control.undrain_members([member]) if drained else None

        return self.change(f"undrain {member}", transition)

    def pin(
        self, resource: str, member: str, *, absent_member: bool = False
    ) -> tuple[Control, bool]:
        """Pin ``resource`` to ``member``, which must be a live member unless
        ``absent_member`` (a static member that has not joined yet or is restarting)."""

        def transition(state: GroupState) -> Control | None:
            if resource not in state.resources:
                shown = ", ".join(sorted(state.resources)[:5])
                raise ConfigurationError(
                    f"resource {resource!r} is not in group {self.group!r} (it has "
                    f"{len(state.resources)} resources{': ' + shown if shown else ''}...): give "
                    "an id that 'rebalancer-spark assignments' shows"
                )
            if member not in state.members and not absent_member:
                raise ConfigurationError(
                    f"member {member!r} is not a live member of group {self.group!r} "
                    f"(live: {', '.join(sorted(state.members)) or 'none'}): give the id that "
                    "'rebalancer-spark members' shows, or --force to pin to a static member "
                    "that has not joined yet (the pin holds only while that member is in the "
                    "group)"
                )
            same = state.control.pins.get(resource) == member
            return None if same else state.control.pin(resource, member)

        return self.change(f"pin {resource} to {member}", transition)

    def unpin(self, resource: str) -> tuple[Control, bool]:
        def transition(state: GroupState) -> Control | None:
            pinned = resource in state.control.pins
            return state.control.unpin(resource) if pinned else None

        return self.change(f"unpin {resource}", transition)

    # -- waiting --------------------------------------------------------------------------------

    def drain_progress(self, member: str, state: GroupState | None = None) -> DrainProgress:
        state = state or self.state()
        owned = {r for r, c in state.claims.items() if c.member_id == member}
        present = member in state.members
        target = state.target.assignment.get(member, frozenset()) if state.target else frozenset()
        # Done once it holds nothing and the target gives it nothing (or it left the group).
        left = len(owned | target) if present else len(owned)
        return DrainProgress(member, left, present)

    def wait_drained(self, member: str, timeout: float) -> DrainProgress:
        """Wait (woken by the group's watch) until ``member`` owns nothing or ``timeout``
        seconds passed; the progress seen last."""
        deadline = time.monotonic() + timeout
        watch = self._backend.watch(self.group)
        try:
            while True:
                progress = self.drain_progress(member)
                left = deadline - time.monotonic()
                if progress.done or left <= 0:
                    return progress
                watch.wait(min(left, _WAIT_SLICE))
        finally:
            watch.close()


def _paused(state: GroupState) -> bool:
    return state.control.mode is ControlMode.PAUSED


def _settings(control: Control) -> tuple[object, ...]:
    return (
        control.mode,
        control.drain,
        dict(control.pins),
        control.imbalance_threshold,
    )
