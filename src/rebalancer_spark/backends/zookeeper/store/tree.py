"""The tree under the chroot: claiming an empty chroot, creating a group's skeleton, refusing
what this library did not write, and removing old chunk directories (only ever ours).

A chroot is taken only if it is empty (or is already marked by :data:`TREE_MARKER`); a chroot
holding anything else is someone else's tree, reported and left untouched. Every znode is
created with the URL's ACL: with credentials, a digest ACL that only that identity can read
or change.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from kazoo.exceptions import NodeExistsError

from rebalancer_spark.backends.zookeeper.store.client import Settings, wait
from rebalancer_spark.backends.zookeeper.store.layout import (
    GROUP_CHILDREN,
    REQUEST_BYTES,
    TREE_MARKER,
    GroupPaths,
)
from rebalancer_spark.backends.zookeeper.store.multiread import Reader
from rebalancer_spark.backends.zookeeper.store.ops import Op, Refused, batches, transact
from rebalancer_spark.backends.zookeeper.store.records import (
    LAYOUT,
    encode,
    read_epoch,
    read_layout,
)
from rebalancer_spark.core.errors import CorruptStateError

__all__ = ["REMOVING", "delete_dir", "group_exists", "prepare_group", "prepare_root"]

log = logging.getLogger("rebalancer_spark.backends.zookeeper")

_LAYOUT = encode({"layout": LAYOUT})

REMOVING = b"removing"
"""The data :func:`delete_dir` sets on a directory before it removes the chunks in it."""


def _reader(client: Any, settings: Settings, what: str) -> Reader:
    return Reader(client, settings, what, settings.unavailable(what, "session expired"))


def _children(client: Any, settings: Settings, path: str, what: str) -> list[str] | None:
    found = _reader(client, settings, what).children(path)()
    return None if found is None else list(found)


def prepare_root(client: Any, settings: Settings, root: str) -> None:
    """Create the chroot if missing and mark it as ours, or refuse a foreign one."""
    what = "preparing the chroot"
    path = ""
    for part in root.split("/")[1:]:
        path = f"{path}/{part}"
        if _reader(client, settings, what).stat(path)() is None:
            with contextlib.suppress(NodeExistsError):
                wait(
                    client.create_async(path, b"", acl=list(settings.acl)),
                    settings,
                    what,
                    _gone(settings),
                )
    shown = root or "/"
    marker = f"{root}/{TREE_MARKER}"
    for _ in range(3):
        children = set(_children(client, settings, shown, what) or [])
        if TREE_MARKER in children:
            found = _reader(client, settings, what).get(marker)()
            if found is not None:
                read_layout(found[0], marker)
            foreign = children - {TREE_MARKER, "groups", *(["zookeeper"] if not root else [])}
            if foreign:
                raise CorruptStateError(
                    f"chroot {shown} of {settings.shown} holds znodes rebalancer-spark never "
                    f"writes ({', '.join(sorted(foreign)[:5])}): remove them, or use another chroot"
                )
            if "groups" in children:
                return
            ops = [Op("create", f"{root}/groups")]
        else:
            foreign = children - ({"zookeeper"} if not root else set())
            if foreign:
                raise CorruptStateError(
                    f"chroot {shown} of {settings.shown} already holds znodes not written by "
                    f"rebalancer-spark ({', '.join(sorted(foreign)[:5])}); they are left "
                    "untouched: give the URL a chroot of its own, e.g. zookeeper://host:2181/rebalancer"
                )
            ops = [Op("create", marker, _LAYOUT), Op("create", f"{root}/groups")]
        try:
            transact(client, ops, settings, what, _gone(settings))
            return
        except Refused:
            continue  # created meanwhile by another process: look again


def _gone(settings: Settings) -> Exception:
    return settings.unavailable("a request", "the client's session expired; retry")


def group_exists(client: Any, settings: Settings, paths: GroupPaths) -> bool:
    return _reader(client, settings, "reading a group").stat(paths.base)() is not None


def prepare_group(client: Any, settings: Settings, paths: GroupPaths) -> None:
    """Create the group's skeleton if missing, then check that it is ours."""
    what = f"preparing group {paths.group!r}"
    if not group_exists(client, settings, paths):
        ops = [
            Op("create", path, _LAYOUT if path == paths.base else b"")
            for path in paths.skeleton()
            if path != paths.epoch
        ]
        ops.append(Op("create", paths.epoch, encode({"epoch": 0})))
        with contextlib.suppress(Refused):  # another process created it meanwhile
            transact(client, ops, settings, what, _gone(settings))
    reader = _reader(client, settings, what)
    base, children, epoch = (
        reader.get(paths.base),
        reader.children(paths.base),
        reader.get(paths.epoch),
    )
    found = base()
    if found is None:
        raise CorruptStateError(f"group znode {paths.base} vanished while being prepared: retry")
    read_layout(found[0], paths.base)
    names = set(children() or [])
    missing = {p.rsplit("/", 1)[1] for p in paths.skeleton()[1:]} - names
    foreign = names - GROUP_CHILDREN
    if missing or foreign:
        problems = [f"unexpected children {sorted(foreign)}"] if foreign else []
        problems += [f"no {sorted(missing)}"] if missing else []
        raise CorruptStateError(
            f"group znode {paths.base} has {' and '.join(problems)}: it was changed outside "
            "rebalancer-spark; nothing was deleted. Remove the group's znodes or use another group"
        )
    epoch_found = epoch()
    if epoch_found is not None:
        read_epoch(epoch_found[0], epoch_found[1].version, paths.epoch)


def delete_dir(
    client: Any,
    settings: Settings,
    path: str,
    fence: Sequence[Op] = (),
    expired: Exception | None = None,
) -> None:
    """Delete a chunk directory this library wrote (its children, then itself), each request
    carrying ``fence``. The directory's data is set first: a reader that finds the directory
    at version 0 *after* reading a chunk in it (requests of one connection are served in
    order) knows the chunk read was not yet being removed, so a missing chunk means none was
    written (the delta of a member without changes). Failures are logged, never raised: this
    is only clean-up."""
    what = f"removing the old chunks {path}"
    gone = expired or _gone(settings)
    try:
        names = _children(client, settings, path, what)
        if names is None:
            return
        transact(client, [*fence, Op("set", path, REMOVING)], settings, what, gone)
        ops = [Op("delete", f"{path}/{n}") for n in names]
        limit = REQUEST_BYTES - sum(op.cost for op in fence)
        for batch in batches(ops, limit):
            transact(client, [*fence, *batch], settings, what, gone)
        transact(client, [*fence, Op("delete", path)], settings, what, gone)
    except Refused as exc:
        log.debug("clean-up of %s stopped: %s", path, exc)
    except Exception as exc:  # clean-up must never fail the write that triggered it
        log.info("clean-up of %s failed, left for the next one: %s", path, exc)
