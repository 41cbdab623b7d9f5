"""What one backend handle remembers of each group, so that Redis losing its data cannot make
epochs go backwards or hand a resource to two owners.

Redis without persistence forgets everything when it restarts: leases, claims, epochs. The
processes that were members still remember. This handle keeps, per group:

* ``high``: the highest number (coordinator epoch, resource epoch, generation, version) it
  has seen or presented in any incarnation of the group;
* ``incarnation``: the id of the group's incarnation it last joined (or created);
* ``max_ttl_ms``: the longest lease of any member it has seen, and
* ``resources``: the last resource set it saw (id -> weight as stored), with
  ``resources_version``, the version it had in the group's incarnation this handle joined.
  A later read of an older version does not replace it, and this handle's own delta is
  applied only to the version just before the one the delta made: a delta applied to a set
  that another writer changed in between kept a set the group never had (the other writer's
  change lost), which this handle would have declared again into a store that lost the group.

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["GroupMemory", "Memory"]


@dataclass(slots=True)
class GroupMemory:
    """One group as this handle last knew it (see the module docstring)."""

    high: int = 0
    incarnation: str = ""
    max_ttl_ms: int = 0
    resources: dict[str, str] | None = field(default=None, repr=False)
    resources_version: int = 0


class Memory:
    """Thread-safe per-group :class:`GroupMemory` of one backend handle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, GroupMemory] = {}

    def snapshot(self, group: str) -> GroupMemory:
        """A copy of what is known of ``group`` (all defaults if nothing)."""
        with self._lock:
            known = self._groups.get(group, GroupMemory())
            resources = None if known.resources is None else dict(known.resources)
            return GroupMemory(
                known.high, known.incarnation, known.max_ttl_ms, resources, known.resources_version
            )

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
            if incarnation != known.incarnation:
                # Versions are numbered afresh in another incarnation; the set is kept, to be
                # declared again into it (Backend._join).
                known.resources_version = 0
            known.incarnation = incarnation
            known.max_ttl_ms = max(known.max_ttl_ms, ttl_ms)

    def saw_ttls(self, group: str, ttls_ms: Iterable[int]) -> None:
        top = max(ttls_ms, default=0)
        if top > 0:
            with self._lock:
                known = self._get(group)
                known.max_ttl_ms = max(known.max_ttl_ms, top)

    def saw_resources(self, group: str, resources: Mapping[str, str], version: int) -> None:
        """The set at ``version`` was read or written: keep it unless a newer one is kept."""
        with self._lock:
            known = self._get(group)
            if known.resources is None or version >= known.resources_version:
                known.resources = dict(resources)
                known.resources_version = version

    def caught_up(
        self,
        group: str,
        incarnation: str,
        since: int,
        version: int,
        put: Mapping[str, str],
        removed: Iterable[str],
    ) -> bool:
        """The changes of the set from ``since`` to ``version`` were read in ``incarnation``:
        False if this handle joined another one (nothing is changed). Otherwise applied if
        the kept set is at ``since``; a kept set at a version in between, or before ``since``,
        can no longer be brought up to date from them: it is dropped rather than declared
        again stale (the front's memory, :class:`~..epochs.EpochMemory`, declares the set it
        keeps through the same changes, :meth:`~..base.Backend._adopt`)."""
        with self._lock:
            known = self._get(group)
            if known.incarnation not in ("", incarnation):
                return False
            if known.resources is None or known.resources_version >= version:
                return True
            if known.resources_version != since:
                known.resources = None
                known.resources_version = 0
                return True
            for rid in removed:
                known.resources.pop(rid, None)
            known.resources.update(put)
            known.resources_version = version
            return True

    def changed_resources(
        self,
        group: str,
        add: Mapping[str, str],
        remove: Iterable[str],
        version: int,
        changed: bool,
    ) -> bool:
        """This handle's delta left the set at ``version``, ``changed`` or not: apply it to
        the kept set if it made ``version`` from the version just before (a delta that
        changed nothing leaves the kept set right only if it is at ``version`` already). False
        if the kept set is older than that (another writer changed the set in between; a
        delta that changed nothing says nothing of what the other writer did): the caller
        reads the set as it is. True if nothing is kept."""
        with self._lock:
            known = self._get(group)
            if known.resources is None or version == known.resources_version:
                return True
            if not changed or version != known.resources_version + 1:
                return version < known.resources_version  # a newer set is kept already
            known.resources.update(add)
            for rid in remove:
                known.resources.pop(rid, None)
            known.resources_version = version
            return True
