"""``zookeeper://hosts/chroot``: the ZooKeeper backend (kazoo); see :mod:`.backend` and
``docs/backends/zookeeper.md``."""

from __future__ import annotations

from rebalancer_spark.backends.zookeeper.backend import ZookeeperBackend

__all__ = ["ZookeeperBackend"]
