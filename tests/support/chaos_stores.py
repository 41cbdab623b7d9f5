"""The store faults of ``tests/support/chaos.py`` for the servers of ``tests/servers``."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from tests.servers.redis import RedisServer
from tests.servers.zookeeper import Ensemble, ZkServer


@dataclass
class EnsembleFaults:
    """A three-server ZooKeeper ensemble: its leader is killed with -9 and started again
    1 to 4 s later (one server down at a time, so a quorum remains)."""

    ensemble: Ensemble
    name: str = "zookeeper (3-server ensemble)"
    kinds: tuple[str, ...] = ("zk-leader-kill-9",)
    paused_member_stalls_writers: bool = False
    down: list[ZkServer] = field(default_factory=list)

    def inject(self, kind: str, rng: random.Random) -> float:
        assert kind in self.kinds, kind
        leader = self.ensemble.leader(timeout=60)
        leader.kill()
        self.down.append(leader)
        return rng.uniform(1.0, 4.0)

    def heal(self) -> None:
        for server in self.down:
            server.start()
        self.down.clear()
        self.ensemble.wait_quorum()

    def data_lost(self) -> bool:
        return False


@dataclass
class StandaloneZkFaults:
    """A standalone ZooKeeper server stopped for 0.5 s to twice the session timeout and
    started again (its data is on disk; sessions outlive a short outage)."""

    server: ZkServer
    session_timeout: float
    name: str = "zookeeper (standalone)"
    kinds: tuple[str, ...] = ("zk-server-restart",)
    paused_member_stalls_writers: bool = False

    def inject(self, kind: str, rng: random.Random) -> float:
        assert kind in self.kinds, kind
        self.server.stop()
        return rng.uniform(0.5, 2 * self.session_timeout)

    def heal(self) -> None:
        if not self.server.running:
            self.server.start()
        self.server.wait_serving()

    def data_lost(self) -> bool:
        return False


@dataclass
class RedisFaults:
    """redis-server restarted without persistence (everything it held is lost), paused with
    SIGSTOP for up to the session timeout + 1 s and resumed, or, when the server runs with a
    :class:`ClockShift`, its wall clock stepped forward or back by 0.5 to 3 session timeouts
    (Redis ends keys, the backend's leases, by its wall clock: a step forward ends sessions
    early, a step back makes a dead member's lease last longer). The shift stays within
    ±``max_shift_s`` of the real time."""

    server: RedisServer
    session_timeout: float
    name: str = "redis"
    kinds: tuple[str, ...] = ("redis-restart-no-persistence", "redis-sigstop")
    paused_member_stalls_writers: bool = False
    paused: bool = False
    lost: bool = False
    max_shift_s: float = 30.0
    steps: list[tuple[float, int]] = field(default_factory=list)
    """Every clock step injected: (wall-clock time, ms)."""

    def __post_init__(self) -> None:
        if self.server.clock is not None and "redis-clock-step" not in self.kinds:
            self.kinds = (*self.kinds, "redis-clock-step")

    def inject(self, kind: str, rng: random.Random) -> float:
        assert kind in self.kinds, kind
        self.lost = kind == "redis-restart-no-persistence"
        if self.lost:
            self.server.restart()
            return 0.0
        if kind == "redis-clock-step":
            clock = self.server.clock
            assert clock is not None
            step = round(rng.uniform(0.5, 3.0) * self.session_timeout * 1000)
            if rng.random() < 0.5:
                step = -step
            if abs(clock.shift_ms + step) > self.max_shift_s * 1000:
                step = -step
            clock.step(step)
            self.steps.append((time.time(), step))
            return 0.0
        self.server.pause()
        self.paused = True
        return rng.uniform(0.5, self.session_timeout + 1.0)

    def heal(self) -> None:
        if self.paused:
            self.server.resume()
            self.paused = False

    def data_lost(self) -> bool:
        return self.lost
