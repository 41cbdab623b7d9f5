"""What one backend handle remembers of a group's epochs, so that a store that lost its state
cannot make a resource epoch go backwards (used by the front of :mod:`.base`).

A store can lose its state: Redis restarted without persistence, an SQLite file replaced, a
ZooKeeper chroot deleted and created again. The group then starts again from nothing, and its
resource epochs from 1, while the output may already be fenced at higher epochs. The members
that were running still know better, and so does the audit table. This memory keeps, per group:

* ``incarnation``: the store's identity marker of the group that this handle last joined (a
  value written when the group is created: SQLite's ``groups.incarnation``, the ZooKeeper
  group znode's creation zxid, Redis' ``meta inc``); a different one after a join means the
  group was created again;
* ``floors``: per resource, the highest epoch this handle saw (granted, held, committed) or was
  told of (:meth:`~.base.Backend.remember_epochs`: the audit table, an operator's floor);
* ``high`` and ``resources``: the highest epoch of any claim in a group snapshot this handle
  read (``state``), and the last non-empty resource set it read, with its version (``state``
  or ``resources``, as the coordinator reads it; a reference, not a copy: the caller does not
  change it), or kept unparsed (``remember_resources``, as a follower reads it: a loader that
  builds the set only if it is ever needed, for a declaration into a store that lost the
  group), and the changes read since (:meth:`EpochMemory.changed_resources`: applied to that
  set only when it is built, or after :data:`PENDING_CHANGES` of them). The handle's own
  writes count too (:meth:`~.base.Backend.update_resources`, every store): a non-empty set
  written whole is kept as written, and a delta is applied to the kept set only if it made
  the version after it (:meth:`EpochMemory.wrote_resources`; else the caller reads the set).
  Each read or write recorded replaces the kept set, whatever its version: a read answered
  after a later write can put an older set back (one the group had) until the next read, and
  a set kept from an earlier incarnation is replaced by the first read of the new one. (A
  rule that an older version does not replace a later one was tried in session 31 and
  dropped: versions start again in a new incarnation, so an old set could stay pinned.)

On a new incarnation the front lifts every remembered epoch into the store before anything is
granted (each resource of the remembered set at least to ``high``: an epoch that jumps is
harmless, one that goes back is not), declares the remembered resource set again if the new
incarnation has none, and never passes on a grant at or below a remembered epoch (see
:meth:`~.base.Backend.claim`). Stdlib only, thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from rebalancer_spark.core.model import GroupState, Resource, ResourceChange

__all__ = ["PENDING_CHANGES", "EpochMemory"]

PENDING_CHANGES = 32
"""Changes of the remembered set kept unapplied at most: the next one builds the set."""


@dataclass
class _KeptSet:
    version: int
    base: Mapping[str, Resource] | Callable[[], list[Resource]]
    changes: list[ResourceChange] = field(default_factory=list)

    def build(self) -> dict[str, Resource]:
        """The set at :attr:`version` (call with a copy taken under the memory's lock)."""
        base = self.base
        out = {r.id: r for r in base()} if callable(base) else dict(base)
        for change in self.changes:
            for rid in change.removed:
                out.pop(rid, None)
            out.update(change.put)
        return out


class EpochMemory:
    """Per group: the incarnation last joined and, per resource, the highest epoch seen (with
    the session that held it then, None for epochs told of)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._floors: dict[str, dict[str, tuple[int, str | None]]] = {}
        self._incarnations: dict[str, str | None] = {}
        self._high: dict[str, int] = {}
        self._resources: dict[str, _KeptSet] = {}

    def saw_state(self, state: GroupState) -> None:
        """A snapshot of the group was read: keep its highest claim epoch and its resource set
        (if it has any: the empty set of a group that lost its state must not replace it)."""
        top = max((c.epoch for c in state.claims.values()), default=0)
        with self._lock:
            if top > self._high.get(state.group, 0):
                self._high[state.group] = top
            if state.resources:
                self._resources[state.group] = _KeptSet(state.resources_version, state.resources)

    def saw_resources(self, group: str, resources: Mapping[str, Resource], version: int) -> None:
        """The group's resource set at ``version`` was read or written whole (kept if not
        empty, as in :meth:`saw_state`)."""
        if resources:
            with self._lock:
                self._resources[group] = _KeptSet(version, resources)

    def keep_resources(self, group: str, version: int, load: Callable[[], list[Resource]]) -> None:
        """The group's non-empty resource set at ``version`` was read but not built: ``load``
        builds it (from bytes already read: it reads nothing), if :meth:`resources` is ever
        asked."""
        with self._lock:
            self._resources[group] = _KeptSet(version, load)

    def wrote_resources(
        self,
        group: str,
        version: int,
        changed: bool,
        put: Mapping[str, Resource],
        removed: Iterable[str],
    ) -> bool:
        """This handle's own delta (``put``, then ``removed``) left the set at ``version``,
        ``changed`` or not. Applied to the kept set if it made ``version`` from the version
        just before; a delta that changed nothing leaves the kept set right only if it is at
        ``version`` already. False if the kept set is older than that: another writer changed
        the set in between, and the delta applied to the kept set would be a set the group
        never had (the other writer's change lost), declared again into a store that lost
        the group; the caller reads the set as it is then. True if nothing is kept."""
        with self._lock:
            kept = self._resources.get(group)
            if kept is None or kept.version == version:
                return True
            if not changed or version != kept.version + 1:
                return version < kept.version  # a later set is kept already
            gone = frozenset(removed)
            mine = {rid: r for rid, r in put.items() if rid not in gone}
            kept.changes.append(ResourceChange(kept.version, version, mine, gone))
            kept.version = version
            if len(kept.changes) <= PENDING_CHANGES:
                return True
        self.resources(group)  # builds it, folding the changes in
        return True

    def changed_resources(self, group: str, change: ResourceChange) -> bool:
        """The changes of the group's set from ``change.since`` were read: kept if the set
        remembered is at that version (then it is at ``change.version``); whether it was. A
        memory at another version (none, an empty set that was not kept, another read since)
        leaves the caller to read the set whole."""
        with self._lock:
            kept = self._resources.get(group)
            if kept is None or kept.version != change.since:
                return False
            kept.version = change.version
            if change.size:
                kept.changes.append(change)
            if len(kept.changes) <= PENDING_CHANGES:
                return True
        self.resources(group)  # builds it, folding the changes in
        return True

    def resources(self, group: str) -> list[Resource]:
        """The last non-empty resource set read of ``group`` (empty if none), with the changes
        read since."""
        with self._lock:
            kept = self._resources.get(group)
            if kept is None:
                return []
            seen = _KeptSet(kept.version, kept.base, list(kept.changes))
        if not callable(seen.base) and not seen.changes:
            return list(seen.base.values())
        built = seen.build()
        with self._lock:  # built once, unless it changed meanwhile
            if self._resources.get(group) is kept and kept.version == seen.version:
                self._resources[group] = _KeptSet(seen.version, built)
        return list(built.values())

    def see(
        self,
        group: str,
        epochs: Mapping[str, int] | Iterable[tuple[str, int]],
        session_id: str | None = None,
    ) -> None:
        """Epochs of ``group``'s resources seen (held by ``session_id``) or told of (None):
        keep the highest of each."""
        items = epochs.items() if isinstance(epochs, Mapping) else epochs
        with self._lock:
            floors = self._floors.setdefault(group, {})
            for resource, epoch in items:
                if epoch > floors.get(resource, (0, None))[0]:
                    floors[resource] = (epoch, session_id)

    def refused(self, group: str, epochs: Mapping[str, int], session_id: str) -> dict[str, int]:
        """The entries of ``epochs`` (resource to the epoch of a grant to ``session_id``) that
        are not above everything known, unless it is the grant this session already holds."""
        none = (0, None)
        with self._lock:
            floors = self._floors.get(group, {})
            low: dict[str, int] = {}
            for resource, epoch in epochs.items():
                known, holder = floors.get(resource, none)
                if epoch < known or (epoch == known and holder != session_id):
                    low[resource] = epoch
            return low

    def floor(self, group: str, resource: str) -> int:
        """The highest epoch known for ``resource`` (0 if none)."""
        with self._lock:
            return self._floors.get(group, {}).get(resource, (0, None))[0]

    def floors(self, group: str) -> dict[str, int]:
        """The floor of every resource known in ``group``: its own highest epoch, and at least
        the group's highest for the resources of the remembered set."""
        with self._lock:
            own = {r: e for r, (e, _) in self._floors.get(group, {}).items()}
            high = max(self._high.get(group, 0), max(own.values(), default=0))
        if high:
            for r in self.resources(group):
                own[r.id] = high
        return own

    def incarnation(self, group: str) -> str | None:
        """The incarnation of ``group`` this handle last joined (None: none yet)."""
        with self._lock:
            return self._incarnations.get(group)

    def is_new(self, group: str, incarnation: str | None) -> bool:
        """Whether joining ``incarnation`` must lift the known epochs: it is not the
        incarnation joined before, or this handle joins for the first time while it knows
        epochs of the group."""
        with self._lock:
            if group not in self._incarnations:
                return bool(self._floors.get(group)) or bool(self._high.get(group))
            return self._incarnations[group] != incarnation

    def joined(self, group: str, incarnation: str | None) -> None:
        """Record a join of ``incarnation`` (after its epochs were lifted). In another
        incarnation than the one joined before, versions are numbered afresh: the set kept
        stays, to be declared again, but no change applies to it any more."""
        with self._lock:
            kept = self._resources.get(group)
            if kept is not None and self._incarnations.get(group) != incarnation:
                kept.version = -1
            self._incarnations[group] = incarnation
