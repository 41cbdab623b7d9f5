"""The grammar of ``sqlite:///abs/path/groups.db[?name=value&...]`` (stdlib only).

The file is local to this machine: no host, three slashes then the absolute path. The URL
options are ``poll`` and ``busy_timeout`` (:data:`OPTIONS`). A read-only command asks
:func:`store_missing` first, so that it never creates a file by reading it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import quote, unquote

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.plugins import BackendGrammar
from rebalancer_spark.core.urls import BackendUrl, SplitUrl, show

__all__ = ["GRAMMAR", "OPTIONS", "url_in"]

OPTIONS: Mapping[str, str] = {
    "poll": "seconds between checks for changes (default 0.02)",
    "busy_timeout": "seconds to wait for the write lock (default 10)",
}


def parse(url: SplitUrl) -> BackendUrl:
    """The absolute file path of a ``sqlite://`` URL; see the module docstring."""
    shown = url.shown
    if url.authority:
        host = url.authority.rpartition("@")[2]
        if host.lower() == "localhost" and url.path:
            example = f"sqlite://{url.path}"
        else:
            example = f"sqlite:///full/path/to/{(host + url.path).lstrip('./') or 'groups.db'}"
        raise ConfigurationError(
            f"backend URL {shown!r}: sqlite takes no host, but the URL has "
            f"{show(host) if host else 'credentials'} between '//' and the path; the file "
            f"is local to this machine: write three slashes then the absolute path, "
            f"e.g. {example}"
        )
    path = unquote(url.path)
    if not path:
        raise ConfigurationError(
            f"backend URL {shown!r} has an empty path: write three slashes then the absolute "
            "path of the database file, e.g. sqlite:///full/path/to/groups.db"
        )
    if not path.isprintable():
        raise ConfigurationError(
            f"backend URL {shown!r}: the path {show(path)} contains a NUL or control "
            "character: give a plain absolute file path"
        )
    path = "/" + path.lstrip("/")
    relative = path[1:]
    if relative in (".", "..", "~") or relative.startswith(("./", "../", "~")):
        raise ConfigurationError(
            f"backend URL {shown!r}: the path {show(relative)} is relative (and '~' is not "
            f"expanded): sqlite needs an absolute path, three slashes then the path from the "
            f"root, e.g. sqlite:///full/path/to/{relative.lstrip('./~') or 'groups.db'}"
        )
    if path.endswith("/"):
        raise ConfigurationError(
            f"backend URL {shown!r}: the path {show(path)} names a directory: add the file "
            f"name, e.g. sqlite://{quote(path, safe='/:@')}groups.db"
        )
    options = url.options(None)
    return BackendUrl("sqlite", (), path, 0, None, None, options, quote(path, safe="/:@"))


def no_slashes(scheme: str, text: str, shown: str) -> str | None:
    """The message for ``sqlite:path`` written without ``//``."""
    if "@" in text:
        return None
    path = text[len(scheme) + 1 :]
    if path.startswith("/"):
        return f"backend URL {shown!r} needs three slashes after 'sqlite:': write sqlite://{path}"
    return (
        f"backend URL {shown!r} has the relative path {show(path)}: sqlite needs an "
        f"absolute path, three slashes then the path from the root, e.g. "
        f"sqlite:///full/path/to/{path.lstrip('./~') or 'groups.db'}"
    )


def store_missing(url: BackendUrl) -> bool:
    """Whether the database file does not exist (opening it would create it)."""
    return not os.path.exists(url.path)


GRAMMAR = BackendGrammar(
    parse=parse,
    options=OPTIONS,
    store_missing=store_missing,
    local_file=True,
    no_slashes=no_slashes,
)


def url_in(state_dir: str) -> str:
    """The URL of ``groups.db`` in the absolute directory ``state_dir``, for example
    ``sqlite:///var/lib/rebalancer/groups.db``; special characters are percent-encoded so that
    :func:`parse_backend_url` gives back exactly that path."""
    if not state_dir.startswith("/"):
        raise ConfigurationError(
            f"state directory {show(state_dir)} is not an absolute path: give the full path "
            "from the root, e.g. /var/lib/rebalancer"
        )
    return "sqlite://" + quote(state_dir.rstrip("/") + "/groups.db", safe="/:@")
