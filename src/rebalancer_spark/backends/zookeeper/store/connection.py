"""One member session: its own kazoo client, hence its own ZooKeeper session, and a lease.

The contract's lease and ZooKeeper's session are kept together. The *server* ends the session
when the process dies, freezes or loses the network (no packet for the negotiated timeout);
this module ends it when the member stops renewing (no :meth:`ZkSession.extend` within the
timeout: a stuck heartbeat thread), by closing the client, which deletes every ephemeral znode
of the session at once. Either way the member's own deadline (start of its last renewal +
timeout - safety margin) comes first.

States (transitions enforced under the session's lock)::

    LIVE <-> SUSPENDED          the connection dropped / came back within the timeout
      \\         |
       +-----> ENDED            left, lapsed, expired by ZooKeeper, or the backend closed

ENDED is final: kazoo would silently open a *new* ZooKeeper session after an expiry, so an
ended session's client is closed and never used again (and every session-bound write also
checks the session's own ``sessions/<id>`` znode, which no other session can have).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kazoo.protocol.states import KazooState

from rebalancer_spark.backends.base import Session
from rebalancer_spark.backends.zookeeper.store.client import stop_client
from rebalancer_spark.backends.zookeeper.store.layout import GroupPaths
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.errors import SessionExpired

__all__ = ["Held", "PublishedBase", "SessionState", "SessionTable", "ZkSession"]

_CLOSE_WAIT = 15.0
"""Longest wait for another thread's close of the same session to finish."""


class SessionState(StrEnum):
    LIVE = "live"
    SUSPENDED = "suspended"
    ENDED = "ended"


@dataclass(frozen=True, slots=True)
class PublishedBase:
    """The last target a coordinator session published: its generation, base directory (name,
    chunk count of each member's part, number of ids), the delta chain written since, and the
    ids those deltas changed in all."""

    generation: int
    name: str
    counts: Mapping[str, int]
    size: int
    deltas: tuple[str, ...] = ()
    changed: int = 0
    published_at: float = 0.0
    """When its pointer switch was answered (monotonic, this process's clock)."""


@dataclass(frozen=True, slots=True)
class Held:
    """A claim this session holds for sure: its epoch, and the version of its
    ``epochs/<id>`` record as this session last wrote or read it (None: unknown)."""

    epoch: int
    record_version: int | None = None


