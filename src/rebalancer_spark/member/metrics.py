"""A member's Prometheus metrics: its own registry, fed by its event sink and a few hooks.

Use case: ``member.metrics_text()`` gives the Prometheus text format for a scrape handler the
application already has; ``metrics_port=9464`` makes the member serve it itself on
``http://host:9464/metrics``. Every member has a registry of its own, so several members in one
process never clash; every series carries ``group`` and ``member`` labels.

Series (gauges unless named ``_total``, histograms ``_seconds``; docs/operations.md says
what each alert means):

* ``rebalancer_group_members``: members the coordinator's target covers; 0 on a member that
  is not coordinator (aggregate with ``max by (group)``);
* ``rebalancer_group_resources``: resources in the group's set, on the coordinator (0 on the
  others);
* ``rebalancer_owned_resources``: resources this member owns now (0 once its lease lapsed);
* ``rebalancer_is_coordinator``: 1 while this member is the coordinator;
* ``rebalancer_coordinator_epoch``: the coordinator epoch this member last saw;
* ``rebalancer_rebalances_total``: targets this member published as coordinator;
* ``rebalancer_rebalance_duration_seconds``: from the first change seen to the publication;
* ``rebalancer_resources_moved_total``: resources those targets moved to another member;
* ``rebalancer_ownership_events_total{kind}``: acquired, released, lost, fenced events;
* ``rebalancer_fenced_writes_total``: commits of this member refused because it no longer
  owned the resource (found locally, or by the store: the latter also emit a ``fenced``
  event);
* ``rebalancer_lease_renew_seconds``: time a successful lease renewal took;
* ``rebalancer_changed_files_total{action}``: processed files found rewritten under the same
  name by this member's Spark job (``action`` = ``ignored`` or ``reread``, the file source's
  ``on_change`` option);
* ``rebalancer_resource_stuck{resource}``: 1 while this member's Spark job cannot make progress
  on the resource (its progress record is unreadable, its listing or a read fails;
  ``rebalancer-spark status`` says why and what fixes it);
* ``rebalancer_pending_files{resource}``, ``rebalancer_pending_bytes{resource}``: the lag,
  files listed and not processed yet, as the job last listed them;
* ``rebalancer_pending_messages{resource}``: the lag of a queue, messages ready and not fetched
  yet, as the job's consumer last read it (after every batch; approximate on SQS);
* ``rebalancer_discovery_failing``: 1 while the coordinator's last listing of the source failed
  (the group keeps its resource set meanwhile; ``Member.discovery_error`` says why);
* ``rebalancer_callback_overruns{callback}``: callbacks of this member that did not return
  within ``callback_timeout`` (``Ownership.overruns``; a count read from memory);
* ``rebalancer_audit_backlog``: ownership events accepted by this member's audit sinks and not
  in the table yet (the sum of the sinks' ``backlog``, e.g. ``DeltaAuditLog.backlog``).

``prometheus_client`` is imported when a member is made (``pip install
'rebalancer-spark[metrics]'``); without it the member runs without metrics and
:meth:`MemberMetrics.text` is not available.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.events import EventKind, OwnershipEvent

__all__ = ["CALLBACKS", "MemberMetrics", "metrics_available"]

log = logging.getLogger("rebalancer_spark.metrics")

_REBALANCE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CALLBACKS = ("on_assigned", "on_revoked", "on_lost")
"""The user callbacks whose overruns are counted (``rebalancer_callback_overruns``)."""

_RENEW_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def metrics_available() -> bool:
    """Whether ``prometheus_client`` can be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


FALLBACK_PORTS = 10
"""How many ports after a taken ``metrics_port`` are tried before one the system picks."""


def _candidates(port: int) -> list[int]:
    """``port``, the next :data:`FALLBACK_PORTS` (up to 65535), then 0 (the system picks);
    just ``[0]`` for 0."""
    if port == 0:
        return [0]
    return [*range(port, min(port + FALLBACK_PORTS, 65535) + 1), 0]


def _count_of(counts: Callable[[], Mapping[str, int]], name: str) -> Callable[[], float]:
    return lambda: counts().get(name, 0)


