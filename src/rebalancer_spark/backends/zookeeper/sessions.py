"""Member sessions: joining (a member znode and a session znode, both ephemeral of a new
ZooKeeper session), renewing (a round trip through that session), the member's record
(draining flag, acknowledged generation), and sessions that ended while unreachable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.exceptions import NoNodeError

from rebalancer_spark.backends.base import Session
from rebalancer_spark.backends.zookeeper.store.client import (
    Settings,
    close_session,
    open_client,
    wait,
)
from rebalancer_spark.backends.zookeeper.store.connection import ZkSession
from rebalancer_spark.backends.zookeeper.store.fence import (
    alive_op,
    require_live,
    session_gone,
    session_reader,
    session_transact,
)
from rebalancer_spark.backends.zookeeper.store.layout import GroupPaths
from rebalancer_spark.backends.zookeeper.store.multiread import Reader
from rebalancer_spark.backends.zookeeper.store.ops import Op, Refused
from rebalancer_spark.backends.zookeeper.store.records import member_data, read_member
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.errors import BackendUnavailable, MemberIdInUse, RebalancerError
from rebalancer_spark.core.model import MemberRecord

__all__ = [
    "GroupGone",
    "Leftovers",
    "acked",
    "join",
    "leaving",
    "renew",
    "update_member",
    "with_info",
]

Change = Callable[[MemberRecord], bytes | None]


class GroupGone(BackendUnavailable):
    """A join found the group's znodes gone (a chroot deleted since this backend object
    prepared the group): the backend prepares it again and retries."""


class Leftovers:
    """Sessions this backend ended while the ensemble was unreachable (the server never heard
    of the close). The next :func:`join` resumes and closes them, so their member znodes and
    claims go at once instead of at their timeout, and a static member rejoining under its id
    is not refused meanwhile."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._pending: list[tuple[int, bytes]] = []

    def note(self, client_id: tuple[int, bytes]) -> None:
        with self._lock:
            self._pending.append(client_id)

    def close_all(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        left = [c for c in pending if not close_session(self._settings, c)]
        if left:
            with self._lock:
                self._pending.extend(left)


def join(
    settings: Settings,
    client: Any,
    paths: GroupPaths,
    member_id: str,
    *,
    info: Mapping[str, str],
    ttl: float,
    static: bool,
    clock: Clock,
    leftovers: Leftovers,
) -> ZkSession:
    """Open a new ZooKeeper session asking for ``ttl`` and register the member in it; its
    :class:`Session` carries the timeout the server granted. ``client`` is the shared client
    (to name the holder of a member id in use)."""
    started = clock.monotonic()
    own = open_client(settings, ttl)
    leftovers.close_all()  # the ensemble answers: a good moment
    session = Session(paths.group, member_id, f"{own.client_id[0]:016x}", own.negotiated)
    zs = ZkSession(
        session, own.client, own.client_id, paths, started + own.negotiated, clock, leftovers.note
    )
    # kazoo's session id, kept while the connection is down (its ``client_id`` is None then)
    # and reset when the session expires. Another one (or none) now means the session
    # expired before ``zs`` listened to the client: the join's znodes would be those of
    # kazoo's next session. Give it up; the join is tried again.
    if own.client._session_id != own.client_id[0]:
        zs.close("it expired as it was opened")
        raise settings.unavailable(
            f"joining group {paths.group!r}", "the new session expired as it was opened"
        )
    record = member_data(session.session_id, info, static=static)
    ops = [
        Op("create", paths.member(member_id), record, ephemeral=True),
        Op("create", paths.session(session.session_id), ephemeral=True),
        Op("set", paths.changes),
    ]
    try:
        session_transact(zs, settings, ops, f"joining group {paths.group!r}")
    except BaseException as exc:
        zs.close("its join failed")
        if isinstance(exc, Refused) and isinstance(exc.error, NoNodeError):
            # A parent of any of the join's znodes is gone: the group was deleted, or is being
            # deleted (a recursive delete takes ``sessions/`` before ``members/``).
            raise GroupGone(
                f"joining group {paths.group!r}: its znodes are gone (the chroot was "
                "deleted?); the join prepares the group again and retries"
            ) from None
        if isinstance(exc, Refused) and exc.op.path == paths.member(member_id):
            raise _in_use(client, settings, paths, member_id) from None
        raise
    return zs


def _in_use(client: Any, settings: Settings, paths: GroupPaths, member_id: str) -> MemberIdInUse:
    what = "reading a member"
    found = Reader(client, settings, what, settings.unavailable(what, "session expired")).get(
        paths.member(member_id)
    )()
    holder: dict[str, str] = {}
    if found is not None:
        try:
            holder = dict(read_member(member_id, found[0], paths.member(member_id)).info)
        except RebalancerError:
            holder = {}
    return MemberIdInUse(
        paths.group, member_id, host=holder.get("host", "?"), pid=holder.get("pid", "?")
    )


def renew(zs: ZkSession, settings: Settings, clock: Clock) -> None:
    """One round trip through the session's own connection proves the session alive; the
    lease then runs ``ttl`` from the moment this call started."""
    started = clock.monotonic()
    if zs.lapse_if_due(started):
        zs.close_soon()
    require_live(zs, settings, "renewing the session")
    pending = zs.client.exists_async(zs.paths.session(zs.session.session_id))
    stat = wait(pending, settings, "renewing the session", zs.expired())
    if stat is None or stat.ephemeralOwner != zs.zk_id:
        raise session_gone(zs)
    if not zs.extend(started):
        if zs.lapse_if_due(clock.monotonic()):
            zs.close_soon()
        raise zs.expired()


def update_member(zs: ZkSession, settings: Settings, change: Change, what: str) -> None:
    """Rewrite the member's record with ``change`` (None: nothing to do), compare-and-set on
    its version, fenced by the session."""
    require_live(zs, settings, what)
    s = zs.session
    path = zs.paths.member(s.member_id)
    for _ in range(10):
        found = session_reader(zs, settings, what).get(path)()
        if found is None:
            raise session_gone(zs)
        record = read_member(s.member_id, found[0], path)
        if record.session_id != s.session_id:
            raise session_gone(zs)
        data = change(record)
        if data is None:
            return
        ops = [
            alive_op(zs),
            Op("set", path, data, version=found[1].version),
            Op("set", zs.paths.changes),
        ]
        try:
            session_transact(zs, settings, ops, what)
            return
        except Refused as exc:
            if exc.op.kind == "check":
                raise session_gone(zs) from None
    raise settings.unavailable(what, "the member znode kept changing")


def leaving(r: MemberRecord) -> bytes:
    return member_data(
        r.session_id, r.info, static=r.static, leaving=True, acked=r.acked_generation
    )


def acked(generation: int) -> Change:
    def change(r: MemberRecord) -> bytes | None:
        if r.acked_generation >= generation:
            return None
        return member_data(
            r.session_id, r.info, static=r.static, leaving=r.leaving, acked=generation
        )

    return change


def with_info(info: Mapping[str, str]) -> Change:
    def change(r: MemberRecord) -> bytes | None:
        if dict(r.info) == dict(info):
            return None
        return member_data(
            r.session_id, info, static=r.static, leaving=r.leaving, acked=r.acked_generation
        )

    return change