class ZkSession:
    """A member session hosted by this backend object; see the module docstring."""

    def __init__(
        self,
        session: Session,
        client: Any,
        client_id: tuple[int, bytes],
        paths: GroupPaths,
        deadline: float,
        clock: Clock,
        on_unclosed: Callable[[tuple[int, bytes]], None] | None = None,
    ) -> None:
        self.session = session
        self.client = client
        self.paths = paths
        self.client_id = client_id
        """The ZooKeeper session ``client`` opened (id and password): kazoo's own
        ``client_id`` is None while the connection is down, and names another session once
        kazoo replaced an expired one."""
        self.zk_id = self.client_id[0]
        self._on_unclosed = on_unclosed
        self._clock = clock
        self._lock = threading.Lock()
        self._state = SessionState.LIVE
        self._deadline = deadline
        self._why = ""
        self._close_started = False
        self._closed = threading.Event()
        self._attempted: set[str] = set()
        self._confirmed: dict[str, Held] = {}
        self._claiming = 0
        self.parts: tuple[str, tuple[str, ...], frozenset[str]] | None = None
        """This member's part of the last target it read: the base directory's name, the
        deltas applied, and the ids. Directories are written once under fresh names and never
        changed, so only deltas added to the chain since are read (:func:`..reads
        .read_own_part`)."""
        self.held_by_others: dict[str, tuple[str, int]] = {}
        """Resources the last claim found held by another live session (by their records, or
        by a delta's hint: :attr:`assumed`): the holder's session id and its session znode's
        version then. While that znode is still at that version
        the holder has released nothing, so a claim need not read those records again
        (:func:`..ownership._read_for_claims`). Used by the claiming thread only."""
        self.hints: dict[str, tuple[str, int]] = {}
        """Resources of this member's part that the last delta it read named the previous
        holder of: resource -> that holder's session and the ``czxid`` of the hints chunk.
        Replaced whenever the member reads new deltas; trusted for
        :data:`..ownership.HINT_TRUST` seconds from :attr:`hinted_at` (:func:`..ownership
        .claim`, "Hints"). Read and written on the member's reconciler thread only (its views
        and claims)."""
        self.hinted_at = 0.0
        """When :attr:`hints` were read (monotonic)."""
        self.assumed: dict[str, float] = {}
        """The entries of :attr:`held_by_others` taken from a hint, not from a record read,
        each with the time its hint was read: dropped once no longer trusted, so that the next
        claim reads their records."""
        self.group_size = 0
        """The number of members of the last target this session read (0: none yet), about
        the number of the group's live sessions: a claim lists and reads those only when it
        has at least as many records to read whose holder it does not know
        (:func:`..ownership.claim`)."""
        self.base: PublishedBase | None = None
        """The base and delta chain of the last target this session published as coordinator,
        from which the next one may go out as a delta (:func:`..coordination.publish`)."""
        client.add_listener(self._on_state)

    def monotonic(self) -> float:
        """Now, on the clock of this session's backend."""
        return self._clock.monotonic()

    def note_hints(self, hints: Mapping[str, tuple[str, int]]) -> None:
        """The member read new deltas, the last of which named these resources' previous
        holders (resource -> session, hints chunk ``czxid``): they replace the hints kept."""
        self.hints = dict(hints)
        self.hinted_at = self._clock.monotonic()

    def trusted_hints(self, resources: Iterable[str], trust: float) -> dict[str, tuple[str, int]]:
        """The hints of ``resources`` read at most ``trust`` seconds ago. Older hints are
        forgotten, and so are the entries of :attr:`held_by_others` taken from hints read
        longer ago than that: the next claim reads those records."""
        now = self._clock.monotonic()
        if self.hints and now - self.hinted_at > trust:
            self.hints = {}
        for r in [r for r, at in self.assumed.items() if now - at > trust]:
            del self.assumed[r]
            self.held_by_others.pop(r, None)
        return {r: hint for r in resources if (hint := self.hints.get(r)) is not None}

    # -- state ------------------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def deadline(self) -> float:
        return self._deadline

    def expired(self) -> SessionExpired:
        """The error for any use of this session once it ended."""
        s = self.session
        return SessionExpired(
            s.group, s.member_id, s.session_id, why=self._why or "ZooKeeper expired it"
        )

    def end(self, why: str) -> bool:
        """Mark the session ended (final); True if this call ended it."""
        with self._lock:
            if self._state is SessionState.ENDED:
                return False
            self._state = SessionState.ENDED
            self._why = why
            return True

    def extend(self, started: float) -> bool:
        """A renewal round trip that started at ``started`` succeeded: push the lease out to
        ``started + ttl``. False, changing nothing, if the lease had already lapsed."""
        with self._lock:
            if self._state is SessionState.ENDED or self._clock.monotonic() >= self._deadline:
                return False
            client_id = self.client.client_id  # once: None as soon as the connection drops
            if client_id is None or client_id[0] != self.zk_id:
                return False
            self._deadline = max(self._deadline, started + self.session.ttl)
            return True

    def lease_valid(self) -> bool:
        """True while the session lives and its lease has not run out on this host's clock."""
        with self._lock:
            live = self._state is not SessionState.ENDED
            return live and self._clock.monotonic() < self._deadline

    def lapse_if_due(self, now: float) -> bool:
        """End the session if its lease ran out; True if this call ended it."""
        with self._lock:
            if self._state is SessionState.ENDED or now < self._deadline:
                return False
            self._state = SessionState.ENDED
            self._why = f"not renewed within its {self.session.ttl:g} s timeout"
            return True

    def _on_state(self, state: str) -> None:
        """kazoo's connection listener: runs on kazoo's thread and must not block."""
        if state == KazooState.LOST:
            if self.end("ZooKeeper expired the session"):
                self.close_soon()
            return
        with self._lock:
            if self._state is SessionState.ENDED:
                return
            if state == KazooState.SUSPENDED:
                self._state = SessionState.SUSPENDED
                return
            client_id = self.client.client_id
            if client_id is not None and client_id[0] == self.zk_id:
                self._state = SessionState.LIVE
                return
        if self.end("kazoo reconnected under another ZooKeeper session"):
            self.close_soon()

    # -- claims this session may hold -------------------------------------------------------

    def begin_claim(self, resources: set[str]) -> None:
        """Note resources about to be claimed: every claim of this session is made here, so
        these notes are a superset of what the store can hold for the session."""
        with self._lock:
            self._attempted |= resources
            self._claiming += 1

    def end_claim(self, refused: set[str], confirmed: Mapping[str, Held]) -> None:
        """The claim is over: ``refused`` were not granted; ``confirmed`` are held, as the
        answer of the request that granted them (or a read) said."""
        with self._lock:
            self._attempted -= refused
            self._claiming -= 1
        self.confirm(confirmed)

    def confirm(self, held: Mapping[str, Held]) -> None:
        """Note claims read or answered as this session's."""
        with self._lock:
            self._attempted |= held.keys()
            self._confirmed.update(held)

    def forget(self, resources: set[str], *, only_if_idle: bool = False) -> None:
        """Drop resources known not to be held (released, or read as someone else's)."""
        with self._lock:
            if not (only_if_idle and self._claiming):
                self._attempted -= resources
                for r in resources:
                    self._confirmed.pop(r, None)

    def doubt(self, resource: str) -> None:
        """A write found ``resource``'s claim not as this session holds it (someone rewrote
        its record behind its back): read it again with the next view."""
        with self._lock:
            self._confirmed.pop(resource, None)

    def held(self) -> tuple[dict[str, int], set[str]]:
        """What this session holds for sure (resource -> epoch) and what it may hold: claims
        whose request got no answer (the connection broke), to be read. Only this session
        rewrites the records of its claims (a release) until it ends, so a confirmed claim
        stays held as long as the session lives; the caller checks that it does."""
        with self._lock:
            confirmed = {r: h.epoch for r, h in self._confirmed.items()}
            return confirmed, self._attempted - self._confirmed.keys()

    def record_versions(self, claims: Mapping[str, int]) -> dict[str, int]:
        """Of ``claims`` (resource -> epoch), those held for sure at that epoch whose epoch
        record this session last wrote or read at a known version: that version. Only this
        session rewrites the record while it holds the claim, so a write fenced on it needs
        no read first; if the record moved anyway, the write is refused, not wrong."""
        with self._lock:
            return {
                r: h.record_version
                for r, epoch in claims.items()
                if (h := self._confirmed.get(r)) is not None
                and h.epoch == epoch
                and h.record_version is not None
            }

    # -- closing ----------------------------------------------------------------------------

    def close(self, why: str = "left the group") -> None:
        """End the session and close its client (deleting its ephemeral znodes); returns once
        closed, whoever started the close. Idempotent."""
        self.end(why)
        with self._lock:
            first = not self._close_started
            self._close_started = True
        if not first:
            self._closed.wait(_CLOSE_WAIT)
            return
        try:
            self.client.remove_listener(self._on_state)
            reached = self.client.state == KazooState.CONNECTED
            stop_client(self.client)
            if not reached and self._on_unclosed is not None and "expired" not in self._why:
                self._on_unclosed(self.client_id)  # the server never heard of the close
        finally:
            self._closed.set()

    def close_soon(self) -> None:
        """Close on another thread (from kazoo's own threads, which must not block)."""
        threading.Thread(target=self.close, name="rebalancer-zk-close", daemon=True).start()


