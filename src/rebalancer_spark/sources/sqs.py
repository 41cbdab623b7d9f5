"""``sqs://REGION/PREFIX``: each Amazon SQS queue whose name starts with PREFIX is a resource.

::

    sqs://us-east-1/orders-                          every queue named orders-* in us-east-1
    sqs:///orders-?endpoint_url=http://127.0.0.1:5000  the default region; a local endpoint
    sqs://eu-west-1/?visibility_timeout=120&batch=500&dedupe=attribute:event_id

The host is the region (empty: boto3's default region); the path after the first ``/`` is the
queue-name prefix (empty: every queue of the account and region). Credentials come from boto3's
usual chain (environment, profile, instance role), never from the URL. Options:

* ``endpoint_url=URL`` — another SQS endpoint (a VPC endpoint, a local test server);
* ``visibility_timeout=S`` (default 60) — how long a fetched message stays hidden from every
  consumer; it must exceed the time one batch takes to write and commit, or the message is
  delivered again (harmless, deduplicated, but wasted work); a killed consumer's messages
  reappear after it;
* ``dedupe=message_id|header:NAME|json:FIELD|body`` — the dedupe key (see :mod:`.queues`);
  ``message_id`` is SQS's ``MessageId``, stable across redeliveries but not across a producer
  that sends the same event twice; ``header:NAME`` reads a message attribute
  (``attribute:NAME`` is accepted as its alias);
* ``batch=N`` — messages per batch (default 100, fetched 10 at a time).

A queue's weight is ``ApproximateNumberOfMessages`` in powers of two
(:func:`.queues.depth_weight`); queues are listed with ``ListQueues`` and ``QueueNamePrefix``,
every page. A queue that ``GetQueueAttributes`` says no longer exists is left out of the
listing; any other failure there fails the whole listing (:class:`SourceError`), so a throttled
or refused call never revokes a queue that is still listed. A resource id is the queue's name.
Acknowledging is ``DeleteMessageBatch``; giving back and closing set the visibility of the
messages still held to 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from rebalancer_spark.core.errors import ConfigurationError, SourceError
from rebalancer_spark.core.model import Resource
from rebalancer_spark.core.urls import redact_url
from rebalancer_spark.sources.queues import (
    DEPTH_CACHE_SECONDS,
    DedupeRule,
    QueueConsumer,
    QueueMessage,
    QueueSource,
    batch_option,
    depth_weight,
    parse_query,
)

__all__ = ["SqsSource"]

log = logging.getLogger("rebalancer_spark.sources.sqs")

_OPTIONS = ("batch", "dedupe", "endpoint_url", "visibility_timeout")
_MAX_VISIBILITY = 43_200  # SQS's limit: 12 hours
_GONE = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
"""The error codes of a queue that does not exist (the query and the JSON protocol's)."""


def _boto3() -> Any:
    try:
        import boto3
    except ImportError:
        raise ConfigurationError(
            "sqs:// sources need the boto3 package: pip install 'rebalancer-spark[sqs]' "
            "(or pip install boto3)"
        ) from None
    return boto3


class SqsSource(QueueSource):
    """The SQS queues of one region whose names start with a prefix; see the module docstring."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.shown = redact_url(url)
        where = f"source {self.shown!r}"
        parts = urlsplit(url)
        if parts.scheme != "sqs" or "@" in parts.netloc:
            raise ConfigurationError(
                f"{where} is not an SQS URL: write sqs://REGION/PREFIX (credentials come from "
                "the environment or a profile, never from the URL)"
            )
        self.region = parts.netloc or None
        self.prefix = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
        options = parse_query(parts.query, _OPTIONS, where)
        self.endpoint_url = options.get("endpoint_url")
        if self.endpoint_url is not None and not self.endpoint_url.startswith(
            ("http://", "https://")
        ):
            raise ConfigurationError(
                f"{where}: endpoint_url={self.endpoint_url!r} is not an http(s) URL"
            )
        self.batch_size = batch_option(options.get("batch"), where)
        rule = options.get("dedupe", "message_id")
        if rule.startswith("attribute:"):
            rule = "header:" + rule.removeprefix("attribute:")
        self.dedupe = DedupeRule.parse(rule, where)
        text = options.get("visibility_timeout", "60")
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= _MAX_VISIBILITY:
            raise ConfigurationError(
                f"visibility_timeout={text!r} in {where} is not a whole number of seconds from "
                f"1 to {_MAX_VISIBILITY}: make it longer than one batch takes to write"
            )
        self.visibility_timeout = int(text)
        self.page_size = 1000
        """Queue URLs per ListQueues page (1 to 1000; SQS's maximum by default)."""
        self._client: Any = None
        self._urls: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"SqsSource({self.shown!r})"

    @property
    def client(self) -> Any:
        """The boto3 SQS client (made on first use; boto3 clients are thread-safe)."""
        if self._client is None:
            self._client = _boto3().client(
                "sqs", region_name=self.region, endpoint_url=self.endpoint_url
            )
        return self._client

    def _call(self, doing: str, fn: Any, **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except Exception as exc:  # botocore's errors: translated at the plug-in boundary
            raise SourceError(
                f"SQS {doing} failed for source {self.shown!r} ({_why(exc)}): check the "
                "region, endpoint and credentials"
            ) from None

    def queue_url(self, queue: str) -> str:
        url = self._urls.get(queue)
        if url is None:
            answer = self._call("GetQueueUrl", self.client.get_queue_url, QueueName=queue)
            url = self._urls[queue] = str(answer["QueueUrl"])
        return url

    def discover(self) -> list[Resource]:
        names: list[str] = []
        kwargs: dict[str, Any] = {"QueueNamePrefix": self.prefix, "MaxResults": self.page_size}
        while True:
            page = self._call("ListQueues", self.client.list_queues, **kwargs)
            for url in page.get("QueueUrls", []):
                name = str(url).rstrip("/").rsplit("/", 1)[-1]
                self._urls[name] = str(url)
                names.append(name)
            token = page.get("NextToken")
            if not token:
                break
            kwargs["NextToken"] = token
        found = []
        for name in sorted(set(names)):
            depth = self._listed_depth(name)
            if depth is None:
                continue
            found.append(Resource(name, depth_weight(depth)))
        return found

    def _listed_depth(self, name: str) -> int | None:
        """The depth of a queue ListQueues just gave; None only if SQS says it is gone.

        Any other failure (a timeout, throttling, AccessDenied) fails the whole listing: a
        listing that left out a queue SQS still has would revoke it from its owner.
        """
        try:
            answer = self.client.get_queue_attributes(
                QueueUrl=self._urls[name], AttributeNames=["ApproximateNumberOfMessages"]
            )
        except Exception as exc:  # botocore's errors: translated at the plug-in boundary
            if _error_code(exc) in _GONE:
                log.warning("source %s: queue %r was deleted since listed", self.shown, name)
                self._urls.pop(name, None)
                return None
            raise SourceError(
                f"SQS GetQueueAttributes failed for queue {name!r} of source {self.shown!r} "
                f"({_why(exc)}): the listing is incomplete, so the group keeps its resources; "
                "check the region, endpoint, credentials and the sqs:GetQueueAttributes "
                "permission"
            ) from None
        return int(answer["Attributes"]["ApproximateNumberOfMessages"])

    def depth(self, queue: str) -> int:
        answer = self._call(
            "GetQueueAttributes",
            self.client.get_queue_attributes,
            QueueUrl=self.queue_url(queue),
            AttributeNames=["ApproximateNumberOfMessages"],
        )
        return int(answer["Attributes"]["ApproximateNumberOfMessages"])

    def consumer(self, queue: str) -> QueueConsumer:
        return _SqsConsumer(self, queue, self.queue_url(queue))


class _SqsConsumer(QueueConsumer):
    """Receives with the source's visibility timeout; remembers what it holds to give back."""

    def __init__(self, source: SqsSource, queue: str, queue_url: str) -> None:
        self.resource = queue
        self._source = source
        self._url = queue_url
        self._held: dict[str, str] = {}  # message id -> receipt handle
        self._closed = False
        self._depth: tuple[float, int] | None = None  # (monotonic time, approximate depth)

    def __repr__(self) -> str:
        return f"SqsConsumer({self.resource!r} of {self._source.shown!r})"

    def fetch(self, max_messages: int) -> list[QueueMessage]:
        if self._closed:
            raise SourceError(f"{self!r} is closed: open a new consumer")
        out: list[QueueMessage] = []
        while len(out) < max_messages:
            answer = self._source._call(
                "ReceiveMessage",
                self._source.client.receive_message,
                QueueUrl=self._url,
                MaxNumberOfMessages=min(10, max_messages - len(out)),
                VisibilityTimeout=self._source.visibility_timeout,
                WaitTimeSeconds=0,
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            )
            got = answer.get("Messages", [])
            if not got:
                break
            for m in got:
                body = str(m.get("Body", "")).encode()
                headers = {
                    str(k): str(v.get("StringValue", v.get("BinaryValue", "")))
                    for k, v in (m.get("MessageAttributes") or {}).items()
                }
                key = self._source.dedupe.key(m.get("MessageId"), headers, body)
                receives = int((m.get("Attributes") or {}).get("ApproximateReceiveCount", "1"))
                handle = (str(m["MessageId"]), str(m["ReceiptHandle"]))
                self._held[handle[0]] = handle[1]
                out.append(QueueMessage(key, body, handle, headers, receives > 1))
        return out

    def depth(self) -> int:
        """ApproximateNumberOfMessages (ready, not in flight), asked at most once per
        :data:`DEPTH_CACHE_SECONDS`: GetQueueAttributes is a billed request."""
        now = time.monotonic()
        if self._depth is None or now - self._depth[0] >= DEPTH_CACHE_SECONDS:
            self._depth = (now, self._source.depth(self.resource))
        return self._depth[1]

    def _batches(self, messages: Sequence[QueueMessage]) -> list[list[tuple[str, str]]]:
        handles = [m.handle for m in messages]
        pairs = [h for h in handles if isinstance(h, tuple)]
        return [pairs[i : i + 10] for i in range(0, len(pairs), 10)]

    def ack(self, messages: Sequence[QueueMessage]) -> None:
        for chunk in self._batches(messages):
            answer = self._source._call(
                "DeleteMessageBatch",
                self._source.client.delete_message_batch,
                QueueUrl=self._url,
                Entries=[{"Id": str(i), "ReceiptHandle": r} for i, (_, r) in enumerate(chunk)],
            )
            failed = answer.get("Failed") or []
            for message_id, _ in chunk:
                self._held.pop(message_id, None)
            if failed:  # an expired receipt: the message is delivered again, deduplicated then
                log.warning(
                    "%r: %d messages could not be deleted (visibility timeout over?): %s",
                    self,
                    len(failed),
                    str(failed[0].get("Message", ""))[:200],
                )

    def give_back(self, messages: Sequence[QueueMessage]) -> None:
        self._hide(
            [(m, r) for chunk in self._batches(messages) for m, r in chunk], raise_errors=True
        )

    def _hide(self, pairs: list[tuple[str, str]], *, raise_errors: bool) -> None:
        for i in range(0, len(pairs), 10):
            chunk = pairs[i : i + 10]
            try:
                self._source._call(
                    "ChangeMessageVisibilityBatch",
                    self._source.client.change_message_visibility_batch,
                    QueueUrl=self._url,
                    Entries=[
                        {"Id": str(n), "ReceiptHandle": r, "VisibilityTimeout": 0}
                        for n, (_, r) in enumerate(chunk)
                    ],
                )
            except SourceError:
                if raise_errors:
                    raise
                log.warning("%r: could not return messages; they reappear after the timeout", self)
            for message_id, _ in chunk:
                self._held.pop(message_id, None)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._hide(list(self._held.items()), raise_errors=False)


def _error_code(exc: BaseException) -> str | None:
    """The AWS error code of a botocore ``ClientError`` (None for any other exception)."""
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    code = error.get("Code") if isinstance(error, dict) else None
    return str(code) if code is not None else None


def _why(exc: BaseException) -> str:
    return redact_url(f"{type(exc).__name__}: {exc}"[:300])
