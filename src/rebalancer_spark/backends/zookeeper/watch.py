"""Wake-ups from ZooKeeper watches: no polling.

Every write of this library that changes a group also sets the group's ``changes`` znode in
the same multi-op, and ZooKeeper itself changes the children of ``members/`` when it deletes
the ephemeral znodes of an ended session (which makes no ``changes`` write). A
:class:`ZookeeperWatch` keeps one data watch on ``changes`` and one child watch on
``members/``.

Watches fire once, so each firing re-arms both, and the waiter is woken only once the server
has *answered* both re-arming requests: from then on both watches are registered on the
server, and every change the waiter's next read does not see fires them again. (Waking the
waiter at once would let a change land between its read and the re-arm's arrival, seen by
neither.) Reads through another connection must also not lag behind the server the watches
are on: :func:`.ownership.member_view` syncs the session's connection first. :meth:`Backend
.watch` likewise returns only once the first arm is answered. A dropped connection wakes the
waiter at once (kazoo fires every watch when it disconnects); when the connection, or a new
session of the shared client, is back the watches are re-armed, and the waiter woken once
that is answered.
"""

from __future__ import annotations

import threading
from typing import Any

from kazoo.protocol.states import KazooState

from rebalancer_spark.backends.base import Watch
from rebalancer_spark.backends.zookeeper.store.layout import GroupPaths

__all__ = ["ZookeeperWatch"]


class ZookeeperWatch(Watch):
    """Wakes a waiter whenever ``paths``' group may have changed; ``timeout`` bounds the wait
    for the first arm in the constructor."""

    def __init__(self, client: Any, paths: GroupPaths, timeout: float = 10.0) -> None:
        self._client = client
        self._paths = paths
        self._event = threading.Event()
        self._closed = False
        client.add_listener(self._on_state)
        armed = self._arm(wake=False)
        # A change made after watch() returned must wake the next wait: return once both
        # watches are registered. If the connection is down (the listener arms again when it
        # is back) or the server does not answer in time, wake the first wait instead.
        if not (client.connected and armed.wait(timeout)):
            self._event.set()

    def _arm(self, wake: bool = True) -> threading.Event:
        """Ask ZooKeeper to notify the next change, without blocking. The event returned is
        set once the server answered both requests (so both watches are registered, or the
        requests failed, which the connection listener handles); with ``wake`` the waiter is
        woken then, not before."""
        answered = threading.Event()
        if self._closed:
            answered.set()
            return answered
        pending = [
            self._client.exists_async(self._paths.changes, watch=self._fired),
            self._client.get_children_async(self._paths.members, watch=self._fired),
        ]
        lock = threading.Lock()
        left = [len(pending)]

        def on_answer(_: Any) -> None:  # on kazoo's completion thread: must not block
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                answered.set()
                if wake:
                    self._event.set()

        for result in pending:
            result.rawlink(on_answer)
        return answered

    def _fired(self, event: Any) -> None:
        """A watch fired (or the connection dropped): re-arm; the waiter wakes once the
        server has answered the re-arm."""
        if self._closed:
            return
        self._arm()

    def _on_state(self, state: str) -> bool:
        """kazoo's connection listener; returning True removes it."""
        if self._closed:
            return True
        if state == KazooState.CONNECTED:
            self._arm()  # wakes the waiter once answered
        else:
            self._event.set()
        return False

    @property
    def closed(self) -> bool:
        return self._closed

    def wait(self, timeout: float) -> bool:
        if self._closed:
            return True
        if self._event.wait(timeout):
            self._event.clear()
            return True
        return False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._event.set()
            self._client.remove_listener(self._on_state)
