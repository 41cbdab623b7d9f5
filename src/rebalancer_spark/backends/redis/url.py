"""The grammar of ``redis://[[user]:password@]host[:port][/db][?name=value&...]`` and of
``rediss://`` (Redis over TLS), stdlib only.

Exactly one host, port 6379 unless given, database 0 to 15 (default 0). The URL options are
:data:`OPTIONS`; those of :data:`TLS_OPTIONS` apply to ``rediss://`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.plugins import BackendGrammar
from rebalancer_spark.core.urls import BackendUrl, SplitUrl, show

__all__ = ["DEFAULT_PORT", "GRAMMAR", "OPTIONS", "TLS_OPTIONS"]

DEFAULT_PORT = 6379
MAX_DB = 15
_EXAMPLES = {
    "redis": "redis://:PASSWORD@redis-host:6379/0",
    "rediss": "rediss://USER:PASSWORD@redis-host:6380/0",
}

TLS_OPTIONS: Mapping[str, str] = {
    "ca_file": "rediss:// only: PEM file of the CA certificates that signed the server's "
    "certificate (default: the system's trusted CAs)",
    "cert_file": "rediss:// only: PEM client certificate, for servers started with "
    "tls-auth-clients yes",
    "key_file": "rediss:// only: PEM private key of cert_file",
    "key_password": "rediss:// only: the password of an encrypted key_file",
    "check_hostname": "rediss:// only: check that the certificate names the host "
    "(default true; the certificate chain is verified either way)",
}

OPTIONS: Mapping[str, str] = {
    "timeout": "seconds one command may take before the store counts as unreachable (default 5)",
    "connect_timeout": "seconds to wait for a new connection (default 5)",
    **TLS_OPTIONS,
}


def parse(url: SplitUrl) -> BackendUrl:
    """Host, port and database of a ``redis://`` or ``rediss://`` URL."""
    (username, password), hostpart = url.credentials()
    example = _EXAMPLES.get(url.scheme, _EXAMPLES["redis"])
    if not hostpart:
        raise url.fail(f"names no host: write the host after '//', e.g. {example}")
    if "," in hostpart:
        raise url.fail(
            f"lists several hosts ({show(hostpart)}): {url.scheme} takes exactly one host, "
            f"e.g. {example}"
        )
    hosts = (url.host_port(hostpart, DEFAULT_PORT),)
    database = _database(url.path, url.shown)
    options = url.options(None)
    return BackendUrl(url.scheme, hosts, "", database, username, password, options, f"/{database}")


def _database(path_part: str, shown: str) -> int:
    if path_part in ("", "/"):
        return 0
    text = unquote(path_part[1:])
    if not (text.isascii() and text.isdigit() and len(text) <= 5) or int(text) > MAX_DB:
        raise ConfigurationError(
            f"backend URL {shown!r}: the Redis database {show(text)} after the host is not a "
            f"number from 0 to {MAX_DB}: write e.g. redis://host:6379/0, or leave the "
            "path out for database 0"
        )
    return int(text)


GRAMMAR = BackendGrammar(parse=parse, options=OPTIONS)
