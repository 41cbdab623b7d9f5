"""A member's lifecycle: its states, the legal transitions between them, and their enforcement.

::

    CREATED --> STARTING --> RUNNING <--> REJOINING
       |           |            \\          /
       |           |             DRAINING         (RUNNING, REJOINING and DRAINING
       |           |                |              all go to STOPPING)
       +-----------+--> STOPPED <-- STOPPING

``DRAINING``: ``stop()`` announced the leave; the coordinator moves the member's resources away
and it claims nothing more (a lapse meanwhile rejoins without leaving this state).

:data:`TRANSITIONS` writes the arrows down; :class:`Lifecycle` refuses any other move. The
lifecycle shares its lock with what the member holds (see :mod:`.ownership`), so a thread that
checks the state and acts on it under that lock cannot race a concurrent ``stop()``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from enum import StrEnum

from rebalancer_spark.core.errors import RebalancerError

__all__ = ["TRANSITIONS", "Lifecycle", "MemberState"]


class MemberState(StrEnum):
    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    REJOINING = "rejoining"
    DRAINING = "draining"
    STOPPING = "stopping"
    STOPPED = "stopped"


TRANSITIONS: Mapping[MemberState, frozenset[MemberState]] = {
    MemberState.CREATED: frozenset({MemberState.STARTING, MemberState.STOPPED}),
    MemberState.STARTING: frozenset({MemberState.RUNNING, MemberState.STOPPED}),
    MemberState.RUNNING: frozenset(
        {MemberState.REJOINING, MemberState.DRAINING, MemberState.STOPPING}
    ),
    MemberState.REJOINING: frozenset(
        {MemberState.RUNNING, MemberState.DRAINING, MemberState.STOPPING}
    ),
    MemberState.DRAINING: frozenset({MemberState.STOPPING}),
    MemberState.STOPPING: frozenset({MemberState.STOPPED}),
    MemberState.STOPPED: frozenset(),
}


class Lifecycle:
    """The state of member ``member_id``, moved only along :data:`TRANSITIONS`; every move
    notifies ``changed`` (a condition on the member's lock)."""

    def __init__(self, member_id: str, changed: threading.Condition) -> None:
        self._member_id = member_id
        self._changed = changed
        self._state = MemberState.CREATED

    @property
    def state(self) -> MemberState:
        return self._state

    def move(self, new: MemberState) -> None:
        """Go to ``new``; a :class:`RebalancerError` if that is not a legal next state."""
        with self._changed:
            if new not in TRANSITIONS[self._state]:
                raise RebalancerError(
                    f"member {self._member_id!r} cannot go from {self._state.value} to "
                    f"{new.value}; legal next states: "
                    f"{sorted(s.value for s in TRANSITIONS[self._state])}"
                )
            self._state = new
            self._changed.notify_all()

    def move_from(self, current: MemberState, new: MemberState) -> bool:
        """Go to ``new`` only if the state is ``current`` (checked and moved under the lock);
        return whether it moved."""
        with self._changed:
            if self._state is not current:
                return False
            self.move(new)
            return True
