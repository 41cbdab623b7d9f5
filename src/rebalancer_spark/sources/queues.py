"""The queue-source contract: each queue of a broker is a resource, read at least once.

A :class:`QueueSource` lists queues (:meth:`~QueueSource.discover`, weighted by depth) and opens
a :class:`QueueConsumer` on one queue. A consumer hands out messages **without acknowledging
them**; each carries a stable **dedupe key** (the same on every redelivery of that message) and
an opaque ack handle. The caller writes the messages' output, commits its progress fenced by
the resource epoch, and only then calls :meth:`~QueueConsumer.ack`. Until then the broker keeps
the messages: :meth:`~QueueConsumer.give_back` and :meth:`~QueueConsumer.close` return them at
once, and a consumer whose process died returns them when the broker notices (RabbitMQ: the
connection drops; SQS: the visibility timeout ends).

The dedupe key is chosen by the source URL's ``dedupe=`` option (:class:`DedupeRule`)::

    dedupe=message_id       the broker's or producer's message id (the default)
    dedupe=header:NAME      a header (RabbitMQ) or message attribute (SQS) set by the producer
    dedupe=json:FIELD       a top-level field of a JSON body
    dedupe=body             the SHA-256 of the body: identical bodies are one message

A message that lacks the configured key is keyed by the SHA-256 of its body (``sha256:...``),
so it is still delivered at least once and deduplicated against exact copies of itself.

Consumers are not thread-safe: one thread uses a consumer, including for :meth:`close`.
"""

from __future__ import annotations

import abc
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self
from urllib.parse import unquote

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.sources.base import ResourceSource

__all__ = [
    "DEFAULT_BATCH",
    "DEPTH_CACHE_SECONDS",
    "DedupeRule",
    "QueueConsumer",
    "QueueMessage",
    "QueueSource",
    "batch_option",
    "depth_weight",
    "parse_query",
    "split_names",
]

DEFAULT_BATCH = 100
"""Messages fetched per batch unless the source URL says ``batch=N``."""
DEPTH_CACHE_SECONDS = 5.0
"""How long a consumer whose broker charges a call for the depth (SQS) keeps the answer."""
MAX_BATCH = 10_000


def depth_weight(depth: int) -> float:
    """The weight of a queue holding ``depth`` messages: the next power of two above the depth
    (0 → 1, 1 → 2, 2-3 → 4, 4-7 → 8 ...). Exact depths would change the resource set at
    every listing and so trigger a rebalance every ``discovery_interval``; powers of two move
    a queue's weight only when its depth doubles or halves."""
    return float(1 << max(depth, 0).bit_length())


@dataclass(frozen=True, slots=True)
class DedupeRule:
    """Where a message's dedupe key comes from; see the module docstring."""

    kind: str  # "message_id", "header", "json" or "body"
    name: str = ""

    @classmethod
    def parse(cls, text: str, where: str) -> DedupeRule:
        kind, colon, name = text.partition(":")
        if kind in ("message_id", "body") and not colon:
            return cls(kind)
        if kind in ("header", "json") and name:
            return cls(kind, name)
        raise ConfigurationError(
            f"dedupe={text!r} in {where} is not a dedupe rule: use message_id (the default), "
            "header:NAME, json:FIELD or body"
        )

    def key(self, message_id: str | None, headers: Mapping[str, object], body: bytes) -> str:
        """The dedupe key of a message; the body's SHA-256 when the message lacks it."""
        found: object = None
        if self.kind == "message_id":
            found = message_id
        elif self.kind == "header":
            found = headers.get(self.name)
        elif self.kind == "json":
            try:
                decoded = json.loads(body)
            except ValueError:
                decoded = None
            if isinstance(decoded, dict):
                found = decoded.get(self.name)
        if isinstance(found, bytes):
            found = found.decode("utf-8", "replace")
        if isinstance(found, str | int) and not isinstance(found, bool) and str(found):
            return str(found)
        return "sha256:" + hashlib.sha256(body).hexdigest()

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else self.kind


