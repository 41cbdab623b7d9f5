"""The member's own view of its lease (member/lease.py), on a clock the test moves."""

from __future__ import annotations

import pytest

from rebalancer_spark.backends.base import Session
from rebalancer_spark.member.lease import Lease

SESSION = Session(group="g", member_id="m", session_id="s1", ttl=10.0)


class SteppedClock:
    """Both readings advance together; :meth:`step_wall` moves the wall clock alone, as an
    NTP step of the host does."""

    def __init__(self) -> None:
        self.mono, self.offset = 1000.0, 1_700_000_000.0

    def monotonic(self) -> float:
        return self.mono

    def wall(self) -> float:
        return self.mono + self.offset

    def step_wall(self, seconds: float) -> None:
        self.offset += seconds


def test_the_lapse_is_dated_at_the_deadline_on_the_monotonic_clock() -> None:
    clock = SteppedClock()
    lease = Lease(clock, safety_margin=1.0)
    lease.start(SESSION, started_at=clock.monotonic())
    wall_deadline = clock.wall() + 9.0
    assert lease.ended_at(lease.snapshot()) == pytest.approx(clock.wall(), abs=1e-6)  # not yet: now
    clock.mono += 4.0
    assert lease.renewed(SESSION, started_at=clock.monotonic())
    clock.mono += 20.0  # a pause far past the deadline
    snap = lease.snapshot()
    assert snap.lapsed and lease.valid_session() is None
    assert lease.ended_at(snap) == pytest.approx(wall_deadline + 4.0, abs=1e-6)


@pytest.mark.parametrize("step", [0.25, -0.25])
def test_a_wall_clock_step_during_a_pause_never_dates_the_lapse_later(step: float) -> None:
    """A successor's grant stamped before a forward step would otherwise read as earlier
    than this member's lapse: a double ownership in the trails that never happened."""
    clock = SteppedClock()
    lease = Lease(clock, safety_margin=1.0)
    lease.start(SESSION, started_at=clock.monotonic())
    wall_deadline = clock.wall() + 9.0
    clock.mono += 15.0
    clock.step_wall(step)
    ended = lease.ended_at(lease.snapshot())
    assert ended == pytest.approx(min(wall_deadline, wall_deadline + step), abs=1e-6)


def test_a_session_the_store_ended_lapses_now_if_that_is_before_its_deadline() -> None:
    clock = SteppedClock()
    lease = Lease(clock, safety_margin=1.0)
    lease.start(SESSION, started_at=clock.monotonic())
    clock.mono += 2.0
    lease.lapse(SESSION)
    clock.mono += 30.0
    assert lease.ended_at(lease.snapshot()) == pytest.approx(1000.0 + 2.0 + clock.offset, abs=1e-6)
