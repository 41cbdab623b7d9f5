"""Epochs never go backwards, even when the store loses a group's state (every backend).

The store loses the group (SQLite: the file replaced; Redis: the keys gone, as after a restart
without persistence; ZooKeeper: the chroot deleted). A member that ran before finds its session
gone, rejoins, and the epochs it knew are lifted into the new incarnation before anything is
granted; a member that never saw the group grants nothing at or below the epochs it is told of
(the audit table's); and a grant that went backwards anyway is handed back, never used.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rebalancer_spark.backends import Backend, Session
from rebalancer_spark.core.errors import BackendUnavailable, MemberIdInUse, SessionExpired
from rebalancer_spark.core.model import Grant, Phase, Resource
from tests.support.helpers import wait_for
from tests.support.store_loss import lose_state

TTL = 1.0  # Redis holds grants back for the longest lease known after a loss: keep it short
RESOURCES = ["a", "b"]


def _lead_and_target(store: Backend, session: Session, resources: list[str]) -> int:
    record = store.elect(session)
    assert record is not None and record.session_id == session.session_id
    version = store.update_resources(session.group, replace=[Resource(r) for r in resources])
    return store.publish(
        session,
        record.epoch,
        {session.member_id: resources},
        phase=Phase.RUNNING,
        resources_version=version,
    ).generation


def _claim_all(store: Backend, session: Session, resources: list[str]) -> dict[str, Grant]:
    """Claim until every resource is granted (Redis grants nothing for a lease after a loss;
    a grant handed back for going backwards is taken again at a higher epoch)."""
    granted: dict[str, Grant] = {}

    def more() -> bool:
        store.renew(session)
        generation = store.member_view(session).generation
        granted.update(store.claim(session, resources, generation))
        return set(granted) == set(resources)

    wait_for(more, timeout=20, what=f"grants of {resources}")
    return granted


def _cycle(store: Backend, session: Session, generation: int, times: int) -> dict[str, int]:
    """Claim and release every resource ``times`` times; the last epochs granted."""
    epochs: dict[str, int] = {}
    for _ in range(times):
        grants = store.claim(session, RESOURCES, generation)
        epochs = {r: g.epoch for r, g in grants.items()}
        store.release(session, epochs)
    return epochs


def test_a_member_that_ran_before_lifts_its_epochs_into_the_recreated_group(
    open_store: Callable[[], Backend], backend_url: str, group: str
) -> None:
    store = open_store()
    session = store.join(group, "m1", info={}, ttl=TTL, static=False)
    before = _cycle(store, session, _lead_and_target(store, session, RESOURCES), 3)
    assert set(before) == set(RESOURCES)
    first = store.incarnation(group)
    lose_state(backend_url, group)
    with pytest.raises(SessionExpired):  # the member stops its work at once
        store.renew(session)
    again = store.join(group, "m1", info={}, ttl=TTL, static=False)
    assert store.incarnation(group) not in (None, first)
    _lead_and_target(store, again, RESOURCES)
    after = _claim_all(store, again, RESOURCES)
    for r in RESOURCES:
        assert after[r].epoch > before[r], f"{r}: {after[r].epoch} after {before[r]}"


def test_a_new_member_told_the_durable_epochs_grants_nothing_at_or_below_them(
    open_store: Callable[[], Backend], group: str
) -> None:
    store = open_store()
    store.remember_epochs(group, {"a": 40, "b": 7})  # as read from the audit table
    session = store.join(group, "m1", info={}, ttl=TTL, static=False)
    _lead_and_target(store, session, RESOURCES)
    grants = _claim_all(store, session, RESOURCES)
    assert grants["a"].epoch > 40 and grants["b"].epoch > 7


def test_a_grant_that_went_backwards_is_handed_back_and_taken_again_above(
    open_store: Callable[[], Backend], group: str
) -> None:
    store, other = open_store(), open_store()
    session = store.join(group, "m1", info={}, ttl=TTL, static=False)
    generation = _lead_and_target(store, session, RESOURCES)
    store.remember_epochs(group, {"a": 25})  # learnt after joining: nothing lifted yet
    first = store.claim(session, RESOURCES, generation)
    assert "a" not in first, f"granted at {first['a'].epoch} though 25 is known"
    assert other.state(group).claims.get("a") is None, "the backwards grant was kept"
    grants = _claim_all(store, session, ["a"])
    assert grants["a"].epoch == 26


def test_the_set_declared_again_after_a_loss_holds_this_handles_writes_and_anothers(
    open_store: Callable[[], Backend], backend_url: str, group: str
) -> None:
    """A handle remembers the set it wrote, not only the sets it read: its own delta is applied
    to the set it keeps when the delta made the version after it, and when another writer
    changed the set in between the handle reads the set rather than apply its delta to an
    older one (which would drop the other writer's change). After a loss, the set it declares
    again holds all of it. (Until session 31 only the Redis handle remembered its own writes;
    a ZooKeeper or SQLite handle that had only written the set declared nothing again.)"""
    a, b = open_store(), open_store()
    session = a.join(group, "m1", info={}, ttl=TTL, static=False)
    a.update_resources(group, replace=[Resource("r")])
    b.update_resources(group, add=[Resource("from-b")])  # a does not see this one
    a.update_resources(group, add=[Resource("from-a")])  # made the version after b's
    a.update_resources(group, add=[Resource("mine")], remove=["r"])
    wanted = {"from-b", "from-a", "mine"}
    assert set(b.state(group).resources) == wanted
    lose_state(backend_url, group)
    with pytest.raises(SessionExpired):  # (an SQLite handle moves to the new file here)
        a.renew(session)
    wait_for(lambda: _rejoined(a, group), timeout=20, what="a join after the loss")
    assert set(open_store().state(group).resources) == wanted


def _rejoined(store: Backend, group: str) -> bool:
    try:
        store.join(group, "m1", info={}, ttl=TTL, static=False)
    except (BackendUnavailable, MemberIdInUse):
        return False  # the store is still coming back, or the old session still holds the id
    return True
