"""Queue sources against real brokers: the machine's RabbitMQ and moto's SQS server.

Discovery and depth weights, dedupe keys, messages held without acknowledgement and returned
when a consumer closes or its process dies, URLs refused with the password hidden.
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark.core.errors import ConfigurationError, SourceError
from rebalancer_spark.core.model import Resource
from rebalancer_spark.sources.queues import (
    DEPTH_CACHE_SECONDS,
    DedupeRule,
    QueueMessage,
    depth_weight,
)
from rebalancer_spark.sources.rabbitmq import RabbitMqSource
from rebalancer_spark.sources.sqs import SqsSource
from tests.servers.cloud import RabbitMq, RabbitMqNode, SqsPrefix
from tests.support.helpers import wait_for


def _bodies(n: int, tag: str = "m") -> list[tuple[str | None, bytes]]:
    return [(f"{tag}-{i}", json.dumps({"n": i}).encode()) for i in range(n)]


def test_depth_weight_moves_only_when_the_depth_doubles() -> None:
    assert [depth_weight(d) for d in (0, 1, 2, 3, 4, 7, 8, 100)] == [1, 2, 4, 4, 8, 8, 16, 128]


def test_dedupe_rules() -> None:
    body = json.dumps({"event": "e-7", "n": 1}).encode()
    assert DedupeRule.parse("message_id", "t").key("id-1", {}, body) == "id-1"
    assert DedupeRule.parse("header:k", "t").key(None, {"k": "h-1"}, body) == "h-1"
    assert DedupeRule.parse("json:event", "t").key(None, {}, body) == "e-7"
    hashed = DedupeRule.parse("body", "t").key("id-1", {}, body)
    assert hashed.startswith("sha256:") and len(hashed) == 7 + 64
    # a message without the configured key falls back to its body's hash
    assert DedupeRule.parse("message_id", "t").key(None, {}, body) == hashed
    assert DedupeRule.parse("json:missing", "t").key(None, {}, b"not json") != hashed
    with pytest.raises(ConfigurationError, match="dedupe='header:'"):
        DedupeRule.parse("header:", "t")


# -- RabbitMQ ---------------------------------------------------------------------------------


def test_rabbitmq_lists_the_given_queues_weighted_by_depth(rabbitmq: RabbitMq) -> None:
    empty = rabbitmq.declare("empty")
    five = rabbitmq.declare("five")
    many = rabbitmq.declare("many")
    rabbitmq.publish(five, _bodies(5))
    rabbitmq.publish(many, _bodies(100))
    missing = rabbitmq.prefix + "missing"
    source = RabbitMqSource(rabbitmq.source_url(queues=f"{many},{empty},{five},{missing}"))
    found = source.discover()
    assert found == sorted([Resource(empty, 1.0), Resource(five, 8.0), Resource(many, 128.0)])
    assert source.depth(five) == 5
    with pytest.raises(SourceError, match="does not exist"):
        source.depth(missing)


def test_rabbitmq_pattern_lists_queues_through_the_management_api(
    rabbitmq_management: RabbitMqNode,
) -> None:
    broker = RabbitMq(rabbitmq_management.url, "pattern-")
    try:
        a = broker.declare("orders-a")
        b = broker.declare("orders-b")
        broker.declare("other-c")
        broker.publish(a, _bodies(3))
        url = broker.url.replace("amqp://", "rabbitmq://", 1)
        source = RabbitMqSource(
            f"{url}?pattern=pattern-orders-*&management={rabbitmq_management.management}"
        )
        wanted = [Resource(a, 4.0), Resource(b, 1.0)]
        wait_for(lambda: source.discover() == wanted, timeout=15, what=f"the listing {wanted}")
        wrong = RabbitMqSource(
            url.replace("guest:guest@", "guest:n0pe-pw@")
            + f"?pattern=*&management={rabbitmq_management.management}"
        )
        with pytest.raises(SourceError, match="management API") as caught:
            wrong.discover()
        assert "n0pe-pw" not in str(caught.value)
    finally:
        broker.cleanup()


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every GET with ``self.server.answer`` and records the request's headers."""

    server: _HttpServer

    def do_GET(self) -> None:
        self.server.seen.append((self.path, self.headers.get("Authorization")))
        code, headers = self.server.answer
        self.send_response(code)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _HttpServer(http.server.ThreadingHTTPServer):
    def __init__(self, answer: tuple[int, dict[str, str]]) -> None:
        super().__init__(("127.0.0.1", 0), _Recorder)
        self.answer = answer
        self.seen: list[tuple[str, str | None]] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def http_servers() -> Iterator[Callable[[tuple[int, dict[str, str]]], _HttpServer]]:
    started: list[tuple[_HttpServer, threading.Thread]] = []

    def start(answer: tuple[int, dict[str, str]]) -> _HttpServer:
        server = _HttpServer(answer)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        started.append((server, thread))
        return server

    yield start
    for server, thread in started:
        server.shutdown()
        server.server_close()
        thread.join()


