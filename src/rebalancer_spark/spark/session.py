"""The rebalancer node on a Spark driver, and ``assigned_sources()`` for pipeline code.

::

    node = start(spark, job)              # joins the group on a background thread
    for batch in batches(spark):          # what it owns now, from memory (spark.batch)
        with batch:
            batch.write(batch.read())     # fenced in the output's commit, then in the store
    spark.stop()                          # stops the node first (graceful drain), then Spark

The node stops with the Spark session: :func:`start` wraps this session's ``stop()`` so the
member drains and leaves before Spark goes away, and registers an ``atexit`` hook for drivers
that exit without stopping Spark. The Spark application id and name go into the member's info,
so the group's status and the audit table say which application owned what.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rebalancer_spark.audit.delta import DeltaAuditLog
from rebalancer_spark.audit.reader import epoch_floors
from rebalancer_spark.core.errors import BackendUnavailable, ConfigurationError, RebalancerError
from rebalancer_spark.core.events import EventKind, EventSink, OwnershipEvent
from rebalancer_spark.member import Member, OwnedResource
from rebalancer_spark.member.logfields import bind_thread, unbind_thread
from rebalancer_spark.member.ownership import Callback
from rebalancer_spark.sources import FileSource, ResourceSource, open_source
from rebalancer_spark.spark.file_history import FileHistory
from rebalancer_spark.spark.guard import OwnerGuard
from rebalancer_spark.spark.lag import LagSampler
from rebalancer_spark.spark.option_table import DEFAULT
from rebalancer_spark.spark.options import JobConfig
from rebalancer_spark.spark.outputs import Output, open_output, s3_storage_options
from rebalancer_spark.spark.progress_requests import ControlRequests
from rebalancer_spark.spark.source import AssignedSource, ReadSettings
from rebalancer_spark.spark.watchdog import DriverWatchdog, watch_driver

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "RebalancerNode",
    "assigned_sources",
    "current_node",
    "require_shared_store",
    "single_host_master",
    "start",
]

log = logging.getLogger("rebalancer_spark.spark")

START_RETRY_SECONDS = 60.0
"""How long :func:`start` keeps trying to join while the store is unavailable (a Redis restart,
a ZooKeeper leader election, a paused server) before it gives up with the store's error."""
START_RETRY_PAUSE = 1.0


