"""Time, injected: every timeout and lease in the library is measured through a :class:`Clock`.

:class:`SystemClock` reads ``CLOCK_BOOTTIME`` on Linux: it never jumps with NTP or a changed
wall clock, keeps counting while the machine is suspended, and is the same for every process on
a host, so the SQLite backend can compare lease deadlines written by different processes.
:class:`ManualClock` is for tests and the simulator: time moves only when told to.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    """Where the library reads time from."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards, shared by the processes of a host."""
        ...

    def wall(self) -> float:
        """Seconds since the Unix epoch, for timestamps shown to people."""
        ...


class SystemClock:
    """The host's clocks: ``CLOCK_BOOTTIME`` where the platform has it, else ``monotonic``."""

    def __init__(self) -> None:
        self._clock_id: int | None = getattr(time, "CLOCK_BOOTTIME", None)

    def monotonic(self) -> float:
        if self._clock_id is not None:
            return time.clock_gettime(self._clock_id)
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only through :meth:`advance`; both readings move together."""

    def __init__(self, start: float = 1000.0, wall_start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._offset = wall_start - start

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._now + self._offset

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (never backwards)."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards: advance({seconds})")
        self._now += seconds
