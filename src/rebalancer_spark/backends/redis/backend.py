"""``redis://[user:password@]host:port/db`` and ``rediss://``: the Redis backend (redis-py).

Use it for members on several hosts sharing one Redis (or one Redis Cluster shard). Every
change is one Lua script (:mod:`.store.prelude`) that checks what it depends on (lease, coordinator
epoch, resource epoch) before writing; leases are keys with a PX time-to-live, so Redis
decides when a session has expired; every state change is PUBLISHed so watchers react at once
(:mod:`.watch`); and epochs never go backwards even when Redis loses its data
(:mod:`.memory`). The design, the key layout and each script's contract are in
``docs/backends/redis.md``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import uuid
import weakref
from collections.abc import Collection, Mapping
from typing import ClassVar

import redis
from redis.client import Pipeline

from rebalancer_spark.backends.base import (
    RESOURCE_LOG_IDS,
    RESOURCE_LOG_SHARE,
    RESOURCE_LOG_VERSIONS,
    Backend,
    Capability,
    KeptParts,
    Session,
    TargetChange,
)
from rebalancer_spark.backends.records import parse_phase
from rebalancer_spark.backends.redis import messages
from rebalancer_spark.backends.redis.errors import Refusal
from rebalancer_spark.backends.redis.persistence import persistence_warnings
from rebalancer_spark.backends.redis.store.connection import OPTIONS
from rebalancer_spark.backends.redis.store.decode import (
    CLAIM_ROW,
    DecodedView,
    decode_control,
    decode_grant,
    decode_head,
    decode_member_view,
    decode_progress_record,
    decode_resources,
    decode_state,
    decode_target,
    encode_progress_record,
    number,
    pairs,
)
from rebalancer_spark.backends.redis.store.keys import check_session_id, meta_key, prefix
from rebalancer_spark.backends.redis.store.runner import Lua, ScriptRunner
from rebalancer_spark.backends.redis.store.staging import (
    chunks,
    stage_change,
    stage_resources,
    stage_target,
)
from rebalancer_spark.backends.redis.watch import RedisWatch
from rebalancer_spark.core.clock import Clock, SystemClock
from rebalancer_spark.core.control import Control
from rebalancer_spark.core.errors import ControlConflict, CorruptStateError
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
    fold_changes,
)
from rebalancer_spark.core.protocols import MemberHead, MemberView
from rebalancer_spark.core.urls import BackendUrl

__all__ = ["RedisBackend"]

log = logging.getLogger("rebalancer_spark.backends.redis")


@dataclasses.dataclass(frozen=True, slots=True)
class _KeptPart:
    """A member's part of the target as its session last viewed it, with what names it to
    MEMBER_VIEW: the group's incarnation, the generation and the target's token."""

    incarnation: str
    generation: int
    token: str
    part: frozenset[str]


_FREED_KEPT = 200_000
"""Grants whose reported predecessor end a handle keeps (a few MB)."""


class RedisBackend(Backend):
    """The Redis backend; see the module docstring."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.PUSH_NOTIFICATIONS,
            Capability.MULTI_HOST,
            Capability.AUTHENTICATION,
            Capability.PAUSE_TOLERANT,
        }
    )
    options: ClassVar[Mapping[str, str]] = OPTIONS

    def __init__(self, url: BackendUrl, *, clock: Clock | None = None) -> None:
        super().__init__(url)
        self._clock: Clock = clock or SystemClock()
        self._freed_at: dict[tuple[str, str, int], float | None] = {}
        """(group, resource, epoch) -> the predecessor's end this handle first reported."""
        self._runner = ScriptRunner(url)
        self.client: redis.Redis = self._runner.client
        """The redis-py client (for tests and operators; the backend goes through scripts)."""
        self.run = self._runner.run
        self._memory = self._runner.memory
        self._lock = threading.Lock()
        self._watches: weakref.WeakSet[RedisWatch] = weakref.WeakSet()
        self._parts: KeptParts[_KeptPart] = KeptParts()
        """Each member's last view's part: the next view asks only for what the target's
        change log says moved since."""

    def __repr__(self) -> str:
        return f"RedisBackend({self.url.redacted()!r})"

    def close(self) -> None:
        with self._lock:
            if self._runner.closed:
                return
            watches = list(self._watches)
        for watch in watches:
            watch.close()
        self._runner.close()

    # -- sessions ------------------------------------------------------------------------

    def _join(
        self, group: str, member_id: str, *, info: dict[str, str], ttl: float, static: bool
    ) -> Session:
        ttl_ms = max(1, math.ceil(ttl * 1000))
        session_id = uuid.uuid4().hex
        known = self._memory.snapshot(group)
        high = self._presented(group, known.high)
        remembers = high > 0 or known.incarnation != ""
        uptime = self._runner.server_uptime() if remembers else -1
        quarantine = max(ttl_ms, known.max_ttl_ms)
        args = [member_id, session_id, ttl_ms, json.dumps(info, sort_keys=True)]
        args += ["1" if static else "0", high, known.incarnation, quarantine, uptime]
        try:
            incarnation, evidence = self._runner.run(Lua.JOIN, group, args, "joining")
        except Refusal as exc:
            raise messages.in_use(group, member_id, exc) from None
        self._memory.joined(group, str(incarnation), ttl_ms)
        if int(evidence):
            since = (
                f"the restart of the Redis server about {uptime} s ago (it started after this "
                "member last heard from the one before)"
                if uptime >= 0
                else "when the loss was first noticed (at the latest now)"
            )
            log.warning(
                "group %s: Redis lost the group's data or went back to an older copy of it "
                "(incarnation %s is new to this member): epochs continue above all handed out "
                "before (this member saw up to %d) and nothing is granted for %.1f s (the "
                "longest lease known) from %s",
                group,
                incarnation,
                high,
                quarantine / 1000,
                since,
            )
            # The set the front remembers (EpochMemory), declared again inside the quarantine;
            # the front's own declaration (Backend._adopt) then finds the group has one.
            remembered = self.epochs.resources(group)
            if remembered:
                weights = {r.id: repr(float(r.weight)) for r in remembered}
                self._update(group, "restore", weights, [], known.max_ttl_ms)
        return Session(group=group, member_id=member_id, session_id=session_id, ttl=ttl)

    def _presented(self, group: str, high: int) -> int:
        """The highest number this handle presents when it may create the group: what it saw,
        and the epochs recorded durably elsewhere (the audit table a fresh job read its floors
        from, :meth:`remember_epochs`). A group the store created again, or one behind them,
        then continues above Redis' clock, not just above the recorded epochs: two fresh jobs,
        each lifted only to the audit's floors, were both granted floor + 1 across a restart
        of Redis without its data (the Spark-driver chaos run)."""
        return max(high, max(self.epochs.floors(group).values(), default=0))

    def _sid(self, session: Session) -> str:
        return check_session_id(session.group, session.member_id, session.session_id)

    def _renew(self, session: Session) -> None:
        ttl_ms = max(1, math.ceil(session.ttl * 1000))
        args = [self._sid(session), ttl_ms, self._memory.high(session.group)]
        try:
            self._runner.run(Lua.RENEW, session.group, args, "renewing a lease")
        except Refusal:
            raise messages.expired(session, "renewing") from None

    def _update_info(self, session: Session, info: dict[str, str]) -> None:
        args = [self._sid(session), json.dumps(info, sort_keys=True)]
        try:
            self._runner.run(Lua.UPDATE_INFO, session.group, args, "publishing info")
        except Refusal:
            raise messages.expired(session, "publishing its info") from None

    def _set_leaving(self, session: Session) -> None:
        try:
            self._runner.run(
                Lua.SET_LEAVING, session.group, [self._sid(session)], "marking a drain"
            )
        except Refusal:
            raise messages.expired(session, "announcing the drain") from None

    def _leave(self, session: Session) -> None:
        self._runner.run(Lua.LEAVE, session.group, [self._sid(session)], "leaving")
        self._parts.forget(session)

    # -- reading ---------------------------------------------------------------------------

    def _store_warnings(self) -> list[str]:
        return persistence_warnings(self._runner.client, self.url.redacted())

    def _incarnation(self, group: str) -> str | None:
        def fill(pipe: Pipeline) -> None:
            pipe.hget(meta_key(group), "inc")

        (inc,) = self._runner.pipeline_read(fill, "reading the group's identity")
        return None if inc is None else str(inc)

    def _lift_epochs(self, group: str, floors: dict[str, int]) -> int:
        args = [x for r, e in floors.items() for x in (r, e)]
        return int(self._runner.run(Lua.LIFT_EPOCHS, group, args, "lifting resource epochs"))

    def _state(self, group: str) -> GroupState:
        decoded = decode_state(group, self._runner.run(Lua.STATE, group, [], "reading the group"))
        self._memory.saw_ttls(group, decoded.ttls_ms)
        return decoded.state

    def _head(self, group: str) -> GroupHead:
        decoded = decode_head(group, self._runner.run(Lua.HEAD, group, [], "reading the group"))
        self._memory.saw_ttls(group, decoded.ttls_ms)
        return decoded.head

    def _control(self, group: str) -> Control:
        flat = self._runner.run(Lua.CONTROL, group, [], "reading the control record")
        return decode_control(group, flat)

    def _resources(self, group: str) -> tuple[int, dict[str, Resource]]:
        version, weights = self._resource_weights(group)
        return version, decode_resources(group, weights)

    def _remember_resources(self, group: str) -> int:
        version, weights = self._resource_weights(group)
        if weights:  # built only if a store that lost the group needs it declared again
            self.epochs.keep_resources(
                group, version, lambda: list(decode_resources(group, weights).values())
            )
        return version

    def _resource_changes(self, group: str, since: int) -> ResourceChange | None:
        text, incarnation, logged, entries = self._runner.run(
            Lua.RESOURCE_CHANGES, group, [since], "reading the changes of the resource set"
        )
        if str(logged) != "1":
            return None
        version = number(group, "resources_version", text)
        put, removed = fold_changes(
            (rid, weight or None) for entry in entries for rid, weight in pairs(entry).items()
        )
        joined = self._memory.snapshot(group).incarnation
        if not incarnation or joined not in ("", str(incarnation)):
            return None  # an incarnation other than the one this handle joined: versions
            # are numbered afresh there, so the caller's is no version of it
        return ResourceChange(since, version, decode_resources(group, put), frozenset(removed))

    def _resource_weights(self, group: str) -> tuple[int, dict[str, str]]:
        """The resource set's version and its weights as stored (id → text)."""
        text, _, flat = self._runner.run(Lua.RESOURCES, group, [], "reading the resource set")
        return number(group, "resources_version", text), pairs(flat)

    def _target(self, group: str) -> Target | None:
        meta, flat = self._runner.run(Lua.TARGET, group, [], "reading the target")
        return decode_target(group, pairs(meta), flat)

    def _holders(self, group: str, sessions: dict[str, str]) -> frozenset[str]:
        owners = {sid: m for m, sid in sessions.items()}
        sids = [check_session_id(group, owners[sid], sid) for sid in owners]
        found = self._runner.run(Lua.HOLDERS, group, sids, "reading which members hold claims")
        return frozenset(owners[str(sid)] for sid in found)

    def _member_head(self, session: Session) -> MemberHead:
        try:
            reply = self._runner.run(
                Lua.MEMBER_HEAD, session.group, [self._sid(session)], "reading"
            )
        except Refusal:
            raise messages.expired(session, "reading the member's view") from None
        generation, phase, epoch = (str(v) for v in reply)
        head = MemberHead(
            number(session.group, "generation", generation),
            parse_phase(session.group, phase, store="Redis"),
            number(session.group, "target epoch", epoch),
        )
        return head

    def _member_view(self, session: Session, claims: bool) -> MemberView:
        kept = self._parts.get(session)
        try:
            decoded = self._view(session, kept, claims)
        except CorruptStateError as exc:
            if kept is None:
                raise
            log.warning("%s", exc)
            decoded = self._view(session, None, claims)
        view = decoded.view
        self._parts.keep(
            session, _KeptPart(decoded.incarnation, view.generation, decoded.token, view.target)
        )
        return view

    def _view(self, session: Session, kept: _KeptPart | None, claims: bool) -> DecodedView:
        """MEMBER_VIEW, naming ``kept`` (if any) as the part to bring up to date, with the
        session's claims if ``claims``."""
        args: list[object] = [self._sid(session), "1" if claims else "0"]
        args += ["", "", ""] if kept is None else [kept.incarnation, kept.generation, kept.token]
        try:
            reply = self._runner.run(Lua.MEMBER_VIEW, session.group, args, "reading")
        except Refusal:
            self._parts.forget(session)
            raise messages.expired(session, "reading the member's view") from None
        part = frozenset() if kept is None else kept.part
        return decode_member_view(session.group, reply, part, claims=claims)

    def _progress(self, group: str, resources: list[str]) -> dict[str, Progress]:
        self._runner.check_open()
        key = prefix(group) + "progress"

        def fill(pipe: Pipeline) -> None:
            for chunk in chunks(resources):
                pipe.hmget(key, list(chunk))

        replies = self._runner.pipeline_read(fill, "reading progress")
        values = [v for reply in replies for v in reply]
        return {
            rid: decode_progress_record(group, rid, str(text))
            for rid, text in zip(resources, values, strict=True)
            if text
        }

    def _watch(self, group: str) -> RedisWatch:
        self._runner.check_open()
        watch = RedisWatch(self, group, self._clock)
        with self._lock:
            self._watches.add(watch)
        return watch

    # -- coordinator ---------------------------------------------------------------------------

    def _elect(self, session: Session) -> CoordinatorRecord | None:
        reply = self._runner.run(Lua.ELECT, session.group, [self._sid(session)], "electing")
        if reply is None:
            return None
        member, sid, text = (str(v) for v in reply)
        epoch = number(session.group, "coord_epoch", text)
        return CoordinatorRecord(member, sid, epoch)

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
        group, sid = session.group, self._sid(session)
        members = list(assignment)
        nonce = uuid.uuid4().hex
        head = [sid, epoch, phase.value, resources_version, nonce]
        try:
            generation = None
            if change is not None:
                generation = self._publish_change(group, nonce, head, members, change)
            if generation is None:
                fill = stage_target(group, nonce, assignment)
                args = [*head, len(members), *members]
                generation = int(
                    self._runner.run_staged(Lua.PUBLISH, group, fill, args, "publishing")
                )
        except Refusal as exc:
            raise messages.fenced_coordinator_refused(session, epoch, exc) from None
        return Target(
            generation=generation,
            coordinator_epoch=epoch,
            assignment={m: frozenset(rs) for m, rs in assignment.items()},
            phase=phase,
            resources_version=resources_version,
        )

    def _publish_change(
        self,
        group: str,
        nonce: str,
        head: list[object],
        members: list[str],
        change: TargetChange,
    ) -> int | None:
        """PUBLISH_CHANGE: only the moved ids travel; None if the stored target is no
        longer ``change.base`` (then the caller publishes the whole target)."""
        fill = stage_change(group, nonce, members, change.added, change.removed)
        dropped = sorted(change.dropped)
        args = [*head, change.base, len(members), *members, len(dropped), *dropped]
        try:
            return int(self._runner.run_staged(Lua.PUBLISH_CHANGE, group, fill, args, "publishing"))
        except Refusal as exc:
            if exc.code == "STALE":
                return None
            raise

    def _resign(self, session: Session, epoch: int) -> None:
        self._runner.run(Lua.RESIGN, session.group, [self._sid(session), epoch], "resigning")

    # -- resources -------------------------------------------------------------------------

    def _update_control(self, group: str, expected_version: int, control: Control) -> Control:
        body = control.encode()
        written, version = self._runner.run(
            Lua.UPDATE_CONTROL, group, [expected_version, body], "changing the control record"
        )
        if str(written) != "1":
            raise ControlConflict(
                f"the control record of group {group!r} is at version {version}, not "
                f"{expected_version} as read: someone changed it meanwhile; read it again and "
                "retry"
            )
        return Control.decode(group, body, int(version))

    def _update_resources(
        self,
        group: str,
        *,
        replace: Collection[Resource] | None,
        add: Collection[Resource],
        remove: list[str],
        base: int | None,
    ) -> tuple[int, bool]:
        added = {r.id: repr(float(r.weight)) for r in add}
        removed = remove
        ttl_ms = self._memory.snapshot(group).max_ttl_ms
        if replace is None or base is not None:
            # A delta; with base, only if the set is still at base (else it goes whole below).
            mode = "delta" if replace is None else "change"
            version, changed, stale = self._update(group, mode, added, removed, ttl_ms, base)
            if not stale:
                return version, changed
        assert replace is not None
        wanted = {r.id: repr(float(r.weight)) for r in replace}
        wanted.update(added)
        for rid in removed:
            wanted.pop(rid, None)
        version, changed, _ = self._update(group, "replace", wanted, [], ttl_ms)
        return version, changed

    def _update(
        self,
        group: str,
        mode: str,
        staged: Mapping[str, str],
        removed: list[str],
        ttl_ms: int,
        base: int | None = None,
    ) -> tuple[int, bool, bool]:
        """UPDATE_RESOURCES: the set's version after it, whether this call changed it, and
        whether it did nothing because the set was no longer at ``base`` (mode ``change``)."""
        known = self._memory.snapshot(group)
        high = self._presented(group, known.high)
        remembers = high > 0 or known.incarnation != ""
        uptime = self._runner.server_uptime() if remembers and ttl_ms else -1
        nonce = uuid.uuid4().hex
        fill = stage_resources(group, nonce, staged)
        log = [RESOURCE_LOG_IDS, RESOURCE_LOG_SHARE, RESOURCE_LOG_VERSIONS]
        at = "" if base is None else base
        args = [mode, nonce, high, known.incarnation, ttl_ms, uptime, *log, at, *removed]
        version, changed, stale = self._runner.run_staged(
            Lua.UPDATE_RESOURCES, group, fill, args, "updating resources"
        )
        return int(version), str(changed) == "1", str(stale) == "1"

    # -- ownership ---------------------------------------------------------------------------

    def _claim(self, session: Session, resources: list[str], generation: int) -> dict[str, Grant]:
        args = [self._sid(session), generation, *resources]
        try:
            flat = self._runner.run(Lua.CLAIM, session.group, args, "claiming")
        except Refusal:
            raise messages.expired(session, "claiming resources") from None
        rows = [flat[i : i + CLAIM_ROW] for i in range(0, len(flat) - CLAIM_ROW + 1, CLAIM_ROW)]
        # A resource epoch someone overwrote with garbage is corrupt data, never a ValueError
        # that would end the member thread.
        now = self._clock.wall()
        granted = {str(row[0]): decode_grant(session.group, row, now) for row in rows}
        # The end comes as an age, so each answer puts it a little elsewhere on this clock: a
        # grant asked for again (held) names the end first given for it.
        with self._lock:
            for rid, grant in list(granted.items()):
                key = (session.group, rid, grant.epoch)
                first = self._freed_at.setdefault(key, grant.freed_at)
                if first != grant.freed_at:
                    granted[rid] = dataclasses.replace(grant, freed_at=first)
            if len(self._freed_at) > _FREED_KEPT:
                self._freed_at.clear()  # only a repeated grant's time is not exactly the first
        return granted

    def _release(self, session: Session, claims: dict[str, int]) -> None:
        args: list[object] = [self._sid(session)]
        for rid, epoch in claims.items():
            args += [rid, epoch]
        self._runner.run(Lua.RELEASE, session.group, args, "releasing")

    def _acknowledge(self, session: Session, generation: int) -> None:
        args = [self._sid(session), generation]
        self._runner.run(Lua.ACKNOWLEDGE, session.group, args, "acknowledging")

    def _commit(self, session: Session, resource: str, epoch: int, text: str) -> None:
        record = encode_progress_record(epoch, session.member_id, text)
        args = [self._sid(session), resource, epoch, record]
        try:
            self._runner.run(Lua.COMMIT, session.group, args, "committing progress")
        except Refusal as exc:
            raise messages.fenced_commit_refused(session, resource, epoch, exc) from None
