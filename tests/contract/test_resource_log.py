"""The resource set's change log (:meth:`Backend.resource_changes`), on every backend: what a
reader behind gets, where the log stops, and the coordinator's and followers' reads by it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rebalancer_spark.backends import Backend, Session
from rebalancer_spark.backends.base import (
    RESOURCE_LOG_IDS,
    RESOURCE_LOG_VERSIONS,
    GroupReader,
)
from rebalancer_spark.core.clock import ManualClock
from rebalancer_spark.core.model import Resource, ResourceChange

TTL = 30.0


def _set(*ids: str, weight: float = 1.0) -> dict[str, Resource]:
    return {r: Resource(r, weight) for r in ids}


def test_the_changes_since_a_version_are_what_was_put_and_removed_after_it(
    open_store: Callable[[], Backend], group: str
) -> None:
    writer, reader = open_store(), open_store()
    v1 = writer.update_resources(group, replace=_set("a", "b", "c").values())
    v2 = writer.update_resources(group, add=[Resource("d"), Resource("b", 3.0)], remove=["a"])
    v3 = writer.update_resources(group, replace=[Resource("b", 3.0), Resource("d"), Resource("a")])
    v4 = writer.update_resources(group, remove=["d"])
    assert v1 < v2 < v3 < v4
    change = reader.resource_changes(group, v1)
    assert change is not None
    assert (change.since, change.version) == (v1, v4)
    assert change.put == {"b": Resource("b", 3.0), "a": Resource("a")}
    assert change.removed == {"c", "d"}
    whole = reader.resources(group)
    assert change.apply(_set("a", "b", "c")) == whole[1] and whole[0] == v4
    later = reader.resource_changes(group, v3)
    assert later == ResourceChange(v3, v4, {}, frozenset({"d"}))
    assert reader.resource_changes(group, v4) == ResourceChange(v4, v4, {}, frozenset())
    assert reader.resource_changes(group, v4 + 1) is None  # a version it never reached


def test_a_reader_given_its_kept_set_reads_the_changes_and_one_behind_the_log_reads_it_whole(
    open_store: Callable[[], Backend], group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, reader = open_store(), open_store()
    v1 = writer.update_resources(group, replace=[Resource(f"r{i}") for i in range(10)])
    kept = reader.resources(group)
    assert kept[0] == v1
    wholes: list[str] = []
    inner = reader._resources

    def counting(g: str) -> Any:
        wholes.append(g)
        return inner(g)

    monkeypatch.setattr(reader, "_resources", counting)
    v2 = writer.update_resources(group, add=[Resource("new")], remove=["r0"])
    version, now = reader.resources(group, kept)
    assert (version, set(now)) == (v2, {f"r{i}" for i in range(1, 10)} | {"new"})
    assert wholes == []  # the change alone was read
    assert set(kept[1]) == {f"r{i}" for i in range(10)}  # the kept copy is left as it was
    # A change larger than the log keeps (a listing that replaced most of a large set) is not
    # logged: a reader behind it reads the set whole, and the log starts again after it.
    big = [Resource(f"s{i}") for i in range(RESOURCE_LOG_IDS + 1)]
    v3 = writer.update_resources(group, replace=big)
    assert reader.resource_changes(group, v2) is None
    assert reader.resources(group, (version, now)) == (v3, {r.id: r for r in big})
    assert wholes == [group]
    v4 = writer.update_resources(group, remove=["s0"])
    assert reader.resource_changes(group, v3) == ResourceChange(v3, v4, {}, frozenset({"s0"}))


def test_the_log_keeps_the_last_changes_only(open_store: Callable[[], Backend], group: str) -> None:
    writer, reader = open_store(), open_store()
    first = writer.update_resources(group, replace=[Resource("base")])
    versions = [first]
    for i in range(RESOURCE_LOG_VERSIONS + 2):
        versions.append(writer.update_resources(group, add=[Resource(f"r{i}")]))
    assert reader.resource_changes(group, versions[0]) is None
    assert reader.resource_changes(group, versions[1]) is None
    oldest = versions[-1 - RESOURCE_LOG_VERSIONS]
    change = reader.resource_changes(group, oldest)
    assert change is not None and change.version == versions[-1]
    assert set(change.put) == {f"r{i}" for i in range(2, RESOURCE_LOG_VERSIONS + 2)}
    # As many ids as the log names at most, in one change: the older changes go.
    v = writer.update_resources(group, add=[Resource(f"x{i}") for i in range(RESOURCE_LOG_IDS)])
    assert reader.resource_changes(group, versions[-2]) is None
    change = reader.resource_changes(group, versions[-1])
    assert change is not None and change.version == v and len(change.put) == RESOURCE_LOG_IDS


def _group_of_two(
    open_store: Callable[[], Backend], group: str, size: int
) -> tuple[Backend, Backend, Backend, Session, Session]:
    """A coordinator a, a follower b (each on a handle of its own) and a writer's handle, with
    a set of ``size`` resources."""
    lead, follow, writer = open_store(), open_store(), open_store()
    a = lead.join(group, "a", info={}, ttl=TTL, static=False)
    b = follow.join(group, "b", info={}, ttl=TTL, static=False)
    assert lead.elect(a) is not None
    writer.update_resources(group, replace=[Resource(f"r{i}") for i in range(size)])
    return lead, follow, writer, a, b


def test_a_coordinator_reads_only_the_changes_of_the_set_and_a_follower_remembers_them(
    open_store: Callable[[], Backend], group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lead, follow, writer, a, b = _group_of_two(open_store, group, 2000)
    clock = ManualClock()
    coordinator = GroupReader(lead, group, clock=clock)
    follower = GroupReader(follow, group, clock=clock, at_once=8)
    assert len(coordinator.read("a", a.session_id).resources) == 2000
    follower.read("b", b.session_id)
    wholes: list[str] = []
    for handle in (lead, follow):
        for name in ("_resources", "_remember_resources"):
            inner = getattr(handle, name)
            monkeypatch.setattr(handle, name, _counting(inner, wholes, name))
    v = writer.update_resources(group, add=[Resource("new", 2.0)], remove=["r7"])
    view = coordinator.read("a", a.session_id)
    assert view.resources_version == v and len(view.resources) == 2000
    assert view.resources["new"] == Resource("new", 2.0) and "r7" not in view.resources
    follower.read("b", b.session_id)  # the first eight followers remember at once
    assert follower.remember_due is None
    assert wholes == []  # neither read the set whole
    remembered = {r.id: r for r in follow.epochs.resources(group)}
    assert remembered == dict(view.resources)


def test_a_reader_keeps_its_version_across_an_error_but_not_outside_its_session(
    open_store: Callable[[], Backend], group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, follow, writer, _, b = _group_of_two(open_store, group, 100)
    follower = GroupReader(follow, group, clock=ManualClock())
    follower.read("b", b.session_id)
    wholes: list[str] = []
    inner = follow._remember_resources
    monkeypatch.setattr(follow, "_remember_resources", _counting(inner, wholes, "whole"))
    follower.forget()  # an error: the same session, the same incarnation
    writer.update_resources(group, add=[Resource("x")])
    follower.read("b", b.session_id)
    assert wholes == []  # read by its changes
    # A session the store does not hold (it lost the group, or the session ended, before
    # this member noticed): no version kept names the set there.
    follow.leave(b)
    writer.update_resources(group, add=[Resource("y")])
    follower.read("b", b.session_id)
    assert wholes == ["whole"]
    c = follow.join(group, "b", info={}, ttl=TTL, static=False)
    writer.update_resources(group, add=[Resource("z")])
    follower.read("b", c.session_id)  # a new session: read whole
    assert wholes == ["whole", "whole"]
    assert {r.id for r in follow.epochs.resources(group)} >= {"x", "y", "z"}


def test_a_listing_written_against_the_set_it_knows_is_the_listing_whether_or_not_the_set_moved(
    open_store: Callable[[], Backend], group: str
) -> None:
    writer, other = open_store(), open_store()
    v1 = writer.update_resources(group, replace=[Resource(f"r{i}") for i in range(50)])
    known = writer.resources(group)
    listing = [Resource(f"r{i}") for i in range(5, 55)]
    v2 = writer.update_resources(group, replace=listing, known=known)
    assert other.resources(group) == (v2, {r.id: r for r in listing})
    assert other.resource_changes(group, v1) == ResourceChange(
        v1, v2, {f"r{i}": Resource(f"r{i}") for i in range(50, 55)}, frozenset(_ids(0, 5))
    )
    # Another writer moved the set on since the one this writer knows: the listing goes whole.
    v3 = other.update_resources(group, add=[Resource("intruder")], remove=["r5"])
    old = {r.id: r for r in listing}
    listing = [Resource(f"r{i}") for i in range(10, 60)]
    v4 = writer.update_resources(group, replace=listing, known=(v2, old))
    assert v4 > v3 and other.resources(group) == (v4, {r.id: r for r in listing})
    # Change after change, each against the last (beyond a ZooKeeper chain of 16): every
    # whole read, whichever way, is the listing.
    kept = other.resources(group)
    for i in range(20):
        listing = [*listing[1:], Resource(f"n{i}", 1.0 + i)]
        v = writer.update_resources(group, replace=listing, known=kept)
        kept = (v, {r.id: r for r in listing})
        assert other.resources(group) == kept
        assert other.state(group).resources == kept[1]
        assert other.remember_resources(group) == v


def _ids(first: int, end: int) -> list[str]:
    return [f"r{i}" for i in range(first, end)]


def _counting(inner: Callable[..., Any], calls: list[str], name: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        calls.append(name)
        return inner(*args)

    return call