class _Registry:
    """The one node of this driver."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.node: RebalancerNode | None = None


_registry = _Registry()


class RebalancerNode:
    """One job's member of its group, tied to its Spark session."""

    def __init__(
        self, spark: SparkSession, job: JobConfig, source: ResourceSource | None = None
    ) -> None:
        self.spark = spark
        self.job = job
        if source is None and job.source:
            source = open_source(job.source)
        self.source: ResourceSource | None = source
        self.audit: DeltaAuditLog | None = DeltaAuditLog(job.audit) if job.audit else None
        self._lag = LagSampler(job.lag_interval)
        sc = spark.sparkContext
        sinks: list[EventSink] = [self.audit] if self.audit is not None else []
        self.member = Member(
            job.member,
            resources=None if job.resources is None else list(job.resources),
            discover=None if self.source is None else self.source.discover,
            discovery_interval=job.discovery_interval,
            event_sinks=sinks,
            info={"spark_app_id": str(sc.applicationId), "spark_app_name": str(sc.appName)},
            on_assigned=self._assigned,
            on_revoked=self._revoked,
            on_lost=self._lost,
            epoch_floors=epoch_floors(job.audit, job.member.group) if job.audit else None,
        )
        self._requests = ControlRequests(self.member)
        self._sources: dict[tuple[str, int], AssignedSource] = {}
        self._listeners: list[tuple[Callback | None, Callback | None, Callback | None]] = []
        self._lock = threading.Lock()
        self._stopped = False
        self._driver_thread: threading.Thread | None = None
        self._output: Output | None = None
        self._output_lock = threading.Lock()
        self._watchdog: DriverWatchdog | None = None

    def listen(
        self,
        *,
        on_assigned: Callback | None = None,
        on_revoked: Callback | None = None,
        on_lost: Callback | None = None,
    ) -> None:
        """Also call these on the member thread when ownership changes (see
        :class:`~rebalancer_spark.member.Member`: ``on_revoked`` must return only once work on
        those resources has stopped). Register before the work starts."""
        with self._lock:
            self._listeners.append((on_assigned, on_revoked, on_lost))

    def start(self) -> RebalancerNode:
        """Join the group. The calling thread (the driver thread that runs the job's main
        loop) logs with this member's group, member and epoch fields until :meth:`stop`."""
        self.member.start()
        self._watchdog = watch_driver(self.spark.sparkContext, self._driver_died)
        self._driver_thread = threading.current_thread()
        bind_thread(self._driver_thread, self.member.log_context)
        _wrap_stop(self.spark, self)
        atexit.register(self.stop)
        log.info(
            "member %s joined group %s (spark app %s)",
            self.member.member_id,
            self.member.group,
            self.member.info.get("spark_app_id"),
        )
        return self

    def stop(self) -> None:
        """Drain and leave the group, then flush the audit log. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        atexit.unregister(self.stop)
        if self._watchdog is not None:
            self._watchdog.stop()
        try:
            self.member.stop()
        finally:
            if self.audit is not None:
                self.audit.close()
            if self._driver_thread is not None:
                unbind_thread(self._driver_thread, self.member.log_context)
            _forget_current(self)

    def _driver_died(self, reason: str) -> bool:
        """The watchdog's verdict: this driver cannot work any more. Give everything up at
        once, without draining, then close as :meth:`stop` does (the audit log too when a
        :meth:`stop` on another thread waits for the watchdog); whether this call did it."""
        abandoned = self.member.abandon(reason)
        self.stop()
        if self.audit is not None:
            self.audit.close()
        return abandoned

    def assigned_sources(self) -> list[AssignedSource]:
        """What this job owns now, one :class:`AssignedSource` per resource, sorted."""
        out: list[AssignedSource] = []
        for owned in self.member.assigned():
            key = (owned.resource, owned.epoch)
            with self._lock:
                src = self._sources.get(key)
                if src is None:
                    src = self._sources[key] = self._make(owned)
            out.append(src)
        return out

    @property
    def output(self) -> Output | None:
        """The job's output (``--output`` in ``--output-format``), opened on first use."""
        if self._output is None and self.job.output is not None:
            with self._output_lock:
                if self._output is None:
                    self._configure_s3a()
                    self._output = open_output(
                        self.spark, self.job.output, self.member.group, self.job.output_format
                    )
        return self._output

    def _configure_s3a(self) -> None:
        """An output next to a file source is written with what Spark needs to reach it (an
        S3 source's endpoint and credentials): set it before the output reads Spark's conf."""
        if isinstance(self.source, FileSource):
            self.source.prepare_spark(self.spark)

    def owns(self, resource: str, epoch: int) -> bool:
        """Whether this job owns ``resource`` at ``epoch`` now, from memory (False once the
        local lease deadline passed). The one "am I still the owner?" check of the Spark glue."""
        return OwnerGuard(self.member, resource, epoch).owned()

    def _make(self, owned: OwnedResource) -> AssignedSource:
        session = self.member.session
        job = self.job
        return AssignedSource(
            group=self.member.group,
            resource=owned.resource,
            epoch=owned.epoch,
            progress=owned.progress,
            source=self.source,
            commit=lambda resource, value, epoch: self.member.commit(resource, value, epoch=epoch),
            owner=self.member,
            before_first_read=self._audit_before_work,
            who={
                "member_id": self.member.member_id,
                "session_id": "" if session is None else session.session_id,
            },
            output=self.output,
            read=ReadSettings(
                job.format, job.schema, dict(job.read_options), job.max_files_per_batch
            ),
            changed=self._changed_files,
            history=self._files_history(),
            watch=self._watch,
            event=self._event,
            requests=self._requests,
        )

    def _event(self, kind: str, resource: str, epoch: int, reason: str) -> None:
        """A ``stuck`` or ``progress`` event of this job, to the audit table and metrics."""
        session = self.member.session
        now = time.time()
        event = OwnershipEvent(
            EventKind(kind), self.member.group, resource, self.member.member_id,
            "" if session is None else session.session_id, epoch, now, now, reason,
        )  # fmt: skip
        for sink in (self.audit, self.member.metrics):
            if sink is not None:
                sink(event)

    def _watch(
        self, resource: str, epoch: int, stuck: str | None, pending: tuple[int, int] | None
    ) -> None:
        metrics = self.member.metrics
        if metrics is not None:
            metrics.resource_state(resource, stuck, pending)
        if self.audit is None or pending is None:
            return
        files, size = pending
        if self._lag.take(resource, epoch, files, size):
            self._lag_row(resource, epoch, f"{files} files, {size} bytes pending",
                          files=files, size=size)  # fmt: skip

    def queue_lag(self, resource: str, epoch: int, messages: int) -> None:
        """A queue's depth after a fetch by its owner at ``epoch`` (the queue loop's
        ``watch``): to the metrics, and sampled into the audit table as ``lag`` rows, as
        for the files of a file resource."""
        metrics = self.member.metrics
        if metrics is not None:
            metrics.queue_depth(resource, messages)
        if self.audit is not None and self._lag.take(resource, epoch, messages, 0):
            self._lag_row(resource, epoch, f"{messages} messages pending",
                          messages=messages)  # fmt: skip

    def _lag_row(
        self, resource: str, epoch: int, reason: str, *, files: int | None = None,
        size: int | None = None, messages: int | None = None,
    ) -> None:  # fmt: skip
        assert self.audit is not None
        session = self.member.session
        now = time.time()
        self.audit(
            OwnershipEvent(
                EventKind.LAG, self.member.group, resource, self.member.member_id,
                "" if session is None else session.session_id, epoch, now, now, reason,
                pending_files=files, pending_bytes=size, pending_messages=messages,
            )
        )  # fmt: skip

    def _files_history(self) -> FileHistory | None:
        """The ``--files-history`` table, or None: next to the output."""
        if self.job.files_history is None:
            return None
        uri = self.job.files_history
        options: dict[str, str] = {}
        if uri.startswith(("s3://", "s3a://")):
            bucket = urlsplit(uri).netloc
            uri = "s3://" + uri.split("://", 1)[1]
            options = s3_storage_options(self.spark, bucket)
        return FileHistory(uri, self.member.group, storage_options=options)

    def _changed_files(self, count: int, action: str) -> None:
        metrics = self.member.metrics
        if metrics is not None:
            metrics.changed_files(count, action)

    def flush_audit(self) -> None:
        """Wait (at most 30 s) until the audit table holds every ownership event so far: call
        it before working on a newly acquired resource."""
        self._audit_before_work()

    def _audit_before_work(self) -> None:
        """The acquisition reaches the audit table before the first byte is read."""
        if self.audit is not None and not self.audit.flush(timeout=30):
            log.warning("audit table %s lags behind: %s", self.job.audit, self.audit.last_error)

    def _assigned(self, owned: Sequence[OwnedResource]) -> None:
        for on_assigned, _, _ in list(self._listeners):
            if on_assigned is not None:
                on_assigned(owned)

    def _revoked(self, owned: Sequence[OwnedResource]) -> None:
        try:
            for _, on_revoked, _ in list(self._listeners):
                if on_revoked is not None:
                    on_revoked(owned)
        finally:
            self._forget(owned)

    def _lost(self, owned: Sequence[OwnedResource]) -> None:
        self._forget(owned)
        for _, _, on_lost in list(self._listeners):
            if on_lost is not None:
                on_lost(owned)

    def _forget(self, owned: Sequence[OwnedResource]) -> None:
        with self._lock:
            for o in owned:
                self._sources.pop((o.resource, o.epoch), None)
        metrics = self.member.metrics
        if metrics is not None:
            for o in owned:
                metrics.resource_gone(o.resource)


