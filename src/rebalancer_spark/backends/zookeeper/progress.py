"""Progress: fenced commits, and the progress of a new claim read right behind the claim.

A progress commit checks the caller's session, the claim and ``epochs/<id>`` at the version
read with it (so the claim is the one granted at the caller's epoch) and sets
``progress/<id>`` in the same multi-op: a stale owner or an ended session changes nothing.

When a member is granted a resource it asks for its progress next. :class:`Prefetch` sends
that read right behind the claim on the same connection, and :class:`PrefetchCache` keeps the
answer for the member's next :meth:`Backend.progress` call: no extra round trip, and the
member knows what it owns as soon as the store says it does. Only the claimer's session can
commit while it holds the claim, so the value cannot go stale meanwhile; a commit through this
backend drops it, and it expires after :data:`PREFETCH_TTL` seconds anyway.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection
from typing import Any

from rebalancer_spark.backends.zookeeper.client import Settings
from rebalancer_spark.backends.zookeeper.fence import (
    require_live,
    session_reader,
    session_transact,
)
from rebalancer_spark.backends.zookeeper.layout import PROGRESS_HINT, GroupPaths
from rebalancer_spark.backends.zookeeper.ops import Op, Refused, transact
from rebalancer_spark.backends.zookeeper.reader import Reader
from rebalancer_spark.backends.zookeeper.records import (
    progress_data,
    read_claim,
    read_progress,
    read_resource_epoch,
)
from rebalancer_spark.backends.zookeeper.session import SessionState, ZkSession
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.errors import FencedError, RebalancerError, SessionExpired
from rebalancer_spark.core.model import Progress, encode_progress

__all__ = ["PREFETCH_TTL", "Prefetch", "PrefetchCache", "commit", "read_progresses"]

PREFETCH_TTL = 5.0
"""Seconds a progress record read right behind a claim is kept for the next read of it."""
_ATTEMPTS = 10


class PrefetchCache:
    """Progress read right behind claims, kept for the next :func:`read_progresses`. An
    entry counts only while the claim that read it stands: its session still lives here, and
    it was not released (:meth:`forget`) nor committed over."""

    def __init__(self, clock: Clock, alive: Callable[[str], bool]) -> None:
        self._clock = clock
        self._alive = alive
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, str], tuple[float, str, Progress | None]] = {}

    def remember(self, group: str, session_id: str) -> Callable[[str, Progress | None], None]:
        def keep(resource: str, progress: Progress | None) -> None:
            with self._lock:
                self._kept[(group, resource)] = (self._clock.monotonic(), session_id, progress)

        return keep

    def forget(self, group: str, resource: str) -> None:
        with self._lock:
            self._kept.pop((group, resource), None)

    def take(self, group: str, resources: Collection[str]) -> tuple[dict[str, Progress], list[str]]:
        """The fresh entries among ``resources`` (consumed), and the resources not known."""
        known: dict[str, Progress] = {}
        unknown: list[str] = []
        now = self._clock.monotonic()
        with self._lock:
            for r in dict.fromkeys(resources):
                seen = self._kept.pop((group, r), None)
                if seen is None or now - seen[0] >= PREFETCH_TTL or not self._alive(seen[1]):
                    unknown.append(r)
                elif seen[2] is not None:
                    known[r] = seen[2]
        return known, unknown


def read_progresses(
    client: Any, settings: Settings, paths: GroupPaths, resources: Collection[str]
) -> dict[str, Progress]:
    what = f"reading the progress of group {paths.group!r}"
    reader = Reader(client, settings, what, settings.unavailable(what, "session expired"))
    reads = [
        (r, paths.progress(r), reader.get(paths.progress(r), PROGRESS_HINT)) for r in resources
    ]
    out: dict[str, Progress] = {}
    for r, path, read in reads:
        found = read()
        if found is not None:
            out[r] = read_progress(r, found[0], path)
    return out


class Prefetch:
    """The progress of resources being claimed, read in a request sent right behind the
    claim on the same connection (so served right after it): the member asks for it next,
    and gets it without another round trip. A failed read just leaves nothing prefetched."""

    def __init__(
        self,
        zs: ZkSession,
        settings: Settings,
        resources: list[str],
        remember: Callable[[str, Progress | None], None],
    ) -> None:
        self._paths = zs.paths
        self._reader = session_reader(zs, settings, "reading the progress of new claims")
        self._reads = {r: self._reader.get(zs.paths.progress(r), PROGRESS_HINT) for r in resources}
        self._remember = remember
        self.send = self._reader.send

    def collect(self) -> None:
        try:
            found = {r: read() for r, read in self._reads.items()}
        except RebalancerError:
            return
        for r, value in found.items():
            path = self._paths.progress(r)
            self._remember(r, None if value is None else read_progress(r, value[0], path))


def commit(
    zs: ZkSession | None,
    client: Any,
    settings: Settings,
    paths: GroupPaths,
    session: Any,
    resource: str,
    epoch: int,
    progress: Any,
    at: float,
) -> None:
    """Store progress if ``session`` lives and holds ``resource`` at ``epoch``."""
    text = encode_progress(resource, progress)
    value = json.loads(text)
    who = f"commit for resource {resource!r} by member {session.member_id!r} at epoch {epoch}"
    if zs is not None and zs.state is SessionState.ENDED:
        raise FencedError(f"{who} refused: its session has ended; stop working on it")
    if zs is not None:
        require_live(zs, settings, "committing progress")
    what = f"committing progress of {resource!r}"
    create = False  # most commits overwrite the previous one; the first creates the znode
    for _ in range(_ATTEMPTS):
        reader = Reader(
            client, settings, what, FencedError(f"{who} refused: its session has ended")
        )
        held, seen = reader.get(paths.claim(resource)), reader.get(paths.resource_epoch(resource))
        current, stat = held(), seen()
        c = None if current is None else read_claim(resource, current[0], paths.claim(resource))
        if c is None or stat is None or c.session_id != session.session_id or c.epoch != epoch:
            holder = "nobody" if c is None else repr(c.member_id)
            at_epoch = (
                c.epoch
                if c
                else (read_resource_epoch(stat[0], paths.resource_epoch(resource)) if stat else 0)
            )
            raise FencedError(
                f"{who} refused: the resource is held by {holder} at epoch {at_epoch}; stop "
                "working on it, the new owner resumes from the last accepted commit"
            )
        data = progress_data(value, epoch, session.member_id, at)
        write = Op("create" if create else "set", paths.progress(resource), data)
        ops = [
            Op("check", paths.session(session.session_id)),
            Op("check", paths.claim(resource)),
            Op("check", paths.resource_epoch(resource), version=stat[1].version),
            write,
        ]
        try:
            if zs is not None:
                session_transact(zs, settings, ops, what)
            else:
                transact(client, ops, settings, what, SessionExpired(who))
        except SessionExpired:
            raise FencedError(f"{who} refused: its session has ended; stop working on it") from None
        except Refused as exc:
            if exc.op is write:
                create = not create  # no progress znode yet (or one appeared): the other way
                continue
            raise FencedError(
                f"{who} refused: the claim or the session changed meanwhile ({exc.op.path} "
                "failed its check); stop working on it"
            ) from None
        if zs is not None and not zs.lease_valid():
            # Applied while the session lived, but answered after its lease ran out (the
            # process was paused, say): the member must not count on it, nor go on working.
            raise FencedError(
                f"{who}: the store's answer came after this member's lease had run out, so "
                "the commit may or may not count; stop working on it, the next owner resumes "
                "from the last commit the store accepted"
            )
        return
    raise settings.unavailable(what, "the progress znode kept changing")
