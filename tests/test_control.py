"""The control record and the planning under it, as properties (hypothesis) and cases."""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rebalancer_spark.audit.verify import history, verify_events
from rebalancer_spark.core.assignors import moved, sticky_balanced
from rebalancer_spark.core.control import (
    MAX_CONTROL_ENTRIES,
    Control,
    ControlMode,
    control_changes,
    imbalance,
    keep_assignment,
    plan_target,
)
from rebalancer_spark.core.errors import ConfigurationError, CorruptStateError

MEMBERS = [f"m{i}" for i in range(8)]
RESOURCES = [f"r{i}" for i in range(40)]
PROPS = settings(max_examples=300, deadline=None)


@dataclass(frozen=True)
class Case:
    members: list[str]
    weights: dict[str, float]
    previous: dict[str, frozenset[str]]
    control: Control


@st.composite
def cases(draw: st.DrawFn, mode: ControlMode | None = None) -> Case:
    """Present members, resources (equal or random weights), a previous partition over
    present and departed members, and a control record with drains, pins and a threshold."""
    members = draw(st.lists(st.sampled_from(MEMBERS), min_size=1, unique=True))
    ids = draw(st.lists(st.sampled_from(RESOURCES), unique=True))
    if draw(st.booleans()):
        weights = {r: 1.0 for r in ids}
    else:
        weights = {r: draw(st.floats(0.5, 10.0)) for r in ids}
    universe = [*ids, "gone-resource"]
    owners = [*MEMBERS, "gone-member"]
    previous: dict[str, set[str]] = {}
    for r in universe:
        owner = draw(st.sampled_from([None, *owners]))
        if owner is not None:
            previous.setdefault(owner, set()).add(r)
    drain = draw(st.frozensets(st.sampled_from(MEMBERS), max_size=3))
    pins = draw(st.dictionaries(st.sampled_from(RESOURCES), st.sampled_from(owners), max_size=6))
    threshold = draw(st.sampled_from([0.0, 1.0, 2.0, 5.0, 1e9]))
    chosen = mode if mode is not None else draw(st.sampled_from(list(ControlMode)))
    requests = draw(st.dictionaries(st.sampled_from(RESOURCES), st.just('{"action":"reset"}')))
    control = Control(mode=chosen, drain=drain, pins=pins, imbalance_threshold=threshold,
                      requests=requests)  # fmt: skip
    frozen = {m: frozenset(rs) for m, rs in previous.items()}
    return Case(members, weights, frozen, control)


def _plan(case: Case, *, forced: bool = False) -> dict[str, frozenset[str]]:
    return plan_target(
        sticky_balanced, case.members, case.weights, case.previous, case.control, forced=forced
    )


def _owner(assignment: Mapping[str, AbstractSet[str]]) -> dict[str, str]:
    return {r: m for m, rs in assignment.items() for r in rs}


def _eligible(case: Case) -> list[str]:
    return [m for m in case.members if m not in case.control.drain]


def _held(case: Case) -> dict[str, str]:
    """Resource -> present member that held it (the smallest id if listed twice)."""
    out: dict[str, str] = {}
    for m in sorted(case.members):
        for r in case.previous.get(m, ()):
            if r in case.weights:
                out.setdefault(r, m)
    return out


@PROPS
@given(cases())
def test_every_member_is_a_key_and_no_resource_is_owned_twice(case: Case) -> None:
    plan = _plan(case)
    assert set(plan) == set(case.members)
    seen = [r for rs in plan.values() for r in rs]
    assert len(seen) == len(set(seen)) and set(seen) <= set(case.weights)


@PROPS
@given(cases())
def test_every_resource_is_owned_when_some_member_may_own(case: Case) -> None:
    plan = _plan(case)
    owned = set(_owner(plan))
    if case.control.mode is ControlMode.ACTIVE:
        assert owned == (set(case.weights) if _eligible(case) else set())
    elif _eligible(case):
        assert owned == set(case.weights)


@PROPS
@given(cases(ControlMode.ACTIVE))
def test_drained_members_get_nothing_and_pins_hold_while_active(case: Case) -> None:
    plan = _plan(case)
    for member in case.control.drain & set(case.members):
        assert plan[member] == frozenset()
    owner = _owner(plan)
    for resource, member in case.control.pins.items():
        if resource in case.weights and member in _eligible(case):
            assert owner[resource] == member


@PROPS
@given(cases(ControlMode.PAUSED))
def test_paused_nothing_owned_moves_and_orphans_find_an_owner(case: Case) -> None:
    plan = _plan(case)
    owner = _owner(plan)
    held = _held(case)
    for resource, member in held.items():
        assert owner[resource] == member, f"{resource} moved while paused"
    for resource in set(owner) - set(held):
        assert owner[resource] in _eligible(case), "an orphan went to a drained member"


