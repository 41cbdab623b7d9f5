"""The Redis backend (``redis://`` and ``rediss://``), on redis-py.

:class:`RedisBackend` is what :func:`rebalancer_spark.backends.open_backend` opens for those
schemes; the design is in ``docs/backends/redis.md`` and in the docstrings of the modules:
:mod:`.keys` (key layout), :mod:`.scripts` and :mod:`.reads` (the Lua scripts),
:mod:`.memory` (epochs across data loss), :mod:`.watch` (notifications),
:mod:`.connection` (AUTH, TLS), :mod:`.errors` (translation) and :mod:`.url` (the URL grammar
and options, stdlib only).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rebalancer_spark.backends.redis.backend import RedisBackend
    from rebalancer_spark.backends.redis.watch import RedisWatch

__all__ = ["RedisBackend", "RedisWatch"]

_LAZY = {"RedisBackend": "backend", "RedisWatch": "watch"}


def __getattr__(name: str) -> object:
    # The URL grammar (.url) needs no redis-py: the classes, and redis-py, load on first use.
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