def single_host_master(master: str) -> bool:
    """Whether every driver of a Spark master URL runs on this host: ``local``,
    ``local[N]``, ``local[*]``, ``local[N,F]`` and ``local-cluster[...]``."""
    return master == "local" or master.startswith(("local[", "local-cluster["))


def require_shared_store(job: JobConfig, master: str) -> None:
    """Refuse a job whose drivers may run on several hosts (any master but ``local…``) when it
    was given no ``--backend``: the default store is an SQLite file on the driver's host, so
    jobs on other hosts would each form a group of their own and take every resource. A
    backend given explicitly, even a ``sqlite://`` one, is taken as meant (with a warning for
    SQLite)."""
    if single_host_master(master):
        return
    url = job.member.backend_url
    if job.origins.get("backend") == DEFAULT:
        raise ConfigurationError(
            f"no --backend given on Spark master {master!r}, whose drivers may run on several "
            f"hosts: the default store is an SQLite file on this host ({url.redacted()}), so "
            "jobs on other hosts would each form a group of their own and take every resource. "
            "Give a store every driver reaches: --backend zookeeper://zk1:2181,zk2:2181/"
            "rebalancer or --backend redis://host:6379/0 (or spark.rebalancer.backend); if "
            "every driver of the group runs on this host, give the SQLite store explicitly: "
            "--backend sqlite:///path/groups.db"
        )
    if url.scheme == "sqlite":
        log.warning(
            "group %s uses the host-local store %s on Spark master %r: only drivers on this "
            "host share it; use a zookeeper:// or redis:// --backend when drivers run on "
            "several hosts (cluster deploy mode, YARN, Kubernetes)",
            job.member.group,
            url.redacted(),
            master,
        )