@PROPS
@given(cases(ControlMode.ACTIVE))
def test_under_the_threshold_nothing_owned_by_an_eligible_member_moves(case: Case) -> None:
    plan = _plan(case)
    eligible = _eligible(case)
    pinned = {r for r, m in case.control.pins.items() if r in case.weights and m in eligible}
    free = {r: w for r, w in case.weights.items() if r not in pinned}
    previous = {m: case.previous.get(m, frozenset()) - pinned for m in eligible}
    kept = keep_assignment(eligible, free, previous)
    threshold = case.control.imbalance_threshold
    owner, held = _owner(plan), _held(case)
    if threshold > 0 and imbalance(kept, free, eligible) <= threshold:
        for resource, member in held.items():
            if member in eligible and resource not in pinned:
                assert owner[resource] == member, f"{resource} moved under the threshold"
    else:  # over the threshold (or none): the assignor's balance on the unpinned resources
        unpinned = {m: plan[m] - pinned for m in eligible}
        assert unpinned == sticky_balanced(eligible, free, previous)


@PROPS
@given(cases(ControlMode.ACTIVE))
def test_a_forced_rebalance_ignores_the_threshold(case: Case) -> None:
    eligible = _eligible(case)
    plan = _plan(case, forced=True)
    pinned = {r for r, m in case.control.pins.items() if r in case.weights and m in eligible}
    free = {r: w for r, w in case.weights.items() if r not in pinned}
    previous = {m: case.previous.get(m, frozenset()) - pinned for m in eligible}
    assert {m: plan[m] - pinned for m in eligible} == sticky_balanced(eligible, free, previous)


@PROPS
@given(cases())
def test_the_default_record_changes_nothing_and_planning_is_deterministic(case: Case) -> None:
    plain = plan_target(sticky_balanced, case.members, case.weights, case.previous, Control())
    assert plain == sticky_balanced(case.members, case.weights, case.previous)
    again = plan_target(
        sticky_balanced,
        list(reversed(case.members)),
        dict(reversed(list(case.weights.items()))),
        case.previous,
        case.control,
    )
    assert again == _plan(case)


def test_threshold_two_keeps_two_two_zero_but_balances_three_three_zero() -> None:
    control = Control(imbalance_threshold=2)
    small = {f"r{i}": 1.0 for i in range(4)}
    prev = {"a": frozenset({"r0", "r1"}), "b": frozenset({"r2", "r3"})}
    assert plan_target(sticky_balanced, "abc", small, prev, control) == {
        "a": frozenset({"r0", "r1"}),
        "b": frozenset({"r2", "r3"}),
        "c": frozenset(),
    }
    big = {f"r{i}": 1.0 for i in range(6)}
    prev = {"a": frozenset({"r0", "r1", "r2"}), "b": frozenset({"r3", "r4", "r5"})}
    plan = plan_target(sticky_balanced, "abc", big, prev, control)
    assert sorted(len(rs) for rs in plan.values()) == [2, 2, 2]
    assert moved(prev, plan) == 2


def test_a_pinned_resource_goes_back_to_its_member_when_it_returns() -> None:
    control = Control(pins={"r0": "b"})
    weights = {f"r{i}": 1.0 for i in range(4)}
    away = plan_target(sticky_balanced, ["a"], weights, {"b": frozenset({"r0"})}, control)
    assert away == {"a": frozenset(weights)}
    back = plan_target(sticky_balanced, ["a", "b"], weights, away, control)
    assert "r0" in back["b"]


def test_weighted_imbalance_is_the_spread_of_loads() -> None:
    weights = {"x": 3.0, "y": 0.5, "z": 1.0}
    assert imbalance({"a": {"x"}, "b": {"y", "z"}}, weights, ["a", "b"]) == 1.5
    assert imbalance({}, weights, []) == 0.0
    assert imbalance({"a": {"x"}}, weights, ["a", "c"]) == 3.0


def test_transitions_raise_the_version_and_reset_keeps_the_request_counter() -> None:
    c = Control().pause().request_rebalance().drain_member("m1").pin("r", "m2")
    c = c.with_threshold(3)
    assert c.version == 5 and c.mode is ControlMode.PAUSED
    reset = c.reset()
    assert reset == Control(rebalance_requests=1, version=6)
    assert c.resume().undrain_members(["m1"]).unpin("r").drain == frozenset()


