"""A group's control record: the ``control`` znode, changed by compare-and-set on its version.

The znode holds the record's JSON (:meth:`Control.encode`); the record's version is the znode's
data version plus one (0 while the znode does not exist). An update is one multi-op: a create
(when none exists; a concurrent create fails it) or a set at the version read, with a touch of
``changes`` so that watchers wake and snapshots see it. Created with the group's ACL.
"""

from __future__ import annotations

from typing import Any

from rebalancer_spark.backends.zookeeper.store.client import Settings
from rebalancer_spark.backends.zookeeper.store.layout import CHUNK_BYTES, GroupPaths
from rebalancer_spark.backends.zookeeper.store.multiread import Reader
from rebalancer_spark.backends.zookeeper.store.ops import Op, Refused, transact
from rebalancer_spark.core.control import Control
from rebalancer_spark.core.errors import ControlConflict

__all__ = ["decode_control", "update_control"]


def decode_control(group: str, found: tuple[bytes, Any] | None) -> Control:
    """The record from a read of the ``control`` znode (None: the default record)."""
    if found is None:
        return Control()
    data, stat = found
    return Control.decode(group, data.decode("utf-8", "replace"), stat.version + 1)


def update_control(
    client: Any, settings: Settings, paths: GroupPaths, expected_version: int, control: Control
) -> Control:
    """:meth:`Backend.update_control`."""
    what = f"changing the control record of group {paths.group!r}"
    expired = settings.unavailable(what, "the client's session expired; retry")
    path = paths.control
    current = decode_control(
        paths.group, Reader(client, settings, what, expired).get(path, 4 * CHUNK_BYTES)()
    )
    conflict = ControlConflict(
        f"the control record of group {paths.group!r} is at version {current.version}, not "
        f"{expected_version} as read: someone changed it meanwhile; read it again and retry"
    )
    if current.version != expected_version:
        raise conflict
    data = control.encode().encode()
    write = (
        Op("create", path, data)
        if expected_version == 0
        else Op("set", path, data, version=expected_version - 1)
    )
    try:
        transact(client, [write, Op("set", paths.changes)], settings, what, expired)
    except Refused:
        raise conflict from None
    return Control.decode(paths.group, control.encode(), expected_version + 1)
