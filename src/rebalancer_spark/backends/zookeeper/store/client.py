"""The kazoo side of the backend: opening clients, bounded waits, pipelined reads, and the
translation of kazoo's exceptions into :mod:`rebalancer_spark.core.errors`.

Every wait has a deadline (``request_timeout``): a request queued while the connection is down
is never waited on forever. Messages show the URL redacted; credentials never leave this module
except inside the kazoo client itself.
"""

from __future__ import annotations

import contextlib
import logging
import math
import select
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NoAuthError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.serialization import Connect
from kazoo.retry import KazooRetry
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl, make_digest_acl_credential

from rebalancer_spark.backends.zookeeper.url import OPTIONS
from rebalancer_spark.core.errors import BackendUnavailable, ConfigurationError
from rebalancer_spark.core.urls import BackendUrl

__all__ = [
    "KAZOO_LOG",
    "OPTIONS",
    "Settings",
    "close_session",
    "open_client",
    "stop_client",
    "wait",
]


class _Redact(logging.Filter):
    """Replaces credentials in kazoo's log records: at DEBUG kazoo logs every request it
    sends, the digest ``Auth`` packet (user:password) and ACLs (user:hash) included."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = record.getMessage()
            if any(secret in message for secret in self.secrets):
                for secret in self.secrets:
                    message = message.replace(secret, "***")
                record.msg, record.args = message, ()
        return True


_REDACT = _Redact()
KAZOO_LOG = logging.getLogger("kazoo.client.rebalancer_spark")
"""The logger given to every kazoo client (a child of kazoo's own, so its configuration
applies), with credentials redacted from every record."""
KAZOO_LOG.addFilter(_REDACT)


def _positive(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = float(text)
        if not 0 < value < float("inf"):
            raise ValueError(f"{name} must be a positive number of seconds")
        return value

    return parse


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything needed to open a client, parsed once from the URL."""

    hosts: str
    shown: str
    """The URL with its password replaced by ``***``: the only form ever put in a message."""
    connect_timeout: float
    request_timeout: float
    acl: Sequence[Any]
    auth_data: Sequence[tuple[str, str]] = field(repr=False)
    ssl: Mapping[str, Any] = field(default_factory=dict)
    identity: str = "anonymous"

    @classmethod
    def from_url(cls, url: BackendUrl) -> Settings:
        if (url.username is None) != (url.password is None):
            raise ConfigurationError(
                f"backend URL {url.redacted()!r} gives a user name without a password or a "
                "password without a user name: ZooKeeper digest authentication needs both, "
                "as zookeeper://user:password@host:2181/chroot"
            )
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in url.hosts)
        ssl: dict[str, Any] = {}
        if url.option("use_ssl", bool, False):
            ssl = {
                "use_ssl": True,
                "verify_certs": url.option("verify_certs", bool, True),
                "ca": url.option("ca", str, None),
                "certfile": url.option("certfile", str, None),
                "keyfile": url.option("keyfile", str, None),
            }
        if url.username is not None and url.password is not None:
            acl = [make_digest_acl(url.username, url.password, all=True)]
            auth = [("digest", f"{url.username}:{url.password}")]
            hashed = make_digest_acl_credential(url.username, url.password).split(":", 1)[1]
            _REDACT.secrets.update({url.password, hashed})
            identity = f"digest user {url.username!r}"
        else:
            acl, auth, identity = list(OPEN_ACL_UNSAFE), [], "anonymous"
        return cls(
            hosts=hosts,
            shown=url.redacted(),
            connect_timeout=url.option("connect_timeout", _positive("connect_timeout"), 10.0),
            request_timeout=url.option("request_timeout", _positive("request_timeout"), 10.0),
            acl=acl,
            auth_data=auth,
            ssl=ssl,
            identity=identity,
        )

    def unavailable(self, what: str, why: str) -> BackendUnavailable:
        return BackendUnavailable(
            f"ZooKeeper {self.shown}: {what} failed ({why}); check that the ensemble is up, has "
            "a quorum and is reachable from this host, or raise ?request_timeout= in the URL"
        )

    def refused(self, path: str) -> ConfigurationError:
        return ConfigurationError(
            f"ZooKeeper {self.shown} refused {self.identity} access to {path} (NoAuth): its "
            "ACL belongs to another identity. Use the user and password the group was created "
            "with (zookeeper://user:password@hosts/chroot), or another chroot"
        )


_READABLE = ~select.POLLOUT
"""``poll`` events that make a descriptor readable: data, and also an error or a hang-up (a
read then says what happened), as ``selectors`` reports them."""
_WRITABLE = ~(select.POLLIN | select.POLLPRI)


def poll_select(
    rlist: Sequence[Any], wlist: Sequence[Any], xlist: Sequence[Any], timeout: float | None = None
) -> tuple[list[Any], list[Any], list[Any]]:
    """``select`` for kazoo's connection loop, by ``poll``: one system call. kazoo's own
    (``selector_select``) builds an epoll object for every call (create, register each
    descriptor, wait, close): its connection threads loop once per packet, and in a
    100-member group on two cores that was 5 % of a member host's samples during a join.
    The same answers for kazoo's calls (each object in one list): the objects of ``rlist``
    and ``wlist`` that are ready (an error or a hang-up makes one ready), none of ``xlist``
    (kazoo passes none); a closed descriptor raises TypeError, as kazoo's does."""
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be non-negative")
    reads = [(_fd(o), o) for o in rlist]
    writes = [(_fd(o), o) for o in wlist]
    events: dict[int, int] = {}
    for pairs, mask in ((reads, select.POLLIN), (writes, select.POLLOUT)):
        for fd, _ in pairs:
            events[fd] = events.get(fd, 0) | mask
    poller = select.poll()
    for fd, mask in events.items():
        poller.register(fd, mask)
    ready = dict(poller.poll(None if timeout is None else math.ceil(timeout * 1000)))
    return (
        [o for fd, o in reads if ready.get(fd, 0) & _READABLE],
        [o for fd, o in writes if ready.get(fd, 0) & _WRITABLE],
        [],
    )


