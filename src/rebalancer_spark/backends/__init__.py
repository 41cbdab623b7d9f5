"""Backends chosen by URL scheme: ``sqlite:///path``, ``zookeeper://hosts/chroot``,
``redis://host:port/db`` and ``rediss://``.

The schemes, and where each backend's code is, are one line each in
:mod:`.registry`. :func:`open_backend` parses the URL with the backend's own grammar, refuses
options the backend does not know, imports the backend's module (and its client library) only
then, and can *require* capabilities so that a missing one fails at start-up rather than at
3 a.m. :func:`store_missing` tells a read-only command that the store a URL names does not
exist yet (an absent SQLite file), so that it refuses instead of creating it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType

from rebalancer_spark.backends.base import Backend, Capability, Session, Watch
from rebalancer_spark.backends.registry import (
    PLUGINS,
    SCHEMES,
    backend_class,
    check_backend_url,
    parse_backend_url,
    store_missing,
)
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.errors import ConfigurationError

__all__ = [
    "BACKENDS",
    "PLUGINS",
    "SCHEMES",
    "Backend",
    "Capability",
    "Session",
    "Watch",
    "check_backend_url",
    "open_backend",
    "parse_backend_url",
    "store_missing",
]

BACKENDS: Mapping[str, tuple[str, str, str]] = MappingProxyType(
    {s: (p.module, p.class_name, p.extra) for p in PLUGINS for s in p.schemes}
)
"""scheme -> (module, class, the extra to install for its client library), derived from
:data:`PLUGINS`."""


def open_backend(
    url: str, *, clock: Clock | None = None, require: Collection[Capability] = ()
) -> Backend:
    """Open the backend named by ``url``; see the module docstring."""
    cls, parsed = backend_class(url)
    missing = set(require) - cls.capabilities
    if missing:
        raise ConfigurationError(
            f"backend {parsed.redacted()!r} lacks the required capabilities "
            f"{sorted(c.value for c in missing)}; it has "
            f"{sorted(c.value for c in cls.capabilities)}: choose another backend"
        )
    kwargs = {} if clock is None else {"clock": clock}
    return cls(parsed, **kwargs)
