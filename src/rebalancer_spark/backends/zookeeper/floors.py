"""A group's identity marker (its incarnation) and lifting resource epochs above a floor.

The marker is the creation zxid of the group znode: a chroot deleted and created again (or a
group's znodes removed and created again) gives the group znode another one, which is how the
front of :mod:`rebalancer_spark.backends.base` finds out that the store lost its state. No
write is needed to keep it.

Lifting writes ``epochs/<id>`` (created, or set at the version read) to ``{"epoch": floor}``.
If the record read names a holder that has not released it, the same multi-op also creates
and deletes that session's ``sessions/<session id>``: that fails while the session lives (its
ephemeral znode is there), so a lift never changes the epoch under a holder. The next grant
is then ``floor + 1``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rebalancer_spark.backends.zookeeper.store.chain import read_record
from rebalancer_spark.backends.zookeeper.store.client import Settings
from rebalancer_spark.backends.zookeeper.store.layout import RECORD_HINT, GroupPaths
from rebalancer_spark.backends.zookeeper.store.multiread import Reader
from rebalancer_spark.backends.zookeeper.store.ops import Op, Refused, transact
from rebalancer_spark.backends.zookeeper.store.records import encode

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
    found = {r: reader.get(paths.resource_epoch(r), RECORD_HINT) for r in floors}
    lifted = 0
    for r, floor in floors.items():
        current = found[r]()
        path = paths.resource_epoch(r)
        record = encode({"epoch": floor})
        ops: list[Op] = []
        if current is None:
            ops.append(Op("create", path, record))
        elif (seen := read_record(*current, path)).epoch < floor:
            if (holder := seen.holder) is not None:  # held, unless that session has ended
                ops += [Op("create", paths.session(holder)), Op("delete", paths.session(holder))]
            ops.append(Op("set", path, record, seen.version))
        else:
            continue
        try:
            transact(client, ops, settings, what, gone)
        except Refused:
            continue  # held, or changed meanwhile: a claim raised it, or the next lift will
        lifted += 1
    if lifted:
        transact(client, [Op("set", paths.changes)], settings, what, gone)
    return lifted
