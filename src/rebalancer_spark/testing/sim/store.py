"""The simulated store: the backend contract of :mod:`rebalancer_spark.backends.base`, in memory.

Every call is one atomic step of the store at one virtual instant (``now``), as a Lua script, a
ZooKeeper multi or an SQLite transaction is. What it keeps and checks, per the contract:

* sessions with a lease the *store* expires: alive while ``now < expires``; a renewal sets
  ``expires = now + ttl`` (``now`` is when the request *reaches* the store, never earlier than
  when the member sent it);
* the coordinator and its epoch; ``publish`` is fenced by epoch and live coordinator session;
* one claim per resource; ``claim`` grants only what the current running target (at the
  generation the member read) gives the caller and is free (never claimed, released, or held by
  an expired session); a grant raises the resource epoch;
* ``commit`` only from the live session holding the resource at exactly that epoch.

Store restarts: :meth:`SimStore.crash` makes every call fail with :class:`BackendUnavailable`
until :meth:`SimStore.recover`; with ``lose_data`` everything is gone, as with Redis without
persistence, and the high-water mechanism of the Redis backend (docs/backends/redis.md,
"Epochs that never go backwards") keeps numbers monotonic: a member's handle remembers the
highest number it saw; a join that finds the group recreated sets a floor
``base = max(store time in µs, highest presented + 1)``, every number handed out afterwards is
``max(current, base) + 1``, and grants are held back until the last lease of the lost data has
surely run out (``restart time + longest ttl``).

``Faults`` flags plant bugs, so that a test can prove the simulator notices them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from rebalancer_spark.core.control import Control
from rebalancer_spark.core.errors import (
    BackendUnavailable,
    ControlConflict,
    FencedError,
    MemberIdInUse,
    SessionExpired,
)
from rebalancer_spark.core.model import (
    Claim,
    CoordinatorRecord,
    GroupState,
    MemberRecord,
    Phase,
    Resource,
    Target,
)
from rebalancer_spark.core.protocols import MemberHead, MemberView

__all__ = ["SIM_GROUP", "HandleMemory", "SimClaim", "SimSession", "SimStore", "StoreBugs"]

SIM_GROUP = "sim"
"""The group the simulated store's refusals name (it holds one group)."""


@dataclass(frozen=True, slots=True)
class StoreBugs:
    """Deliberate defects of the store, for tests that prove the simulator can fail."""

    grant_before_release: bool = False
    """Grant a claim even while another live session holds the resource."""
    commit_without_epoch: bool = False
    """Accept a commit from any session, live or not, whatever epoch it carries."""
    no_high_water: bool = False
    """Recreate a lost group from epoch 0, ignoring what members remember."""
    no_quarantine: bool = False
    """Grant at once after a data loss, while old members may still believe in their leases."""


@dataclass(slots=True)
class SimSession:
    member_id: str
    session_id: str
    ttl: float
    expires: float
    acked: int = 0
    leaving: bool = False
    static: bool = False


@dataclass(frozen=True, slots=True)
class SimClaim:
    member_id: str
    session_id: str
    epoch: int


@dataclass(slots=True)
class HandleMemory:
    """What one member's backend handle remembers of the group (Redis ``memory.py``)."""

    incarnation: int = -1
    highest: int = 0
    longest_ttl: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)

    def saw(self, number: int) -> None:
        self.highest = max(self.highest, number)