def start(
    spark: SparkSession, job: JobConfig, source: ResourceSource | None = None
) -> RebalancerNode:
    """Start this driver's node (one per driver) and make it the one ``assigned_sources()``
    answers from. ``source`` is the job's source object when the job made it itself (a queue
    job does, to keep its type); by default it is opened from ``job.source``. Refuses a job
    with the default, host-local store on a multi-host master (:func:`require_shared_store`).
    A store unavailable while joining (:class:`BackendUnavailable`) is tried again every
    :data:`START_RETRY_PAUSE` s for up to :data:`START_RETRY_SECONDS`; any other error at once."""
    require_shared_store(job, str(spark.sparkContext.master))
    deadline = time.monotonic() + START_RETRY_SECONDS
    while True:
        with _registry.lock:
            running = _registry.node
            if running is not None:
                raise RebalancerError(
                    "this driver already runs a rebalancer node for group "
                    f"{running.member.group!r}: stop it (or the Spark session) before starting "
                    "another"
                )
            node = RebalancerNode(spark, job, source)
            _registry.node = node
        try:
            return node.start()
        except BackendUnavailable as exc:
            node.stop()  # its audit log too; the member never joined
            if time.monotonic() + START_RETRY_PAUSE >= deadline:
                raise
            log.warning(
                "the store is unavailable while joining group %s (%s); trying again in %g s, "
                "for at most %g s in all",
                job.member.group,
                exc,
                START_RETRY_PAUSE,
                START_RETRY_SECONDS,
            )
            time.sleep(START_RETRY_PAUSE)  # a backoff between attempts to reach the store
        except BaseException:
            _forget_current(node)
            raise


def current_node() -> RebalancerNode:
    """The node started by :func:`start` in this driver."""
    node = _registry.node
    if node is None:
        raise RebalancerError(
            "no rebalancer node runs in this driver: call rebalancer_spark.spark.start(spark, "
            "job) first (the jobs in jobs/ do it from --group and the other options)"
        )
    return node


def assigned_sources() -> list[AssignedSource]:
    """What this driver's job owns now, answered from memory."""
    return current_node().assigned_sources()


def _forget_current(node: RebalancerNode) -> None:
    with _registry.lock:
        if _registry.node is node:
            _registry.node = None


def _wrap_stop(spark: SparkSession, node: RebalancerNode) -> None:
    original = spark.stop

    def stop(*args: Any, **kwargs: Any) -> None:
        node.stop()
        original(*args, **kwargs)

    setattr(spark, "stop", stop)  # noqa: B010 - an instance attribute shadows the method
