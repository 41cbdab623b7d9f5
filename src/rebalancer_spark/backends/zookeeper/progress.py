"""Progress: fenced commits, and the progress of a new claim read right behind the claim.

A progress commit reads ``epochs/<id>``, which must name the caller's session at the caller's
epoch, not released; then it checks the caller's session and that record at the version read
and sets ``progress/<id>`` in the same multi-op: a stale owner or an ended session changes
nothing.

A grant hands over the resource's progress (:attr:`Grant.progress`). :class:`Prefetch` sends
that read right behind the claim's multi-op on the same connection, so it costs no extra round
trip, and it is exact: only the claimer's session can commit while it holds the claim.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from rebalancer_spark.backends.base import Session, fenced_commit
from rebalancer_spark.backends.zookeeper.store.chain import EpochRecord, read_record
from rebalancer_spark.backends.zookeeper.store.client import Settings, wait
from rebalancer_spark.backends.zookeeper.store.connection import SessionState, ZkSession
from rebalancer_spark.backends.zookeeper.store.fence import (
    require_live,
    session_reader,
    session_transact,
)
from rebalancer_spark.backends.zookeeper.store.layout import (
    PROGRESS_HINT,
    RECORD_HINT,
    SESSION_HINT,
    GroupPaths,
)
from rebalancer_spark.backends.zookeeper.store.multiread import Reader
from rebalancer_spark.backends.zookeeper.store.ops import Op, Refused, transact
from rebalancer_spark.backends.zookeeper.store.records import progress_data, read_progress
from rebalancer_spark.core.errors import RebalancerError, SessionExpired
from rebalancer_spark.core.model import Progress

__all__ = ["Prefetch", "commit", "read_progresses"]

_ATTEMPTS = 10


def read_progresses(
    client: Any,
    settings: Settings,
    paths: GroupPaths,
    resources: Collection[str],
    *,
    sync: bool = False,
) -> dict[str, Progress]:
    """The progress of each of ``resources`` that has any, read through ``client``.

    ``sync``: send a ``sync`` ahead of the reads, in the same pipeline. The server the client
    is on may be a follower that has not yet applied commits the ensemble acknowledged (reads
    in ZooKeeper are sequentially consistent per client, not linearizable); after the sync
    it has, so the answer holds every commit acknowledged before this call began (as far as
    a ``sync`` goes: it is not a quorum operation, and a leader just cut off from the others
    can still answer it). The
    public read (:meth:`.Backend.progress`, another process checking what a member
    committed) needs it; a grant's read behind its own claim does not (see
    :class:`Prefetch`)."""
    what = f"reading the progress of group {paths.group!r}"
    expired = settings.unavailable(what, "session expired")
    synced = client.sync_async(paths.progresses) if sync else None
    reader = Reader(client, settings, what, expired)
    reads = [
        (r, paths.progress(r), reader.get(paths.progress(r), PROGRESS_HINT)) for r in resources
    ]
    if synced is not None:
        reader.send()  # right behind the sync; its answer is due first
        wait(synced, settings, what, expired, paths.progresses)
    out: dict[str, Progress] = {}
    for r, path, read in reads:
        found = read()
        if found is not None:
            out[r] = read_progress(r, found[0], path)
    return out


class Prefetch:
    """The progress of resources being claimed, read in a request sent right behind the
    claim on the same connection (so served right after it, before anyone else's request
    can change it): the grants hand it over without another round trip. A failed read
    leaves those resources out of :meth:`collect`; the claim reads them again."""

    def __init__(self, zs: ZkSession, settings: Settings, resources: list[str]) -> None:
        self._paths = zs.paths
        self._reader = session_reader(zs, settings, "reading the progress of new claims")
        self._reads = {r: self._reader.get(zs.paths.progress(r), PROGRESS_HINT) for r in resources}
        self.send = self._reader.send

    def collect(self) -> dict[str, Progress | None]:
        try:
            found = {r: read() for r, read in self._reads.items()}
        except RebalancerError:
            return {}
        return {
            r: None if value is None else read_progress(r, value[0], self._paths.progress(r))
            for r, value in found.items()
        }


def commit(
    zs: ZkSession | None,
    client: Any,
    settings: Settings,
    paths: GroupPaths,
    session: Session,
    resource: str,
    epoch: int,
    text: str,
    at: float,
) -> None:
    """Store the progress ``text`` (JSON) if ``session`` lives and holds ``resource`` at
    ``epoch``."""
    value = json.loads(text)
    ended = fenced_commit(session, resource, epoch, why="its session has ended")
    if zs is not None and zs.state is SessionState.ENDED:
        raise ended
    if zs is not None:
        require_live(zs, settings, "committing progress")
    what = f"committing progress of {resource!r}"
    create = False  # most commits overwrite the previous one; the first creates the znode
    for _ in range(_ATTEMPTS):
        reader = Reader(client, settings, what, ended)
        seen = reader.get(paths.resource_epoch(resource), RECORD_HINT)()
        record = None if seen is None else read_record(*seen, paths.resource_epoch(resource))
        if record is None or record.holder != session.session_id or record.epoch != epoch:
            if zs is not None:
                zs.doubt(resource)
            raise fenced_commit(
                session,
                resource,
                epoch,
                holder=_holder(client, settings, paths, record, ended),
                current_epoch=0 if record is None else record.epoch,
            )
        data = progress_data(value, epoch, session.member_id, at)
        write = Op("create" if create else "set", paths.progress(resource), data)
        ops = [
            Op("check", paths.session(session.session_id)),
            Op("check", paths.resource_epoch(resource), version=record.version),
            write,
        ]
        try:
            if zs is not None:
                session_transact(zs, settings, ops, what)
            else:
                transact(client, ops, settings, what, ended)
        except SessionExpired:
            raise ended from None
        except Refused as exc:
            if exc.op is write:
                create = not create  # no progress znode yet (or one appeared): the other way
                continue
            if zs is not None:
                zs.doubt(resource)
            raise fenced_commit(
                session,
                resource,
                epoch,
                why=f"the claim or the session changed meanwhile ({exc.op.path} failed its check)",
            ) from None
        if zs is not None and not zs.lease_valid():
            # Applied while the session lived, but answered after its lease ran out (the
            # process was paused, say): the member must not count on it, nor go on working.
            raise fenced_commit(
                session,
                resource,
                epoch,
                why="the store's answer came after this member's lease had run out, so the "
                "commit may or may not count",
            )
        return
    raise settings.unavailable(what, "the progress znode kept changing")


def _holder(
    client: Any,
    settings: Settings,
    paths: GroupPaths,
    record: EpochRecord | None,
    ended: Exception,
) -> str | None:
    """The member that holds the resource whose ``record`` this is (None: nobody): the one
    it names, if that session lives."""
    if record is None or record.holder is None or record.member is None:
        return None
    what = "reading who holds a resource"
    alive = Reader(client, settings, what, ended).stat(paths.session(record.holder), SESSION_HINT)()
    return None if alive is None else record.member