@dataclass(frozen=True, slots=True)
class QueueMessage:
    """One message fetched and not yet acknowledged."""

    key: str
    """Stable dedupe key: the same on every redelivery of this message."""
    body: bytes = field(repr=False)
    handle: object = field(repr=False)
    """What the consumer needs to acknowledge or give back this delivery."""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    redelivered: bool = False
    """The broker says it delivered this message before (RabbitMQ; SQS: receive count > 1)."""


class QueueConsumer(abc.ABC):
    """Reads one queue; see the module docstring. Use as a context manager or call close()."""

    resource: str

    @abc.abstractmethod
    def fetch(self, max_messages: int) -> list[QueueMessage]:
        """Up to ``max_messages`` messages now available, not acknowledged; ``[]`` if none.
        Raises :class:`SourceError` if the broker cannot be read."""

    @abc.abstractmethod
    def ack(self, messages: Sequence[QueueMessage]) -> None:
        """Remove ``messages`` from the queue for good. Call only after the output and the
        fenced progress commit of their batch succeeded."""

    @abc.abstractmethod
    def give_back(self, messages: Sequence[QueueMessage]) -> None:
        """Return ``messages`` to the queue now, for any consumer to receive again."""

    @abc.abstractmethod
    def depth(self) -> int:
        """Messages still ready in this queue (not counting those fetched and not yet
        acknowledged), as cheaply as the broker allows: the lag of the queue shown by
        ``status``, ``assignments`` and the metrics. Called after every batch; a plug-in whose
        broker charges a call for it keeps the answer for a while (SQS: approximate, cached
        for :data:`DEPTH_CACHE_SECONDS`). Raises :class:`SourceError` if the broker cannot
        tell."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop reading; every message fetched and not acknowledged returns to the queue.
        Idempotent; never raises for a broker that is gone."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class QueueSource(ResourceSource):
    """A source whose resources are queues; :meth:`discover` weighs each by its depth."""

    batch_size: int = DEFAULT_BATCH
    dedupe: DedupeRule = DedupeRule("message_id")

    @abc.abstractmethod
    def depth(self, queue: str) -> int:
        """Messages waiting in ``queue`` now (ready, not in flight); approximate on SQS."""

    @abc.abstractmethod
    def consumer(self, queue: str) -> QueueConsumer:
        """A new consumer of ``queue``; :class:`SourceError` if it cannot be opened."""


def batch_option(value: str | None, where: str) -> int:
    """The ``batch=N`` option of a queue source URL."""
    if value is None:
        return DEFAULT_BATCH
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_BATCH:
        raise ConfigurationError(
            f"batch={value!r} in {where} is not a number of messages from 1 to {MAX_BATCH}: "
            f"write e.g. batch=500, or leave it out for {DEFAULT_BATCH}"
        )
    return int(value)


def split_names(value: str, what: str, where: str) -> list[str]:
    """A comma-separated list of queue names, each non-empty, no repeats, kept in order."""
    names = [n.strip() for n in value.split(",")]
    if not value.strip() or any(not n for n in names):
        raise ConfigurationError(
            f"{what}={value!r} in {where} has an empty name: write names separated by single "
            "commas, e.g. queues=orders,payments"
        )
    return list(dict.fromkeys(names))


def parse_query(query: str, allowed: Sequence[str], where: str) -> dict[str, str]:
    """The ``name=value`` options of a source URL's query, percent-decoded; an unknown,
    repeated or valueless option is refused, naming the accepted ones."""
    found: dict[str, str] = {}
    for piece in query.split("&"):
        if not piece:
            continue
        raw_key, equals, raw_value = piece.partition("=")
        key, value = unquote(raw_key), unquote(raw_value)
        if key not in allowed:
            raise ConfigurationError(
                f"{where} has the unknown option {key!r}: the options are {', '.join(allowed)}"
            )
        if not equals or not value:
            raise ConfigurationError(f"{where}: the option {key!r} has no value: write {key}=...")
        if key in found:
            raise ConfigurationError(f"{where} gives the option {key!r} twice: keep one")
        found[key] = value
    return found
