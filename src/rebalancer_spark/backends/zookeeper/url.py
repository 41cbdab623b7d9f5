"""The grammar of ``zookeeper://[user:password@]host[:port][,host[:port]...][/chroot][?...]``
(stdlib only).

Every host of the comma list gets port 2181 unless it names one. The chroot is normalised
(``"/"`` if none, never a trailing slash) and may not hold empty, ``.`` or ``..`` segments,
control characters or lie inside ``/zookeeper``. The URL options are :data:`OPTIONS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote, unquote

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.plugins import BackendGrammar
from rebalancer_spark.core.urls import BackendUrl, SplitUrl, show

__all__ = ["DEFAULT_PORT", "GRAMMAR", "OPTIONS"]

DEFAULT_PORT = 2181
EXAMPLE = "zookeeper://zk1:2181,zk2:2181/rebalancer"

OPTIONS: Mapping[str, str] = {
    "connect_timeout": "seconds to wait for a connection to the ensemble (default 10)",
    "request_timeout": "seconds to wait for the answer to one request (default 10)",
    "use_ssl": "connect with TLS to the servers' secureClientPort (default false)",
    "ca": "TLS: file of the CA certificates that signed the servers' certificates",
    "certfile": "TLS: this client's certificate file (for servers that require one)",
    "keyfile": "TLS: the private key of certfile",
    "verify_certs": "TLS: check the servers' certificates (default true)",
}


def parse(url: SplitUrl) -> BackendUrl:
    """Hosts and chroot of a ``zookeeper://`` URL; see the module docstring."""
    (username, password), hostpart = url.credentials()
    if not hostpart:
        raise url.fail(f"names no host: write the host after '//', e.g. {EXAMPLE}")
    hosts = tuple(url.host_port(entry, DEFAULT_PORT) for entry in hostpart.split(","))
    path = _chroot(url.path, url.shown)
    shown_path = "" if path == "/" else quote(path, safe="/:")
    options = url.options(None)
    return BackendUrl("zookeeper", hosts, path, 0, username, password, options, shown_path)


def _chroot(path_part: str, shown: str) -> str:
    path = unquote(path_part)
    if path in ("", "/"):
        return "/"
    fix = "write the chroot as /name/sub, e.g. zookeeper://zk1:2181/rebalancer/orders"
    if not path.isprintable() or any("\ud800" <= c <= "\udfff" for c in path):
        raise ConfigurationError(
            f"backend URL {shown!r}: the ZooKeeper chroot {show(path)} contains a NUL, "
            f"control or unpaired surrogate character, which ZooKeeper refuses: {fix}"
        )
    segments = path[1:].removesuffix("/").split("/")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise ConfigurationError(
                f"backend URL {shown!r}: the ZooKeeper chroot {show(path)} has "
                f"{'an empty segment' if not segment else f'the segment {segment!r}'}; ZooKeeper "
                f"paths have no empty, '.' or '..' parts: {fix}"
            )
    if segments[0] == "zookeeper":
        raise ConfigurationError(
            f"backend URL {shown!r}: the chroot {show(path)} is inside /zookeeper, which "
            f"ZooKeeper reserves for itself: {fix}"
        )
    return "/" + "/".join(segments)


GRAMMAR = BackendGrammar(parse=parse, options=OPTIONS)
