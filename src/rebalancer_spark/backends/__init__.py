"""Backends chosen by URL scheme: ``sqlite:///path``, ``zookeeper://hosts/chroot``,
``redis://host:port/db`` and ``rediss://``.

:func:`open_backend` parses the URL, refuses options the backend does not know, imports the
backend's module (and its client library) only then, and can *require* capabilities so that a
missing one fails at start-up rather than at 3 a.m.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection, Mapping

from rebalancer_spark.backends.base import Backend, Capability, Session, Watch
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.urls import BackendUrl, parse_backend_url

__all__ = [
    "BACKENDS",
    "Backend",
    "Capability",
    "Session",
    "Watch",
    "check_backend_url",
    "open_backend",
]

# scheme -> (module, class, the extra to install for its client library). Each backend class
# declares the URL options it accepts in ``Backend.options``.
BACKENDS: Mapping[str, tuple[str, str, str]] = {
    "sqlite": ("rebalancer_spark.backends.sqlite", "SqliteBackend", ""),
    "zookeeper": ("rebalancer_spark.backends.zookeeper", "ZookeeperBackend", "zookeeper"),
    "redis": ("rebalancer_spark.backends.redis", "RedisBackend", "redis"),
    "rediss": ("rebalancer_spark.backends.redis", "RedisBackend", "redis"),
}


def check_backend_url(url: str) -> BackendUrl:
    """``url`` parsed and checked as :func:`open_backend` checks it (scheme, syntax, the
    backend's own options), without connecting; a :class:`ConfigurationError` otherwise."""
    return _backend_class(url)[1]


def _backend_class(url: str) -> tuple[type[Backend], BackendUrl]:
    scheme = parse_backend_url(url).scheme  # refuses malformed URLs and unknown schemes
    entry = BACKENDS.get(scheme)
    if entry is None:
        raise ConfigurationError(
            f"backend {parse_backend_url(url).redacted()!r}: the {scheme} backend is not part "
            f"of this version of rebalancer-spark; available: {', '.join(sorted(BACKENDS))}"
        )
    module_name, class_name, extra = entry
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("rebalancer_spark"):
            raise ConfigurationError(
                f"backend {parse_backend_url(url).redacted()!r}: the {scheme} backend is not "
                "part of this installation of rebalancer-spark; use sqlite:///path"
            ) from None
        raise ConfigurationError(
            f"backend {parse_backend_url(url).redacted()!r} needs the Python package "
            f"{exc.name!r}: pip install 'rebalancer-spark[{extra}]'"
        ) from None
    cls: type[Backend] = getattr(module, class_name)
    return cls, parse_backend_url(url, allowed_options={scheme: tuple(cls.options)})


def open_backend(
    url: str, *, clock: Clock | None = None, require: Collection[Capability] = ()
) -> Backend:
    """Open the backend named by ``url``; see the module docstring."""
    cls, parsed = _backend_class(url)
    missing = set(require) - cls.capabilities
    if missing:
        raise ConfigurationError(
            f"backend {parsed.redacted()!r} lacks the required capabilities "
            f"{sorted(c.value for c in missing)}; it has "
            f"{sorted(c.value for c in cls.capabilities)}: choose another backend"
        )
    kwargs = {} if clock is None else {"clock": clock}
    return cls(parsed, **kwargs)
