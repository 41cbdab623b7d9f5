"""Wake-ups from ZooKeeper watches: no polling.

Every write of this library that changes a group also sets the group's ``changes`` znode in
the same multi-op, and ZooKeeper itself changes the children of ``members/`` when it deletes
the ephemeral znodes of an ended session (which makes no ``changes`` write). Which znodes a
:class:`ZookeeperWatch` watches follows its :attr:`~.Watch.interest`, so that in a group of
100 members a claim or an acknowledgement wakes the coordinator, not 200 threads that would
each read the store for nothing:

* :attr:`Interest.ALL`: a data watch on ``changes`` and a child watch on ``members/``;
* :attr:`Interest.SUCCESSION`: the ``coordinator`` znode (an ephemeral that an election
  creates and a resignation or the coordinator's end deletes), ``members/`` and the
  ``resources`` pointer (a follower remembers the set, so that it can declare it again into a
  store that lost it: :class:`~rebalancer_spark.backends.base.GroupReader`);
* :attr:`Interest.COORDINATOR`: the ``coordinator`` znode and the ``resources`` pointer;
* :attr:`Interest.MEMBER`: the ``target`` pointer (a publication), ``control``, the
  member's own ``members/<id>`` (an ephemeral of its session, which the session's end
  deletes; other members' joins and leaves wake none of the 100, since nothing a member acts
  on changes until a target says so), and the znodes :meth:`ZookeeperWatch.follow` names:
  after a claim found resources held by another live session (or a delta's hint named
  one: :func:`.ownership.claim`, "Hints"), that session's znode
  (``sessions/<id>``), which every release sets in its multi-op and which goes with the
  session. So a member wakes for the releases of resources its target gives it once it asked
  for them, which is what the reconciler does on every new target.

Watches fire once, so each firing re-arms the watch that fired (the interest's others did not
fire and stand; a dropped connection, which makes kazoo forget them all, re-arms them all),
and the waiter is woken only once the server has *answered* the re-arming requests: from then
on the watches are registered on the server, and every change the waiter's next read does not
see fires them again. (Waking the waiter at once would let a change land between its read and
the re-arm's arrival, seen by neither.) A followed znode's firing is the exception: the
interest's watches did not fire, so they are still registered, and the waiter wakes at once
(one round trip less from a release to the claim it lets through). Reads through another
connection must also not lag behind the server the watches are on:
:func:`.ownership.member_view` syncs the session's connection first.
:meth:`Backend.watch` likewise returns only once the first arm is answered. A dropped
connection wakes the waiter at once (kazoo fires every watch when it disconnects); when the
connection, or a new session of the shared client, is back the watches are re-armed, and the
waiter woken once that is answered.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from kazoo.protocol.states import KazooState

from rebalancer_spark.backends.base import Interest, Watch
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
        self._followed: set[str] = set()
        """Znodes :meth:`follow` asked to watch whose watch has not fired yet."""
        self._moved: set[str] = set()
        """Followed znodes that fired since :meth:`take_moved` last took them, or that were
        at another version (or gone) when their watch was registered."""
        self._followed_lock = threading.Lock()
        self._timeout = timeout
        client.add_listener(self._on_state)
        armed = self._arm(wake=False)
        # A change made after watch() returned must wake the next wait: return once the
        # watches are registered. If the connection is down (the listener arms again when it
        # is back) or the server does not answer in time, wake the first wait instead.
        if not (client.connected and armed.wait(timeout)):
            self._event.set()

    @property
    def paths(self) -> GroupPaths:
        return self._paths

    def focus(self, interest: Interest, member_id: str | None = None) -> None:
        """Watch the znodes of ``interest`` from now on. Narrowing from :attr:`Interest.ALL`
        returns once the new watches are registered (the old ones covered everything until
        then); any other change wakes the waiter once they are (what the old interest did not
        watch for is not known: the wake-up stands for it)."""
        if (interest, member_id) == (self.interest, self.member_id):
            return
        narrowing = self.interest is Interest.ALL
        super().focus(interest, member_id)
        armed = self._arm(wake=not narrowing)
        if narrowing and not (self._client.connected and armed.wait(self._timeout)):
            self._event.set()

    def follow(self, znodes: Mapping[str, int], *, again: bool = False) -> None:
        """Also wake for the next change of each znode named, which was at the version given
        when read (the claim's consistent cut): if it is gone or at another version by the
        time the watch is registered, wake at once. ``again`` wakes at once.

        A znode followed already, whose watch has not fired, is not asked for again: that
        watch was registered before the caller's read, and the znode has not changed since
        (or its firing is on its way), so its next change fires it. A newcomer claiming while
        99 holders release followed each of them once per claim round: 254 watch requests of
        its own in one join at 100,000 x 100, where 99 do."""
        if self._closed:
            return
        if again:
            self._event.set()
        with self._followed_lock:
            new = {path: v for path, v in znodes.items() if path not in self._followed}
            self._followed.update(new)
        for path, version in new.items():
            pending = self._client.exists_async(path, watch=self._fired)

            def on_answer(result: Any, path: str = path, version: int = version) -> None:
                try:  # on kazoo's thread
                    stat = result.get_nowait()
                except Exception:
                    stat = None  # no watch registered: the next follow asks again
                moved = stat is None or stat.version != version
                with self._followed_lock:
                    if stat is None:
                        self._followed.discard(path)
                    if moved:
                        self._moved.add(path)
                if moved:
                    self._event.set()

            pending.rawlink(on_answer)

    def take_moved(self) -> set[str]:
        """The followed znodes that moved since the claim that followed them read them (a
        holder's release or end): those that fired since the last call, and those found at
        another version (or gone, or whose registration failed) when their watch was
        registered. The claim that follows
        reads their records right behind the holders' znodes, in its first read
        (:func:`.ownership.claim`): one round trip instead of two.

        (A followed znode whose registration is not answered yet is not taken as moved: in
        session 32 it was, for the claim the reconciler chains right behind one that granted
        something, and with the hints of a delta that claim then read the records of all 99
        holders in a join at 100,000 x 100 while few had released: 74 ms at the peak.)"""
        with self._followed_lock:
            moved, self._moved = self._moved, set()
        return moved

    def _interest(self) -> tuple[list[str], str | None]:
        """The znodes the current interest watches: those of data watches, and the parent
        of a child watch (None: none)."""
        p = self._paths
        nodes = {
            Interest.ALL: [p.changes],
            Interest.SUCCESSION: [p.coordinator, p.resources],
            Interest.COORDINATOR: [p.coordinator, p.resources],
            Interest.MEMBER: [p.target, p.control],
        }[self.interest]
        if self.interest is Interest.MEMBER and self.member_id is not None:
            # Its own membership only (an ephemeral of its session: the session's end
            # deletes it): others joining or leaving change nothing it acts on until a target
            # says so, and the holders it waits for are followed themselves.
            return [*nodes, p.member(self.member_id)], None
        if self.interest is Interest.COORDINATOR:
            return nodes, None
        return nodes, p.members

    def _watched(self, only: str | None = None) -> list[Any]:
        """Send the watch requests of the current interest (``only``: that znode's alone, a
        watch of it that fired); their pending answers."""
        client = self._client
        nodes, parent = self._interest()
        pending = [
            client.exists_async(path, watch=self._fired)
            for path in nodes
            if only is None or path == only
        ]
        if parent is not None and only in (None, parent):
            pending.append(client.get_children_async(parent, watch=self._fired))
        return pending

    def _arm(self, wake: bool = True, only: str | None = None) -> threading.Event:
        """Ask ZooKeeper to notify the next change, without blocking. The event returned is
        set once the server answered every request (so the watches are registered, or the
        requests failed, which the connection listener handles); with ``wake`` the waiter is
        woken then, not before. ``only``: re-arm that znode's watch alone (the one that
        fired; the others are registered still)."""
        answered = threading.Event()
        if self._closed:
            answered.set()
            return answered
        pending = self._watched(only)
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
        server has answered the re-arm. Only the watch that fired is re-armed: the others
        are registered still (a target published woke each member's watch to ask for three
        watches again, two of them standing: 200 requests too many a join in a group of 100). A
        followed znode (a holder's release) wakes the waiter at once instead: the watches of
        the interest did not fire, so there is nothing to re-arm (a round trip less between a
        release and the claim that follows it). A followed znode is not watched again: the
        wake-up makes the member claim again, which follows what is still held.

        A dropped connection fires every watch with no path: kazoo forgets them all, so
        everything is re-armed, and the followed znodes are forgotten too (the claim the
        wake-up makes follows them again)."""
        if self._closed:
            return
        path: str | None = getattr(event, "path", None)
        followed = False
        with self._followed_lock:
            if path is None:
                self._followed.clear()
            elif path in self._followed:
                followed = True
                self._followed.discard(path)
                self._moved.add(path)
        if followed:
            self._event.set()
            return
        nodes, parent = self._interest()
        self._arm(only=path if path in (*nodes, parent) else None)

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
