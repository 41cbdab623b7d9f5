"""The group's resource set: changed atomically however large it is.

A new set is written as chunks under a fresh ``resource-sets/<set>`` directory, then the small
``resources`` pointer is switched with a versioned set (compare-and-swap) in a multi-op that
also checks every chunk of the new set and touches ``changes``. A writer that loses the race
removes its own directory and tries again on the new set. The winner removes the set it
replaced, and any set that nobody has pointed to for :data:`ORPHAN_MS` (left by a writer that
died between its two steps).

Each change is also logged, for readers that kept an earlier set
(:meth:`~rebalancer_spark.backends.base.Backend.resource_changes`): the ids it put ([id,
weight]) and removed ([id, null]) go in chunks under a ``resource-sets/log-v<version>-<tag>``
directory written with the new set and checked by the same switch, and the pointer names the
log's changes (version, directory, chunks, ids) and the version after which every change is
in it. The switch drops the oldest beyond
:data:`~rebalancer_spark.backends.base.RESOURCE_LOG_VERSIONS` changes or
:func:`~rebalancer_spark.backends.base.resource_log_limit` ids (a larger change empties the
log), and the writer then removes their directories; a reader that finds one gone reads the
set whole.

A change is written alone, without the set, while the changes since the set written last whole
(the pointer's ``set_version``: its *chain*) stay within :data:`CHAIN` changes and
``resource_log_limit`` ids: the pointer keeps that set's directory, named ``base`` instead of
``set`` (a reader of an earlier release takes it for corrupt rather than read the set without
its chain, so nothing is chained while a member whose record does not say ``"chains": true``
lives), and a reader of the whole set applies the chain's changes to it in order; the log is
never trimmed into the chain. A writer that knows the set at the pointer's version (``base``
of :func:`update_resources`: the coordinator's listing) does not read it first.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from rebalancer_spark.backends.base import RESOURCE_LOG_VERSIONS, resource_log_limit
from rebalancer_spark.backends.zookeeper.reads import Changed, read_resources
from rebalancer_spark.backends.zookeeper.store.client import Settings
from rebalancer_spark.backends.zookeeper.store.layout import (
    LOG_PREFIX,
    REQUEST_BYTES,
    GroupPaths,
    chunk_json,
)
from rebalancer_spark.backends.zookeeper.store.multiread import Reader
from rebalancer_spark.backends.zookeeper.store.ops import Op, Refused, batches, transact
from rebalancer_spark.backends.zookeeper.store.records import (
    LoggedChange,
    ResourcesPointer,
    encode,
    read_resources_pointer,
    reads_chains,
)
from rebalancer_spark.backends.zookeeper.store.tree import delete_dir
from rebalancer_spark.core.errors import BackendUnavailable
from rebalancer_spark.core.model import Resource

__all__ = ["CHAIN", "ORPHAN_MS", "update_resources"]

CHAIN = 16
"""Changes written alone behind a set written whole, at most: the next is written with the
set whole (a reader of the whole set reads its directory and the chain's, in one round)."""

ORPHAN_MS = 600_000
"""A resource-set directory that is not current and older than this (ZooKeeper's own clock,
milliseconds) was left by a writer that died: removed by the next writer."""

_ATTEMPTS = 20


def update_resources(
    client: Any,
    settings: Settings,
    paths: GroupPaths,
    *,
    replace: Collection[Resource] | None,
    add: Collection[Resource],
    remove: Collection[str],
    base: int | None = None,
) -> tuple[int, bool]:
    """Change the resource set; its version after the change and whether this call changed
    it. With ``base`` (``add`` and
    ``remove`` are exactly the change from the set at that version to ``replace``) and the
    set still at it, the set is not read, and the change alone is written while the chain
    behind the last set written whole stays within :data:`CHAIN` changes and
    :func:`resource_log_limit` ids (the module docstring)."""
    what = f"updating the resources of group {paths.group!r}"
    expired = settings.unavailable(what, "the client's session expired; retry")
    for _ in range(_ATTEMPTS):
        found = Reader(client, settings, what, expired).get(paths.resources)()
        pointer = None if found is None else read_resources_pointer(found[0], paths.resources)
        version = 0 if pointer is None else pointer.version
        if base is not None and replace is not None and pointer is not None and version == base:
            change = _Change({r.id: r for r in add}, set(remove), len(replace), replace)
        else:
            try:
                current = read_resources(Reader(client, settings, what, expired), paths, pointer)()
            except Changed:
                continue
            change = _Change.between(current, replace, add, remove)
        if not change.put and not change.gone:
            return version, False
        chains = pointer is not None and _members_read_chains(client, settings, paths)
        new, writes, name, entry = _next(paths, pointer, version + 1, change, chains)
        switch = (
            Op("create", paths.resources, new.encode())
            if found is None
            else Op("set", paths.resources, new.encode(), version=found[1].version)
        )
        try:
            for batch in batches(writes, REQUEST_BYTES):
                transact(client, batch, settings, what, expired)
            checks = [Op("check", op.path) for op in writes]
            transact(client, [*checks, switch, Op("set", paths.changes)], settings, what, expired)
        except Refused:
            for written in (name, entry):
                if written is not None:
                    delete_dir(client, settings, paths.resource_set(written))
            continue
        dropped = [] if pointer is None else [c.name for c in pointer.log if c not in new.log]
        _collect_garbage(client, settings, paths, new, replaced=pointer, dropped=dropped)
        return new.version, True
    raise BackendUnavailable(
        f"ZooKeeper {settings.shown}: the resources of group {paths.group!r} kept changing "
        f"during {_ATTEMPTS} attempts to update them; retry"
    )


@dataclass(frozen=True, slots=True)
class _Change:
    put: dict[str, Resource]
    """Added or reweighted."""
    gone: set[str]
    size: int
    """Resources in the set after the change."""
    whole: Collection[Resource]
    """The set after the change."""

    @classmethod
    def between(
        cls,
        current: dict[str, Resource],
        replace: Collection[Resource] | None,
        add: Collection[Resource],
        remove: Collection[str],
    ) -> _Change:
        wanted = dict(current) if replace is None else {r.id: r for r in replace}
        wanted.update((r.id, r) for r in add)
        for rid in remove:
            wanted.pop(rid, None)
        put = {rid: r for rid, r in wanted.items() if current.get(rid) != r}
        return cls(put, set(current.keys() - wanted.keys()), len(wanted), wanted.values())


def _members_read_chains(client: Any, settings: Settings, paths: GroupPaths) -> bool:
    """Whether every live member's record says it reads chained pointers: a member of an
    earlier release would take one for corrupt and stop (a member of such a release that
    joins after a chain was written stops the same way, until the set is written whole)."""
    what = f"reading the members of group {paths.group!r}"
    expired = settings.unavailable(what, "the client's session expired; retry")
    names = Reader(client, settings, what, expired).children(paths.members)()
    if names is None:
        return True
    reader = Reader(client, settings, what, expired)
    records = [(paths.member(m), reader.get(paths.member(m))) for m in names]
    for path, pending in records:
        found = pending()
        if found is not None and not reads_chains(found[0], path):
            return False
    return True


def _next(
    paths: GroupPaths,
    pointer: ResourcesPointer | None,
    version: int,
    change: _Change,
    chains: bool,
) -> tuple[ResourcesPointer, list[Op], str | None, str | None]:
    """The pointer that makes ``version`` by ``change``, the writes that must come before it,
    and the directories they create (the set's, the change's): the change alone behind the
    set written last while the chain stays short (:data:`CHAIN`, :func:`resource_log_limit`
    ids), else the set whole in a directory of its own; the change logged in both cases if
    it names no more ids than the log may."""
    entry, writes = _log_change(paths, version, change.put, change.gone)
    log_from, log = _log(pointer, entry, version, change.size)
    logged = entry.name if entry in log else None
    chain = (*pointer.chain, entry) if pointer is not None else ()
    if (
        pointer is not None
        and chains
        and len(chain) <= CHAIN
        and sum(c.ids for c in chain) <= resource_log_limit(change.size)
    ):
        kept = pointer.whole_at
        return (
            ResourcesPointer(version, pointer.name, pointer.chunks, log_from, log, kept),
            writes,
            None,
            logged,
        )
    name = f"v{version}-{uuid.uuid4().hex[:8]}"
    chunks = chunk_json(encode([r.id, r.weight]) for r in sorted(change.whole))
    writes = (writes if logged else []) + [Op("create", paths.resource_set(name))]
    writes += [Op("create", paths.resource_chunk(name, k), c) for k, c in enumerate(chunks)]
    return ResourcesPointer(version, name, len(chunks), log_from, log), writes, name, logged


def _log_change(
    paths: GroupPaths, version: int, put: Mapping[str, Resource], gone: Collection[str]
) -> tuple[LoggedChange, list[Op]]:
    """The log entry of the change that made ``version`` (``put``: added or reweighted,
    ``gone``: removed), and the writes of its directory and chunks."""
    entries = [encode([rid, r.weight]) for rid, r in sorted(put.items())]
    entries += [encode([rid, None]) for rid in sorted(gone)]
    name = f"{LOG_PREFIX}v{version}-{uuid.uuid4().hex[:8]}"
    chunks = chunk_json(entries)
    writes = [Op("create", paths.resource_set(name))] + [
        Op("create", paths.resource_chunk(name, k), chunk) for k, chunk in enumerate(chunks)
    ]
    return LoggedChange(version, name, len(chunks), len(entries)), writes


def _log(
    pointer: ResourcesPointer | None, entry: LoggedChange, version: int, size: int
) -> tuple[int, tuple[LoggedChange, ...]]:
    """The log of the pointer that makes ``version`` (its start and its changes): the old
    pointer's with ``entry`` added, less the oldest beyond :data:`RESOURCE_LOG_VERSIONS` or
    :func:`resource_log_limit` ids; empty after ``entry`` if it alone names more ids than that.
    A pointer written before the log was kept starts it at its version."""
    limit = resource_log_limit(size)
    if entry.ids > limit:
        return version, ()
    start = 0 if pointer is None else pointer.logged_from
    log = [*(() if pointer is None else pointer.log), entry]
    while len(log) > RESOURCE_LOG_VERSIONS or sum(c.ids for c in log) > limit:
        start = log.pop(0).version
    return start, tuple(log)


def _collect_garbage(
    client: Any,
    settings: Settings,
    paths: GroupPaths,
    current: ResourcesPointer,
    replaced: ResourcesPointer | None,
    dropped: list[str],
) -> None:
    if replaced is not None and replaced.name != current.name:
        delete_dir(client, settings, paths.resource_set(replaced.name))
    for name in dropped:  # changes the log no longer names
        delete_dir(client, settings, paths.resource_set(name))
    what = "listing old resource sets"
    reader = Reader(client, settings, what, settings.unavailable(what, "session expired"))
    listing, pointer = reader.children(paths.resource_sets), reader.stat(paths.resources)
    found, now = listing(), pointer()
    if found is None or now is None or len(found) <= 1:
        return
    keep = {current.name, *(c.name for c in current.log), *dropped}
    if replaced is not None:
        keep.add(replaced.name)
    stale = [n for n in found if n not in keep]
    if not stale:
        return
    reader = Reader(client, settings, what, settings.unavailable(what, "session expired"))
    stats = [(n, reader.stat(paths.resource_set(n))) for n in stale]
    for n, stat in stats:
        seen = stat()
        if seen is not None and now.mtime - seen.ctime > ORPHAN_MS:
            delete_dir(client, settings, paths.resource_set(n))
