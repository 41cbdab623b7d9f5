"""The peers as group members in this process: kazoo's SetPartitioner and tooz's partitioner
(zookeeper driver), each member with a ZooKeeper session of its own behind a TCP proxy.

A member's thread keeps ``owned`` up to date and records every change as an ownership interval,
so that an observer can tell when the group is settled and count moves, gaps and overlaps the
same way ``bench_rebalance.py`` does for our member processes:

* **kazoo** ``SetPartitioner(time_boundary=…)``: owns ``set(partitioner)`` while ``acquired``;
  ownership ends when the member sees ``release`` (before ``release_set()``) or ``finish()``es.
* **tooz** ``join_partitioned_group``: ``run_watchers()`` every 10 ms, then owns the items its
  hash ring gives itself (``belongs_to_self``). tooz has no claims: its members are settled when
  their rings agree. FACTS.md's start-up race (a ring that missed a member for good, then
  ``UnknownNode`` from ``run_watchers()`` forever) is detected by :meth:`ToozMember.diagnose`.

A **crash** cuts the member's proxy (its session then expires at the server after the session
timeout, as for a process killed with -9) and ends its ownership at that instant.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from tests.servers.zookeeper import TcpProxy

from rebalancer_spark.core import audit

TICK = 0.01
"""Seconds between two looks of a member's thread at its partitioner."""

logging.getLogger("kazoo").setLevel(logging.CRITICAL)  # crashes make it complain
logging.getLogger("tooz").setLevel(logging.CRITICAL)


class PeerMember:
    """One member of a peer's group, on its own thread and ZooKeeper session."""

    system = "peer"

    def __init__(self, name: str, zk_port: int, items: Sequence[str], session_timeout: float):
        self.name = name
        self.items = list(items)
        self.session_timeout = session_timeout
        self.proxy = TcpProxy(zk_port)
        self.session = uuid.uuid4().hex
        self.owned: frozenset[str] = frozenset()
        self.settled = False
        """The member's own view is final (kazoo: acquired; tooz: its watchers are drained)."""
        self.intervals: list[audit.Interval] = []
        self.errors: list[str] = []
        self.dead = False
        self.joined_at = 0.0
        self._since: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"peer-{name}", daemon=True)

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"

    def start(self) -> None:
        self.connect()
        self.joined_at = time.time()
        self.join()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(TICK):
            try:
                self.step()
            except Exception as exc:
                if not self._stop.is_set():
                    self.errors.append(f"{type(exc).__name__}: {exc}"[:200])

    def set_owned(self, owned: frozenset[str], at: float | None = None) -> None:
        at = time.time() if at is None else at
        with self._lock:
            if self._stop.is_set():
                return  # left or crashed: the thread's last look must not own anything again
            for item in owned - self.owned:
                self._since[item] = at
            for item in self.owned - owned:
                self._close(item, at)
            self.owned = owned

    def _close(self, item: str, at: float) -> None:
        start = self._since.pop(item)
        self.intervals.append(audit.Interval(item, self.name, self.session, 0, start, at, "end"))

    def all_intervals(self) -> list[audit.Interval]:
        with self._lock:
            now = time.time()
            open_ = [
                audit.Interval(i, self.name, self.session, 0, s, now, "open")
                for i, s in self._since.items()
            ]
            return self.intervals + open_

    def leave(self) -> None:
        """Graceful leave; ownership ends now."""
        self.set_owned(frozenset())
        with self._lock:
            self._stop.set()
        self._thread.join(30)
        self.depart()
        self.dead = True
        self.proxy.close()

    def crash(self) -> float:
        """Cut the network as a kill -9 would; ownership ends now. Returns the time."""
        at = time.time()
        self.proxy.cut()
        self.dead = True
        with self._lock:
            self._stop.set()
            for item in list(self._since):
                self._close(item, at)
            self.owned = frozenset()
        return at

    def close(self) -> None:
        """Stop the client, giving up after 5 s: a crashed member's client may block for good
        (tooz's heartbeat waits without a timeout on a connection that is cut)."""
        self._stop.set()
        self._thread.join(5)

        def abandon() -> None:
            with contextlib.suppress(Exception):
                self.abandon()

        closer = threading.Thread(target=abandon, name=f"close-{self.name}", daemon=True)
        closer.start()
        closer.join(5)
        self.proxy.close()

    # -- per peer ---------------------------------------------------------------------------

    def connect(self) -> None:
        raise NotImplementedError

    def join(self) -> None:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError

    def depart(self) -> None:
        raise NotImplementedError

    def abandon(self) -> None:
        """Stop the client without waiting for anything (after a crash or at the end)."""
        raise NotImplementedError

    def ring_view(self) -> set[str] | None:
        """The members this member believes are in the group, where the peer exposes it."""
        return None


