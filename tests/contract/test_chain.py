"""The contract's epoch chain: every grant tells the claimant what it superseded, read and
written atomically with the grant (``Grant``), on every backend alike.

Times are wall-clock seconds (``freed_at``), from the store's clock: the stores of the suite
run on this host, so they are compared with this process's clock within ``SKEW``.
"""

from __future__ import annotations

import time

from rebalancer_spark.backends import Backend, Session
from rebalancer_spark.core.model import Freed, Grant, Phase
from tests.support.helpers import wait_for

TTL = 30.0
SHORT_TTL = 0.6
SKEW = 0.5
"""Seconds of difference allowed between the store's clock and this process's."""


def _join(store: Backend, group: str, member: str, ttl: float = TTL) -> Session:
    return store.join(group, member, info={"host": "test"}, ttl=ttl, static=False)


def _target(store: Backend, coordinator: Session, epoch: int, owner: str) -> int:
    members = {owner: ["a"]}
    if coordinator.member_id != owner:
        members[coordinator.member_id] = []
    return store.publish(
        coordinator, epoch, members, phase=Phase.RUNNING, resources_version=0
    ).generation


def _lead(store: Backend, session: Session) -> int:
    record = store.elect(session)
    assert record is not None and record.session_id == session.session_id
    return record.epoch


def test_a_first_grant_is_new_and_a_claim_again_returns_the_same_grant(
    store: Backend, group: str
) -> None:
    s1 = _join(store, group, "m1")
    gen = _target(store, s1, _lead(store, s1), "m1")
    first = store.claim(s1, ["a"], gen)
    assert first == {"a": Grant(1, Freed.NEW, None, None, 0, None)}
    assert store.claim(s1, ["a"], gen) == first  # held: the grant that gave it


def test_a_grant_after_a_release_names_the_releaser_and_the_release_time(
    store: Backend, group: str
) -> None:
    s1, s2 = _join(store, group, "m1"), _join(store, group, "m2")
    epoch = _lead(store, s1)
    store.claim(s1, ["a"], _target(store, s1, epoch, "m1"))
    gen = _target(store, s1, epoch, "m2")
    before = time.time()
    store.release(s1, {"a": 1})
    after = time.time()
    granted = store.claim(s2, ["a"], gen)["a"]
    assert granted.epoch == 2 and granted.prev_epoch == 1
    assert granted.freed is Freed.RELEASED
    assert (granted.prev_member_id, granted.prev_session_id) == ("m1", s1.session_id)
    assert granted.freed_at is not None and before - SKEW <= granted.freed_at <= after + SKEW
    assert store.claim(s2, ["a"], gen)["a"] == granted  # held: the same link again


def test_a_grant_after_an_expiry_names_the_expired_session_and_its_lease_end(
    store: Backend, group: str
) -> None:
    joined = time.time()
    s1 = _join(store, group, "m1", ttl=SHORT_TTL)
    s2 = _join(store, group, "m2")
    epoch = _lead(store, s2)
    store.claim(s1, ["a"], _target(store, s2, epoch, "m1"))
    gen = _target(store, s2, epoch, "m2")
    grants = wait_for(lambda: store.claim(s2, ["a"], gen), timeout=15, what="expiry of m1")
    granted_by = time.time()
    granted = grants["a"]
    assert granted.epoch == 2 and granted.prev_epoch == 1
    assert granted.freed is Freed.EXPIRED
    assert (granted.prev_member_id, granted.prev_session_id) == ("m1", s1.session_id)
    # The lease ran at least its ttl from the join, and had ended by the grant.
    assert granted.freed_at is not None
    assert joined + s1.ttl - SKEW <= granted.freed_at <= granted_by + SKEW


def test_a_grant_after_a_leave_names_the_member_that_left(store: Backend, group: str) -> None:
    s1, s2 = _join(store, group, "m1"), _join(store, group, "m2")
    epoch = _lead(store, s2)
    store.claim(s1, ["a"], _target(store, s2, epoch, "m1"))
    gen = _target(store, s2, epoch, "m2")
    store.leave(s1)
    left = time.time()
    granted = store.claim(s2, ["a"], gen)["a"]
    assert granted.epoch == 2 and granted.prev_epoch == 1
    assert (granted.prev_member_id, granted.prev_session_id) == ("m1", s1.session_id)
    # ZooKeeper ends the session's claims with it and keeps no time of it: expired, bounded by
    # the grant's own time; the others record the leave as a release.
    assert granted.freed in (Freed.RELEASED, Freed.EXPIRED)
    assert granted.freed_at is not None and granted.freed_at <= time.time() + SKEW
    assert granted.freed is Freed.EXPIRED or granted.freed_at <= left + SKEW


def test_a_grant_after_a_lift_names_no_predecessor(store: Backend, group: str) -> None:
    """A lifted epoch (after a store lost its records, or an operator's floor) breaks the
    chain on purpose: the next grant must not name the last holder at an epoch it never held;
    the audit then bounds the earlier owners by this grant (core.audit, superseded)."""
    s1 = _join(store, group, "m1")
    gen = _target(store, s1, _lead(store, s1), "m1")
    store.claim(s1, ["a"], gen)
    store.release(s1, {"a": 1})
    assert store.lift_epochs(group, {"a": 50}) == 1
    granted = store.claim(s1, ["a"], gen)["a"]
    assert granted.epoch == 51
    assert (granted.freed, granted.prev_member_id, granted.prev_session_id) == (None, None, None)


def test_a_lift_leaves_a_held_resource_alone_and_raises_it_once_its_holder_has_gone(
    store: Backend, group: str
) -> None:
    """A lift never changes an epoch under a live holder (its commits are fenced on it), and
    a holder whose session ended holds nothing: its resource is lifted like a released one.
    (On ZooKeeper the record names the holder and the lift's multi-op proves that holder's
    session znode gone; a lift that checked only the record would lift ``a`` at once.)"""
    s1 = _join(store, group, "m1")
    epoch = _lead(store, s1)
    gen = store.publish(
        s1, epoch, {"m1": ["a", "b"]}, phase=Phase.RUNNING, resources_version=0
    ).generation
    assert set(store.claim(s1, ["a", "b"], gen)) == {"a", "b"}
    store.release(s1, {"b": 1})
    assert store.lift_epochs(group, {"a": 50, "b": 50}) == 1  # b only: m1 holds a
    store.commit(s1, "a", 1, {"n": 1})  # a's epoch did not move under its holder
    store.leave(s1)
    assert store.lift_epochs(group, {"a": 50}) == 1
    s2 = _join(store, group, "m2")
    gen = store.publish(
        s2, _lead(store, s2), {"m2": ["a"]}, phase=Phase.RUNNING, resources_version=0
    ).generation
    assert store.claim(s2, ["a"], gen)["a"].epoch == 51