class SimStore:
    """One group in one in-memory store; see the module docstring."""

    def __init__(self, bugs: StoreBugs = StoreBugs()) -> None:
        self.bugs = bugs
        self.up = True
        self.incarnation = 0
        self.restarted_at = 0.0
        self._next_sid = 0
        self.on_grant: Callable[[str, str, str, int], None] = lambda r, m, s, e: None
        """Called with (resource, member, session, epoch) on every new grant (the checker)."""
        self.on_number: Callable[[str, int], None] = lambda kind, value: None
        """Called with ("coordinator epoch" | "generation", value) when one is handed out."""
        self.on_commit: Callable[[str, str, int], None] = lambda r, s, e: None
        """Called with (resource, session, epoch) for every commit the store accepts."""
        self._wipe()

    def _wipe(self) -> None:
        self.exists = False
        self.sessions: dict[str, SimSession] = {}
        self.coordinator: tuple[str, str, int] | None = None
        self.coordinator_epoch = 0
        self.generation = 0
        self.target: Target | None = None
        self.resources: dict[str, float] = {}
        self.resources_version = 0
        self.control = Control()
        self.claims: dict[str, SimClaim] = {}
        self.epochs: dict[str, int] = {}
        self.progress: dict[str, tuple[int, str, int]] = {}
        """Resource → (epoch, session, value) of the last accepted commit."""
        self.base = 0
        self.quarantine_until = 0.0

    # -- faults ---------------------------------------------------------------------------------

    def crash(self) -> None:
        self.up = False

    def recover(self, now: float, *, lose_data: bool) -> None:
        self.up = True
        if lose_data:
            self._wipe()
            self.incarnation += 1
            self.restarted_at = now

    # -- helpers ----------------------------------------------------------------------------------

    def _check_up(self) -> None:
        if not self.up:
            raise BackendUnavailable("simulated store is down (restarting): retry later")

    def _number(self, current: int, memory: HandleMemory) -> int:
        value = max(current, self.base) + 1
        memory.saw(value)
        return value

    def _live(self, sid: str, now: float) -> SimSession | None:
        rec = self.sessions.get(sid)
        return rec if rec is not None and now < rec.expires else None

    def _expire(self, now: float) -> None:
        for sid in [s for s, rec in self.sessions.items() if now >= rec.expires]:
            self._drop(sid)

    def _drop(self, sid: str) -> None:
        self.sessions.pop(sid, None)
        for r in [r for r, c in self.claims.items() if c.session_id == sid]:
            del self.claims[r]
        if self.coordinator is not None and self.coordinator[1] == sid:
            self.coordinator = None

    def _require(self, sid: str, now: float) -> SimSession:
        self._check_up()
        rec = self._live(sid, now)
        if rec is None:
            raise SessionExpired(SIM_GROUP, "?", sid, why="not alive in the simulated store")
        return rec

    def _ensure_group(self, now: float, memory: HandleMemory) -> None:
        """Create the group if missing; after a data loss lift the floor above what the caller
        remembers and hold grants back until old leases have run out."""
        recreated = memory.incarnation not in (-1, self.incarnation)
        if not self.exists:
            self.exists = True
            if recreated and memory.resources and not self.resources_version:
                self.resources = dict(memory.resources)
                self.resources_version = self._number(0, memory)
        if recreated and not self.bugs.no_high_water:
            self.base = max(self.base, int(now * 1e6), memory.highest + 1)
            ttl = max(memory.longest_ttl, 0.0)
            self.quarantine_until = max(self.quarantine_until, self.restarted_at + ttl)
        memory.incarnation = self.incarnation

    # -- sessions ---------------------------------------------------------------------------------

    def join(
        self,
        member_id: str,
        ttl: float,
        now: float,
        memory: HandleMemory,
        *,
        static: bool = False,
    ) -> SimSession:
        self._check_up()
        self._ensure_group(now, memory)
        self._expire(now)
        if any(rec.member_id == member_id for rec in self.sessions.values()):
            raise MemberIdInUse(SIM_GROUP, member_id)
        self._next_sid += 1
        rec = SimSession(member_id, f"s{self._next_sid}", ttl, now + ttl, static=static)
        self.sessions[rec.session_id] = rec
        memory.longest_ttl = max(memory.longest_ttl, ttl)
        return rec

    def renew(self, sid: str, now: float) -> None:
        rec = self._require(sid, now)
        rec.expires = now + rec.ttl

    def set_leaving(self, sid: str, now: float) -> None:
        self._require(sid, now).leaving = True

    def leave(self, sid: str, now: float) -> None:
        self._check_up()
        self._drop(sid)

    # -- reading ---------------------------------------------------------------------------------

    def state(self, now: float, memory: HandleMemory | None = None) -> GroupState:
        """The group as one read sees it (``Backend.state``); like the Redis handle, a
        ``memory`` that joined this incarnation of the data remembers the resource set it read
        (restored after a loss)."""
        self._check_up()
        if memory is not None and memory.incarnation == self.incarnation:
            memory.resources = dict(self.resources)
        live = {sid: rec for sid, rec in self.sessions.items() if now < rec.expires}
        members = {
            rec.member_id: MemberRecord(
                rec.member_id,
                sid,
                acked_generation=rec.acked,
                leaving=rec.leaving,
                static=rec.static,
            )
            for sid, rec in live.items()
        }
        coordinator = None
        if self.coordinator is not None and self.coordinator[1] in live:
            coordinator = CoordinatorRecord(*self.coordinator)
        claims = {
            r: Claim(r, c.member_id, c.session_id, c.epoch)
            for r, c in self.claims.items()
            if c.session_id in live
        }
        return GroupState(
            "sim",
            members,
            coordinator,
            {r: Resource(r, w) for r, w in self.resources.items()},
            self.resources_version,
            self.target,
            claims,
            self.control,
        )

    def member_head(self, sid: str, now: float) -> MemberHead:
        self._require(sid, now)
        target = self.target
        if target is None:
            return MemberHead(0, Phase.RUNNING)
        return MemberHead(target.generation, target.phase, target.coordinator_epoch)

    def member_view(self, sid: str, now: float) -> MemberView:
        rec = self._require(sid, now)
        target = self.target
        owned = {r: c.epoch for r, c in self.claims.items() if c.session_id == sid}
        if target is None:
            return MemberView(0, Phase.RUNNING, frozenset(), owned)
        mine = target.assignment.get(rec.member_id, frozenset())
        return MemberView(target.generation, target.phase, mine, owned, target.coordinator_epoch)

    def live_claims(self, now: float) -> dict[str, SimClaim]:
        """Claims of live sessions (for the checker, not a contract call)."""
        return {r: c for r, c in self.claims.items() if self._live(c.session_id, now)}

    # -- coordinator ------------------------------------------------------------------------------

    def elect(self, sid: str, now: float, memory: HandleMemory) -> CoordinatorRecord | None:
        self._check_up()
        self._expire(now)
        if sid not in self.sessions:
            return None
        if self.coordinator is None:
            self.coordinator_epoch = self._number(self.coordinator_epoch, memory)
            self.on_number("coordinator epoch", self.coordinator_epoch)
            self.coordinator = (self.sessions[sid].member_id, sid, self.coordinator_epoch)
        return CoordinatorRecord(*self.coordinator)

    def resign(self, sid: str, epoch: int, now: float) -> None:
        self._check_up()
        if self.coordinator is not None and self.coordinator[1:] == (sid, epoch):
            self.coordinator = None

    def publish(
        self,
        sid: str,
        epoch: int,
        assignment: Mapping[str, Collection[str]],
        phase: Phase,
        resources_version: int,
        now: float,
        memory: HandleMemory,
    ) -> Target:
        self._require(sid, now)
        if self.coordinator is None or self.coordinator[1:] != (sid, epoch):
            raise FencedError(
                write="coordinator",
                group=SIM_GROUP,
                member=self.sessions[sid].member_id,
                epoch=epoch,
                holder=None if self.coordinator is None else self.coordinator[0],
                current_epoch=None if self.coordinator is None else self.coordinator[2],
            )
        self.generation = self._number(self.generation, memory)
        self.on_number("generation", self.generation)
        self.target = Target(
            self.generation,
            epoch,
            {m: frozenset(rs) for m, rs in assignment.items()},
            phase,
            resources_version,
        )
        return self.target

    def update_resources(
        self, resources: Mapping[str, float], now: float, memory: HandleMemory
    ) -> int:
        self._check_up()
        self._ensure_group(now, memory)
        if dict(resources) != self.resources:
            self.resources = dict(resources)
            self.resources_version = self._number(self.resources_version, memory)
        memory.resources = dict(self.resources)
        return self.resources_version

    def update_control(self, expected_version: int, control: Control, now: float) -> Control:
        """``Backend.update_control``: a compare-and-set on the record's version."""
        self._check_up()
        if self.control.version != expected_version:
            raise ControlConflict(
                f"control record at version {self.control.version}, not {expected_version}"
            )
        self.control = dataclasses.replace(control, version=expected_version + 1)
        return self.control

    # -- ownership ---------------------------------------------------------------------------------

    def claim(
        self,
        sid: str,
        resources: Collection[str],
        generation: int,
        now: float,
        memory: HandleMemory,
    ) -> dict[str, int]:
        rec = self._require(sid, now)
        target = self.target
        if target is None or target.generation != generation or target.phase is not Phase.RUNNING:
            return {}
        granted: dict[str, int] = {}
        mine = target.assignment.get(rec.member_id, frozenset())
        for r in sorted(resources):
            if r not in mine or r not in self.resources:
                continue
            held = self.claims.get(r)
            if held is not None and held.session_id == sid:
                granted[r] = held.epoch
                continue
            busy = held is not None and self._live(held.session_id, now) is not None
            if busy and not self.bugs.grant_before_release:
                continue
            if now < self.quarantine_until and not self.bugs.no_quarantine:
                continue
            epoch = self._number(self.epochs.get(r, 0), memory)
            self.epochs[r] = epoch
            self.claims[r] = SimClaim(rec.member_id, sid, epoch)
            self.on_grant(r, rec.member_id, sid, epoch)
            granted[r] = epoch
        return granted

    def release(self, sid: str, claims: Mapping[str, int], now: float) -> None:
        self._require(sid, now)
        for r, epoch in claims.items():
            held = self.claims.get(r)
            if held is not None and held.session_id == sid and held.epoch == epoch:
                del self.claims[r]

    def acknowledge(self, sid: str, generation: int, now: float) -> None:
        rec = self._require(sid, now)
        rec.acked = max(rec.acked, generation)

    def commit(self, sid: str, resource: str, epoch: int, value: int, now: float) -> None:
        if self.bugs.commit_without_epoch:
            self._check_up()
        else:
            self._require(sid, now)
        held = self.claims.get(resource)
        ok = held is not None and held.session_id == sid and held.epoch == epoch
        if not ok and not self.bugs.commit_without_epoch:
            raise FencedError(
                write="commit",
                group=SIM_GROUP,
                member=self.sessions[sid].member_id,
                resource=resource,
                epoch=epoch,
                holder=None if held is None else held.member_id,
                current_epoch=0 if held is None else held.epoch,
            )
        self.on_commit(resource, sid, epoch)
        self.progress[resource] = (epoch, sid, value)
