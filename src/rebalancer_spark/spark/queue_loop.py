"""The processing loop for queue sources: at least once from the broker, once per key in the
output, progress fenced by the resource epoch.

For every queue this member owns now, one batch at a time::

    fetch up to N messages (not acknowledged)
    -> an Arrow table: _resource, _key, _body, _headers (JSON), _redelivered
    -> process(resource, epoch, table) (optional: a Spark transformation, see .queues)
    -> still the owner at this epoch? else close the consumer: the messages go back
    -> KeyedDeltaOutput.write: rows whose key the table already holds are dropped
    -> member.commit(resource, progress, epoch=)   fenced: refused once ownership moved on
    -> only then consumer.ack(messages)

Why nothing is lost: a message leaves the broker only through ``ack``, which runs after its row
is in the table and the progress committed; a process killed anywhere before leaves it
unacknowledged, and the broker delivers it again (RabbitMQ when the connection drops, SQS when
the visibility timeout ends). Why nothing is doubled: the output keeps one row per key and
queue (:mod:`.queue_output`), so a redelivered message is written zero times. A stale owner's
commit is refused; it then closes its consumer without acknowledging, and its messages return
to the queue for the new owner, whose write finds their keys if they were written.

A consumer is opened per (queue, epoch) and closed as soon as the queue is no longer owned at
that epoch (checked before every batch), or after any broker error (its messages are returned).
Progress, as committed::

    {"batches": n, "messages": total, "written": rows, "last": {"id": n, "keys": [...]}}

(``keys`` only when they fit in 256 KiB of JSON.)
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rebalancer_spark.core.errors import FencedError, RebalancerError, SourceError
from rebalancer_spark.core.model import JsonValue
from rebalancer_spark.member import Member, OwnedResource
from rebalancer_spark.sources.queues import QueueConsumer, QueueMessage, QueueSource
from rebalancer_spark.spark.queue_output import KEY, RESOURCE, KeyedDeltaOutput

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["Process", "QueueLoop", "QueueStats", "messages_table"]

log = logging.getLogger("rebalancer_spark.queues")

Process = Callable[[str, int, "pa.Table"], "pa.Table"]
"""``process(resource, epoch, table)``: the batch's output rows; must keep ``_key``."""
_KEYS_LIMIT = 256 * 1024


@dataclass(slots=True)
class QueueStats:
    """What one member's loop did."""

    batches: int = 0
    messages: int = 0
    written: int = 0
    duplicates: int = 0
    fenced: int = 0
    errors: int = 0
    per_resource: dict[str, int] = field(default_factory=dict)


def messages_table(resource: str, messages: list[QueueMessage]) -> pa.Table:
    """The raw rows of a batch: ``_resource``, ``_key``, ``_body`` (bytes), ``_headers`` (a JSON
    object) and ``_redelivered``."""
    import pyarrow as pa

    return pa.table(
        {
            RESOURCE: pa.array([resource] * len(messages), pa.string()),
            KEY: pa.array([m.key for m in messages], pa.string()),
            "_body": pa.array([m.body for m in messages], pa.binary()),
            "_headers": pa.array(
                [json.dumps(dict(m.headers), sort_keys=True) for m in messages], pa.string()
            ),
            "_redelivered": pa.array([m.redelivered for m in messages], pa.bool_()),
        }
    )


