"""Helpers shared by the tests: waiting on a condition with a deadline, never sleeping."""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rebalancer_spark.backends.base import Backend, Session, TargetChange, Watch
from rebalancer_spark.core.control import Control
from rebalancer_spark.core.errors import BackendUnavailable
from rebalancer_spark.core.model import (
    CoordinatorRecord,
    Grant,
    GroupHead,
    GroupState,
    Phase,
    Progress,
    Resource,
    ResourceChange,
    Target,
)
from rebalancer_spark.core.protocols import MemberHead, MemberView

if TYPE_CHECKING:
    from rebalancer_spark.member import Member
    from rebalancer_spark.sources.base import FileSource
    from rebalancer_spark.spark.guard import WriteGuard
    from rebalancer_spark.spark.outputs import Output
    from rebalancer_spark.spark.source import AssignedSource

T = TypeVar("T")

# The Spark conf of every spark-submit application a test starts (with
# rebalancer_spark.spark.packages.spark_submit_command, which adds the Delta and S3 jars).
JOB_CONF = {
    "spark.ui.enabled": "false",
    "spark.driver.memory": "512m",
    "spark.databricks.delta.snapshotPartitions": "2",  # Delta's default (50 tasks): big tables
}


def quiet(watch: Watch) -> None:
    """Let the wake-ups of the changes made so far pass (one change may fire two of the
    znodes a ZooKeeper watch follows, and a watch's first registration covered everything)."""
    for _ in range(20):
        if not watch.wait(0.3):
            return
    raise AssertionError("the watch kept waking with nothing changing")


def wait_for(condition: Callable[[], T], *, timeout: float, what: str, interval: float = 0.01) -> T:
    """Poll ``condition`` until it returns something truthy; fail with ``what`` after
    ``timeout`` seconds, showing the last value seen."""
    deadline = time.monotonic() + timeout
    last: T = condition()
    while not last:
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")
        time.sleep(interval)  # a poll interval between checks, not a synchronisation sleep
        last = condition()
    return last


