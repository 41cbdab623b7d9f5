"""What one backend handle remembers of each group, so that Redis losing its data cannot make
epochs go backwards or hand a resource to two owners.

Redis without persistence forgets everything when it restarts: leases, claims, epochs. The
processes that were members still remember. This handle keeps, per group:

* ``high``: the highest number (coordinator epoch, resource epoch, generation, version) it
  has seen or presented in any incarnation of the group;
* ``incarnation``: the id of the group's incarnation it last joined (or created);
* ``max_ttl_ms``: the longest lease of any member it has seen.

The last resource set this handle saw, to declare again into a store that lost the group, is
the front's (:class:`~rebalancer_spark.backends.epochs.EpochMemory`, which every backend shares:
a later read of an older version does not replace it, and this handle's own delta is applied
to it only if it made the version after the one kept). Until session 31 this module kept a
copy of its own beside it.

``high`` is kept by the script runner itself (:mod:`.runner`): every script's reply comes with
the group's high-water mark, so no call site notes numbers by hand. Every join (and resource
update) presents ``high`` and ``incarnation`` to the script. If the
group's keys are gone, or carry another incarnation id, the script knows the caller saw an
earlier life of the group and lifts the epoch base above ``max(Redis TIME in us, high + 1)``
and quarantines the group (no grants) until every lease of the previous life has run out; the
caller then re-declares the resource set it last saw if the group has none. Renewals present
``high`` too: a number above the group's high-water mark (meta ``high``) proves Redis went back
to an older copy of the group (an RDB snapshot, a replica behind), which is handled the same way
(docs/backends/redis.md, "Going back to an older copy").
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["GroupMemory", "Memory"]


@dataclass(slots=True)
class GroupMemory:
    """One group as this handle last knew it (see the module docstring)."""

    high: int = 0
    incarnation: str = ""
    max_ttl_ms: int = 0


class Memory:
    """Thread-safe per-group :class:`GroupMemory` of one backend handle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, GroupMemory] = {}

    def snapshot(self, group: str) -> GroupMemory:
        """A copy of what is known of ``group`` (all defaults if nothing)."""
        with self._lock:
            known = self._groups.get(group, GroupMemory())
            return GroupMemory(known.high, known.incarnation, known.max_ttl_ms)

    def high(self, group: str) -> int:
        """The highest number seen for ``group`` (0 if none), without copying the rest."""
        with self._lock:
            known = self._groups.get(group)
            return 0 if known is None else known.high

    def _get(self, group: str) -> GroupMemory:
        return self._groups.setdefault(group, GroupMemory())

    def see(self, group: str, numbers: Iterable[int]) -> None:
        """Numbers handed out (or presented) for ``group``: keep the highest."""
        top = max(numbers, default=0)
        if top > 0:
            with self._lock:
                known = self._get(group)
                known.high = max(known.high, top)

    def joined(self, group: str, incarnation: str, ttl_ms: int) -> None:
        with self._lock:
            known = self._get(group)
            known.incarnation = incarnation
            known.max_ttl_ms = max(known.max_ttl_ms, ttl_ms)

    def saw_ttls(self, group: str, ttls_ms: Iterable[int]) -> None:
        top = max(ttls_ms, default=0)
        if top > 0:
            with self._lock:
                known = self._get(group)
                known.max_ttl_ms = max(known.max_ttl_ms, top)