class MemberMetrics:
    """The metrics of member ``member`` of ``group``; see the module docstring.

    ``owned``, ``is_coordinator``, ``epoch``, ``group_members`` and ``group_resources`` are
    read at scrape time (from memory); the rest is pushed by the member through
    :meth:`__call__` (an event sink), :meth:`rebalanced` and :meth:`renewed`."""

    def __init__(
        self,
        group: str,
        member: str,
        *,
        owned: Callable[[], int],
        is_coordinator: Callable[[], bool],
        epoch: Callable[[], int | None],
        group_members: Callable[[], int],
        group_resources: Callable[[], int],
        discovery_failing: Callable[[], bool] = lambda: False,
        overruns: Callable[[], Mapping[str, int]] = dict,
        audit_backlog: Callable[[], int] = lambda: 0,
    ) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError as exc:
            raise ConfigurationError(
                f"member metrics need prometheus_client ({exc}): pip install "
                "'rebalancer-spark[metrics]', or leave metrics_port at 0"
            ) from exc
        self.registry = CollectorRegistry()
        labels = ("group", "member")
        values = (group, member)

        def gauge(name: str, text: str, read: Callable[[], float]) -> None:
            Gauge(name, text, labels, registry=self.registry).labels(*values).set_function(read)

        gauge("rebalancer_group_members", "members the coordinator's target covers", lambda: (
            group_members() if is_coordinator() else 0
        ))  # fmt: skip
        gauge("rebalancer_group_resources", "resources in the group's set", lambda: (
            group_resources() if is_coordinator() else 0
        ))  # fmt: skip
        gauge("rebalancer_owned_resources", "resources this member owns now", owned)
        gauge("rebalancer_is_coordinator", "1 while this member coordinates", is_coordinator)
        gauge("rebalancer_coordinator_epoch", "the coordinator epoch last seen", lambda: (
            epoch() or 0
        ))  # fmt: skip
        gauge("rebalancer_discovery_failing", "1 while the last listing of the source failed",
              lambda: 1 if is_coordinator() and discovery_failing() else 0)  # fmt: skip
        gauge("rebalancer_audit_backlog", "ownership events not in the audit table yet",
              audit_backlog)  # fmt: skip
        stuck = Gauge(
            "rebalancer_callback_overruns",
            "callbacks that did not return within callback_timeout",
            (*labels, "callback"),
            registry=self.registry,
        )
        for name in CALLBACKS:
            stuck.labels(*values, name).set_function(_count_of(overruns, name))
        self._rebalances = Counter(
            "rebalancer_rebalances",
            "targets published by this member as coordinator",
            labels,
            registry=self.registry,
        ).labels(*values)
        self._duration = Histogram(
            "rebalancer_rebalance_duration_seconds",
            "first change seen to target published",
            labels,
            buckets=_REBALANCE_BUCKETS,
            registry=self.registry,
        ).labels(*values)
        self._moved = Counter(
            "rebalancer_resources_moved",
            "resources moved by the targets this member published",
            labels,
            registry=self.registry,
        ).labels(*values)
        self._events = Counter(
            "rebalancer_ownership_events",
            "ownership events of this member",
            (*labels, "kind"),
            registry=self.registry,
        )
        self._event_children = {kind: self._events.labels(*values, str(kind)) for kind in EventKind}
        self._fenced = Counter(
            "rebalancer_fenced_writes",
            "commits refused because ownership moved on",
            labels,
            registry=self.registry,
        ).labels(*values)
        self._renew = Histogram(
            "rebalancer_lease_renew_seconds",
            "time a successful lease renewal took",
            labels,
            buckets=_RENEW_BUCKETS,
            registry=self.registry,
        ).labels(*values)
        self._changed = Counter(
            "rebalancer_changed_files",
            "processed files found rewritten under the same name",
            (*labels, "action"),
            registry=self.registry,
        )
        per_resource = (*labels, "resource")
        self._stuck = Gauge(
            "rebalancer_resource_stuck",
            "1 while this member cannot make progress on the resource",
            per_resource,
            registry=self.registry,
        )
        self._pending_files = Gauge(
            "rebalancer_pending_files",
            "files of the resource listed and not processed yet",
            per_resource,
            registry=self.registry,
        )
        self._pending_bytes = Gauge(
            "rebalancer_pending_bytes",
            "bytes of the resource's files listed and not processed yet",
            per_resource,
            registry=self.registry,
        )
        self._pending_messages = Gauge(
            "rebalancer_pending_messages",
            "messages ready in the queue and not fetched yet (approximate on SQS)",
            per_resource,
            registry=self.registry,
        )
        self._values = values
        self._server: Any = None
        self._server_thread: threading.Thread | None = None

    # -- what the member pushes ---------------------------------------------------------------

    def __call__(self, event: OwnershipEvent) -> None:
        """The event sink: counts ownership events."""
        self._event_children[event.kind].inc()

    def emit_many(self, events: Sequence[OwnershipEvent]) -> None:
        """The events of one change: counted per kind, one increment each."""
        for kind, count in Counter(e.kind for e in events).items():
            self._event_children[kind].inc(count)

    def refused_write(self) -> None:
        """A commit was refused: the member no longer owned the resource at that epoch."""
        self._fenced.inc()

    def changed_files(self, count: int, action: str) -> None:
        """``count`` processed files were found rewritten; ``action``: ignored or reread."""
        self._changed.labels(*self._values, action).inc(count)

    def resource_state(
        self, resource: str, stuck: str | None, pending: tuple[int, int] | None
    ) -> None:
        """What the Spark job last found on ``resource``: stuck (why) or not, and its lag
        (files, bytes; None: unchanged)."""
        self._stuck.labels(*self._values, resource).set(0 if stuck is None else 1)
        if pending is not None:
            self._pending_files.labels(*self._values, resource).set(pending[0])
            self._pending_bytes.labels(*self._values, resource).set(pending[1])

    def queue_depth(self, resource: str, messages: int) -> None:
        """The lag of the queue ``resource``: messages ready, as its consumer last read."""
        self._pending_messages.labels(*self._values, resource).set(messages)

    def resource_gone(self, resource: str) -> None:
        """``resource`` left this member: its series go."""
        gauges = (self._stuck, self._pending_files, self._pending_bytes, self._pending_messages)
        for gauge in gauges:
            with contextlib.suppress(KeyError):
                gauge.remove(*self._values, resource)

    def rebalanced(self, seconds: float, moved: int) -> None:
        """A target was published ``seconds`` after the first change, moving ``moved``."""
        self._rebalances.inc()
        self._duration.observe(max(seconds, 0.0))
        self._moved.inc(moved)

    def renewed(self, seconds: float) -> None:
        """A lease renewal succeeded after ``seconds``."""
        self._renew.observe(max(seconds, 0.0))

    # -- what the operator reads --------------------------------------------------------------

    def text(self) -> str:
        """Every series in the Prometheus text format."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode("utf-8")

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:  # noqa: S104 - scraped remotely
        """Serve :meth:`text` on ``http://addr:port/metrics`` from a daemon thread; returns
        the port bound (also :attr:`port`). A port that is taken (another driver on the same
        host) is not fatal: the next :data:`FALLBACK_PORTS` ports are tried, then one the
        system picks, with a warning naming the port bound. Raises :class:`ConfigurationError`
        only when no port at all can be bound on ``addr``."""
        from prometheus_client import start_http_server

        tried: list[str] = []
        for candidate in _candidates(port):
            try:
                server, thread = start_http_server(candidate, addr=addr, registry=self.registry)
            except OSError as exc:
                tried.append(f"{candidate} ({exc.strerror or exc})")
                continue
            self._server, self._server_thread = server, thread
            bound = int(server.server_address[1])
            if tried:
                log.warning(
                    "metrics port %d on %s is taken (tried %s): metrics served on "
                    "http://%s:%d/metrics instead; give each driver on this host its own "
                    "metrics_port to keep the port fixed",
                    port,
                    addr,
                    ", ".join(tried),
                    addr,
                    bound,
                )
            else:
                log.info("metrics served on http://%s:%d/metrics", addr, bound)
            return bound
        raise ConfigurationError(
            f"cannot serve metrics on {addr}: tried {', '.join(tried)}; check the address, "
            "or set metrics_port to 0 to turn the endpoint off"
        )

    @property
    def port(self) -> int | None:
        """The port the metrics are served on, or None when not serving."""
        server = self._server
        return None if server is None else int(server.server_address[1])

    def close(self) -> None:
        """Stop serving (if serving). Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
