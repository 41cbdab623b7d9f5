"""Which samples of a file resource's lag go to the audit table (``lag`` rows).

Use case: an operator asks "how far behind was resource X last night, and when did it catch
up?". The owner knows its lag after every planning (files and bytes listed and not processed
yet); the audit table keeps a sample of it, so the notebook can draw lag over time from Delta
alone. Writing every planning would flood the table (a job plans every ``poll_interval``), so
per resource a sample is kept when:

* it is the first under this epoch (a new owner starts its line),
* the lag reaches zero or leaves it (caught up, fell behind: the moments an operator looks
  for), or
* the lag changed and ``interval`` seconds have passed since the last sample.

A resource therefore writes at most one row per ``interval`` while its lag moves, plus two
per catch-up, and none while it stays the same: a line that holds its last value is a lag that
did not change. No I/O (the clock is passed in), thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["LagSampler"]


@dataclass(frozen=True, slots=True)
class _Sample:
    epoch: int
    files: int
    size: int
    at: float


class LagSampler:
    """Decides, per resource, whether a lag reading is kept (see the module docstring)."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, _Sample] = {}

    def take(self, resource: str, epoch: int, files: int, size: int) -> bool:
        """Whether the reading ``files``/``size`` of ``resource`` owned at ``epoch`` is kept
        as a sample (it then becomes the one the next readings are compared with)."""
        now = self._clock()
        with self._lock:
            last = self._last.get(resource)
            keep = (
                last is None
                or last.epoch != epoch
                or (files == 0) != (last.files == 0)
                or ((files, size) != (last.files, last.size) and now - last.at >= self.interval)
            )
            if keep:
                self._last[resource] = _Sample(epoch, files, size, now)
            return keep
