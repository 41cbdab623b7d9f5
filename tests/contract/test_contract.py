"""The backend contract suite: every backend passes these tests unchanged.

Each test opens independent handles on one store (as separate processes would) and checks one
promise of :mod:`rebalancer_spark.backends.base`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from rebalancer_spark.backends import Backend, Session
from rebalancer_spark.backends.base import Interest
from rebalancer_spark.core.errors import FencedError, MemberIdInUse, SessionExpired
from rebalancer_spark.core.model import Phase, Resource, grant_epochs
from rebalancer_spark.core.protocols import MemberView
from tests.support.helpers import quiet, wait_for

TTL = 30.0
SHORT_TTL = 0.6


def _join(store: Backend, group: str, member: str, ttl: float = TTL) -> Session:
    return store.join(group, member, info={"host": "test"}, ttl=ttl, static=False)


def _lead(store: Backend, session: Session) -> int:
    record = store.elect(session)
    assert record is not None and record.session_id == session.session_id
    return record.epoch


def _setup(
    store: Backend, group: str, members: list[str], resources: list[str]
) -> tuple[dict[str, Session], int, int]:
    """Join members, make the first coordinator, publish a round-robin target of resources.
    Returns the sessions, the coordinator epoch and the target generation."""
    sessions = {m: _join(store, group, m) for m in members}
    epoch = _lead(store, sessions[members[0]])
    version = store.update_resources(group, replace=[Resource(r) for r in resources])
    assignment = {
        m: [r for i, r in enumerate(resources) if i % len(members) == k]
        for k, m in enumerate(members)
    }
    target = store.publish(
        sessions[members[0]], epoch, assignment, phase=Phase.RUNNING, resources_version=version
    )
    return sessions, epoch, target.generation


# -- sessions -----------------------------------------------------------------------------


def test_join_makes_a_live_member_visible_to_other_handles(
    open_store: Callable[[], Backend], group: str
) -> None:
    a, b = open_store(), open_store()
    session = a.join(group, "m1", info={"host": "h1", "pid": "7"}, ttl=TTL, static=True)
    state = b.state(group)
    assert set(state.members) == {"m1"}
    record = state.members["m1"]
    assert record.session_id == session.session_id
    assert record.info == {"host": "h1", "pid": "7"}
    assert record.static and not record.leaving


def test_a_live_member_id_cannot_join_twice(open_store: Callable[[], Backend], group: str) -> None:
    a, b = open_store(), open_store()
    _join(a, group, "m1")
    with pytest.raises(MemberIdInUse, match="'m1'"):
        _join(b, group, "m1")


def test_a_member_id_is_free_again_after_leave(store: Backend, group: str) -> None:
    first = _join(store, group, "m1")
    store.leave(first)
    store.leave(first)  # idempotent
    second = _join(store, group, "m1")
    assert second.session_id != first.session_id
    assert store.state(group).members["m1"].session_id == second.session_id


def test_an_expired_lease_removes_the_member_and_cannot_be_renewed(
    store: Backend, group: str
) -> None:
    session = _join(store, group, "m1", ttl=SHORT_TTL)
    store.renew(session)
    wait_for(lambda: "m1" not in store.state(group).members, timeout=5, what="lease expiry")
    with pytest.raises(SessionExpired):
        store.renew(session)
    with pytest.raises(SessionExpired):
        store.member_view(session)
    # The id is free again for a new session.
    assert _join(store, group, "m1").session_id != session.session_id


def test_renewal_keeps_a_short_lease_alive(store: Backend, group: str) -> None:
    session = _join(store, group, "m1", ttl=SHORT_TTL)
    end = time.monotonic() + 3 * SHORT_TTL
    while time.monotonic() < end:
        store.renew(session)
        assert "m1" in store.state(group).members
        time.sleep(SHORT_TTL / 6)  # the heartbeat cadence under test, not synchronisation


def test_set_leaving_marks_the_member(store: Backend, group: str) -> None:
    session = _join(store, group, "m1")
    store.set_leaving(session)
    assert store.state(group).members["m1"].leaving


# -- coordinator election and fencing ----------------------------------------------------------


def test_first_elected_wins_and_others_see_it(store: Backend, group: str) -> None:
    s1, s2 = _join(store, group, "m1"), _join(store, group, "m2")
    epoch = _lead(store, s1)
    seen = store.elect(s2)
    assert seen is not None and seen.member_id == "m1" and seen.epoch == epoch
    state = store.state(group)
    assert state.coordinator is not None and state.coordinator.member_id == "m1"


def test_epoch_grows_with_every_new_coordinator(store: Backend, group: str) -> None:
    epochs = []
    for i in range(4):
        session = _join(store, group, f"m{i}")
        epochs.append(_lead(store, session))
        store.leave(session)
    assert epochs == sorted(epochs) and len(set(epochs)) == 4


def test_coordinator_of_an_expired_session_is_replaced(store: Backend, group: str) -> None:
    s1 = _join(store, group, "m1", ttl=SHORT_TTL)
    s2 = _join(store, group, "m2")
    e1 = _lead(store, s1)
    wait_for(lambda: store.state(group).coordinator is None, timeout=5, what="coordinator expiry")
    e2 = _lead(store, s2)
    assert e2 > e1


def test_publish_is_fenced_by_epoch_and_session(store: Backend, group: str) -> None:
    s1, s2 = _join(store, group, "m1"), _join(store, group, "m2")
    e1 = _lead(store, s1)
    store.publish(s1, e1, {"m1": ["r"]}, phase=Phase.RUNNING, resources_version=0)
    with pytest.raises(FencedError, match="epoch"):
        store.publish(s2, e1, {"m2": ["r"]}, phase=Phase.RUNNING, resources_version=0)
    store.resign(s1, e1)
    e2 = _lead(store, s2)
    with pytest.raises(FencedError):
        store.publish(s1, e1, {"m1": ["r"]}, phase=Phase.RUNNING, resources_version=0)
    target = store.publish(s2, e2, {"m2": ["r"]}, phase=Phase.RUNNING, resources_version=0)
    state = store.state(group)
    assert state.target is not None
    assert state.target.assignment == {"m2": frozenset({"r"})}
    assert state.target.generation == target.generation
    assert state.target.coordinator_epoch == e2


def test_target_generations_grow_and_keep_empty_members(store: Backend, group: str) -> None:
    s1 = _join(store, group, "m1")
    e = _lead(store, s1)
    g1 = store.publish(
        s1, e, {"m1": ["a", "b"], "m2": []}, phase=Phase.RUNNING, resources_version=3
    ).generation
    g2 = store.publish(
        s1, e, {"m1": ["b"], "m2": ["a"]}, phase=Phase.STOPPING, resources_version=4
    ).generation
    assert g2 == g1 + 1
    target = store.state(group).target
    assert target is not None
    assert target.assignment == {"m1": frozenset({"b"}), "m2": frozenset({"a"})}
    assert target.phase is Phase.STOPPING and target.resources_version == 4
    store.publish(s1, e, {"m1": ["a", "b"], "m2": []}, phase=Phase.RUNNING, resources_version=4)
    target = store.state(group).target
    assert target is not None and target.assignment["m2"] == frozenset()


# -- resources -----------------------------------------------------------------------------


def test_resource_set_changes_bump_the_version_only_when_it_changes(
    store: Backend, group: str
) -> None:
    v1 = store.update_resources(group, replace=[Resource("a"), Resource("b", 2.0)])
    assert store.update_resources(group, replace=[Resource("a"), Resource("b", 2.0)]) == v1
    v2 = store.update_resources(group, add=[Resource("c")], remove=["a"])
    assert v2 > v1
    state = store.state(group)
    assert state.resources == {"b": Resource("b", 2.0), "c": Resource("c")}
    assert state.resources_version == v2
    assert store.update_resources(group, remove=["zzz"]) == v2


def test_resource_ids_with_slashes_and_unicode_round_trip(store: Backend, group: str) -> None:
    ids = ["raw/orders/2024/", "../../etc", "ключ/значение", "a:b*c?d", "x" * 1024]
    store.update_resources(group, replace=[Resource(i) for i in ids])
    assert set(store.state(group).resources) == set(ids)


# -- claims ----------------------------------------------------------------------------------


def test_claims_follow_the_target_and_grant_increasing_epochs(store: Backend, group: str) -> None:
    sessions, _, gen = _setup(store, group, ["m1", "m2"], ["a", "b", "c", "d"])
    granted = store.claim(sessions["m1"], ["a", "b", "c"], gen)
    assert grant_epochs(granted) == {"a": 1, "c": 1}  # b is m2's
    assert grant_epochs(store.claim(sessions["m1"], ["a"], gen)) == {"a": 1}  # idempotent
    state = store.state(group)
    assert {r: c.member_id for r, c in state.claims.items()} == {"a": "m1", "c": "m1"}
    view = store.member_view(sessions["m1"])
    assert view.generation == gen and view.target == {"a", "c"} and view.owned == {"a": 1, "c": 1}


def test_a_view_asked_without_the_claims_is_the_same_view_without_them(
    store: Backend, group: str
) -> None:
    # A member that knows its claims asks without them: the same target, generation, phase
    # and coordinator epoch, also when the part is brought up to date from a kept one.
    sessions, epoch, gen = _setup(store, group, ["m1", "m2"], ["a", "b", "c", "d"])
    store.claim(sessions["m1"], ["a", "c"], gen)
    for _ in range(2):  # the part read whole, then kept
        full = store.member_view(sessions["m1"])
        bare = store.member_view(sessions["m1"], claims=False)
        assert full.owned == {"a": 1, "c": 1} and bare.owned is None
        assert bare == MemberView(
            full.generation, full.phase, full.target, None, full.coordinator_epoch
        )
    moved = store.publish(
        sessions["m1"],
        epoch,
        {"m1": ["a", "b", "c"], "m2": ["d"]},
        phase=Phase.RUNNING,
        resources_version=0,
        previous=store.target(group),
    )
    bare = store.member_view(sessions["m1"], claims=False)
    assert bare.generation == moved.generation and bare.owned is None
    assert bare.target == {"a", "b", "c"}
    assert store.member_view(sessions["m1"]).owned == {"a": 1, "c": 1}


def test_a_view_of_thousands_of_claims_lists_each_with_its_epoch(
    store: Backend, group: str
) -> None:
    # Stores read a member's claims in batches (Redis: a thousand per HMGET; ZooKeeper: the
    # claims its own requests created): the edges of those batches lose nothing.
    resources = [f"r{i:05d}" for i in range(2600)]
    sessions, _, gen = _setup(store, group, ["m1", "m2"], resources)
    mine = resources[::2]
    assert len(store.claim(sessions["m1"], mine, gen)) == 1300
    store.release(sessions["m1"], dict.fromkeys(mine[:300], 1))
    again = store.claim(sessions["m1"], mine[:100], gen)
    assert grant_epochs(again) == dict.fromkeys(mine[:100], 2)
    view = store.member_view(sessions["m1"])
    expected = dict.fromkeys(mine[300:], 1) | dict.fromkeys(mine[:100], 2)
    assert view.owned == expected and view.target == frozenset(mine)


def test_a_claim_held_by_a_live_session_is_not_granted_until_released(
    store: Backend, group: str
) -> None:
    sessions, epoch, gen = _setup(store, group, ["m1", "m2"], ["a", "b"])
    assert grant_epochs(store.claim(sessions["m1"], ["a"], gen)) == {"a": 1}
    moved = store.publish(
        sessions["m1"],
        epoch,
        {"m1": [], "m2": ["a", "b"]},
        phase=Phase.RUNNING,
        resources_version=0,
    ).generation
    assert grant_epochs(store.claim(sessions["m2"], ["a", "b"], moved)) == {"b": 1}
    store.release(sessions["m1"], {"a": 7})  # wrong epoch: ignored
    assert grant_epochs(store.claim(sessions["m2"], ["a"], moved)) == {}
    store.release(sessions["m1"], {"a": 1})
    assert grant_epochs(store.claim(sessions["m2"], ["a"], moved)) == {"a": 2}


def test_a_claim_of_an_expired_session_is_granted_again(store: Backend, group: str) -> None:
    s1 = _join(store, group, "m1", ttl=SHORT_TTL)
    s2 = _join(store, group, "m2")
    e = _lead(store, s2)
    g = store.publish(
        s2, e, {"m1": ["a"], "m2": []}, phase=Phase.RUNNING, resources_version=0
    ).generation
    assert grant_epochs(store.claim(s1, ["a"], g)) == {"a": 1}
    g2 = store.publish(s2, e, {"m2": ["a"]}, phase=Phase.RUNNING, resources_version=0).generation
    assert grant_epochs(store.claim(s2, ["a"], g2)) == {}
    wait_for(lambda: store.claim(s2, ["a"], g2), timeout=5, what="claim after holder expiry")
    assert store.state(group).claims["a"].epoch == 2


def test_claims_need_the_current_generation_and_a_running_phase(store: Backend, group: str) -> None:
    sessions, epoch, gen = _setup(store, group, ["m1"], ["a"])
    assert grant_epochs(store.claim(sessions["m1"], ["a"], gen - 1)) == {}
    stopping = store.publish(
        sessions["m1"], epoch, {"m1": ["a"]}, phase=Phase.STOPPING, resources_version=0
    ).generation
    assert grant_epochs(store.claim(sessions["m1"], ["a"], stopping)) == {}
    running = store.publish(
        sessions["m1"], epoch, {"m1": ["a"]}, phase=Phase.RUNNING, resources_version=0
    ).generation
    assert grant_epochs(store.claim(sessions["m1"], ["a"], running)) == {"a": 1}


def test_leave_releases_claims(store: Backend, group: str) -> None:
    sessions, _, gen = _setup(store, group, ["m1"], ["a", "b"])
    assert grant_epochs(store.claim(sessions["m1"], ["a", "b"], gen)) == {"a": 1, "b": 1}
    store.leave(sessions["m1"])
    assert store.state(group).claims == {}


def test_acknowledgements_are_recorded(store: Backend, group: str) -> None:
    sessions, _, gen = _setup(store, group, ["m1", "m2"], ["a"])
    store.acknowledge(sessions["m2"], gen)
    state = store.state(group)
    assert state.members["m2"].acked_generation == gen
    assert state.members["m1"].acked_generation == 0


# -- progress commits, fenced ----------------------------------------------------------------


def test_commit_is_accepted_from_the_owner_and_handed_to_the_next(
    store: Backend, group: str
) -> None:
    sessions, _, gen = _setup(store, group, ["m1", "m2"], ["a"])
    assert grant_epochs(store.claim(sessions["m1"], ["a"], gen)) == {"a": 1}
    store.commit(sessions["m1"], "a", 1, {"files": ["f1", "f2"]})
    progress = store.progress(group, ["a", "missing"])
    assert set(progress) == {"a"}
    assert progress["a"].value == {"files": ["f1", "f2"]}
    assert progress["a"].epoch == 1 and progress["a"].member_id == "m1"


def test_a_stale_owner_cannot_commit(store: Backend, group: str) -> None:
    sessions, epoch, gen = _setup(store, group, ["m1", "m2"], ["a"])
    store.claim(sessions["m1"], ["a"], gen)
    store.commit(sessions["m1"], "a", 1, 1)
    store.release(sessions["m1"], {"a": 1})
    with pytest.raises(FencedError, match="epoch 1"):
        store.commit(sessions["m1"], "a", 1, 2)
    g2 = store.publish(
        sessions["m1"], epoch, {"m2": ["a"], "m1": []}, phase=Phase.RUNNING, resources_version=0
    ).generation
    assert grant_epochs(store.claim(sessions["m2"], ["a"], g2)) == {"a": 2}
    with pytest.raises(FencedError, match="'m2' at epoch 2"):
        store.commit(sessions["m1"], "a", 1, 3)
    with pytest.raises(FencedError):
        store.commit(sessions["m2"], "a", 1, 3)  # right member, wrong epoch
    store.commit(sessions["m2"], "a", 2, 4)
    assert store.progress(group, ["a"])["a"].value == 4


def test_an_expired_session_cannot_commit(store: Backend, group: str) -> None:
    s1 = _join(store, group, "m1", ttl=SHORT_TTL)
    e = _lead(store, s1)
    g = store.publish(s1, e, {"m1": ["a"]}, phase=Phase.RUNNING, resources_version=0).generation
    store.claim(s1, ["a"], g)
    store.commit(s1, "a", 1, "ok")
    wait_for(lambda: "m1" not in store.state(group).members, timeout=5, what="lease expiry")
    with pytest.raises(FencedError):
        store.commit(s1, "a", 1, "late")
    assert store.progress(group, ["a"])["a"].value == "ok"


# -- notifications ---------------------------------------------------------------------------


def test_watch_wakes_on_a_change_made_through_another_handle(
    open_store: Callable[[], Backend], group: str
) -> None:
    a, b = open_store(), open_store()
    a.update_resources(group, replace=[Resource("a")])
    watch = a.watch(group)
    try:
        assert watch.wait(0.05) is False
        woke = threading.Event()

        def waiter() -> None:
            if watch.wait(10):
                woke.set()

        thread = threading.Thread(target=waiter)
        thread.start()
        b.update_resources(group, add=[Resource("b")])
        thread.join(10)
        assert woke.is_set()
    finally:
        watch.close()


def test_watch_wakes_when_a_lease_runs_out(store: Backend, group: str) -> None:
    _join(store, group, "m1", ttl=SHORT_TTL)
    watch = store.watch(group)
    try:
        started = time.monotonic()
        while "m1" in store.state(group).members:
            assert time.monotonic() - started < 5, "the lease never expired"
            watch.wait(5)
        assert time.monotonic() - started < SHORT_TTL + 1.0
    finally:
        watch.close()


def test_watch_wakes_when_a_lease_runs_out_while_others_keep_writing(
    open_store: Callable[[], Backend], group: str
) -> None:
    store, other = open_store(), open_store()
    _join(store, group, "dies", ttl=SHORT_TTL)
    lives = _join(other, group, "lives", ttl=TTL)
    stop = threading.Event()

    def keep_renewing() -> None:
        while not stop.wait(0.01):
            other.renew(lives)

    renewer = threading.Thread(target=keep_renewing)
    renewer.start()
    watch = store.watch(group)
    try:
        started = time.monotonic()
        while "dies" in store.state(group).members:
            assert time.monotonic() - started < 5, "the lease never expired"
            assert watch.wait(5), "the watch slept through a lease expiry until its timeout"
        # Woken by the expiry itself, not by the 5 s timeout.
        assert time.monotonic() - started < SHORT_TTL + 1.0
    finally:
        stop.set()
        renewer.join()
        watch.close()


def test_a_focused_watch_still_wakes_for_what_its_interest_covers(
    open_store: Callable[[], Backend], group: str
) -> None:
    """Focusing may hold back changes the interest does not cover (Redis and ZooKeeper do),
    never one it covers: a member's watch wakes for a new target and for the release of a
    resource its target gives it that it asked for; a follower's watch for the coordinator
    leaving, whether it watches members coming too (SUCCESSION) or not (COORDINATOR)."""
    a, b = open_store(), open_store()
    s1 = _join(a, group, "m1")
    s2 = _join(b, group, "m2")
    e = _lead(a, s1)
    g1 = a.publish(s1, e, {"m1": ["x", "y"], "m2": []}, phase=Phase.RUNNING, resources_version=0)
    a.claim(s1, ["x", "y"], g1.generation)
    member, follower, alone = b.watch(group), b.watch(group), b.watch(group)
    try:
        member.focus(Interest.MEMBER, "m2")
        follower.focus(Interest.SUCCESSION)
        alone.focus(Interest.COORDINATOR)
        assert not any(w.wait(0.05) for w in (member, follower, alone))
        g2 = a.publish(s1, e, {"m1": ["y"], "m2": ["x"]}, phase=Phase.RUNNING, resources_version=0)
        assert member.wait(5), "a new target"
        assert b.claim(s2, ["x"], g2.generation) == {}  # m1 holds it still
        a.release(s1, {"x": 1})
        assert member.wait(5), "the release of a resource its target gives it"
        # A narrowed ZooKeeper watch keeps its first, wider registration until it fires
        # once: a join fires it, so that only the coordinator's going can wake ``alone``.
        _join(a, group, "m3")
        quiet(alone)
        a.leave(s1)
        assert follower.wait(5), "the coordinator left"
        assert alone.wait(5), "the coordinator left"
    finally:
        for watch in (member, follower, alone):
            watch.close()


def test_a_follower_s_watch_wakes_when_the_resource_set_changes(
    open_store: Callable[[], Backend], group: str
) -> None:
    """A follower remembers the resource set so that it can declare it again into a store
    that lost the group (``GroupReader``), so its watch wakes when the set changes, whether it
    watches members coming too (SUCCESSION) or not (COORDINATOR)."""
    a, b = open_store(), open_store()
    s1 = _join(a, group, "m1")
    _join(b, group, "m2")
    _lead(a, s1)
    a.update_resources(group, replace=[Resource("x")])
    follower, alone = b.watch(group), b.watch(group)
    try:
        follower.focus(Interest.SUCCESSION)
        alone.focus(Interest.COORDINATOR)
        # A narrowed ZooKeeper watch keeps its first, wider registration until it fires once:
        # a join fires it, so that only what the interest covers can wake the watches after.
        _join(a, group, "m3")
        for watch in (follower, alone):
            quiet(watch)
        a.update_resources(group, add=[Resource("y")])
        assert follower.wait(5), "the resource set changed"
        assert alone.wait(5), "the resource set changed"
    finally:
        for watch in (follower, alone):
            watch.close()


def test_update_info_replaces_what_the_member_publishes_while_it_lives(
    open_store: Callable[[], Backend], group: str
) -> None:
    a, b = open_store(), open_store()
    session = a.join(group, "m1", info={"host": "h1"}, ttl=TTL, static=False)
    a.update_info(session, {"host": "h1", "audit_backlog": "3"})
    assert b.state(group).members["m1"].info == {"host": "h1", "audit_backlog": "3"}
    a.leave(session)
    with pytest.raises(SessionExpired):
        a.update_info(session, {"host": "h1"})