class QueueLoop:
    """Runs the batches of the queues ``member`` owns; see the module docstring. Used from one
    thread; :meth:`close` closes every consumer (their messages return to the queues)."""

    def __init__(
        self,
        member: Member,
        source: QueueSource,
        output: KeyedDeltaOutput,
        *,
        process: Process | None = None,
        batch_size: int | None = None,
        before_first_batch: Callable[[], None] | None = None,
    ) -> None:
        self.member = member
        self.source = source
        self.output = output
        self.process = process
        self.batch_size = batch_size or source.batch_size
        self.stats = QueueStats()
        self._before_first_batch = before_first_batch
        self._consumers: dict[tuple[str, int], QueueConsumer] = {}
        self._progress: dict[tuple[str, int], dict[str, Any]] = {}

    @property
    def open_consumers(self) -> list[tuple[str, int]]:
        """The (queue, epoch) pairs a consumer is open for now."""
        return sorted(self._consumers)

    def run(self, stop: threading.Event, poll_interval: float) -> QueueStats:
        """Run batches until ``stop`` is set, waiting ``poll_interval`` when nothing came."""
        try:
            while not stop.is_set():
                if not self.run_once(stop):
                    stop.wait(poll_interval)
        finally:
            self.close()
        return self.stats

    def run_once(self, stop: threading.Event | None = None) -> bool:
        """One batch of every queue owned now; whether any message came."""
        owned = {o.resource: o for o in self.member.assigned()}
        self._close_unowned(owned)
        worked = False
        for o in owned.values():
            if stop is not None and stop.is_set():
                break
            worked = self._batch(o) or worked
        return worked

    def close(self) -> None:
        for key in list(self._consumers):
            self._drop(key)

    # -- one batch ------------------------------------------------------------------------

    def _close_unowned(self, owned: dict[str, OwnedResource]) -> None:
        for resource, epoch in list(self._consumers):
            now = owned.get(resource)
            if now is None or now.epoch != epoch:
                log.info("queue %s epoch %d no longer owned: consumer closed", resource, epoch)
                self._drop((resource, epoch))

    def _drop(self, key: tuple[str, int]) -> None:
        consumer = self._consumers.pop(key, None)
        self._progress.pop(key, None)
        if consumer is not None:
            consumer.close()

    def _consumer(self, o: OwnedResource) -> QueueConsumer:
        key = (o.resource, o.epoch)
        consumer = self._consumers.get(key)
        if consumer is None:
            consumer = self._consumers[key] = self.source.consumer(o.resource)
            self._progress[key] = _parse_progress(o.progress)
        return consumer

    def _batch(self, o: OwnedResource) -> bool:
        key = (o.resource, o.epoch)
        name = self.member.member_id
        try:
            consumer = self._consumer(o)
            messages = consumer.fetch(self.batch_size)
        except SourceError as exc:
            self.stats.errors += 1
            log.warning("[%s] queue %s: %s", name, o.resource, exc)
            self._drop(key)
            return False
        if not messages:
            return False
        if self._before_first_batch is not None:
            self._before_first_batch()
            self._before_first_batch = None
        state = self._progress[key]
        batch_id = int(state["batches"]) + 1
        try:
            table = messages_table(o.resource, messages)
            if self.process is not None:
                table = self.process(o.resource, o.epoch, table)
            now = self.member.owns(o.resource)
            if now is None or now.epoch != o.epoch:
                raise FencedError(f"queue {o.resource!r} was lost before its batch was written")
            written = self.output.write(o.resource, table)
            progress = _next_progress(state, batch_id, messages, written)
            self.member.commit(o.resource, progress, epoch=o.epoch)
        except FencedError as exc:
            # Not the owner any more: never acknowledge; the messages go back to the queue.
            self.stats.fenced += 1
            log.warning(
                "[%s] queue %s epoch %d: %s; batch returned", name, o.resource, o.epoch, exc
            )
            self._drop(key)
            return True
        except Exception:  # the write or the transformation failed: redeliver the batch
            self.stats.errors += 1
            log.exception("[%s] queue %s: batch %d failed, returned", name, o.resource, batch_id)
            self._drop(key)
            return True
        self._progress[key] = progress
        try:
            consumer.ack(messages)
        except RebalancerError as exc:  # redelivered later and deduplicated then
            self.stats.errors += 1
            log.warning("[%s] queue %s: acknowledging failed: %s", name, o.resource, exc)
            self._drop(key)
        self.stats.batches += 1
        self.stats.messages += len(messages)
        self.stats.written += written
        self.stats.duplicates += len(messages) - written
        self.stats.per_resource[o.resource] = self.stats.per_resource.get(o.resource, 0) + len(
            messages
        )
        log.info(
            "[%s] queue %s epoch %d batch %d: %d messages, %d new rows",
            name,
            o.resource,
            o.epoch,
            batch_id,
            len(messages),
            written,
        )
        return True


def _parse_progress(value: JsonValue) -> dict[str, Any]:
    if isinstance(value, dict) and isinstance(value.get("batches"), int):
        return dict(value)
    if value is not None:
        log.warning("progress %s is not a queue progress; counting batches from 0", str(value)[:80])
    return {"batches": 0, "messages": 0, "written": 0, "last": None}


def _next_progress(
    state: dict[str, Any], batch_id: int, messages: list[QueueMessage], written: int
) -> dict[str, Any]:
    keys = [m.key for m in messages]
    last: dict[str, Any] = {"id": batch_id, "count": len(keys)}
    if len(json.dumps(keys)) <= _KEYS_LIMIT:
        last["keys"] = keys
    return {
        "batches": batch_id,
        "messages": int(state.get("messages", 0)) + len(messages),
        "written": int(state.get("written", 0)) + written,
        "last": last,
    }
