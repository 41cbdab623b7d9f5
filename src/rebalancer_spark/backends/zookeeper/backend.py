"""``zookeeper://[user:password@]host:2181[,host:2181...][/chroot]``: the ZooKeeper backend.

Use it for groups whose members run on several hosts: members are ephemeral znodes of their
own ZooKeeper sessions, changes are pushed by watches, and every write that depends on a
session, the coordinator role or a claim is fenced by checks in the same multi-op. See
``docs/backends/zookeeper.md`` for the znode layout and how each promise of
:mod:`rebalancer_spark.backends.base` is kept.

One backend object holds one *shared* kazoo client (reads, watches, resource updates) and one
client per member session it hosts (:mod:`.session`), because the contract decides the lease
per member and ephemeral znodes belong to exactly one ZooKeeper session. The session timeout
is what the server *negotiated* (it clamps requests to its minSessionTimeout ..
maxSessionTimeout): :attr:`Session.ttl` is that value, so a member never believes a longer
lease than the server keeps.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Collection, Mapping
from typing import ClassVar

from rebalancer_spark.backends.base import (
    Backend,
    Capability,
    Interest,
    Session,
    TargetChange,
    expired,
    fenced_coordinator,
)
from rebalancer_spark.backends.zookeeper import coordination, floors, ownership, progress, sessions
from rebalancer_spark.backends.zookeeper.control import update_control
from rebalancer_spark.backends.zookeeper.reads import SnapshotReader, build_resources
from rebalancer_spark.backends.zookeeper.resources import update_resources
from rebalancer_spark.backends.zookeeper.store.client import (
    OPTIONS,
    Settings,
    open_client,
    stop_client,
    wait,
)
from rebalancer_spark.backends.zookeeper.store.connection import (
    SessionState,
    SessionTable,
    ZkSession,
)
from rebalancer_spark.backends.zookeeper.store.layout import GroupPaths
from rebalancer_spark.backends.zookeeper.store.multiread import Reader
from rebalancer_spark.backends.zookeeper.store.tree import group_exists, prepare_group, prepare_root
from rebalancer_spark.backends.zookeeper.watch import ZookeeperWatch
from rebalancer_spark.core.clock import Clock, SystemClock
from rebalancer_spark.core.control import Control
from rebalancer_spark.core.errors import (
    BackendUnavailable,
    SessionExpired,
)
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
    validate_group,
)
from rebalancer_spark.core.protocols import MemberHead, MemberView
from rebalancer_spark.core.urls import BackendUrl

__all__ = ["ZookeeperBackend"]

SHARED_TIMEOUT = 10.0
"""Session timeout asked for the shared client (it owns no ephemeral znodes)."""


class ZookeeperBackend(Backend):
    """The ZooKeeper backend; see the module docstring."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.PUSH_NOTIFICATIONS,
            Capability.MULTI_HOST,
            Capability.DURABLE,
            Capability.AUTHENTICATION,
            Capability.PAUSE_TOLERANT,
        }
    )
    options: ClassVar[Mapping[str, str]] = OPTIONS

    def __init__(self, url: BackendUrl, *, clock: Clock | None = None) -> None:
        super().__init__(url)
        self._clock: Clock = clock or SystemClock()
        self.settings = Settings.from_url(url)
        self._root = "" if url.path == "/" else url.path
        self._lock = threading.Lock()
        self._groups: dict[str, GroupPaths] = {}
        self._snapshots: dict[str, SnapshotReader] = {}
        self._sessions = SessionTable(self._clock)
        self._watches: list[ZookeeperWatch] = []
        self._leftovers = sessions.Leftovers(self.settings)
        self._closed = False
        self._client = open_client(self.settings, SHARED_TIMEOUT).client
        try:
            prepare_root(self._client, self.settings, self._root)
        except BaseException:
            stop_client(self._client)
            raise

    # -- plumbing ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendUnavailable(f"the ZooKeeper backend {self.settings.shown} was closed")

    def _paths(self, group: str, *, create: bool = True) -> GroupPaths | None:
        """The group's paths; its skeleton is created (and checked) once per backend object.
        With ``create=False`` a group that does not exist yet is None."""
        self._check_open()
        validate_group(group)  # also for a session's group: a path must never leave the chroot
        with self._lock:
            known = self._groups.get(group)
        if known is not None:
            return known
        paths = GroupPaths(self._root, group)
        if not create and not group_exists(self._client, self.settings, paths):
            return None
        prepare_group(self._client, self.settings, paths)
        with self._lock:
            self._groups[group] = paths
        return paths

    def _group(self, group: str) -> GroupPaths:
        paths = self._paths(group)
        assert paths is not None
        return paths

    def _hosted(self, session: Session) -> ZkSession:
        """The session's local state; SessionExpired if this object does not host it (any
        more): only the process that joined can act for a session."""
        self._check_open()
        zs = self._sessions.get(session.session_id)
        if zs is None:
            raise expired(
                session,
                "it is not open in this backend object: it left, or it was opened by another "
                "process",
            )
        return zs

    def _shared_reader(self, what: str) -> Reader:
        return Reader(
            self._client, self.settings, what, self.settings.unavailable(what, "session expired")
        )

    # -- sessions ------------------------------------------------------------------------------

    def _join(
        self, group: str, member_id: str, *, info: dict[str, str], ttl: float, static: bool
    ) -> Session:
        def once() -> ZkSession:
            return sessions.join(
                self.settings,
                self._client,
                self._present(group),
                member_id,
                info=info,
                ttl=ttl,
                static=static,
                clock=self._clock,
                leftovers=self._leftovers,
            )

        try:
            zs = once()
        except sessions.GroupGone:  # deleted between the check and the join: prepare again
            zs = once()
        self._sessions.add(zs)
        return zs.session

    def _present(self, group: str) -> GroupPaths:
        """The group's paths, its skeleton created again if it vanished since this object
        prepared it (a chroot deleted and created again: the store lost its state)."""
        paths = self._group(group)
        if not group_exists(self._client, self.settings, paths):
            with self._lock:
                self._groups.pop(group, None)
            prepare_root(self._client, self.settings, self._root)
            paths = self._group(group)
        return paths

    def _incarnation(self, group: str) -> str | None:
        paths = self._paths(group, create=False)
        return None if paths is None else floors.incarnation(self._client, self.settings, paths)

    def _lift_epochs(self, group: str, lift: dict[str, int]) -> int:
        return floors.lift_epochs(self._client, self.settings, self._group(group), lift)

    def _renew(self, session: Session) -> None:
        sessions.renew(self._hosted(session), self.settings, self._clock)

    def _update_info(self, session: Session, info: dict[str, str]) -> None:
        sessions.update_member(
            self._hosted(session), self.settings, sessions.with_info(info), "publishing info"
        )

    def _set_leaving(self, session: Session) -> None:
        sessions.update_member(
            self._hosted(session), self.settings, sessions.leaving, "marking the member as leaving"
        )

    def _acknowledge(self, session: Session, generation: int) -> None:
        zs = self._sessions.get(session.session_id)
        if zs is None:
            return
        with contextlib.suppress(SessionExpired):
            sessions.update_member(
                zs, self.settings, sessions.acked(generation), "acknowledging a generation"
            )

    def _leave(self, session: Session) -> None:
        zs = self._sessions.pop(session.session_id)
        if zs is not None:
            zs.close()

    # -- reading ----------------------------------------------------------------------------------

    def _snapshot(self, paths: GroupPaths) -> SnapshotReader:
        with self._lock:
            reader = self._snapshots.get(paths.group)
            if reader is None:
                reader = self._snapshots[paths.group] = SnapshotReader(
                    self._client, self.settings, paths
                )
            return reader

    def _state(self, group: str) -> GroupState:
        paths = self._paths(group, create=False)
        if paths is None:
            return GroupState(group, {}, None, {}, 0, None, {})
        return self._snapshot(paths).state()

    def _head(self, group: str) -> GroupHead:
        paths = self._paths(group, create=False)
        if paths is None:
            return GroupHead(group, {}, None, 0, 0)
        return self._snapshot(paths).head()

    def _control(self, group: str) -> Control:
        paths = self._paths(group, create=False)
        return Control() if paths is None else self._snapshot(paths).control()

    def _resources(self, group: str) -> tuple[int, dict[str, Resource]]:
        paths = self._paths(group, create=False)
        return (0, {}) if paths is None else self._snapshot(paths).resources()

    def _remember_resources(self, group: str) -> int:
        paths = self._paths(group, create=False)
        if paths is None:
            return 0
        version, chunks = self._snapshot(paths).resource_chunks()
        if chunks:  # built only if a store that lost the group needs it declared again
            self.epochs.keep_resources(
                group, version, lambda: list(build_resources(chunks).values())
            )
        return version

    def _resource_changes(self, group: str, since: int) -> ResourceChange | None:
        paths = self._paths(group, create=False)
        if paths is None:
            return ResourceChange(0, 0, {}, frozenset()) if since == 0 else None
        return self._snapshot(paths).resource_changes(since)

    def _target(self, group: str) -> Target | None:
        paths = self._paths(group, create=False)
        return None if paths is None else self._snapshot(paths).target()

    def _holders(self, group: str, members: dict[str, str]) -> frozenset[str]:
        paths = self._paths(group, create=False)
        return frozenset() if paths is None else self._snapshot(paths).holders(members)

    def _member_head(self, session: Session) -> MemberHead:
        return ownership.member_head(self._hosted(session), self.settings)

    def _member_view(self, session: Session, claims: bool) -> MemberView:
        return ownership.member_view(self._hosted(session), self.settings, claims=claims)

    def _progress(self, group: str, resources: list[str]) -> dict[str, Progress]:
        paths = self._paths(group, create=False)
        if paths is None:
            # The server may be behind the group's creation: ask again once it caught up.
            what = f"reading the progress of group {group!r}"
            synced = self._client.sync_async(self._root or "/")
            wait(synced, self.settings, what, self.settings.unavailable(what, "session expired"))
            paths = self._paths(group, create=False)
            if paths is None:
                return {}
        return progress.read_progresses(self._client, self.settings, paths, resources, sync=True)

    def _watch(self, group: str) -> ZookeeperWatch:
        watch = ZookeeperWatch(self._client, self._group(group), self.settings.request_timeout)
        with self._lock:
            self._watches = [w for w in self._watches if not w.closed]
            self._watches.append(watch)
        return watch

    # -- coordinator --------------------------------------------------------------------------

    def _elect(self, session: Session) -> CoordinatorRecord | None:
        zs = self._sessions.get(session.session_id)
        if zs is None or zs.state is SessionState.ENDED:
            return None
        return coordination.elect(zs, self.settings)

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
        zs = self._sessions.get(session.session_id)
        if zs is None:
            raise fenced_coordinator(
                session,
                epoch,
                why=f"its session {session.session_id} is not open in this backend object, so "
                "it cannot be the coordinator",
            )
        # A change from the caller's previous target goes out as a delta from this session's
        # last base (coordination.publish checks that the pointer still names it).
        return coordination.publish(
            zs,
            self.settings,
            epoch,
            assignment,
            phase,
            resources_version,
            change,
        )

    def _resign(self, session: Session, epoch: int) -> None:
        zs = self._sessions.get(session.session_id)
        if zs is not None:
            coordination.resign(zs, self.settings, epoch)

    # -- resources and ownership ------------------------------------------------------------

    def _update_resources(
        self,
        group: str,
        *,
        replace: Collection[Resource] | None,
        add: Collection[Resource],
        remove: list[str],
        base: int | None,
    ) -> tuple[int, bool]:
        paths = self._group(group)
        return update_resources(
            self._client, self.settings, paths, replace=replace, add=add, remove=remove, base=base
        )

    def _update_control(self, group: str, expected_version: int, control: Control) -> Control:
        paths = self._group(group)
        return update_control(self._client, self.settings, paths, expected_version, control)

    def _claim(self, session: Session, resources: list[str], generation: int) -> dict[str, Grant]:
        zs = self._hosted(session)
        # The member's own watches: which holders released since (their records are read
        # with their znodes), and they follow what keeps the rest from it (see .watch).
        with self._lock:
            watches = [
                w
                for w in self._watches
                if not w.closed
                and w.interest is Interest.MEMBER
                and w.member_id == session.member_id
                and w.paths == zs.paths
            ]
        moved = set().union(*(w.take_moved() for w in watches))
        grants, waiting = ownership.claim(zs, self.settings, resources, generation, moved)
        if waiting.znodes or waiting.again:
            for watch in watches:
                watch.follow(waiting.znodes, again=waiting.again)
        return grants

    def _release(self, session: Session, claims: dict[str, int]) -> None:
        zs = self._sessions.get(session.session_id)
        if zs is not None:
            ownership.release(zs, self.settings, claims)

    def _commit(self, session: Session, resource: str, epoch: int, text: str) -> None:
        self._check_open()
        paths = self._group(session.group)
        zs = self._sessions.get(session.session_id)
        client = self._client if zs is None else zs.client
        progress.commit(
            zs, client, self.settings, paths, session, resource, epoch, text, self._clock.wall()
        )

    # -- lifecycle --------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            watches, self._watches = self._watches, []
        for watch in watches:
            watch.close()
        self._sessions.close(lambda zs: zs.close("the backend was closed"))
        stop_client(self._client)