def _fd(obj: Any) -> int:
    fd = obj if isinstance(obj, int) else obj.fileno()
    if fd < 0:
        raise TypeError(f"Invalid file descriptor: {fd}")  # as kazoo.handlers.utils says it
    return int(fd)


class _Handler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler, selecting with :func:`poll_select`."""

    def select(self, *args: Any, **kwargs: Any) -> tuple[list[Any], list[Any], list[Any]]:
        return poll_select(*args, **kwargs)


class _Connection(ConnectionHandler):  # type: ignore[misc]
    """kazoo's connection handler, remembering the session timeout the server negotiated
    (kazoo reads it from the connect answer and keeps it nowhere) and the session the first
    connect opened or resumed. Both are noted before kazoo reports the connection
    established, so they are known when ``start()`` returns."""

    negotiated: float | None = None
    opened: tuple[int, bytes] | None = None
    """The session id and password of the first connect's answer. kazoo's own
    ``client_id`` is None whenever the connection is down, which a server restart can make
    it right after ``start()`` returned; and after an expiry it names kazoo's next session."""

    def _invoke(self, timeout: float, request: Any, xid: int | None = None) -> Any:
        result = super()._invoke(timeout, request, xid)
        if isinstance(request, Connect) and isinstance(result, tuple) and result:
            answer = result[0]
            if isinstance(answer, Connect) and answer.time_out > 0:
                self.negotiated = answer.time_out / 1000.0
                if self.opened is None:
                    self.opened = (answer.session_id, answer.passwd)
        return result


class Opened(NamedTuple):
    """A client :func:`open_client` started: the session the server granted it (id and
    password, as kazoo's ``client_id``) and that session's timeout in seconds."""

    client: Any
    negotiated: float
    client_id: tuple[int, bytes]


def open_client(
    settings: Settings, timeout: float, client_id: tuple[int, bytes] | None = None
) -> Opened:
    """A started kazoo client asking for a session of ``timeout`` seconds (or resuming the
    session ``client_id``), with the session it opened and the timeout the server actually
    granted (it clamps requests to its minSessionTimeout .. maxSessionTimeout). The session
    is the connect answer's: the connection may already have dropped again when this
    returns (a server restarting), and kazoo then resumes that session by itself."""
    client = KazooClient(
        hosts=settings.hosts,
        handler=_Handler(),
        timeout=timeout,
        client_id=client_id,
        logger=KAZOO_LOG,
        auth_data=list(settings.auth_data),
        default_acl=list(settings.acl),
        connection_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=0.5, max_jitter=0.2),
        **settings.ssl,
    )
    old = client._connection
    connection = _Connection(
        client, old.retry_sleeper, logger=old.logger, sasl_options=old.sasl_options
    )
    client._connection = connection
    try:
        client.start(timeout=settings.connect_timeout)
    except KazooTimeoutError:
        raise settings.unavailable(
            "connecting", f"no server answered within {settings.connect_timeout:g} s"
        ) from None
    negotiated, opened = connection.negotiated, connection.opened
    if negotiated is None or negotiated <= 0 or opened is None:
        stop_client(client)
        raise BackendUnavailable(
            f"ZooKeeper {settings.shown}: could not learn the session and its negotiated "
            "timeout from this kazoo version's connect answer; install the kazoo version "
            "rebalancer-spark was tested with"
        )
    return Opened(client, negotiated, opened)


def stop_client(client: Any) -> None:
    """Close the client's session (its ephemeral znodes go at once) and free it."""
    with contextlib.suppress(KazooException, OSError):
        client.stop()
    with contextlib.suppress(Exception):  # kazoo refuses to close a connection still stopping
        client.close()


def close_session(settings: Settings, client_id: tuple[int, bytes]) -> bool:
    """End a session whose client could not tell the server (it was disconnected): resume it
    and close it, so its ephemeral znodes go now rather than at its timeout. True once the
    server was reached (the session is then closed, or had already expired)."""
    try:
        client = open_client(settings, 10.0, client_id).client
    except BackendUnavailable:
        return False
    stop_client(client)
    return True


def wait(
    pending: Any,
    settings: Settings,
    what: str,
    expired: Exception,
    path: str = "",
    deadline: float | None = None,
) -> Any:
    """The result of a kazoo async call, translated; NoNode reads as None."""
    left = settings.request_timeout if deadline is None else deadline - time.monotonic()
    try:
        return pending.get(timeout=max(left, 0.001))
    except NoNodeError:
        return None
    except SessionExpiredError:
        raise expired from None
    except (NoAuthError, AuthFailedError):
        raise settings.refused(path or what) from None
    except (ConnectionLoss, ConnectionClosedError) as exc:
        raise settings.unavailable(what, f"connection lost: {type(exc).__name__}") from None
    except KazooTimeoutError:
        raise settings.unavailable(
            what, f"no answer within {settings.request_timeout:g} s"
        ) from None
    except KazooException as exc:
        raise settings.unavailable(what, f"{type(exc).__name__}: {exc}") from None
