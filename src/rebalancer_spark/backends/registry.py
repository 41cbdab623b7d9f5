"""The backend registry: one :class:`~rebalancer_spark.core.plugins.Plugin` line per backend.

A new backend is a folder under ``backends/`` (its ``url.py`` grammar, stdlib only, and its
implementation) plus one line in :data:`PLUGINS`. Nothing here imports a plug-in: a URL's
grammar module is imported when a URL of its scheme is parsed, the implementation (and its
client library) only when :func:`backend_class` is asked for it.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.plugins import BackendGrammar, Plugin
from rebalancer_spark.core.urls import (
    BackendUrl,
    did_you_mean,
    set_backend_parser,
    show,
    split_url,
)

if TYPE_CHECKING:
    from rebalancer_spark.backends.base import Backend

__all__ = [
    "DEFAULT_STORE",
    "PLUGINS",
    "SCHEMES",
    "backend_class",
    "check_backend_url",
    "default_store_url",
    "grammar",
    "parse_backend_url",
    "plugin",
    "store_missing",
]

_HERE = "rebalancer_spark.backends"

PLUGINS: tuple[Plugin, ...] = (
    Plugin(
        "sqlite",
        ("sqlite",),
        f"{_HERE}.sqlite.backend:SqliteBackend",
        {"sqlite": "sqlite:///var/lib/rebalancer/groups.db"},
        grammar=f"{_HERE}.sqlite.url",
        aliases={"sqlite3": "sqlite", "file": "sqlite"},
    ),
    Plugin(
        "zookeeper",
        ("zookeeper",),
        f"{_HERE}.zookeeper.backend:ZookeeperBackend",
        {"zookeeper": "zookeeper://zk1:2181,zk2:2181/rebalancer"},
        grammar=f"{_HERE}.zookeeper.url",
        extra="zookeeper",
        aliases={"zk": "zookeeper"},
    ),
    Plugin(
        "redis",
        ("redis", "rediss"),
        f"{_HERE}.redis.backend:RedisBackend",
        {
            "redis": "redis://:PASSWORD@redis-host:6379/0",
            "rediss": "rediss://USER:PASSWORD@redis-host:6380/0",
        },
        grammar=f"{_HERE}.redis.url",
        extra="redis",
        tls_schemes=("rediss",),
        aliases={"redis+tls": "rediss"},
    ),
)
"""Every backend plug-in, one line each."""

_BY_SCHEME: Mapping[str, Plugin] = MappingProxyType(
    {scheme: p for p in PLUGINS for scheme in p.schemes}
)
SCHEMES: tuple[str, ...] = tuple(_BY_SCHEME)
"""The backend URL schemes, in the order of :data:`PLUGINS` (``rediss`` is Redis over TLS)."""
_EXAMPLES: Mapping[str, str] = MappingProxyType(
    {scheme: p.example(scheme) for p in PLUGINS for scheme in p.schemes}
)
_ALIASES: Mapping[str, str] = MappingProxyType(
    {alias: scheme for p in PLUGINS for alias, scheme in p.aliases.items()}
)


def plugin(scheme: str) -> Plugin | None:
    """The plug-in of ``scheme`` (lower case), or None."""
    return _BY_SCHEME.get(scheme)


def grammar(scheme: str) -> BackendGrammar:
    """The URL grammar of a known ``scheme``, importing only its stdlib-only grammar module."""
    found = _BY_SCHEME[scheme]
    module = importlib.import_module(found.grammar)
    result: BackendGrammar = module.GRAMMAR
    return result


def parse_backend_url(
    url: str, *, allowed_options: Mapping[str, Collection[str]] | None = None
) -> BackendUrl:
    """Parse and check a backend URL with its plug-in's grammar; see
    :func:`rebalancer_spark.core.urls.parse_backend_url`."""
    parts = split_url(
        url,
        examples=tuple(_EXAMPLES.values()),
        check_scheme=_check_scheme,
        local_path=_local_path,
        no_slashes=_no_slashes,
    )
    parsed = grammar(parts.scheme).parse(parts)
    if allowed_options is not None:
        parts.options(allowed_options.get(parts.scheme, ()))
    return parsed


def check_backend_url(url: str) -> BackendUrl:
    """``url`` parsed and checked as :func:`open_backend` checks it (scheme, syntax, the
    backend's own options), without connecting and without its client library; a
    :class:`ConfigurationError` otherwise."""
    scheme = parse_backend_url(url).scheme
    return parse_backend_url(url, allowed_options={scheme: tuple(grammar(scheme).options)})


def store_missing(url: BackendUrl) -> bool:
    """Whether the store ``url`` names does not exist locally, so that opening it would create
    it (an absent SQLite file). A read-only command refuses such a URL, or reports the group
    as empty, instead of opening it. Network stores: always False."""
    return grammar(url.scheme).store_missing(url)


def backend_class(url: str) -> tuple[type[Backend], BackendUrl]:
    """The implementation class of ``url``'s backend (imported now, with its client library)
    and the URL checked with the backend's options."""
    parsed = check_backend_url(url)
    found = _BY_SCHEME[parsed.scheme]
    try:
        module = importlib.import_module(found.module)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("rebalancer_spark"):
            raise ConfigurationError(
                f"backend {parsed.redacted()!r}: the {parsed.scheme} backend is not "
                "part of this installation of rebalancer-spark; use sqlite:///path"
            ) from None
        raise ConfigurationError(
            f"backend {parsed.redacted()!r} needs the Python package "
            f"{exc.name!r}: {found.install_hint()}"
        ) from None
    cls: type[Backend] = getattr(module, found.class_name)
    return cls, parsed


def _check_scheme(scheme: str, shown: str) -> None:
    if scheme in _BY_SCHEME:
        return
    hint = _ALIASES.get(scheme)
    hint_text = f" (did you mean {hint!r}?)" if hint else did_you_mean(scheme, SCHEMES)
    raise ConfigurationError(
        f"backend URL {shown!r} has the unknown scheme {show(scheme)}{hint_text}: use one "
        f"of {', '.join(f'{s} ({e})' for s, e in _EXAMPLES.items())}"
    )


def _local_path(scheme: str) -> bool:
    return scheme in _BY_SCHEME and grammar(scheme).local_file


def _no_slashes(scheme: str, text: str, shown: str) -> str | None:
    if scheme not in _BY_SCHEME:
        return None
    better = grammar(scheme).no_slashes
    return None if better is None else better(scheme, text, shown)


set_backend_parser(lambda url, allowed: parse_backend_url(url, allowed_options=allowed))


DEFAULT_STORE = "sqlite"
"""The backend a member uses when given no URL: one file per user and host."""


def default_store_url(state_dir: str) -> str:
    """The URL of the default store in the absolute directory ``state_dir``
    (``sqlite:///…/groups.db``), from the SQLite plug-in's own grammar."""
    module = importlib.import_module(f"{_HERE}.{DEFAULT_STORE}.url")
    url: str = module.url_in(state_dir)
    return url