def test_rabbitmq_management_redirects_are_not_followed_with_the_password(
    http_servers: Callable[[tuple[int, dict[str, str]]], _HttpServer],
) -> None:
    secret = "redir-s3cret"  # noqa: S105
    elsewhere = http_servers((200, {"Content-Type": "application/json"}))
    redirecting = http_servers((302, {"Location": f"{elsewhere.url}/api/queues/%2F"}))
    source = RabbitMqSource(
        f"rabbitmq://ops:{secret}@127.0.0.1:1/?pattern=*&management={redirecting.url}"
    )
    with pytest.raises(SourceError, match="redirected to") as caught:
        source.discover()
    assert elsewhere.url in str(caught.value) and secret not in str(caught.value)
    assert len(redirecting.seen) == 1 and redirecting.seen[0][1] is not None  # it got the auth
    assert elsewhere.seen == []  # the redirect target got nothing, so no password


def test_rabbitmq_management_url_secrets_are_hidden() -> None:
    secret = "mgmt-s3cret"  # noqa: S105
    for management, fragment in [
        (f"http://admin:{secret}@127.0.0.1:15672", "has credentials"),
        (f"ftp://admin:{secret}@127.0.0.1:15672", "not an http"),
    ]:
        with pytest.raises(ConfigurationError, match=fragment) as caught:
            RabbitMqSource(f"rabbitmq://u:pw@h/?pattern=*&management={management}")
        assert secret not in str(caught.value)


