"""The coordinator applying the control record, with members in one process on SQLite:
control events reach the sinks, drains of departed members end, every protocol drains."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rebalancer_spark import EventKind, Member, MemberConfig, OwnershipEvent, ProtocolName
from rebalancer_spark.backends import Backend, open_backend
from rebalancer_spark.core.model import GroupState, Resource
from rebalancer_spark.member.control import ControlRefused, GroupControl
from tests.support.helpers import wait_for

RESOURCES = [f"r{i:02d}" for i in range(8)]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path}/groups.db?poll=0.005"


@pytest.fixture
def observer(url: str) -> Iterator[Backend]:
    with open_backend(url) as backend:
        yield backend


def _start(
    url: str, group: str, member_id: str, events: list[OwnershipEvent], **options: object
) -> Member:
    config = MemberConfig(
        group=group,
        backend=url,
        member_id=member_id,
        # Long enough that no lease lapses on a loaded machine: the test counts exact events
        # of one coordinator.
        session_timeout=6.0,
        stability_window=0.05,
        max_rebalance_delay=1.0,
        **options,  # type: ignore[arg-type]
    )
    resources = RESOURCES if member_id == "a" else None
    return Member(config, resources=resources, event_sinks=[events.append]).start()


def _stable(observer: Backend, group: str, members: set[str]) -> GroupState:
    def check() -> GroupState | None:
        state = observer.state(group)
        good = set(state.members) == members and state.is_stable() and len(state.claims) == 8
        return state if good else None

    found = wait_for(check, timeout=15, what=f"a stable group of {sorted(members)}")
    assert found is not None
    return found


def test_a_drained_member_that_leaves_is_undrained_and_every_step_is_an_event(
    url: str, observer: Backend, group: str
) -> None:
    events: list[OwnershipEvent] = []
    a = _start(url, group, "a", events)
    # The test reads a's events: a must be the coordinator before b can race it for the role
    # (on a loaded machine b's thread may otherwise elect itself first).
    wait_for(lambda: a.is_coordinator, timeout=15, what="a to coordinate")
    b = _start(url, group, "b", [])
    try:
        _stable(observer, group, {"a", "b"})
        ops = GroupControl(observer, group, actor="tester")
        ops.drain("b")
        assert ops.wait_drained("b", timeout=15).done

        def reasons() -> list[str]:
            return [e.reason.split(": ", 1)[1] for e in list(events) if e.kind is EventKind.CONTROL]

        # The coordinator reports "drain done" when it next looks at a b that owns nothing; b
        # leaving before that look would skip the report (b is then simply gone): wait for it.
        wait_for(lambda: "drain done b" in reasons(), timeout=15, what="drain done b")
        b.stop()
        wait_for(
            lambda: not observer.state(group).control.drain,
            timeout=30,  # after a session timeout of absence (a lapse is not a departure)
            what="b's drain entry removed once b left",
        )
        history = observer.state(group).control.history
        assert history[-2][2] == "drain b by tester"
        assert history[-1][2] == "undrain b: left the group (by coordinator)"

        wait_for(
            lambda: reasons() == ["drain b", "drain done b", "undrain b"],
            timeout=15,
            what="the coordinator's control events",
        )
        control_events = [e for e in events if e.kind is EventKind.CONTROL]
        assert {e.member_id for e in control_events} == {"a"}
        assert all(e.epoch == a.coordinator_epoch for e in control_events)
    finally:
        b.stop()
        a.stop()


@pytest.mark.parametrize("protocol", list(ProtocolName))
def test_every_protocol_drains_and_pauses(
    url: str, observer: Backend, group: str, protocol: ProtocolName
) -> None:
    a = _start(url, group, "a", [], protocol=protocol, barrier_timeout=5.0)
    b = _start(url, group, "b", [], protocol=protocol, barrier_timeout=5.0)
    try:
        _stable(observer, group, {"a", "b"})
        ops = GroupControl(observer, group)
        ops.drain("b")
        assert ops.wait_drained("b", timeout=15).done
        state = _stable(observer, group, {"a", "b"})
        assert {c.member_id for c in state.claims.values()} == {"a"}
        ops.pause()
        with pytest.raises(ControlRefused, match="paused"):
            ops.rebalance()
        ops.undrain("b")  # recorded while paused, applied on resume
        ops.resume()
        wait_for(
            lambda: {c.member_id for c in observer.state(group).claims.values()} == {"a", "b"},
            timeout=15,
            what="b owning again after undrain",
        )
    finally:
        b.stop()
        a.stop()


def test_an_operators_rebalance_lists_the_source_now(
    url: str, observer: Backend, group: str
) -> None:
    listed = [Resource(r) for r in RESOURCES[:4]]
    calls: list[int] = []

    def discover() -> list[Resource]:
        calls.append(len(listed))
        return list(listed)

    config = MemberConfig(group=group, backend=url, member_id="a", stability_window=0.05)
    # An hour between listings: only the operator's request can make it list again soon.
    a = Member(config, discover=discover, discovery_interval=3600).start()
    try:
        wait_for(lambda: len(a.assigned()) == 4, timeout=15, what="a to own the first listing")
        listed.extend(Resource(r) for r in RESOURCES[4:])
        assert len(observer.state(group).resources) == 4, "listed again without being asked"
        GroupControl(observer, group, actor="tester").rebalance()
        wait_for(lambda: len(a.assigned()) == 8, timeout=15, what="a to own the new listing")
        assert calls[-1] == 8
    finally:
        a.stop()


def test_the_last_member_that_may_own_cannot_be_drained(
    url: str, observer: Backend, group: str
) -> None:
    events: list[OwnershipEvent] = []
    a = _start(url, group, "a", events)
    # The test reads a's events: a must be the coordinator before b can race it for the role
    # (on a loaded machine b's thread may otherwise elect itself first).
    wait_for(lambda: a.is_coordinator, timeout=15, what="a to coordinate")
    b = _start(url, group, "b", [])
    try:
        _stable(observer, group, {"a", "b"})
        ops = GroupControl(observer, group, actor="tester")
        ops.drain("b")
        with pytest.raises(ControlRefused, match=r"last member of group .* that may own"):
            ops.drain("a")
        assert observer.state(group).control.drain == {"b"}
        assert ops.wait_drained("b", timeout=15).done
        assert len(a.assigned()) == len(RESOURCES) or a.wait_until(
            lambda m: len(m.assigned()) == len(RESOURCES), timeout=15
        )
    finally:
        b.stop()
        a.stop()
