"""Waking members when their group changes: pub/sub for writes, a timer for lease expiries.

Every script that changes what :meth:`Backend.state` shows PUBLISHes its kind: on
``rb:{G}:changes`` what any watch may act on (membership, leases, succession, a new target,
control, the resource set), on ``rb:{G}:coord`` what only the coordinator acts on (claims,
releases, acknowledgements, members leaving), and a release also on
``rb:{G}:to:<member>`` for each member whose target holds what was released. A
:class:`RedisWatch` subscribes on its own connection, *before* :meth:`Backend.watch` returns
(the subscription is confirmed), and a reader thread turns each message into a wake-up.

Lease expiry publishes nothing (Redis sends keyspace notifications only when
``notify-keyspace-events`` is configured, which managed services often forbid), so the watch
also reads the remaining time of the leases it follows (``PTTL``, one read-only script) and
wakes when the earliest runs out: every member's lease for the coordinator and the members'
reconcilers, the coordinator's alone for a follower's coordinator thread, which acts only on
the coordinator going away (it reads the lease again after ``elect`` and ``resign``). It
then reads again: a lease that is gone and was due has expired (report it); one still there
was renewed (note its new deadline, sleep on). Every read also reports a known lease that is
gone before its local deadline (the deadline is Redis' expiry plus the reply's travel time),
and, once, a listed session whose lease is gone though no read saw it alive. A deadline that
has passed is checked before anything else, so later writes can never hide an expiry.
Leases renewed meanwhile cost one extra read per lease period, never a wrong wake-up; joins,
leaves and quarantines publish, and the set of leases is re-read after those messages (the
payload of each message names what happened).

What wakes whom (:meth:`Watch.focus`): a watch subscribes to the channels its interest needs
(the coordinator's watch, :attr:`Interest.ALL`: ``changes`` and ``coord``; a member's
reconciler: ``changes`` and its own ``to:<member>``; a follower's coordinator thread:
``changes``), so the claims, releases and acknowledgements of a rebalance reach the
coordinator and the one member each release is for, not every watch of the group: at 100
members, each of the ~300 messages of a join used to be delivered to all 200 watches and
parsed by each of their reader threads, O(members²) work per rebalance on the members' CPU.
Each message names what happened (``claim``, ``ack``, ``publish`` ...; ``release m3 m7``).
The reader keeps the *atoms* of the messages it got since the last wake-up (``claim``,
``release:m3``, ...); ``wait`` returns when one of them is covered by the watch's interest and
then forgets them all. A new interest is applied by the reader thread (the connection is
its own): it subscribes to the new channels before it leaves the old ones, and Redis applies
both in order, so narrowing loses nothing; a channel that widens what the watch hears reports
a change once its subscription is confirmed (messages sent before it were not received).

If the connection drops, the reader reconnects with back-off and reports a (possibly
spurious) change to every interest once it is subscribed again, since messages sent meanwhile
were lost. ``wait`` never raises because Redis is down: it sleeps out its timeout instead.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Any

import redis
from redis.client import PubSub

from rebalancer_spark.backends.base import Interest, Watch
from rebalancer_spark.backends.redis.store.keys import (
    channel,
    coordinator_channel,
    member_channel,
)
from rebalancer_spark.backends.redis.store.runner import Lua
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.errors import RebalancerError

if TYPE_CHECKING:
    from rebalancer_spark.backends.redis.backend import RedisBackend

__all__ = ["RedisWatch"]

log = logging.getLogger("rebalancer_spark.backends.redis")

_POLL = 0.1
"""Seconds the reader blocks for a message before looking at ``closed``."""
_SUBSCRIBE_TIMEOUT = 5.0
_MAX_BACKOFF = 1.0
LEASE_EVENTS = frozenset({"join", "leave", "expired", "quarantine"})
"""Messages after which the set of leases (and the quarantine) must be read again; after the
others (claims, releases, publications ...) only the deadlines already known matter."""
_ANY = "*"
"""The atom of a change of any kind (messages were lost while reconnecting)."""
_MEMBER_EVENTS = LEASE_EVENTS | {"publish", "control", "lift", _ANY}
_SUCCESSION_EVENTS = LEASE_EVENTS | {"resign", "elect", "resources", _ANY}
"""What wakes a follower's coordinator thread: the coordinator's going, and a new resource set
(a follower remembers the set, so that it can declare it again into a store that lost it:
:class:`~rebalancer_spark.backends.base.GroupReader`)."""
_COORDINATOR_CHANGES = frozenset({"resign", "elect"})
"""Messages after which a follower's watch reads the coordinator's lease again."""
_FOLLOWING = frozenset({Interest.SUCCESSION, Interest.COORDINATOR})
"""A follower's interests: a member's coming is a lease event too, which the coordinator's
going away may also be, so Redis wakes for both alike."""

_RETRY = "~retry"
"""A deadline key (never a session id) for reading the leases again after a failed read."""
_RETRY_AFTER = 0.5


def _lease_scope(interest: Interest) -> str:
    """Which leases a watch of ``interest`` follows: the ``coordinator``'s (a follower acts
    only on the coordinator going away) or ``all``."""
    return "coordinator" if interest in _FOLLOWING else "all"


class RedisWatch(Watch):
    """Pub/sub plus lease deadlines for one group; see the module docstring."""

    def __init__(self, backend: RedisBackend, group: str, clock: Clock) -> None:
        self._backend = backend
        self._group = group
        self._channel = channel(group)
        self._coordinator_channel = coordinator_channel(group)
        self._wanted = self._channels(Interest.ALL, None)
        """The channels the interest needs (set by :meth:`focus`, applied by the reader)."""
        self._subscribed: frozenset[str] = frozenset()  # the reader thread's own
        self._expected: collections.deque[tuple[str, bool]] = collections.deque()
        """(Reader thread) The confirmations :meth:`_follow_focus` asked for, in order, each
        with whether its channel widens what the watch hears."""
        self._clock = clock  # kept for symmetry; deadlines are on Redis' (real) time
        self._cond = threading.Condition()
        self._wait_lock = threading.Lock()
        self._atoms: set[str] = set()  # what the messages since the last wake-up said
        self._stale = False
        self._closed = False
        self._deadlines: dict[str, float] = {}
        self._scope = "all"
        """Which leases :attr:`_deadlines` came from: ``all`` or the ``coordinator``'s."""
        self._listed: set[str] = set()
        self._gone: set[str] = set()
        """Keys the last read listed whose lease (or the quarantine) is gone: sessions
        expired and not yet dropped from the group."""
        self._reported_gone: set[str] = set()
        self._pubsub: PubSub | None = None
        try:
            self._pubsub = self._subscribe()
        except (redis.exceptions.RedisError, OSError):
            self._pubsub = None  # the reader keeps trying and reports a change once in
        self._read_leases()
        self._reported_gone = set(self._gone)  # what ran out before watch() returned
        self._thread = threading.Thread(
            target=self._listen, name=f"rebalancer-redis-watch-{group}", daemon=True
        )
        self._thread.start()

    # -- the reader thread ------------------------------------------------------------------

    def _channels(self, interest: Interest, member_id: str | None) -> frozenset[str]:
        """The channels that carry what ``interest`` covers."""
        if interest is Interest.ALL:
            return frozenset({self._channel, self._coordinator_channel})
        if interest is Interest.MEMBER and member_id is not None:
            return frozenset({self._channel, member_channel(self._group, member_id)})
        return frozenset({self._channel})

    def _subscribe(self) -> PubSub:
        """A new connection subscribed to the channels wanted now, each confirmed."""
        with self._cond:
            wanted = self._wanted
        pubsub: PubSub = self._backend.client.pubsub()  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(*sorted(wanted))
            unconfirmed = set(wanted)
            deadline = time.monotonic() + _SUBSCRIBE_TIMEOUT
            while unconfirmed:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise redis.exceptions.TimeoutError(
                        f"no confirmation of SUBSCRIBE {' '.join(sorted(unconfirmed))}"
                    )
                message = pubsub.get_message(timeout=min(left, _POLL))
                if message is not None and message.get("type") == "subscribe":
                    unconfirmed.discard(str(message.get("channel")))
            self._subscribed = wanted
            self._expected.clear()
            return pubsub
        except BaseException:
            with contextlib.suppress(Exception):
                pubsub.close()
            raise

    def _signal(self, data: object = _ANY) -> None:
        """A message came (``data``: its payload), or messages may have been lost (``_ANY``)."""
        kind, *names = str(data).split()
        atoms = {f"{kind}:{name}" for name in names} if names else {kind}
        with self._cond:
            self._atoms |= atoms
            self._stale = (
                self._stale
                or kind in LEASE_EVENTS
                or kind == _ANY
                or (self.interest in _FOLLOWING and kind in _COORDINATOR_CHANGES)
            )
            self._cond.notify_all()

    def _covered(self) -> bool:
        """Whether a change held since the last wake-up concerns this watch's interest (call
        with ``_cond`` held)."""
        atoms = self._atoms
        if not atoms or self.interest is Interest.ALL:
            return bool(atoms)
        if self.interest in _FOLLOWING:
            return not atoms.isdisjoint(_SUCCESSION_EVENTS)
        return not atoms.isdisjoint(_MEMBER_EVENTS) or f"release:{self.member_id}" in atoms

    def _listen(self) -> None:
        backoff = _POLL
        warned = False
        while not self._closed:
            if self._pubsub is None:
                try:
                    self._pubsub = self._subscribe()
                except (redis.exceptions.RedisError, OSError, ValueError) as exc:
                    if isinstance(exc, redis.exceptions.NoPermissionError) and not warned:
                        warned = True
                        log.warning(
                            "group %s: the Redis user may not SUBSCRIBE to %s (%s); members "
                            "react only at their timeouts: grant the channels &rb:*",
                            self._group,
                            " ".join(sorted(self._wanted)),
                            exc,
                        )
                    with self._cond:
                        self._cond.wait_for(lambda: self._closed, backoff)
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                    continue
                backoff = _POLL
                self._signal()  # messages sent while we were away are lost: report a change
            try:
                self._follow_focus(self._pubsub)
                message: Any = self._pubsub.get_message(timeout=_POLL)
            except (redis.exceptions.RedisError, OSError, ValueError, AttributeError):
                with contextlib.suppress(Exception):
                    self._pubsub.close()
                self._pubsub = None
                if not self._closed:
                    self._signal()
                continue
            if message is None:
                continue
            kind = message.get("type")
            if kind == "message":
                self._signal(message.get("data") or _ANY)
            elif kind == "subscribe":
                self._confirmed(str(message.get("channel")))
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                self._pubsub.close()
            self._pubsub = None

    def _follow_focus(self, pubsub: PubSub) -> None:
        """(Reader thread) Subscribe to the channels of a new interest, then leave the old
        ones: one connection, so Redis applies them in that order and no message falls
        between. The confirmation of a channel that widens what the watch hears reports a
        change (:meth:`_confirmed`)."""
        with self._cond:
            wanted = self._wanted
        current = self._subscribed
        if wanted == current:
            return
        added, dropped = wanted - current, current - wanted
        if added:
            pubsub.subscribe(*sorted(added))
            # The coordinator's channel carries every release: a member's channel added while
            # it was heard widens nothing (a member's reconciler narrowing from everything).
            covered = self._coordinator_channel in current
            for c in sorted(added):
                self._expected.append((c, not (covered and c != self._coordinator_channel)))
        if dropped:
            pubsub.unsubscribe(*sorted(dropped))  # type: ignore[no-untyped-call]
        self._subscribed = wanted

    def _confirmed(self, channel: str) -> None:
        """(Reader thread) A subscription to ``channel`` is confirmed. One that widened what
        the watch hears reports a change (messages sent on it before were not received); so
        does one nobody here asked for: redis-py, after one dropped connection, reconnects
        and subscribes again on its own, and messages sent meanwhile were lost."""
        if self._expected and self._expected[0][0] == channel:
            _, widens = self._expected.popleft()
            if widens:
                self._signal()
            return
        self._expected.clear()  # redis-py subscribed again to every channel, ours included
        self._signal()

    # -- lease deadlines ---------------------------------------------------------------------

    def _read_leases(self) -> dict[str, float] | None:
        """Read the remaining time of the leases the interest follows (a follower: the
        coordinator's alone; else every member's) and of the quarantine; keep and return the
        new deadlines, and which keys the read answered for (:attr:`_listed`, gone ones
        too). When Redis cannot be read, return None and try again in a moment (reporting a
        change then, as an expiry may have gone unseen meanwhile)."""
        scope = _lease_scope(self.interest)
        try:
            flat = self._backend.run(
                Lua.LEASES, self._group, [scope] if scope != "all" else [], "watching leases"
            )
        except RebalancerError:
            self._deadlines = {_RETRY: time.monotonic() + _RETRY_AFTER}
            return None
        now = time.monotonic()
        pairs = [(str(flat[i]), int(flat[i + 1])) for i in range(0, len(flat) - 1, 2)]
        fresh = {key: now + ms / 1000 for key, ms in pairs if ms >= 0}
        self._deadlines, self._scope = fresh, scope
        self._listed = {key for key, _ in pairs}
        self._gone = self._listed - fresh.keys()
        return fresh

    def _expired(self, force: bool) -> bool:
        """True if a lease (or the quarantine) known before is gone now. Only a due deadline
        makes the watch read again unless ``force``; but once it reads, *any* known key that
        is gone is reported, due or not: the local deadline is Redis' expiry plus the reply's
        travel time, so a lease can be gone in Redis before it is due here, and dropping it
        silently would lose that expiry (a lease ended by a leave may wake once more:
        spurious wake-ups are allowed, missed ones are not)."""
        now = time.monotonic()
        known, scope = self._deadlines, self._scope
        due = [key for key, at in known.items() if at <= now]
        if not (force or due):
            return False
        fresh = self._read_leases()
        if fresh is None:
            return False
        # A lease can run out before any read saw it (a member that joined and expired
        # between two reads; the coordinator elected after the last read): a listed key whose
        # lease is gone is reported once, known before or not.
        unseen = self._gone - self._reported_gone
        self._reported_gone = set(self._gone)
        if unseen:
            return True
        if _RETRY in known or scope == self._scope:
            return any(key not in fresh for key in known)
        # The interest changed what is followed: of what was known, only the keys this read
        # answered for can be judged (a follower no longer follows the other members).
        return any(key not in fresh for key in known if key in self._listed)

    # -- Watch -------------------------------------------------------------------------------

    def focus(self, interest: Interest, member_id: str | None = None) -> None:
        """Hear, from now on, the channels ``interest`` needs (the reader thread subscribes;
        see the module docstring). Widening reports a change once the subscription is
        confirmed; narrowing never loses a message of the narrower interest."""
        with self._cond:
            if (interest, member_id) == (self.interest, self.member_id):
                return
            if _lease_scope(interest) != _lease_scope(self.interest):
                self._stale = True  # it follows other leases: read them at the next wait
            super().focus(interest, member_id)
            self._wanted = self._channels(interest, member_id)

    def wait(self, timeout: float) -> bool:
        end = time.monotonic() + max(timeout, 0.0)
        with self._wait_lock:
            while True:
                with self._cond:
                    if self._woken():
                        self._atoms.clear()
                        return True
                    stale, self._stale = self._stale, False
                if self._expired(stale):
                    return True
                with self._cond:
                    if self._woken():
                        continue
                    now = time.monotonic()
                    if now >= end:
                        return False
                    upcoming = min(self._deadlines.values(), default=math.inf)
                    pause = min(end, upcoming) - now
                    if pause > 0:
                        self._cond.wait(pause)

    def _woken(self) -> bool:
        """A message this watch's interest covers, a reconnection or close() came in (call
        with ``_cond`` held)."""
        return self._closed or self._covered()

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5 * _POLL + _SUBSCRIBE_TIMEOUT)