@pytest.fixture
def management_stub() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A stand-in for the management API's queue listing: (its URL, the queues it lists)."""
    listing: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(listing).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", listing
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_rabbitmq_pattern_skips_a_queue_that_cannot_be_a_resource_with_a_warning(
    rabbitmq: RabbitMq,
    management_stub: tuple[str, list[dict[str, str]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    management, listing = management_stub
    good = rabbitmq.declare("orders-a")
    bad = rabbitmq.declare("orders-\tbad")  # RabbitMQ takes a tab; a resource id cannot
    listing.extend([{"name": good}, {"name": bad}, {"name": rabbitmq.prefix + "other"}])
    source = RabbitMqSource(
        rabbitmq.source_url(pattern=f"{rabbitmq.prefix}orders-*", management=management)
    )
    with caplog.at_level(logging.WARNING, logger="rebalancer_spark.sources.rabbitmq"):
        assert source.discover() == [Resource(good, 1.0)]
    warned = "\n".join(r.getMessage() for r in caplog.records)
    assert repr(bad) in warned and "rename" in warned
    with pytest.raises(ConfigurationError, match="bad name"):
        RabbitMqSource(rabbitmq.source_url(queues=f"{good},a%0Ab"))


def test_rabbitmq_urls_are_checked_and_passwords_hidden() -> None:
    secret = "s3cr3t-pw"  # noqa: S105 - a made-up password that must never show
    bad = [
        f"rabbitmq://u:{secret}@host:5672/",  # neither queues nor pattern
        f"rabbitmq://u:{secret}@host:5672/?pattern=orders-*",  # pattern without management
        f"rabbitmq://u:{secret}@host:5672/?queues=a,,b",
        f"rabbitmq://u:{secret}@host:5672/?queues=a&batch=0",
        f"rabbitmq://u:{secret}@host:5672/?queues=a&bogus=1",
        f"rabbitmq://u:{secret}@host:5672/?queues=a&dedupe=header:",
        f"rabbitmq://u:{secret}@/?queues=a",
        f"rabbitmq://u:{secret}@host:99999/?queues=a",
        f"rabbitmq://u:{secret}@host/?queues=a&heartbeat=1.5",
    ]
    for url in bad:
        with pytest.raises(ConfigurationError) as caught:
            RabbitMqSource(url)
        assert secret not in str(caught.value), url
        assert "***" in str(caught.value) or "u:" not in str(caught.value), url
    source = RabbitMqSource(f"amqp://u:{secret}@host/orders?queues=a,b&batch=7")
    assert secret not in repr(source)
    assert (source.vhost, source.port, source.queues, source.batch_size) == (
        "orders",
        5672,
        ["a", "b"],
        7,
    )
    assert RabbitMqSource(f"amqps://u:{secret}@h/%2F?queues=a").port == 5671


def _host_part(rabbitmq: RabbitMq, **options: str) -> str:
    """``rabbitmq://HOST:PORT/VHOST?options`` of the test broker, without its user."""
    return rabbitmq.source_url(**options).replace("guest:guest@", "", 1)


def test_rabbitmq_password_from_the_environment_or_a_file_never_guest(
    rabbitmq: RabbitMq, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    queue = rabbitmq.declare("q")
    rabbitmq.publish(queue, _bodies(2))
    with_user = _host_part(rabbitmq, queues=queue).replace("://", "://guest@", 1)
    monkeypatch.delenv("RABBITMQ_PASSWORD", raising=False)
    # a user without a password is refused, naming the ways to give one, not run as guest
    with pytest.raises(ConfigurationError, match=r"password_file=PATH.*RABBITMQ_PASSWORD"):
        RabbitMqSource(with_user)
    # the environment variable: the right one works, a wrong one proves it is the one used
    monkeypatch.setenv("RABBITMQ_PASSWORD", "guest")
    assert RabbitMqSource(with_user).discover() == [Resource(queue, 4.0)]
    monkeypatch.setenv("RABBITMQ_PASSWORD", "env-wr0ng")
    with pytest.raises(SourceError, match="credentials") as caught:
        RabbitMqSource(with_user).discover()
    assert "env-wr0ng" not in str(caught.value)
    # password_file= wins over the environment; one trailing newline is not part of it
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.write_text("guest\n")
    bad.write_text("file-wr0ng\n")
    source = RabbitMqSource(f"{with_user}&password_file={good}")
    assert source.discover() == [Resource(queue, 4.0)]
    with pytest.raises(SourceError, match="credentials") as caught:
        RabbitMqSource(f"{with_user}&password_file={bad}").discover()
    assert "file-wr0ng" not in str(caught.value)
    for url, fragment in [
        (f"{with_user}&password_file={tmp_path / 'missing'}", "cannot read password_file"),
        (f"{with_user}&password_file={tmp_path}", "cannot read password_file"),
        (f"{with_user.replace('guest@', 'guest:x@')}&password_file={good}", "twice"),
        (f"{_host_part(rabbitmq, queues=queue)}&password_file={good}", "no user"),
    ]:
        with pytest.raises(ConfigurationError, match=fragment):
            RabbitMqSource(url)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigurationError, match="is empty"):
        RabbitMqSource(f"{with_user}&password_file={tmp_path / 'empty'}")


def test_rabbitmq_without_any_user_logs_in_as_guest(
    rabbitmq: RabbitMq, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RABBITMQ_PASSWORD", "not-for-guest")  # only for a named user
    queue = rabbitmq.declare("q")
    source = RabbitMqSource(_host_part(rabbitmq, queues=queue))
    assert (source.username, source._password) == ("guest", "guest")
    assert source.discover() == [Resource(queue, 1.0)]


def test_rabbitmq_unreachable_broker_is_a_source_error_without_the_password() -> None:
    secret = "an0ther-pw"  # noqa: S105
    source = RabbitMqSource(f"rabbitmq://guest:{secret}@127.0.0.1:1/?queues=a")
    with pytest.raises(SourceError, match="cannot connect") as caught:
        source.discover()
    assert secret not in str(caught.value)


def test_rabbitmq_wrong_password_is_a_source_error(rabbitmq: RabbitMq) -> None:
    queue = rabbitmq.declare("q")
    url = rabbitmq.source_url(queues=queue).replace("guest:guest@", "guest:wr0ng-pw@")
    with pytest.raises(SourceError, match="credentials") as caught:
        RabbitMqSource(url).discover()
    assert "wr0ng-pw" not in str(caught.value)


class _ChannelRefused:
    """A real connection to the broker whose ``channel()`` fails as a broker at its limit does."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection, name)

    def channel(self) -> Any:
        import pika

        raise pika.exceptions.ChannelClosedByBroker(530, "NOT_ALLOWED - channel_max reached")


def test_rabbitmq_a_refused_channel_is_a_source_error_and_closes_the_connection(
    rabbitmq: RabbitMq,
) -> None:
    queue = rabbitmq.declare("q")
    source = RabbitMqSource(rabbitmq.source_url(queues=queue))
    opened: list[Any] = []

    def connect() -> Any:
        opened.append(RabbitMqSource._connect(source))
        return _ChannelRefused(opened[-1])

    source._connect = connect  # type: ignore[method-assign]
    with pytest.raises(SourceError, match=r"cannot open a channel.*NOT_ALLOWED"):
        source.consumer(queue)
    with pytest.raises(SourceError, match=r"cannot read queue.*NOT_ALLOWED"):
        source.discover()
    assert len(opened) == 2
    assert [c.is_open for c in opened] == [False, False]  # neither connection leaked


def test_rabbitmq_consumer_holds_messages_until_acked_and_close_returns_them(
    rabbitmq: RabbitMq,
) -> None:
    queue = rabbitmq.declare("q")
    rabbitmq.publish(queue, _bodies(10))
    rabbitmq.publish(queue, [(None, b'{"event": "x"}')], headers={"event-id": "ev-1"})
    source = RabbitMqSource(rabbitmq.source_url(queues=queue))
    with source.consumer(queue) as consumer:
        first = consumer.fetch(4)
        assert [m.key for m in first] == ["m-0", "m-1", "m-2", "m-3"]
        assert not any(m.redelivered for m in first)
        assert rabbitmq.depth(queue) == 7  # held, not gone
        consumer.ack(first[:2])
        consumer.give_back(first[2:])
        rest = consumer.fetch(100)
    # given back first, so they come again, marked redelivered
    assert {m.key for m in rest if m.redelivered} == {"m-2", "m-3"}
    assert len(rest) == 9
    last = rest[-1]
    assert last.key.startswith("sha256:") and last.headers == {"event-id": "ev-1"}
    # closed without acknowledging: all nine are back
    wait_for(lambda: rabbitmq.depth(queue) == 9, timeout=10, what="the nine requeued")
    by_header = RabbitMqSource(rabbitmq.source_url(queues=queue, dedupe="header:event-id"))
    with by_header.consumer(queue) as consumer:
        keys = [m.key for m in consumer.fetch(100)]
    assert "ev-1" in keys and len(keys) == 9


_CHILD = textwrap.dedent(
    """
    import sys
    from rebalancer_spark.sources.rabbitmq import RabbitMqSource
    source = RabbitMqSource(sys.argv[1])
    consumer = source.consumer(sys.argv[2])
    got = consumer.fetch(5)
    print(",".join(m.key for m in got), flush=True)
    sys.stdin.read()  # hold the messages, unacknowledged, until killed
    """
)


def test_rabbitmq_consumer_depth_is_what_the_broker_has_left_ready(rabbitmq: RabbitMq) -> None:
    queue = rabbitmq.declare("q")
    rabbitmq.publish(queue, _bodies(10))
    source = RabbitMqSource(rabbitmq.source_url(queues=queue))
    with source.consumer(queue) as consumer:
        assert consumer.depth() == 10  # before any fetch: asked with a passive declare
        consumer.fetch(4)
        assert consumer.depth() == 6  # the last basic.get said so; the 4 held do not count
        rabbitmq.publish(queue, _bodies(2, tag="late"))
        assert len(consumer.fetch(100)) == 8
        assert consumer.depth() == 0  # the fetch ended on an empty queue


def test_rabbitmq_messages_of_a_killed_consumer_are_redelivered(rabbitmq: RabbitMq) -> None:
    queue = rabbitmq.declare("q")
    rabbitmq.publish(queue, _bodies(8))
    url = rabbitmq.source_url(queues=queue)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, queue],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        held = child.stdout.readline().strip().split(",")
        assert held == [f"m-{i}" for i in range(5)]
        assert rabbitmq.depth(queue) == 3
        child.kill()
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()
    wait_for(lambda: rabbitmq.depth(queue) == 8, timeout=15, what="the 5 messages requeued")
    with RabbitMqSource(url).consumer(queue) as consumer:
        again = consumer.fetch(100)
        consumer.ack(again)
    assert sorted(m.key for m in again) == sorted(f"m-{i}" for i in range(8))
    assert {m.key for m in again if m.redelivered} == set(held)
    assert rabbitmq.depth(queue) == 0


# -- SQS --------------------------------------------------------------------------------------


def _sqs_url(sqs: SqsPrefix, **options: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"endpoint_url": sqs.endpoint, **options}.items())
    return f"sqs://us-east-1/{sqs.prefix}?{query}"


def _send(sqs: SqsPrefix, queue_url: str, n: int, tag: str = "m") -> None:
    for i in range(0, n, 10):
        sqs.client.send_message_batch(
            QueueUrl=queue_url,
            Entries=[
                {
                    "Id": str(j),
                    "MessageBody": json.dumps({"event": f"{tag}-{j}"}),
                    "MessageAttributes": {
                        "event_id": {"DataType": "String", "StringValue": f"{tag}-{j}"}
                    },
                }
                for j in range(i, min(n, i + 10))
            ],
        )


def test_sqs_lists_queues_by_prefix_over_pages_weighted_by_depth(sqs_prefix: SqsPrefix) -> None:
    names = [f"q{i}" for i in range(5)]
    urls = {name: sqs_prefix.create(name) for name in names}
    sqs_prefix.client.create_queue(QueueName="other-" + sqs_prefix.prefix + "q9")
    _send(sqs_prefix, urls["q1"], 3)
    _send(sqs_prefix, urls["q3"], 20)
    source = SqsSource(_sqs_url(sqs_prefix))
    source.page_size = 2  # several pages of ListQueues
    found = source.discover()
    weights = {"q1": 4.0, "q3": 32.0}
    assert found == [Resource(sqs_prefix.prefix + n, weights.get(n, 1.0)) for n in names]
    assert source.depth(sqs_prefix.prefix + "q3") == 20


class _SqsClientBetweenListAndAttributes:
    """The real moto client; ``hook(queue_url)`` runs just before each GetQueueAttributes."""

    def __init__(self, client: Any, hook: Callable[[str], None]) -> None:
        self._client = client
        self._hook = hook

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def get_queue_attributes(self, **kwargs: Any) -> Any:
        self._hook(kwargs["QueueUrl"])
        return self._client.get_queue_attributes(**kwargs)


def test_sqs_listing_skips_only_a_queue_deleted_since_listed(sqs_prefix: SqsPrefix) -> None:
    urls = {name: sqs_prefix.create(name) for name in ("a", "b", "c")}
    source = SqsSource(_sqs_url(sqs_prefix))

    def delete_b(queue_url: str) -> None:  # deleted between ListQueues and GetQueueAttributes
        if queue_url == urls["b"]:
            sqs_prefix.client.delete_queue(QueueUrl=queue_url)

    source._client = _SqsClientBetweenListAndAttributes(source.client, delete_b)
    assert source.discover() == [Resource(sqs_prefix.prefix + n, 1.0) for n in ("a", "c")]


@pytest.mark.parametrize("code", ["ThrottlingException", "AccessDenied", "InternalError"])
def test_sqs_listing_fails_whole_when_a_listed_queue_cannot_be_read(
    sqs_prefix: SqsPrefix, code: str
) -> None:
    """A failed listing revokes nothing: an error other than "no such queue" is not a skip."""
    from botocore.exceptions import ClientError

    urls = {name: sqs_prefix.create(name) for name in ("a", "b", "c")}
    source = SqsSource(_sqs_url(sqs_prefix))
    assert len(source.discover()) == 3

    def refuse_b(queue_url: str) -> None:  # SQS cannot be made to throttle on demand
        if queue_url == urls["b"]:
            error = {"Error": {"Code": code, "Message": "injected"}}
            raise ClientError(error, "GetQueueAttributes")  # type: ignore[arg-type]

    source._client = _SqsClientBetweenListAndAttributes(source.client, refuse_b)
    with pytest.raises(SourceError, match=f"GetQueueAttributes.*{code}") as caught:
        source.discover()
    assert sqs_prefix.prefix + "b" in str(caught.value)


def test_sqs_urls_are_checked() -> None:
    for url, fragment in [
        ("sqs://key:secret@us-east-1/p", "credentials"),
        ("sqs://us-east-1/p?visibility_timeout=0", "visibility_timeout"),
        ("sqs://us-east-1/p?endpoint_url=localhost:1", "endpoint_url"),
        ("sqs://us-east-1/p?nope=1", "unknown option"),
    ]:
        with pytest.raises(ConfigurationError, match=fragment) as caught:
            SqsSource(url)
        assert "secret" not in str(caught.value).replace("***", "")
    source = SqsSource("sqs:///orders-?dedupe=attribute:event_id&batch=30")
    assert (source.region, source.prefix, source.batch_size, str(source.dedupe)) == (
        None,
        "orders-",
        30,
        "header:event_id",
    )


def test_sqs_consumer_deletes_on_ack_and_returns_on_close(sqs_prefix: SqsPrefix) -> None:
    queue_url = sqs_prefix.create("q")
    _send(sqs_prefix, queue_url, 25)
    source = SqsSource(_sqs_url(sqs_prefix, dedupe="attribute:event_id", visibility_timeout="60"))
    queue = sqs_prefix.prefix + "q"
    with source.consumer(queue) as consumer:
        first = consumer.fetch(15)
        assert len(first) == 15 and len({m.key for m in first}) == 15
        assert all(m.key.startswith("m-") for m in first)
        assert source.depth(queue) == 10  # the 15 are in flight
        consumer.ack(first[:5])
    # closing made the 10 unacknowledged ones visible again at once
    assert source.depth(queue) == 20
    with source.consumer(queue) as consumer:
        rest: list[QueueMessage] = []
        while batch := consumer.fetch(10):
            rest += batch
        consumer.ack(rest)
    assert len(rest) == 20
    assert {m.key for m in rest} | {m.key for m in first[:5]} == {f"m-{i}" for i in range(25)}
    assert {m.key for m in rest if m.redelivered} == {m.key for m in first[5:]}
    assert source.depth(queue) == 0


def test_sqs_consumer_depth_is_approximate_and_asked_at_most_every_few_seconds(
    sqs_prefix: SqsPrefix, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue_url = sqs_prefix.create("q")
    _send(sqs_prefix, queue_url, 25)
    source = SqsSource(_sqs_url(sqs_prefix, visibility_timeout="60"))
    queue = sqs_prefix.prefix + "q"
    with source.consumer(queue) as consumer:
        consumer.fetch(15)
        assert consumer.depth() == 10  # the 15 in flight are not ready
        _send(sqs_prefix, queue_url, 5, tag="late")
        assert consumer.depth() == 10  # kept: GetQueueAttributes is a billed request
        real = time.monotonic
        monkeypatch.setattr(time, "monotonic", lambda: real() + DEPTH_CACHE_SECONDS)
        assert consumer.depth() == 15  # asked again once the answer is that old


def test_sqs_messages_of_a_consumer_that_vanished_reappear_after_the_timeout(
    sqs_prefix: SqsPrefix,
) -> None:
    queue_url = sqs_prefix.create("q")
    _send(sqs_prefix, queue_url, 4)
    source = SqsSource(_sqs_url(sqs_prefix, visibility_timeout="1"))
    queue = sqs_prefix.prefix + "q"
    held = source.consumer(queue).fetch(10)  # never acknowledged nor closed: a dead consumer
    assert len(held) == 4
    assert source.consumer(queue).fetch(10) == []
    consumer = source.consumer(queue)
    again: list[QueueMessage] = []

    def redelivered() -> bool:
        again.extend(consumer.fetch(10))
        return len(again) == 4

    wait_for(redelivered, timeout=15, what="the 4 messages visible again", interval=0.2)
    consumer.ack(again)
    assert sorted(m.key for m in again) == sorted(m.key for m in held)
    assert all(m.redelivered for m in again)
    assert source.depth(queue) == 0