def test_the_record_round_trips_and_garbage_is_refused() -> None:
    c = Control().pin("s3://b/é x/", "m:1@h").drain_member("m2").with_threshold(1.5)
    assert Control.decode("g", c.encode(), c.version) == c
    assert '"requests"' not in c.encode()  # a record without requests reads as before them
    asked = c.with_request("s3://b/é x/", '{"action": "skip", "file": "ü.csv"}')
    assert Control.decode("g", asked.encode(), asked.version) == asked
    with pytest.raises(CorruptStateError, match=r"control record of group 'g'.*reset --group g"):
        Control.decode("g", '{"mode": "sleeping"}', 1)
    with pytest.raises(CorruptStateError, match="not one rebalancer-spark writes"):
        Control.decode("g", b"\xff\x00", 1)


@pytest.mark.parametrize("bad", [-1, math.inf, math.nan, True, "2"])
def test_a_bad_threshold_is_refused(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"imbalance threshold .* finite number >= 0"):
        Control().with_threshold(bad)  # type: ignore[arg-type]


def test_the_record_is_bounded() -> None:
    c = Control(pins={f"r{i}": "m" for i in range(MAX_CONTROL_ENTRIES)})
    with pytest.raises(ConfigurationError, match=f"at most {MAX_CONTROL_ENTRIES} pins"):
        c.pin("one-more", "m")
    with pytest.raises(ConfigurationError, match="member id"):
        Control().drain_member("bad/id")


def test_a_progress_request_waits_for_its_owner_and_survives_a_reset() -> None:
    c = Control().with_request("r1", "first").with_request("r1", "second")
    assert dict(c.requests) == {"r1": "second"} and c.version == 2
    assert c.without_request("r1", "first") is None, "a newer request is not removed"
    assert c.reset().requests == c.requests, "reset is about ownership, not progress"
    taken = c.without_request("r1", "second")
    assert taken is not None and dict(taken.requests) == {} and taken.version == 3
    assert control_changes(Control(), c) == [("r1", "control v2: progress request for its owner")]
    assert control_changes(c, taken) == [("r1", "control v3: progress request taken by its owner")]
    full = Control(requests={f"r{i}": "x" for i in range(MAX_CONTROL_ENTRIES)})
    with pytest.raises(ConfigurationError, match=f"at most {MAX_CONTROL_ENTRIES} progress"):
        full.with_request("one-more", "x")


def test_changes_are_listed_one_per_transition() -> None:
    old = Control(drain=frozenset({"a"}), pins={"r1": "a", "r2": "b"}, version=3)
    new = Control(
        mode=ControlMode.PAUSED,
        rebalance_requests=1,
        drain=frozenset({"b"}),
        pins={"r1": "c", "r3": "a"},
        imbalance_threshold=2,
        version=4,
    )
    assert control_changes(old, new) == [
        ("", "control v4: paused"),
        ("", "control v4: rebalance requested"),
        ("", "control v4: drain b"),
        ("", "control v4: undrain a"),
        ("r1", "control v4: pin to c"),
        ("r2", "control v4: unpin from b"),
        ("r3", "control v4: pin to a"),
        ("", "control v4: imbalance threshold 2"),
    ]
    assert control_changes(new, new.resume()) == [("", "control v5: resumed")]


def test_the_audit_verdict_ignores_control_rows() -> None:
    def row(kind: str, resource: str, member: str, at: float) -> dict[str, object]:
        return {
            "kind": kind,
            "resource": resource,
            "member_id": member,
            "session_id": f"s-{member}",
            "epoch": 1,
            "at": at,
            "reason": "control v2: pin to m2" if kind == "control" else "",
        }

    trail = [
        row("acquired", "r", "m1", 1.0),
        row("control", "", "m1", 1.5),
        row("control", "r", "m2", 1.6),
        row("released", "r", "m1", 2.0),
        row("acquired", "r", "m2", 2.5),
    ]
    verdict = verify_events(trail)
    assert verdict.ok and verdict.events == 3 and verdict.resources == 1
    assert verdict.intervals == 2 and verdict.members == 2
    assert sum("control" in line for line in history(trail)) == 2


@pytest.mark.parametrize(
    "text",
    [
        '{"mode":"active","rebalance_requests":1e400,"drain":[],"pins":{},"imbalance_threshold":0}',
        '{"mode":"active","rebalance_requests":0,"drain":[],"pins":{},'
        '"imbalance_threshold":0,"history":[[Infinity,0,"x"]]}',
        "[" * 100_000,
    ],
    ids=["infinite-count", "infinite-history", "deep-nesting"],
)
def test_any_malformed_record_is_corrupt_state_not_a_crash(text: str) -> None:
    with pytest.raises(CorruptStateError, match="rebalancer-spark reset"):
        Control.decode("g", text, 3)
