"""What every backend promises alike through the shared front (:class:`Backend`'s public
methods): the progress a grant hands over, refusals that carry their facts, a closed handle,
claims under a broken target, and which writes wake a watch. Once here, for every backend."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from rebalancer_spark.backends import Backend, Session
from rebalancer_spark.core.errors import (
    BackendUnavailable,
    ConfigurationError,
    FencedError,
    MemberIdInUse,
    SessionExpired,
)
from rebalancer_spark.core.model import Grant, Phase, Progress, Resource

TTL = 30.0


def _join(store: Backend, group: str, member: str, ttl: float = TTL) -> Session:
    return store.join(group, member, info={"host": "test"}, ttl=ttl, static=False)


def _lead(store: Backend, session: Session) -> int:
    record = store.elect(session)
    assert record is not None and record.session_id == session.session_id
    return record.epoch


def _give(store: Backend, coordinator: Session, epoch: int, owner: str, other: str) -> int:
    """Publish a target giving resource ``r`` to ``owner``; its generation."""
    assignment = {owner: ["r"], other: []}
    return store.publish(
        coordinator, epoch, assignment, phase=Phase.RUNNING, resources_version=0
    ).generation


def _handed(grants: dict[str, Grant]) -> Progress | None:
    assert set(grants) == {"r"}, grants
    return grants["r"].progress


# -- a grant hands over the progress --------------------------------------------------------


def test_a_grant_hands_over_the_last_accepted_progress(
    open_store: Callable[[], Backend], group: str
) -> None:
    a, b = open_store(), open_store()
    s1, s2 = _join(a, group, "m1"), _join(b, group, "m2")
    epoch = _lead(a, s1)
    gen = _give(a, s1, epoch, "m1", "m2")
    assert _handed(a.claim(s1, ["r"], gen)) is None  # never committed
    a.commit(s1, "r", 1, {"offset": 5})
    # Held already: the grant that gave it, with the progress as it is now.
    assert _handed(a.claim(s1, ["r"], gen)) == Progress("r", {"offset": 5}, 1, "m1")
    a.release(s1, {"r": 1})
    assert _handed(a.claim(s1, ["r"], gen)) == Progress("r", {"offset": 5}, 1, "m1")
    a.release(s1, {"r": 2})
    gen = _give(a, s1, epoch, "m2", "m1")
    assert _handed(b.claim(s2, ["r"], gen)) == Progress("r", {"offset": 5}, 1, "m1")
    b.commit(s2, "r", 3, {"offset": 6})
    b.release(s2, {"r": 3})
    gen = _give(a, s1, epoch, "m1", "m2")
    assert _handed(a.claim(s1, ["r"], gen)) == Progress("r", {"offset": 6}, 3, "m2")
    a.leave(s1)  # its claim ends with its session; the next grant hands over the same value
    gen = _give(b, s2, _lead(b, s2), "m2", "m1")
    grants = b.claim(s2, ["r"], gen)
    assert grants["r"].epoch == 5
    assert _handed(grants) == Progress("r", {"offset": 6}, 3, "m2")
    assert b.progress(group, ["r"]) == {"r": Progress("r", {"offset": 6}, 3, "m2")}


def test_each_grant_of_a_batch_hands_over_its_own_progress(store: Backend, group: str) -> None:
    s1 = _join(store, group, "m1")
    epoch = _lead(store, s1)
    ids = [f"r{i}" for i in range(30)]
    gen = store.publish(s1, epoch, {"m1": ids}, phase=Phase.RUNNING, resources_version=0).generation
    first = store.claim(s1, ids, gen)
    assert set(first) == set(ids) and all(g.progress is None for g in first.values())
    for i, r in enumerate(ids):
        if i % 2:
            store.commit(s1, r, 1, i)
    store.release(s1, {r: 1 for r in ids})
    again = store.claim(s1, [*ids, *ids], gen)  # duplicates are asked for once
    assert {r: None if g.progress is None else g.progress.value for r, g in again.items()} == {
        r: (i if i % 2 else None) for i, r in enumerate(ids)
    }


# -- refusals carry their facts ---------------------------------------------------------------


def test_a_refused_commit_names_the_writer_the_resource_and_both_epochs(
    open_store: Callable[[], Backend], group: str
) -> None:
    a, b = open_store(), open_store()
    s1, s2 = _join(a, group, "m1"), _join(b, group, "m2")
    epoch = _lead(a, s1)
    a.claim(s1, ["r"], _give(a, s1, epoch, "m1", "m2"))
    a.release(s1, {"r": 1})
    b.claim(s2, ["r"], _give(a, s1, epoch, "m2", "m1"))
    with pytest.raises(FencedError) as refused:
        a.commit(s1, "r", 1, {"late": True})
    error = refused.value
    assert (error.write, error.group, error.member, error.resource) == ("commit", group, "m1", "r")
    assert (error.epoch, error.holder, error.current_epoch) == (1, "m2", 2)
    message = str(error)
    for fact in (repr(group), "'m1'", "'r'", "epoch 1", "'m2' at epoch 2", "stop working"):
        assert fact in message, (fact, message)


def test_a_refused_coordinator_write_names_the_writer_and_the_coordinator_now(
    open_store: Callable[[], Backend], group: str
) -> None:
    a, b = open_store(), open_store()
    s1, s2 = _join(a, group, "m1"), _join(b, group, "m2")
    e1 = _lead(a, s1)
    a.resign(s1, e1)
    e2 = _lead(b, s2)
    with pytest.raises(FencedError) as refused:
        a.publish(s1, e1, {"m1": ["r"]}, phase=Phase.RUNNING, resources_version=0)
    error = refused.value
    assert (error.write, error.group, error.member, error.epoch) == (
        "coordinator",
        group,
        "m1",
        e1,
    )
    assert (error.holder, error.current_epoch) == ("m2", e2)
    message = str(error)
    for fact in (repr(group), "'m1'", f"epoch {e1}", f"'m2' at epoch {e2}", "stepped down"):
        assert fact in message, (fact, message)


def test_an_ended_session_is_refused_naming_the_session(store: Backend, group: str) -> None:
    session = _join(store, group, "m1")
    store.leave(session)
    with pytest.raises(SessionExpired) as refused:
        store.renew(session)
    error = refused.value
    assert (error.group, error.member, error.session) == (group, "m1", session.session_id)
    assert error.why
    message = str(error)
    for fact in (repr(group), "'m1'", session.session_id, "rejoin"):
        assert fact in message, (fact, message)


def test_a_duplicate_member_id_names_the_holder(
    open_store: Callable[[], Backend], group: str
) -> None:
    a, b = open_store(), open_store()
    a.join(group, "m1", info={"host": "h1", "pid": "42"}, ttl=TTL, static=True)
    with pytest.raises(MemberIdInUse, match=r"'m1'.*host h1, pid 42.*--member-id") as refused:
        _join(b, group, "m1")
    error = refused.value
    assert (error.group, error.member, error.host, error.pid) == (group, "m1", "h1", "42")


def test_refusals_survive_pickling_with_their_facts(
    open_store: Callable[[], Backend], group: str
) -> None:
    import pickle

    a, b = open_store(), open_store()
    a.join(group, "m1", info={"host": "h1", "pid": "42"}, ttl=TTL, static=True)
    with pytest.raises(MemberIdInUse) as refused:
        _join(b, group, "m1")
    copy = pickle.loads(pickle.dumps(refused.value))  # noqa: S301 (our own bytes)
    assert (str(copy), copy.member, copy.host) == (str(refused.value), "m1", "h1")


# -- what the front refuses before any backend sees it -----------------------------------------


@pytest.mark.parametrize("resource", ["", "a\x00b", "a\nb", "x" * 1025, "\ud800"])
def test_a_bad_resource_id_is_refused_by_every_call_naming_it(
    store: Backend, group: str, resource: str
) -> None:
    session = _join(store, group, "m1")
    epoch = _lead(store, session)
    calls: list[tuple[str, Callable[[], object]]] = [
        ("claim", lambda: store.claim(session, ["ok", resource], 1)),
        ("commit", lambda: store.commit(session, resource, 1, {})),
        ("release", lambda: store.release(session, {resource: 1})),
        ("progress", lambda: store.progress(group, [resource])),
        ("update_resources", lambda: store.update_resources(group, remove=[resource])),
        (
            "publish",
            lambda: store.publish(
                session, epoch, {"m1": [resource]}, phase=Phase.RUNNING, resources_version=0
            ),
        ),
    ]
    for call, fn in calls:
        with pytest.raises(ConfigurationError, match="resource id") as refused:
            fn()
        assert repr(resource)[1:12] in str(refused.value), (call, str(refused.value))
    assert store.state(group).target is None  # nothing reached the store


def test_progress_that_would_not_read_back_is_refused_before_the_store(
    store: Backend, group: str
) -> None:
    session = _join(store, group, "m1")
    for bad in ({1: "int key"}, ("a", "tuple"), float("nan"), "x" * 600_000):
        with pytest.raises(ConfigurationError, match="progress for resource 'r'"):
            store.commit(session, "r", 1, bad)


# -- handles and claims -------------------------------------------------------------------------


def test_a_closed_handle_refuses_calls(open_store: Callable[[], Backend], group: str) -> None:
    handle = open_store()
    handle.close()
    handle.close()
    with pytest.raises(BackendUnavailable, match="closed"):
        handle.state(group)


def test_concurrent_handles_claim_each_resource_once(
    open_store: Callable[[], Backend], group: str
) -> None:
    a, b = open_store(), open_store()
    s1, s2 = _join(a, group, "m1"), _join(b, group, "m2")
    epoch = _lead(a, s1)
    gen = a.publish(
        s1, epoch, {"m1": ["x"], "m2": ["x"]}, phase=Phase.RUNNING, resources_version=0
    ).generation  # a broken target giving x to both: the store still grants it once
    results: list[dict[str, Grant]] = []
    threads = [
        threading.Thread(target=lambda h=h, s=s: results.append(h.claim(s, ["x"], gen)))
        for h, s in ((a, s1), (b, s2))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(len(r) for r in results) == [0, 1]


# -- what wakes a watch ---------------------------------------------------------------------


def test_renewals_wake_nobody_and_every_change_wakes_the_watch_at_once(
    open_store: Callable[[], Backend], group: str
) -> None:
    a, b = open_store(), open_store()
    session = _join(a, group, "m1")
    watch = b.watch(group)
    try:
        for _ in range(5):
            a.renew(session)
        assert watch.wait(0.3) is False, "a renewal woke the watch"
        for change in (
            lambda: a.update_resources(group, add=[Resource("x")]),
            lambda: a.elect(session),
            lambda: a.set_leaving(session),
            lambda: a.leave(session),
        ):
            started = time.monotonic()
            change()
            assert watch.wait(5), "a change did not wake the watch"
            assert time.monotonic() - started < 1.0
    finally:
        watch.close()


# -- the coordinator's partial reads agree with the whole snapshot ----------------------------


def _agree(store: Backend, group: str) -> None:
    whole = store.state(group)
    head = store.head(group)
    assert head.members == whole.members
    assert head.coordinator == whole.coordinator
    assert head.control == whole.control
    assert head.resources_version == whole.resources_version
    assert head.generation == (whole.target.generation if whole.target else 0)
    assert store.resources(group) == (whole.resources_version, dict(whole.resources))
    assert store.target(group) == whole.target


def test_head_resources_target_and_holders_agree_with_the_snapshot(
    open_store: Callable[[], Backend], group: str
) -> None:
    a, b = open_store(), open_store()
    _agree(a, group)  # a group that does not exist yet
    assert a.head(group).members == {} and a.target(group) is None
    s1, s2 = _join(a, group, "m1"), _join(b, group, "m2")
    epoch = _lead(a, s1)
    _agree(a, group)
    version = a.update_resources(group, replace=[Resource("r", 2.0), Resource("q")])
    _agree(b, group)
    assert a.resources(group)[0] == version == a.head(group).resources_version
    # A follower's read: the version, and the set remembered (to declare it again into a
    # store that lost the group), whether built now or when needed.
    assert b.remember_resources(group) == version
    assert sorted(b.epochs.resources(group)) == [Resource("q"), Resource("r", 2.0)]
    gen = a.publish(
        s1, epoch, {"m1": ["r"], "m2": ["q"]}, phase=Phase.RUNNING, resources_version=version
    ).generation
    _agree(b, group)
    assert b.head(group).generation == gen
    sessions = {"m1": s1.session_id, "m2": s2.session_id}
    assert a.holders(group, sessions) == frozenset()
    a.claim(s1, ["r"], gen)
    assert a.holders(group, sessions) == {"m1"}
    b.claim(s2, ["q"], gen)
    assert b.holders(group, sessions) == {"m1", "m2"}
    assert b.holders(group, {"m2": s2.session_id}) == {"m2"}
    a.release(s1, {"r": 1})
    assert a.holders(group, sessions) == {"m2"}
    assert a.holders(group, {}) == frozenset()
    _agree(a, group)


def test_a_target_published_as_a_change_reads_back_whole(
    open_store: Callable[[], Backend], group: str
) -> None:
    """``publish(previous=…)`` writes the difference where the store still holds that
    generation, and the whole target where it does not: either way the target reads back as
    the assignment given."""
    store, other = open_store(), open_store()
    s1 = _join(store, group, "m1")
    s2 = _join(other, group, "m2")
    epoch = _lead(store, s1)
    ids = [f"r{i}" for i in range(30)]
    first = store.publish(
        s1, epoch, {"m1": ids[:20], "m2": ids[20:]}, phase=Phase.RUNNING, resources_version=0
    )
    # m2 joins a third member's share, m1 gives some up, one id vanishes, one is new.
    wanted = {"m1": ids[:12], "m2": [*ids[20:], *ids[12:18]], "m3": [*ids[18:19], "new"]}
    second = store.publish(
        s1, epoch, wanted, phase=Phase.RUNNING, resources_version=0, previous=first
    )
    assert second.generation == first.generation + 1
    read = other.target(group)
    assert read is not None and read.generation == second.generation
    assert {m: set(rs) for m, rs in read.assignment.items()} == {
        m: set(rs) for m, rs in wanted.items()
    }
    # A member dropped from the target, from a stale base (first, not second): written whole.
    third = store.publish(
        s1, epoch, {"m1": ids[:25]}, phase=Phase.RUNNING, resources_version=0, previous=first
    )
    read = other.target(group)
    assert read is not None and read.generation == third.generation
    assert {m: set(rs) for m, rs in read.assignment.items()} == {"m1": set(ids[:25])}
    # And from the right base, dropping a member.
    fourth = store.publish(
        s1, epoch, {"m2": ids[:3]}, phase=Phase.STOPPING, resources_version=0, previous=third
    )
    read = other.target(group)
    assert read == fourth
    assert s2.member_id == "m2"


def test_a_resource_set_given_as_generators_is_written_whole(store: Backend, group: str) -> None:
    """``replace`` and ``add`` are read twice (the store's write, the handle's memory of the
    set): given as generators, they must still reach the store whole."""
    store.update_resources(
        group, replace=(Resource(f"r{i}") for i in range(3)), add=(Resource(x) for x in "xy")
    )
    store.update_resources(group, add=(Resource(z) for z in ["z"]))
    assert set(store.state(group).resources) == {"r0", "r1", "r2", "x", "y", "z"}
