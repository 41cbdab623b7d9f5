"""A group's identity marker (its incarnation) and lifting resource epochs above a floor.

The marker is the creation zxid of the group znode: a chroot deleted and created again (or a
group's znodes removed and created again) gives the group znode another one, which is how the
front of :mod:`rebalancer_spark.backends.base` finds out that the store lost its state. No
write is needed to keep it.

Lifting writes ``epochs/<id>`` (created, or set at the version read) to ``{"epoch": floor}``
in a multi-op that also creates and deletes ``claims/<id>``: it fails if the resource is held,
so a lift never changes the epoch under a holder. The next grant is then ``floor + 1``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rebalancer_spark.backends.zookeeper.store.client import Settings
from rebalancer_spark.backends.zookeeper.store.layout import GroupPaths
from rebalancer_spark.backends.zookeeper.store.multiread import Reader
from rebalancer_spark.backends.zookeeper.store.ops import Op, Refused, transact
from rebalancer_spark.backends.zookeeper.store.records import encode, read_resource_epoch

__all__ = ["incarnation", "lift_epochs"]


def _reader(client: Any, settings: Settings, what: str) -> Reader:
    return Reader(client, settings, what, settings.unavailable(what, "session expired"))


def incarnation(client: Any, settings: Settings, paths: GroupPaths) -> str | None:
    """The creation zxid of the group znode, in hex (None: no such group)."""
    stat = _reader(client, settings, "reading the group's identity").stat(paths.base)()
    return None if stat is None else f"{stat.czxid:x}"


def lift_epochs(
    client: Any, settings: Settings, paths: GroupPaths, floors: Mapping[str, int]
) -> int:
    """Raise ``epochs/<id>`` of each free resource to its floor; return how many were."""
    what = f"lifting resource epochs of group {paths.group!r}"
    gone = settings.unavailable(what, "session expired")
    reader = _reader(client, settings, what)
    found = {r: reader.get(paths.resource_epoch(r)) for r in floors}
    lifted = 0
    for r, floor in floors.items():
        current = found[r]()
        path = paths.resource_epoch(r)
        record = encode({"epoch": floor})
        if current is None:
            raise_epoch = Op("create", path, record)
        elif read_resource_epoch(current[0], path) < floor:
            raise_epoch = Op("set", path, record, current[1].version)
        else:
            continue
        ops = [Op("create", paths.claim(r)), Op("delete", paths.claim(r)), raise_epoch]
        try:
            transact(client, ops, settings, what, gone)
        except Refused:
            continue  # held, or changed meanwhile: a claim raised it, or the next lift will
        lifted += 1
    if lifted:
        transact(client, [Op("set", paths.changes)], settings, what, gone)
    return lifted
