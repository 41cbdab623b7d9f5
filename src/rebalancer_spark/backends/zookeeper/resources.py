"""The group's resource set: replaced atomically however large it is.

A new set is written as chunks under a fresh ``resource-sets/<set>`` directory, then the small
``resources`` pointer is switched with a versioned set (compare-and-swap) in a multi-op that
also checks every chunk of the new set and touches ``changes``. A writer that loses the race
removes its own directory and tries again on the new set. The winner removes the set it
replaced, and any set that nobody has pointed to for :data:`ORPHAN_MS` (left by a writer that
died between its two steps).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from typing import Any

from rebalancer_spark.backends.zookeeper.reads import Changed, read_resources
from rebalancer_spark.backends.zookeeper.store.client import Settings
from rebalancer_spark.backends.zookeeper.store.layout import REQUEST_BYTES, GroupPaths, chunk_json
from rebalancer_spark.backends.zookeeper.store.multiread import Reader
from rebalancer_spark.backends.zookeeper.store.ops import Op, Refused, batches, transact
from rebalancer_spark.backends.zookeeper.store.records import (
    ResourcesPointer,
    encode,
    read_resources_pointer,
)
from rebalancer_spark.backends.zookeeper.store.tree import delete_dir
from rebalancer_spark.core.errors import BackendUnavailable
from rebalancer_spark.core.model import Resource

__all__ = ["ORPHAN_MS", "update_resources"]

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
) -> int:
    """Change the resource set; its version after the change."""
    what = f"updating the resources of group {paths.group!r}"
    expired = settings.unavailable(what, "the client's session expired; retry")
    for _ in range(_ATTEMPTS):
        found = Reader(client, settings, what, expired).get(paths.resources)()
        pointer = None if found is None else read_resources_pointer(found[0], paths.resources)
        try:
            current = read_resources(Reader(client, settings, what, expired), paths, pointer)()
        except Changed:
            continue
        wanted = dict(current) if replace is None else {r.id: r for r in replace}
        wanted.update((r.id, r) for r in add)
        for rid in remove:
            wanted.pop(rid, None)
        version = 0 if pointer is None else pointer.version
        if wanted == current:
            return version
        name = f"v{version + 1}-{uuid.uuid4().hex[:8]}"
        chunks = chunk_json(encode([r.id, r.weight]) for r in sorted(wanted.values()))
        writes = [Op("create", paths.resource_set(name))] + [
            Op("create", paths.resource_chunk(name, k), chunk) for k, chunk in enumerate(chunks)
        ]
        new = ResourcesPointer(version + 1, name, len(chunks))
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
            delete_dir(client, settings, paths.resource_set(name))
            continue
        _collect_garbage(client, settings, paths, keep=name, replaced=pointer)
        return new.version
    raise BackendUnavailable(
        f"ZooKeeper {settings.shown}: the resources of group {paths.group!r} kept changing "
        f"during {_ATTEMPTS} attempts to update them; retry"
    )


def _collect_garbage(
    client: Any,
    settings: Settings,
    paths: GroupPaths,
    keep: str,
    replaced: ResourcesPointer | None,
) -> None:
    if replaced is not None:
        delete_dir(client, settings, paths.resource_set(replaced.name))
    what = "listing old resource sets"
    reader = Reader(client, settings, what, settings.unavailable(what, "session expired"))
    listing, pointer = reader.children(paths.resource_sets), reader.stat(paths.resources)
    found, now = listing(), pointer()
    if found is None or now is None or len(found) <= 1:
        return
    stale = [n for n in found if n != keep and (replaced is None or n != replaced.name)]
    if not stale:
        return
    reader = Reader(client, settings, what, settings.unavailable(what, "session expired"))
    stats = [(n, reader.stat(paths.resource_set(n))) for n in stale]
    for n, stat in stats:
        seen = stat()
        if seen is not None and now.mtime - seen.ctime > ORPHAN_MS:
            delete_dir(client, settings, paths.resource_set(n))
