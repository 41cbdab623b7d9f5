"""``rabbitmq://user:password@host:5672/vhost?queues=a,b``: each RabbitMQ queue is a resource.

Use it when several Spark jobs share the queues of a broker and every queue must be read by
exactly one job at a time (ordering per queue, one consumer per queue)::

    rabbitmq://USER:PASSWORD@HOST[:PORT][/VHOST]?queues=orders,payments[&OPTIONS]
    rabbitmq://USER:PASSWORD@HOST[:PORT][/VHOST]?pattern=orders-*&management=http://HOST:15672

``amqp://`` is the same; ``rabbitmqs://`` and ``amqps://`` use TLS (port 5671 by default). The
vhost is the path, percent-encoded (``/%2F`` or no path is the default vhost ``/``).

The password of ``USER@`` comes from the URL (``USER:PASSWORD@``), else from the file named by
``password_file=PATH`` (its content, one trailing newline dropped), else from the environment
variable ``RABBITMQ_PASSWORD``; a user with none of these is refused. Only a URL without any
user logs in as RabbitMQ's default ``guest``/``guest``. Options:

* ``queues=a,b`` — the queues, listed; a listed queue that does not exist is left out of the
  listing (with a warning) until it does;
* ``password_file=PATH`` — the file holding the user's password (see above);
* ``pattern=GLOB`` with ``management=http[s]://host:15672`` — every queue of the vhost whose
  name matches the glob, listed through the management plugin's HTTP API with the same user
  (sent as Basic auth to that URL only: a redirect is refused, never followed with the
  password; credentials written in the ``management=`` URL itself are hidden in messages);
  AMQP itself cannot list queues, so a pattern without ``management=`` is refused. A matching
  queue whose name cannot be a resource id (a control character) is skipped with a warning
  naming it, so that it does not stop the listing of the others;
* ``dedupe=message_id|header:NAME|json:FIELD|body`` — the dedupe key (see
  :mod:`.queues`); ``message_id`` is the AMQP ``message-id`` property the producer sets;
* ``batch=N`` — messages per batch (default 100); ``heartbeat=S`` — the AMQP heartbeat in
  seconds (default 60): a consumer that makes no call for about twice that long is dropped by
  the broker and its unacknowledged messages are requeued.

A queue's weight is its ready messages (passive ``queue.declare``) in powers of two
(:func:`.queues.depth_weight`). Messages are fetched with ``basic.get`` without
acknowledgement; closing the consumer (or its process dying) requeues every one not yet
acknowledged. The password never appears in a log, an error or a repr.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import ssl
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from rebalancer_spark.core.errors import ConfigurationError, SourceError
from rebalancer_spark.core.model import Resource, validate_resource_id
from rebalancer_spark.core.urls import redact_url
from rebalancer_spark.sources.queues import (
    DedupeRule,
    QueueConsumer,
    QueueMessage,
    QueueSource,
    batch_option,
    depth_weight,
    parse_query,
    split_names,
)
from rebalancer_spark.sources.registry import plugin_named

__all__ = ["RabbitMqSource"]

log = logging.getLogger("rebalancer_spark.sources.rabbitmq")

_PLUGIN = plugin_named("rabbitmq")  # its schemes, and which of them mean TLS
_OPTIONS = ("batch", "dedupe", "heartbeat", "management", "password_file", "pattern", "queues")
PASSWORD_ENV = "RABBITMQ_PASSWORD"  # noqa: S105 - a variable name, not a password
"""The environment variable a user's password is read from when the URL has none."""


def _pika() -> Any:
    try:
        import pika
    except ImportError:
        raise ConfigurationError(
            "rabbitmq:// sources need the pika package: pip install 'rebalancer-spark[rabbitmq]' "
            "(or pip install pika)"
        ) from None
    return pika