class FlakyStore(Backend):
    """A real store that can be cut off from this one member, as if the network to it
    dropped: while ``partitioned`` is set every call fails as an unreachable store does."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner.url)
        self.inner = inner
        self.partitioned = threading.Event()

    def _reach(self) -> Backend:
        if self.partitioned.is_set():
            raise BackendUnavailable("the store is cut off by the test")
        return self.inner

    # The front (Backend's public methods) validates; each protected method passes the call
    # on to the inner store's public method (which validates again: harmless).

    def _renew(self, session: Session) -> None:
        self._reach().renew(session)

    def _join(
        self, group: str, member_id: str, *, info: dict[str, str], ttl: float, static: bool
    ) -> Session:
        return self._reach().join(group, member_id, info=info, ttl=ttl, static=static)

    def _incarnation(self, group: str) -> str | None:
        return self._reach().incarnation(group)

    def _lift_epochs(self, group: str, floors: dict[str, int]) -> int:
        return self._reach().lift_epochs(group, floors)

    def _update_info(self, session: Session, info: dict[str, str]) -> None:
        self._reach().update_info(session, info)

    def _set_leaving(self, session: Session) -> None:
        self._reach().set_leaving(session)

    def _leave(self, session: Session) -> None:
        self._reach().leave(session)

    def _state(self, group: str) -> GroupState:
        return self._reach().state(group)

    def _member_view(self, session: Session, claims: bool) -> MemberView:
        return self._reach().member_view(session, claims=claims)

    def _member_head(self, session: Session) -> MemberHead:
        return self._reach().member_head(session)

    def _head(self, group: str) -> GroupHead:
        return self._reach().head(group)

    def _control(self, group: str) -> Control:
        return self._reach().control(group)

    def _resources(self, group: str) -> tuple[int, dict[str, Resource]]:
        return self._reach().resources(group)

    def _resource_changes(self, group: str, since: int) -> ResourceChange | None:
        return self._reach().resource_changes(group, since)

    def _target(self, group: str) -> Target | None:
        return self._reach().target(group)

    def _holders(self, group: str, sessions: dict[str, str]) -> frozenset[str]:
        return self._reach().holders(group, sessions)

    def _progress(self, group: str, resources: list[str]) -> dict[str, Progress]:
        return self._reach().progress(group, resources)

    def _watch(self, group: str) -> Watch:
        return self.inner.watch(group)

    def _elect(self, session: Session) -> CoordinatorRecord | None:
        return self._reach().elect(session)

    def _publish(
        self,
        session: Session,
        epoch: int,
        assignment: dict[str, list[str]],
        *,
        phase: Phase,
        resources_version: int,
        change: TargetChange | None,
    ) -> Target:
        return self._reach().publish(
            session, epoch, assignment, phase=phase, resources_version=resources_version
        )

    def _resign(self, session: Session, epoch: int) -> None:
        self._reach().resign(session, epoch)

    def _update_resources(
        self,
        group: str,
        *,
        replace: Collection[Resource] | None,
        add: Collection[Resource],
        remove: list[str],
        base: int | None,
    ) -> tuple[int, bool]:
        # Without the kept set behind base, the inner store gets the set whole: the same set.
        return self._reach()._update_resources(
            group, replace=replace, add=add, remove=remove, base=None
        )

    def _update_control(self, group: str, expected_version: int, control: Control) -> Control:
        return self._reach().update_control(group, expected_version, control)

    def _claim(self, session: Session, resources: list[str], generation: int) -> dict[str, Grant]:
        return self._reach().claim(session, resources, generation)

    def _release(self, session: Session, claims: dict[str, int]) -> None:
        self._reach().release(session, claims)

    def _acknowledge(self, session: Session, generation: int) -> None:
        self._reach().acknowledge(session, generation)

    def _commit(self, session: Session, resource: str, epoch: int, text: str) -> None:
        self._reach().commit(session, resource, epoch, json.loads(text))

    def close(self) -> None:
        self.inner.close()


def assigned_source(
    member: Member,
    resource: str,
    source: FileSource,
    output: Output | None = None,
    changed: Callable[[int, str], None] | None = None,
    event: Callable[[str, str, int, str], None] | None = None,
    **read: Any,
) -> AssignedSource:
    """``resource`` as the job of ``member`` works on it, once ``member`` owns it: an
    :class:`AssignedSource` committing through the member and writing to ``output`` (CSV
    ``id STRING, value INT``, two files per batch unless ``read`` says otherwise)."""
    from rebalancer_spark.spark.progress_requests import ControlRequests
    from rebalancer_spark.spark.source import AssignedSource, ReadSettings

    owned = wait_for(lambda: member.owns(resource), timeout=10, what=f"{resource} owned")
    assert owned is not None
    session = member.session
    settings = {"schema": "id STRING, value INT", "max_files_per_batch": 2, **read}
    history = None
    if output is None:  # the group's history, shared by its members, in the temp directory
        from rebalancer_spark.spark.file_history import FileHistory

        where = Path(tempfile.gettempdir()) / "rebalancer-test-history" / member.group
        history = FileHistory(str(where), member.group)
    return AssignedSource(
        group=member.group,
        resource=resource,
        epoch=owned.epoch,
        progress=owned.progress,
        source=source,
        commit=lambda r, v, e: member.commit(r, v, epoch=e),
        owner=member,
        before_first_read=lambda: None,
        who={"member_id": member.member_id, "session_id": session.session_id if session else ""},
        output=output,
        read=ReadSettings(**settings),
        changed=changed,
        history=history,
        event=event,
        requests=ControlRequests(member, interval=0.0),
    )


class GuardWith:
    """A write guard (:mod:`rebalancer_spark.spark.guard`) over ``inner`` (None: one that
    never refuses, for a write made without a member) that runs ``inside_hold`` right after
    each hold begins: a writer paused after its last look, right before its Delta commit."""

    def __init__(
        self, inner: WriteGuard | None = None, inside_hold: Callable[[], None] | None = None
    ) -> None:
        self.inner = inner
        self.inside_hold = inside_hold

    def check(self) -> None:
        if self.inner is not None:
            self.inner.check()

    @contextmanager
    def holding(self) -> Iterator[None]:
        with nullcontext() if self.inner is None else self.inner.holding():
            if self.inside_hold is not None:
                self.inside_hold()
            yield


def read_delta(spark: Any, path: str | Path) -> Any:
    """The Delta table at ``path`` through Spark's own Delta reader."""
    return spark.read.format("delta").load(str(path))


class SqliteMembers:
    """Members of one group on one SQLite file, started on demand (a short stability window),
    all stopped by :meth:`stop_all`. Their tests move resources by stopping members, never by
    waiting out a lease: the session is long enough (6 s) that a member does not lapse while
    Spark runs its first job on a machine loaded with other work (a 2 s session did, under
    two busy loops beside the suite)."""

    def __init__(self, path: Path, group: str) -> None:
        self.url = f"sqlite://{path}?poll=0.005"
        self.group = group
        self.started: list[Member] = []

    def start(self, name: str, *, session_timeout: float = 6.0, **kw: Any) -> Member:
        from rebalancer_spark.core.config import MemberConfig
        from rebalancer_spark.member import Member

        config = MemberConfig(
            group=self.group,
            backend=self.url,
            member_id=name,
            session_timeout=session_timeout,
            stability_window=0.02,
        )
        member = Member(config, **kw).start()
        self.started.append(member)
        return member

    def stop_all(self) -> None:
        for member in self.started:
            member.stop(drain=False)
