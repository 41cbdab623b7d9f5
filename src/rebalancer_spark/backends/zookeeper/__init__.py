"""``zookeeper://hosts/chroot``: the ZooKeeper backend (kazoo); see :mod:`.backend` and
``docs/backends/zookeeper.md``. The URL grammar is :mod:`.url` (no kazoo needed to parse a
URL); :class:`ZookeeperBackend` is imported, with kazoo, on first use."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rebalancer_spark.backends.zookeeper.backend import ZookeeperBackend

__all__ = ["ZookeeperBackend"]


def __getattr__(name: str) -> object:
    if name == "ZookeeperBackend":
        return importlib.import_module(f"{__name__}.backend").ZookeeperBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