class SessionTable:
    """The sessions a backend hosts, and the thread that ends those not renewed in time."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._sessions: dict[str, ZkSession] = {}
        self._stopped = False
        self._thread: threading.Thread | None = None

    def add(self, zs: ZkSession) -> None:
        with self._cond:
            self._sessions[zs.session.session_id] = zs
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(
                    target=self._run, name="rebalancer-zk-leases", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def get(self, session_id: str) -> ZkSession | None:
        with self._cond:
            return self._sessions.get(session_id)

    def pop(self, session_id: str) -> ZkSession | None:
        with self._cond:
            return self._sessions.pop(session_id, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                now = self._clock.monotonic()
                due = [zs for zs in self._sessions.values() if zs.lapse_if_due(now)]
                live = [
                    zs.deadline
                    for zs in self._sessions.values()
                    if zs.state is not SessionState.ENDED
                ]
                if not due:
                    pause = min(live, default=now + 1.0) - now
                    self._cond.wait(min(max(pause, 0.0), 1.0))
                    continue
            for zs in due:
                zs.close_soon()

    def close(self, each: Callable[[ZkSession], None]) -> None:
        """Stop the lease thread and hand every session to ``each`` (which closes it)."""
        with self._cond:
            self._stopped = True
            sessions = list(self._sessions.values())
            self._sessions.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)
        for zs in sessions:
            each(zs)
