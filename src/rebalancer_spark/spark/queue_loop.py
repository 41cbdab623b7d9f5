"""The processing loop for queue sources: at least once from the broker, once per key in the
output, the output fenced by the queue's epoch like the progress.

For every queue this member owns now, one batch at a time::

    on a new (queue, epoch): open a consumer, fence the output table (QueueOutput.fence)
    fetch up to N messages (not acknowledged)
    -> QueueOutput.write: a Spark DataFrame of the messages, the user's transform, the rows
       whose key the table holds dropped, Parquet files written by Spark, one Delta commit
       fenced by (epoch, batch) under the app transaction rebalancer-spark/<group>/<queue>
    -> member.commit(resource, progress, epoch=)   fenced: refused once ownership moved on
    -> only then consumer.ack(messages)

Why nothing is lost: a message leaves the broker only through ``ack``, which runs after its row
is in the table and the progress committed; a process killed anywhere before leaves it
unacknowledged, and the broker delivers it again (RabbitMQ when the connection drops, SQS when
the visibility timeout ends). Why nothing is doubled: the output keeps one row per key and
queue (:mod:`.queue_output`), so a redelivered message is written zero times. A stale owner's
Delta commit is refused by the table once the new owner fenced it, and its progress commit by
the store; it then closes its consumer without acknowledging, and its messages return to the
queue for the new owner.

Ownership is checked through one guard (:class:`~rebalancer_spark.spark.guard.OwnerGuard`:
``Member.owns`` at the consumer's epoch): before every batch (a consumer whose queue is no
longer owned at its epoch is closed), and the Delta commit runs inside its hold (a revocation
waits for the commit, so none lands after the queue's ``released`` event). A consumer is also
closed after any broker error (its messages are returned). Batch ids continue from the progress
and from the highest batch the table holds for the queue (a previous owner killed between its
Delta commit and its progress commit). Progress, as committed::

    {"batches": n, "messages": total, "written": rows, "last": {"id": n, "keys": [...]},
     "pending": {"messages": depth}}

(``keys`` only when they fit in 256 KiB of JSON.) ``pending`` is the queue's lag when the batch
was committed: the messages still ready after its fetch (:meth:`QueueConsumer.depth`), which
``status`` and ``assignments`` show. After every fetch, an empty one included (the queue is then
drained: 0), the depth goes to ``watch``: the node sets the metric
``rebalancer_pending_messages`` and samples it into the audit table as ``lag`` rows
(:meth:`.session.RebalancerNode.queue_lag`); without a node, the member's metric only. A depth
the broker cannot tell is left out, never guessed.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rebalancer_spark.core.errors import FencedError, RebalancerError
from rebalancer_spark.core.model import JsonValue
from rebalancer_spark.member import Member, OwnedResource
from rebalancer_spark.sources.queues import QueueConsumer, QueueMessage, QueueSource
from rebalancer_spark.spark.delta_commit import Landing
from rebalancer_spark.spark.guard import OwnerGuard
from rebalancer_spark.spark.queue_output import QueueOutput

__all__ = ["QueueLoop", "QueueStats"]

log = logging.getLogger("rebalancer_spark.queues")

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


@dataclass(slots=True)
class _Open:
    """A consumer of one queue at one epoch, and where its batches stand."""

    consumer: QueueConsumer
    progress: dict[str, Any]
    last_batch: int


class QueueLoop:
    """Runs the batches of the queues ``member`` owns; see the module docstring. Used from one
    thread; :meth:`close` closes every consumer (their messages return to the queues)."""

    def __init__(
        self,
        member: Member,
        source: QueueSource,
        output: QueueOutput,
        *,
        batch_size: int | None = None,
        before_first_batch: Callable[[], None] | None = None,
        watch: Callable[[str, int, int], None] | None = None,
    ) -> None:
        """``watch(queue, epoch, depth)`` is told the queue's depth after each fetch (the
        module docstring)."""
        self.member = member
        self._watch = watch or self._depth_metric
        self.source = source
        self.output = output
        self.batch_size = batch_size or source.batch_size
        self.stats = QueueStats()
        self._before_first_batch = before_first_batch
        self._open: dict[tuple[str, int], _Open] = {}
        # where the batches of a (queue, epoch) stand after its consumer was dropped (a broker
        # error): the member's copy of the progress is the one handed over at acquisition
        self._kept: dict[tuple[str, int], tuple[dict[str, Any], int]] = {}

    @property
    def open_consumers(self) -> list[tuple[str, int]]:
        """The (queue, epoch) pairs a consumer is open for now."""
        return sorted(self._open)

    def owns(self, resource: str, epoch: int) -> bool:
        """Whether this member still owns ``resource`` at ``epoch`` (from memory; False once
        its local lease lapsed): the loop's one ownership check."""
        return self._guard(resource, epoch).owned()

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
        owned = self.member.assigned()
        for resource, epoch in list(self._open):
            if not self.owns(resource, epoch):
                log.info("queue %s epoch %d no longer owned: consumer closed", resource, epoch)
                self._drop((resource, epoch), forget=True)
        self._kept = {k: v for k, v in self._kept.items() if self.owns(*k)}
        worked = False
        for o in owned:
            if stop is not None and stop.is_set():
                break
            worked = self._batch(o) or worked
        return worked

    def close(self) -> None:
        for key in list(self._open):
            self._drop(key, forget=True)

    # -- one batch ------------------------------------------------------------------------

    def _depth_metric(self, resource: str, epoch: int, depth: int) -> None:
        if self.member.metrics is not None:
            self.member.metrics.queue_depth(resource, depth)

    def _who(self) -> dict[str, str]:
        session = self.member.session
        return {
            "member_id": self.member.member_id,
            "session_id": "" if session is None else session.session_id,
        }

    def _guard(self, resource: str, epoch: int) -> OwnerGuard:
        return OwnerGuard(self.member, resource, epoch, "queue")

    def _drop(self, key: tuple[str, int], *, forget: bool = False) -> None:
        opened = self._open.pop(key, None)
        if opened is not None:
            if not forget:
                self._kept[key] = (opened.progress, opened.last_batch)
            opened.consumer.close()

    def _opened(self, o: OwnedResource) -> _Open:
        """The consumer of ``o``; a new one fences the output first (a new owner: no writer
        of an older epoch can land a batch of the queue after this)."""
        key = (o.resource, o.epoch)
        opened = self._open.get(key)
        if opened is None:
            self._guard(o.resource, o.epoch).check()
            landed = self.output.fence(o.resource, o.epoch, self._who())
            progress, last = self._kept.get(key) or (_parse_progress(o.progress), 0)
            consumer = self.source.consumer(o.resource)
            self._kept.pop(key, None)
            opened = self._open[key] = _Open(
                consumer, progress, max(int(progress["batches"]), last, landed)
            )
        return opened

    def _batch(self, o: OwnedResource) -> bool:
        key = (o.resource, o.epoch)
        name = self.member.member_id
        try:
            opened = self._opened(o)
            messages = opened.consumer.fetch(self.batch_size)
        except FencedError as exc:
            self.stats.fenced += 1
            log.warning("[%s] queue %s epoch %d: %s", name, o.resource, o.epoch, exc)
            self._drop(key)
            return False
        except Exception as exc:  # the broker, or the output table while fencing: try again
            self.stats.errors += 1
            log.warning("[%s] queue %s: %s", name, o.resource, exc)
            self._drop(key)
            return False
        depth = self._depth(o.resource, opened.consumer) if messages else 0
        if depth is not None:
            self._watch(o.resource, o.epoch, depth)
        if not messages:
            return False
        if self._before_first_batch is not None:
            self._before_first_batch()
            self._before_first_batch = None
        batch_id = opened.last_batch + 1
        try:
            landing, written = self.output.write(
                o.resource,
                o.epoch,
                batch_id,
                messages,
                self._who(),
                self._guard(o.resource, o.epoch),
            )
            if landing is Landing.ALREADY:  # cannot be: ids continue from the table's
                raise RebalancerError(
                    f"batch {batch_id} of queue {o.resource!r} is in the output already"
                )
            progress = _next_progress(opened.progress, batch_id, messages, written, depth)
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
        opened.progress = progress
        opened.last_batch = batch_id
        try:
            opened.consumer.ack(messages)
        except RebalancerError as exc:  # redelivered later and deduplicated then
            self.stats.errors += 1
            log.warning("[%s] queue %s: acknowledging failed: %s", name, o.resource, exc)
            self._drop(key)
        self._count(o, batch_id, len(messages), written)
        return True

    def _count(self, o: OwnedResource, batch_id: int, messages: int, written: int) -> None:
        """A batch landed: the stats and the log line."""
        stats = self.stats
        stats.batches += 1
        stats.messages += messages
        stats.written += written
        stats.duplicates += messages - written
        stats.per_resource[o.resource] = stats.per_resource.get(o.resource, 0) + messages
        log.info(
            "[%s] queue %s epoch %d batch %d: %d messages, %d new rows",
            self.member.member_id, o.resource, o.epoch, batch_id, messages, written,
        )  # fmt: skip

    def _depth(self, resource: str, consumer: QueueConsumer) -> int | None:
        """The queue's depth after a fetch, or None when the broker cannot tell now (the batch
        goes on: the lag is a figure for operators, not a condition of the work)."""
        try:
            return consumer.depth()
        except RebalancerError as exc:
            log.info("queue %s: depth not known (%s)", resource, exc)
            return None


def _parse_progress(value: JsonValue) -> dict[str, Any]:
    if isinstance(value, dict) and isinstance(value.get("batches"), int):
        return dict(value)
    if value is not None:
        log.warning("progress %s is not a queue progress; counting batches from 0", str(value)[:80])
    return {"batches": 0, "messages": 0, "written": 0, "last": None}


def _next_progress(
    state: dict[str, Any],
    batch_id: int,
    messages: list[QueueMessage],
    written: int,
    depth: int | None,
) -> dict[str, Any]:
    keys = [m.key for m in messages]
    last: dict[str, Any] = {"id": batch_id, "count": len(keys)}
    if len(json.dumps(keys)) <= _KEYS_LIMIT:
        last["keys"] = keys
    progress: dict[str, Any] = {
        "batches": batch_id,
        "messages": int(state.get("messages", 0)) + len(messages),
        "written": int(state.get("written", 0)) + written,
        "last": last,
    }
    if depth is not None:
        progress["pending"] = {"messages": depth}
    return progress