class KazooMember(PeerMember):
    system = "kazoo SetPartitioner"

    def __init__(
        self,
        name: str,
        zk_port: int,
        items: Sequence[str],
        session_timeout: float,
        *,
        path: str,
        time_boundary: float,
    ) -> None:
        super().__init__(name, zk_port, items, session_timeout)
        self.path = path
        self.time_boundary = time_boundary
        self.client: Any = None
        self.part: Any = None

    def connect(self) -> None:
        from kazoo.client import KazooClient

        self.client = KazooClient(hosts=self.hosts, timeout=self.session_timeout)
        self.client.start(timeout=15)

    def join(self) -> None:
        self.part = self.client.SetPartitioner(
            self.path, set=self.items, identifier=self.name, time_boundary=self.time_boundary
        )

    def step(self) -> None:
        part = self.part
        if part.failed:
            self.set_owned(frozenset())
            self.settled = False
            raise RuntimeError("the SetPartitioner failed")
        if part.release:
            self.settled = False
            self.set_owned(frozenset())
            part.release_set()
        elif part.acquired:
            self.set_owned(frozenset(part))
            self.settled = True
        else:
            self.settled = False
            part.wait_for_acquire(TICK * 5)

    def depart(self) -> None:
        self.part.finish()
        self.client.stop()
        self.client.close()

    def abandon(self) -> None:
        self.client.stop()
        self.client.close()


class ToozMember(PeerMember):
    system = "tooz partitioner (zookeeper)"

    def __init__(
        self,
        name: str,
        zk_port: int,
        items: Sequence[str],
        session_timeout: float,
        *,
        group: bytes,
    ) -> None:
        super().__init__(name, zk_port, items, session_timeout)
        self.group = group
        self.coord: Any = None
        self.part: Any = None
        self.unknown_node_errors = 0
        self._ring: frozenset[str] | None = None

    def connect(self) -> None:
        from tooz import coordination

        url = f"zookeeper://{self.hosts}?timeout={self.session_timeout:g}"
        self.coord = coordination.get_coordinator(url, self.name.encode())
        self.coord.start(start_heart=True)

    def join(self) -> None:
        self.part = self.coord.join_partitioned_group(self.group)

    def step(self) -> None:
        from tooz import coordination

        try:
            self.coord.run_watchers()
        except coordination.MemberNotJoined:
            raise
        except Exception as exc:
            if type(exc).__name__ == "UnknownNode":
                self.unknown_node_errors += 1
            raise
        ring = frozenset(self.ring_view() or ())
        if ring != self._ring:  # the ring changed: look every item up again
            owned = frozenset(i for i in self.items if self.part.belongs_to_self(i))
            self.set_owned(owned)
            self._ring = ring
        self.settled = True

    def ring_view(self) -> set[str] | None:
        with contextlib.suppress(Exception):
            return {n.decode() if isinstance(n, bytes) else str(n) for n in self.part.ring.nodes}
        return None

    def depart(self) -> None:
        self.coord.leave_partitioned_group(self.part)
        self.coord.stop()

    def abandon(self) -> None:
        self.coord.stop()


def diagnose(members: Sequence[PeerMember]) -> str | None:
    """Why a tooz group cannot settle, if it is the start-up race: a live member's ring lacks a
    live member (or keeps a departed one), or run_watchers() raises UnknownNode."""
    live = {m.name for m in members if not m.dead}
    for m in members:
        if m.dead:
            continue
        ring = m.ring_view()
        if ring is not None and ring != live:
            missing, extra = sorted(live - ring), sorted(ring - live)
            return (
                f"tooz start-up race: {m.name}'s hash ring is {sorted(ring)} "
                f"(missing {missing}, departed still in it {extra})"
            )
        if isinstance(m, ToozMember) and m.unknown_node_errors:
            return f"tooz: run_watchers() of {m.name} raised UnknownNode {m.unknown_node_errors}x"
    return None
