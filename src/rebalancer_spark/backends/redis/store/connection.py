"""Opening redis-py clients from a checked :class:`BackendUrl`: AUTH, TLS, timeouts, retries.

``redis://[user:password@]host:port/db`` sends ``AUTH user password`` (an ACL user; without a
user name, the ``default`` user's password) on every new connection. ``rediss://`` speaks TLS
and **always** verifies the server's certificate against ``ca_file`` (or the system's CAs);
``check_hostname=false`` only skips matching the host name, for servers reached by an address
their certificate does not name.

Retries: a command that fails because its pooled connection broke (Redis restarted) is sent
once more on a fresh connection after a short pause; a command that *timed out* is not, since
it may be running. Every script is safe to run twice (see ``docs/backends/redis.md``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from rebalancer_spark.backends.redis.url import OPTIONS, TLS_OPTIONS
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.urls import BackendUrl

__all__ = ["OPTIONS", "TLS_OPTIONS", "open_client"]


def _seconds(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = float(text)
        if not 0 < value < 3600:
            raise ValueError(f"{name} must be a number of seconds above 0 and below 3600")
        return value

    parse.__name__ = "number of seconds"
    return parse


def _readable_file(url: BackendUrl, name: str) -> str | None:
    path = url.options.get(name)
    if path is None:
        return None
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise ConfigurationError(
            f"option {name} = {path!r} in backend URL {url.redacted()!r} is not a readable "
            f"file: give the absolute path of the PEM file ({TLS_OPTIONS[name].split(': ')[1]})"
        )
    return path


def client_options(url: BackendUrl) -> dict[str, Any]:
    """The keyword arguments of :class:`redis.Redis` for ``url`` (checked, nothing opened)."""
    if url.scheme != "rediss":
        given = sorted(set(url.options) & set(TLS_OPTIONS))
        if given:
            raise ConfigurationError(
                f"backend URL {url.redacted()!r} gives the TLS options {given} but its scheme is "
                f"redis:// (no TLS): write rediss:// to connect over TLS, or remove them"
            )
    host, port = url.hosts[0]
    kwargs: dict[str, Any] = {
        "host": host,
        "port": port,
        "db": url.database,
        "username": url.username,
        "password": url.password,
        "socket_timeout": url.option("timeout", _seconds("timeout"), 5.0),
        "socket_connect_timeout": url.option("connect_timeout", _seconds("connect_timeout"), 5.0),
        "socket_keepalive": True,
        "decode_responses": True,
        "retry": Retry(
            ExponentialBackoff(cap=0.2, base=0.02),
            1,
            supported_errors=(redis.exceptions.ConnectionError,),
        ),
        "health_check_interval": 0,
    }
    if url.scheme == "rediss":
        kwargs.update(
            ssl=True,
            ssl_cert_reqs="required",
            ssl_ca_certs=_readable_file(url, "ca_file"),
            ssl_certfile=_readable_file(url, "cert_file"),
            ssl_keyfile=_readable_file(url, "key_file"),
            ssl_password=url.options.get("key_password"),
            ssl_check_hostname=url.option("check_hostname", bool, True),
        )
        if kwargs["ssl_keyfile"] and not kwargs["ssl_certfile"]:
            raise ConfigurationError(
                f"backend URL {url.redacted()!r} gives key_file without cert_file: give both "
                "(the client certificate and its key), or neither"
            )
    return kwargs


def open_client(url: BackendUrl) -> redis.Redis:
    """A client (a thread-safe connection pool) for ``url``; connects lazily."""
    return redis.Redis(**client_options(url))
