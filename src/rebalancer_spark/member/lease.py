"""The member's own view of its lease, and the heartbeat thread that renews it.

Self-fencing rests on one inequality. A renewal that *starts* at local time ``t0`` makes the
store push the lease out to (store time of the write) + ttl, which is never earlier than
``t0 + ttl`` on a clock that runs at the same rate. The member treats its lease as valid only
until ``t0 + ttl - safety_margin``, so it stops all work strictly before the store can
consider it expired and grant its resources to anyone else.

The deadline is kept on the monotonic clock; the wall-clock time it stands for, which the
``lost`` events carry, is also fixed when the deadline is set (:meth:`Lease.ended_at` takes the
earlier of the two readings). A wall clock stepped forward while the member was paused would
otherwise date the lapse later than a successor's grant that was stamped before the step.

A lapse is final for the session: once the local deadline has passed, a late renewal is not
believed, the member reports everything lost, and it rejoins with a new session. Nothing about
a lapsed session is ever resurrected.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from rebalancer_spark.backends.base import Backend, Session
from rebalancer_spark.core.clock import Clock
from rebalancer_spark.core.errors import BackendError, SessionExpired

__all__ = ["Heartbeat", "Lease", "LeaseSnapshot"]

log = logging.getLogger("rebalancer_spark.lease")


@dataclass(frozen=True, slots=True)
class LeaseSnapshot:
    """The lease as one thread saw it at one instant."""

    session: Session | None
    deadline: float
    """On the clock's ``monotonic``."""
    lapsed: bool
    wall_deadline: float
    """The deadline in wall-clock time, as converted when it was set."""


class Lease:
    """Thread-safe holder of the current session and its local deadline."""

    def __init__(self, clock: Clock, safety_margin: float) -> None:
        self._clock = clock
        self._margin = safety_margin
        self._lock = threading.Lock()
        self._session: Session | None = None
        self._deadline = 0.0
        self._wall_deadline = 0.0
        self._lapsed = False
        self.changed = threading.Event()
        """Set whenever the lease lapses or a new session starts; the member loop clears it."""

    def start(self, session: Session, started_at: float) -> None:
        """A new session joined by a request that started at ``started_at``."""
        with self._lock:
            self._session = session
            self._set_deadline(started_at + session.ttl - self._margin)
            self._lapsed = False
        self.changed.set()

    def renewed(self, session: Session, started_at: float) -> bool:
        """Record a renewal that started at ``started_at``; False if the lease had lapsed."""
        with self._lock:
            if self._session != session or self._check_locked():
                return False
            self._set_deadline(max(self._deadline, started_at + session.ttl - self._margin))
            return True

    def lapse(self, session: Session) -> None:
        """The store says the session is gone (or we gave it up)."""
        with self._lock:
            if self._session == session and not self._lapsed:
                self._lapsed = True
                self._set_deadline(min(self._deadline, self._clock.monotonic()))
        self.changed.set()

    def end(self) -> None:
        """The session ended on purpose (graceful leave)."""
        with self._lock:
            self._session = None
            self._lapsed = True
        self.changed.set()

    def _set_deadline(self, deadline: float) -> None:
        self._deadline = deadline
        self._wall_deadline = deadline + self._clock.wall() - self._clock.monotonic()

    def ended_at(self, snap: LeaseSnapshot) -> float:
        """The wall-clock time ``snap``'s lease ran out (now if it has not yet): the earlier
        of its deadline converted now and as converted when it was set."""
        now = self._clock.wall() - max(self._clock.monotonic() - snap.deadline, 0.0)
        return min(now, snap.wall_deadline)

    def _check_locked(self) -> bool:
        if not self._lapsed and self._clock.monotonic() >= self._deadline:
            self._lapsed = True
            self.changed.set()
        return self._lapsed

    def snapshot(self) -> LeaseSnapshot:
        with self._lock:
            lapsed = self._session is None or self._check_locked()
            return LeaseSnapshot(self._session, self._deadline, lapsed, self._wall_deadline)

    def valid_session(self) -> Session | None:
        """The session if its lease is still valid now, else None."""
        snap = self.snapshot()
        return None if snap.lapsed else snap.session


class Heartbeat:
    """Renews the lease every ``interval`` seconds on its own thread, so that slow user
    callbacks on the member thread never delay a renewal."""

    def __init__(
        self,
        backend: Backend,
        lease: Lease,
        clock: Clock,
        interval: float,
        on_renewed: Callable[[float], None] | None = None,
    ) -> None:
        self._backend = backend
        self._on_renewed = on_renewed
        self._lease = lease
        self._clock = clock
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rebalancer-heartbeat", daemon=True)
        self.renew_latency: float | None = None
        """Seconds the last successful renewal took."""

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def _interval_for(self, session: Session | None) -> float:
        # The store may grant a shorter lease than configured: renew often enough for it.
        return self._interval if session is None else min(self._interval, session.ttl / 5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_for(self._lease.snapshot().session)):
            snap = self._lease.snapshot()
            if snap.session is None or snap.lapsed:
                continue
            started = self._clock.monotonic()
            try:
                self._backend.renew(snap.session)
            except SessionExpired:
                log.warning(
                    "lease of member %s in group %s expired in the store; stopping all work",
                    snap.session.member_id,
                    snap.session.group,
                )
                self._lease.lapse(snap.session)
                continue
            except BackendError as exc:
                log.warning("lease renewal failed (%s); retrying until the lease runs out", exc)
                continue
            except Exception:  # a bug must not stop the heartbeat: the lease then just runs out
                log.exception("lease renewal raised; retrying until the lease runs out")
                continue
            self.renew_latency = self._clock.monotonic() - started
            self._lease.renewed(snap.session, started)
            if self._on_renewed is not None:
                self._on_renewed(self.renew_latency)