class RabbitMqSource(QueueSource):
    """The queues of one RabbitMQ vhost; see the module docstring."""

    def __init__(self, url: str) -> None:
        self.url = url
        shown = redact_url(url)
        where = f"source {shown!r}"
        parts = urlsplit(url)
        if parts.scheme not in _PLUGIN.schemes:
            raise ConfigurationError(
                f"{where} is not a RabbitMQ URL: write rabbitmq://USER:PASSWORD@HOST:5672/"
                "VHOST?queues=a,b"
            )
        try:
            host, port = parts.hostname, parts.port
        except ValueError:
            raise ConfigurationError(
                f"{where} has a port that is not a number from 1 to 65535: write HOST:5672"
            ) from None
        if not host:
            raise ConfigurationError(
                f"{where} names no host: write rabbitmq://USER:PASSWORD@HOST:5672/VHOST?queues=a"
            )
        self.tls = parts.scheme in _PLUGIN.tls_schemes
        self.host = host
        self.port = port or (5671 if self.tls else 5672)
        path = parts.path
        self.vhost = "/" if path in ("", "/") else unquote(path[1:])
        options = parse_query(parts.query, _OPTIONS, where)
        self.username, self._password = _credentials(
            unquote(parts.username) if parts.username else None,
            unquote(parts.password) if parts.password is not None else None,
            options.get("password_file"),
            where,
        )
        self.batch_size = batch_option(options.get("batch"), where)
        self.dedupe = DedupeRule.parse(options.get("dedupe", "message_id"), where)
        self.heartbeat = _seconds(options.get("heartbeat", "60"), "heartbeat", where)
        """AMQP heartbeat in whole seconds; 0 turns heartbeats off."""
        self.management = options.get("management")
        self.pattern = options.get("pattern")
        listed = options.get("queues")
        if (listed is None) == (self.pattern is None):
            raise ConfigurationError(
                f"{where} must give exactly one of queues=a,b (the queues) or pattern=GLOB "
                "(with management=http://HOST:15672 to list the vhost's queues)"
            )
        if self.pattern is not None and self.management is None:
            raise ConfigurationError(
                f"{where} gives pattern={self.pattern!r} without management=: AMQP cannot list "
                "queues, so a pattern needs the management plugin's HTTP API, e.g. "
                "&management=http://HOST:15672; or list the queues with queues=a,b"
            )
        self.management_shown = None if self.management is None else redact_url(self.management)
        """``management=`` as shown in messages: any secret in it replaced by ``***``."""
        if self.management is not None:
            if not self.management.startswith(("http://", "https://")):
                raise ConfigurationError(
                    f"{where}: management={self.management_shown!r} is not an http(s) URL: "
                    "write e.g. management=http://HOST:15672"
                )
            if "@" in urlsplit(self.management).netloc:
                raise ConfigurationError(
                    f"{where}: management={self.management_shown!r} has credentials in it: "
                    "write management=http://HOST:15672; the API is called with the source's "
                    "own user and password"
                )
        self.queues = None if listed is None else split_names(listed, "queues", where)
        for queue in self.queues or ():
            try:
                validate_resource_id(queue)
            except ConfigurationError as exc:
                raise ConfigurationError(f"{where}: queues= holds a bad name: {exc}") from None
        self.shown = shown

    def __repr__(self) -> str:
        return f"RabbitMqSource({self.shown!r})"

    # -- connections --------------------------------------------------------------------------

    def _connect(self) -> Any:
        pika = _pika()
        params = pika.ConnectionParameters(
            host=self.host,
            port=self.port,
            virtual_host=self.vhost,
            credentials=pika.PlainCredentials(self.username, self._password),
            heartbeat=self.heartbeat,
            blocked_connection_timeout=30,
            connection_attempts=1,
            socket_timeout=10,
            ssl_options=pika.SSLOptions(ssl.create_default_context(), self.host)
            if self.tls
            else None,
        )
        try:
            return pika.BlockingConnection(params)
        except pika.exceptions.AMQPError as exc:
            raise SourceError(
                f"cannot connect to RabbitMQ for {self.shown!r} ({_why(exc)}): check the host, "
                "port, vhost and credentials, and that the broker runs"
            ) from None

    # -- discovery ----------------------------------------------------------------------------

    def discover(self) -> list[Resource]:
        names = self._listed_by_management() if self.queues is None else self.queues
        conn = self._connect()
        try:
            found = []
            for name in names:
                depth = _passive_depth(conn, name, self.shown)
                if depth is None:
                    if self.queues is not None:
                        log.warning("source %s: queue %r does not exist (yet)", self.shown, name)
                    continue
                found.append(Resource(name, depth_weight(depth)))
        finally:
            _close_quietly(conn)
        return sorted(found)

    def depth(self, queue: str) -> int:
        conn = self._connect()
        try:
            depth = _passive_depth(conn, queue, self.shown)
        finally:
            _close_quietly(conn)
        if depth is None:
            raise SourceError(f"queue {queue!r} of source {self.shown!r} does not exist")
        return depth

    def _listed_by_management(self) -> list[str]:
        assert self.management is not None and self.pattern is not None
        api = f"{self.management.rstrip('/')}/api/queues/{quote(self.vhost, safe='')}"
        request = urllib.request.Request(api + "?columns=name")  # noqa: S310 - http(s) checked
        token = b64encode(f"{self.username}:{self._password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        opener = urllib.request.build_opener(_NoRedirects)
        try:
            with opener.open(request, timeout=10) as answer:
                listing = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            exc.close()
            if 300 <= exc.code < 400:
                target = redact_url(str(exc.headers.get("Location", "?")))[:200]
                raise SourceError(
                    f"the management API at {self.management_shown} redirected to {target!r} "
                    f"(HTTP {exc.code}) for source {self.shown!r}: redirects are not followed, "
                    "so the password goes to no other host; give the final URL as management="
                ) from None
            raise SourceError(
                f"the management API at {self.management_shown} refused to list the queues of "
                f"vhost {self.vhost!r} for source {self.shown!r} (HTTP {exc.code} "
                f"{exc.reason}): check the user's password and that it may read the vhost "
                "(management tag)"
            ) from None
        except (OSError, ValueError) as exc:
            raise SourceError(
                f"cannot list the queues of vhost {self.vhost!r} through the management API "
                f"at {self.management_shown} for source {self.shown!r} ({_why(exc)}): check "
                "that the rabbitmq_management plugin is enabled and the user may read the vhost"
            ) from None
        names = [q.get("name") for q in listing if isinstance(q, dict)]
        matched = sorted(
            n for n in names if isinstance(n, str) and fnmatch.fnmatchcase(n, self.pattern)
        )
        usable = []
        for name in matched:
            try:
                usable.append(validate_resource_id(name))
            except ConfigurationError as exc:
                # one badly named queue must not stop the discovery of every other one
                log.warning(
                    "source %s: queue %r skipped, it cannot be a resource (rename it): %s",
                    self.shown,
                    name,
                    exc,
                )
        return usable

    # -- consuming ----------------------------------------------------------------------------

    def consumer(self, queue: str) -> QueueConsumer:
        pika = _pika()
        connection = self._connect()
        try:
            channel = connection.channel()
        except pika.exceptions.AMQPError as exc:
            _close_quietly(connection)
            raise SourceError(
                f"cannot open a channel to read queue {queue!r} of {self.shown!r} "
                f"({_why(exc)}): the broker refused it or the connection dropped"
            ) from None
        except BaseException:
            _close_quietly(connection)
            raise
        return _RabbitConsumer(self, queue, connection, channel)


class _RabbitConsumer(QueueConsumer):
    """``basic.get`` without ack on one channel; closing the connection requeues the rest."""

    def __init__(self, source: RabbitMqSource, queue: str, connection: Any, channel: Any) -> None:
        self.resource = queue
        self._source = source
        self._conn = connection
        self._channel = channel
        self._closed = False
        self._ready: int | None = None  # what the last basic.get said is left in the queue

    def __repr__(self) -> str:
        return f"RabbitMqConsumer({self.resource!r} of {self._source.shown!r})"

    def _failed(self, doing: str, exc: Exception) -> SourceError:
        self.close()
        return SourceError(
            f"{doing} queue {self.resource!r} of {self._source.shown!r} failed ({_why(exc)}); "
            "its unacknowledged messages return to the queue: open a new consumer"
        )

    def fetch(self, max_messages: int) -> list[QueueMessage]:
        if self._closed:
            raise SourceError(f"{self!r} is closed: open a new consumer")
        pika = _pika()
        out: list[QueueMessage] = []
        try:
            while len(out) < max_messages:
                method, props, body = self._channel.basic_get(self.resource, auto_ack=False)
                if method is None:
                    self._ready = 0
                    break
                self._ready = int(method.message_count)  # Basic.GetOk: messages left
                headers = {str(k): _text(v) for k, v in (props.headers or {}).items()}
                key = self._source.dedupe.key(props.message_id, headers, body)
                out.append(
                    QueueMessage(key, body, method.delivery_tag, headers, bool(method.redelivered))
                )
        except pika.exceptions.AMQPError as exc:
            raise self._failed("reading", exc) from None
        return out

    def depth(self) -> int:
        """What the last ``basic.get`` said is left (free: every GetOk carries it); a passive
        declare on this consumer's connection before the first fetch."""
        if self._ready is not None:
            return self._ready
        if self._closed:
            raise SourceError(f"{self!r} is closed: open a new consumer")
        depth = _passive_depth(self._conn, self.resource, self._source.shown)
        if depth is None:
            raise SourceError(f"queue {self.resource!r} of {self._source.shown!r} does not exist")
        return depth

    def ack(self, messages: Sequence[QueueMessage]) -> None:
        pika = _pika()
        try:
            for message in messages:
                self._channel.basic_ack(delivery_tag=message.handle)
            self._conn.process_data_events(0)  # flush, and notice a dead connection now
        except pika.exceptions.AMQPError as exc:
            raise self._failed("acknowledging", exc) from None

    def give_back(self, messages: Sequence[QueueMessage]) -> None:
        pika = _pika()
        try:
            for message in messages:
                self._channel.basic_nack(delivery_tag=message.handle, requeue=True)
            self._conn.process_data_events(0)
        except pika.exceptions.AMQPError as exc:
            raise self._failed("returning messages to", exc) from None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _close_quietly(self._conn)


def _passive_depth(conn: Any, queue: str, shown: str) -> int | None:
    """Ready messages of ``queue``; None if it does not exist."""
    pika = _pika()
    try:
        channel = conn.channel()
        answer = channel.queue_declare(queue=queue, passive=True)
        count: int = answer.method.message_count
        if channel.is_open:
            channel.close()
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return None
        raise SourceError(f"cannot read queue {queue!r} of {shown!r} ({_why(exc)})") from None
    except pika.exceptions.AMQPError as exc:
        raise SourceError(f"cannot read queue {queue!r} of {shown!r} ({_why(exc)})") from None
    return count


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: the request carries the user's password in Basic auth."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError


def _close_quietly(conn: Any) -> None:
    try:
        if conn.is_open:
            conn.close()
    except Exception as exc:  # a broker that is gone: the messages are requeued by it anyway
        log.debug("closing a RabbitMQ connection failed: %s", _why(exc))


def _credentials(
    user: str | None, password: str | None, password_file: str | None, where: str
) -> tuple[str, str]:
    """``(user, password)``: from the URL, else ``password_file=``, else ``RABBITMQ_PASSWORD``.

    No user at all is RabbitMQ's default ``guest``/``guest`` (a broker's own test account,
    allowed from localhost only); a user without a password anywhere is refused, never guessed.
    """
    if user is None:
        if password is not None or password_file is not None:
            raise ConfigurationError(
                f"{where} gives a password but no user: write rabbitmq://USER@HOST/... with the "
                f"password in the URL, in password_file=PATH or in ${PASSWORD_ENV}"
            )
        return "guest", "guest"
    if password is not None:
        if password_file is not None:
            raise ConfigurationError(
                f"{where} gives the password twice, in the URL and in password_file=: keep one"
            )
        return user, password
    if password_file is not None:
        try:
            with open(password_file, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(
                f"{where}: cannot read password_file={password_file!r} "
                f"({_why(exc)}): "
                "give a readable UTF-8 file holding the password"
            ) from None
        text = text.removesuffix("\n").removesuffix("\r")
        if not text:
            raise ConfigurationError(f"{where}: password_file={password_file!r} is empty")
        return user, text
    env = os.environ.get(PASSWORD_ENV)
    if env:
        return user, env
    raise ConfigurationError(
        f"{where} names user {user!r} without a password: put it in a file and add "
        f"&password_file=PATH, or set the environment variable {PASSWORD_ENV}, or (less safe: "
        "URLs end up in logs and process lists) write rabbitmq://USER:PASSWORD@HOST/...; "
        "without any user the source logs in as guest"
    )


def _seconds(text: str, name: str, where: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > 3600:
        raise ConfigurationError(
            f"{name}={text!r} in {where} is not a whole number of seconds from 0 to 3600"
        )
    return int(text)


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _why(exc: BaseException) -> str:
    return redact_url(f"{type(exc).__name__}: {exc}"[:300])
