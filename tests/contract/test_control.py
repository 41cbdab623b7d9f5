"""The control record part of the backend contract: every backend passes these unchanged.

A group's control record (pause, rebalance requests, drains, pins, imbalance threshold) is
changed only by compare-and-set on its version, is part of every :meth:`Backend.state`
snapshot, and wakes the group's watchers when it changes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from rebalancer_spark.backends import Backend
from rebalancer_spark.core.control import Control, ControlMode
from rebalancer_spark.core.errors import ControlConflict
from rebalancer_spark.core.model import Resource

TTL = 30.0


def test_a_group_without_a_record_has_the_default_one(store: Backend, group: str) -> None:
    assert store.state(group).control == Control()
    store.update_resources(group, replace=[Resource("a")])
    assert store.state(group).control == Control()


def test_a_change_is_stored_with_the_next_version_and_seen_by_other_handles(
    open_store: Callable[[], Backend], group: str
) -> None:
    a, b = open_store(), open_store()
    stored = a.update_control(group, 0, Control().pause())
    assert stored.version == 1 and stored.mode is ControlMode.PAUSED
    seen = b.state(group).control
    assert seen == stored
    odd = "s3://bucket/prefix with spaces/é/%2F/.."
    again = b.update_control(
        group, 1, seen.resume().pin(odd, "m-1").drain_member("m:2@h").with_threshold(2.5)
    )
    assert again.version == 2
    assert a.state(group).control == again
    assert dict(again.pins) == {odd: "m-1"} and again.drain == {"m:2@h"}
    assert again.imbalance_threshold == 2.5 and again.mode is ControlMode.ACTIVE


def test_the_record_is_read_alone_with_its_progress_requests(
    open_store: Callable[[], Backend], group: str
) -> None:
    """``control(group)`` is the record of ``state(group)``, progress requests included; a
    group with no record (or none at all) reads the default one."""
    a, b = open_store(), open_store()
    assert b.control(group) == Control()
    odd = "s3://bucket/prefix with spaces/é"
    request = '{"action":"reset","after":"a b.csv","id":"x1"}'
    stored = a.update_control(group, 0, Control().with_request(odd, request).pause())
    assert b.control(group) == stored == b.state(group).control
    assert dict(b.control(group).requests) == {odd: request}
    taken = stored.without_request(odd, request)
    assert taken is not None and stored.without_request(odd, "another") is None
    a.update_control(group, stored.version, taken)
    assert dict(b.control(group).requests) == {} and b.control(group).version == 2


def test_a_write_from_a_stale_version_is_refused_and_changes_nothing(
    open_store: Callable[[], Backend], group: str
) -> None:
    a, b = open_store(), open_store()
    first = a.update_control(group, 0, Control().pause())
    with pytest.raises(ControlConflict, match="version 1, not 0"):
        b.update_control(group, 0, Control().request_rebalance())
    with pytest.raises(ControlConflict, match="version 1, not 5"):
        b.update_control(group, 5, Control().request_rebalance())
    assert b.state(group).control == first


def test_concurrent_writers_from_one_version_have_exactly_one_winner(
    open_store: Callable[[], Backend], group: str
) -> None:
    handles = [open_store() for _ in range(4)]
    handles[0].update_control(group, 0, Control().pause())
    start = threading.Barrier(len(handles))
    outcomes: list[str] = []
    lock = threading.Lock()

    def write(k: int, store: Backend) -> None:
        start.wait(10)
        try:
            store.update_control(group, 1, Control(version=1).pin(f"r{k}", f"m{k}"))
            result = f"won r{k}"
        except ControlConflict:
            result = "lost"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=write, args=(k, s)) for k, s in enumerate(handles)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(outcomes) == len(handles) and len(winners) == 1, outcomes
    final = handles[0].state(group).control
    assert final.version == 2 and [f"won {r}" for r in final.pins] == winners


def test_the_record_lives_beside_members_and_survives_their_sessions(
    store: Backend, group: str
) -> None:
    session = store.join(group, "m1", info={}, ttl=TTL, static=False)
    store.update_control(group, 0, Control().drain_member("m1"))
    state = store.state(group)
    assert set(state.members) == {"m1"} and state.control.drain == {"m1"}
    store.leave(session)
    assert store.state(group).control.drain == {"m1"}


def test_a_control_change_wakes_the_watchers(open_store: Callable[[], Backend], group: str) -> None:
    a, b = open_store(), open_store()
    a.update_resources(group, replace=[Resource("a")])
    watch = a.watch(group)
    try:
        while watch.wait(0.05):  # absorb wake-ups from the setup
            pass
        woke = threading.Event()

        def waiter() -> None:
            if watch.wait(10):
                woke.set()

        thread = threading.Thread(target=waiter)
        thread.start()
        b.update_control(group, 0, Control().pause())
        thread.join(10)
        assert woke.is_set(), "the watch slept through a control change"
    finally:
        watch.close()
