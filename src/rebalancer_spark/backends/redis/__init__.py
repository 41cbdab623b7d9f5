"""The Redis backend (``redis://`` and ``rediss://``), on redis-py.

:class:`RedisBackend` is what :func:`rebalancer_spark.backends.open_backend` opens for those
schemes; the design is in ``docs/backends/redis.md`` and in the docstrings of the modules:
:mod:`.keys` (key layout), :mod:`.scripts` and :mod:`.reads` (the Lua scripts),
:mod:`.memory` (epochs across data loss), :mod:`.watch` (notifications),
:mod:`.connection` (AUTH, TLS) and :mod:`.errors` (translation).
"""

from __future__ import annotations

from rebalancer_spark.backends.redis.backend import RedisBackend
from rebalancer_spark.backends.redis.watch import RedisWatch

__all__ = ["RedisBackend", "RedisWatch"]
