"""The checks that make writes safe: every write that depends on a session, on the coordinator
role or on a claim carries them in the same multi-op, so ZooKeeper applies it only if they hold.

* **session**: ``check sessions/<id>``: that znode is an ephemeral of exactly this session, so
  the check fails once the session ended, even if kazoo reconnected under a new session;
* **coordinator** (:func:`coordinator_fence`): ``check epoch`` at version == the caller's epoch
  (nobody was elected since; the epoch znode names the session that won it) and
  ``check coordinator`` (the winner still holds the role);
* **claim** (in :mod:`.ownership`): ``check epochs/<id>`` at the version read, the record
  naming this session at its epoch (nobody claimed or lifted the resource since).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rebalancer_spark.backends.base import fenced_coordinator as fence_error
from rebalancer_spark.backends.zookeeper.store.client import Settings
from rebalancer_spark.backends.zookeeper.store.connection import SessionState, ZkSession
from rebalancer_spark.backends.zookeeper.store.layout import SESSION_HINT
from rebalancer_spark.backends.zookeeper.store.multiread import Reader
from rebalancer_spark.backends.zookeeper.store.ops import Op, Refused, answer, transact
from rebalancer_spark.backends.zookeeper.store.records import read_epoch
from rebalancer_spark.core.errors import FencedError, SessionExpired

__all__ = [
    "alive_op",
    "coordinator_fence",
    "fenced_coordinator",
    "require_live",
    "session_gone",
    "session_reader",
    "session_sync",
    "session_transact",
]


def require_live(zs: ZkSession, settings: Settings, what: str) -> None:
    """Refuse at once on an ended session (SessionExpired) or a dropped connection
    (BackendUnavailable): nothing is queued to run later behind the caller's back."""
    if zs.state is SessionState.ENDED:
        raise zs.expired()
    if zs.state is SessionState.SUSPENDED:
        raise settings.unavailable(
            what, "the connection of this member's session is down; kazoo is reconnecting"
        )


def session_gone(zs: ZkSession) -> SessionExpired:
    """The store says the session is gone: end it here too and return the error to raise."""
    if zs.end("ZooKeeper no longer has it"):
        zs.close_soon()
    return zs.expired()


def session_reader(zs: ZkSession, settings: Settings, what: str) -> Reader:
    return Reader(zs.client, settings, what, zs.expired())


def session_sync(zs: ZkSession, path: str) -> Any:
    """Send a ``sync`` through the session's own client, without waiting: the server answers
    the requests sent after it on that connection only once it has caught up with the leader
    (as of the sync), so they see at least what any other client of the ensemble saw before.
    Returns kazoo's pending result."""
    return zs.client.sync_async(path)


def alive_op(zs: ZkSession) -> Op:
    return Op("check", zs.paths.session(zs.session.session_id))


def session_transact(
    zs: ZkSession,
    settings: Settings,
    ops: Sequence[Op],
    what: str,
    then: Callable[[], None] | None = None,
) -> list[Any]:
    """Run ``ops`` through the session's own client; an expiry ends the session here.
    Returns kazoo's results."""
    try:
        return transact(zs.client, ops, settings, what, zs.expired(), then)
    except SessionExpired:
        raise session_gone(zs) from None


def session_answer(
    zs: ZkSession, settings: Settings, pending: Any, ops: Sequence[Op], what: str
) -> list[Any]:
    """The results of ``ops`` sent through the session's client with :func:`.ops.send`
    (pipelined behind other requests); an expiry ends the session here."""
    try:
        return answer(pending, ops, settings, what, zs.expired())
    except SessionExpired:
        raise session_gone(zs) from None


def fenced_coordinator(
    zs: ZkSession,
    epoch: int,
    why: str = "",
    *,
    holder: str | None = None,
    current_epoch: int | None = None,
) -> FencedError:
    return fence_error(zs.session, epoch, holder=holder, current_epoch=current_epoch, why=why)


def coordinator_fence(zs: ZkSession, settings: Settings, epoch: int, what: str) -> list[Op]:
    """The checks of a write by the coordinator elected at ``epoch``; :class:`FencedError`
    at once if the store already says it is not (any more) that coordinator."""
    if zs.state is SessionState.ENDED:
        raise fenced_coordinator(zs, epoch, "its session has ended")
    require_live(zs, settings, what)
    p = zs.paths
    reader = session_reader(zs, settings, what)
    epoch_node, holder, alive = (
        reader.get(p.epoch),
        reader.stat(p.coordinator),
        reader.stat(p.session(zs.session.session_id), SESSION_HINT),
    )
    found = epoch_node()
    if alive() is None:
        session_gone(zs)
        raise fenced_coordinator(zs, epoch, "its session has ended")
    if found is None:
        raise fenced_coordinator(zs, epoch, "the group has no epoch znode")
    current = read_epoch(found[0], found[1].version, p.epoch)
    if current.epoch != epoch or current.session_id != zs.session.session_id:
        raise fenced_coordinator(
            zs, epoch, holder=current.member_id or None, current_epoch=current.epoch
        )
    if holder() is None:
        raise fenced_coordinator(zs, epoch, f"the role was given up at epoch {epoch}")
    return [Op("check", p.epoch, version=epoch), Op("check", p.coordinator), alive_op(zs)]


def fenced_transact(
    zs: ZkSession, settings: Settings, epoch: int, ops: Sequence[Op], what: str
) -> None:
    """Run a coordinator write whose first operations are its fence; a refused fence (or an
    expired session) is a :class:`FencedError`."""
    try:
        session_transact(zs, settings, ops, what)
    except SessionExpired:
        raise fenced_coordinator(zs, epoch, "its session has ended") from None
    except Refused as exc:
        if exc.op.kind == "check":
            raise fenced_coordinator(
                zs, epoch, "another coordinator was elected meanwhile"
            ) from None
        raise
