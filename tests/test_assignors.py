"""Invariants of the assignors, as properties (hypothesis) and a few concrete cases."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rebalancer_spark.core.assignors as assignors_module
from rebalancer_spark.core.assignors import (
    ASSIGNORS,
    Assignment,
    Assignor,
    get_assignor,
    minimum_moves,
    moved,
    round_robin,
    sticky_balanced,
)
from rebalancer_spark.core.errors import ConfigurationError

MEMBER_IDS = [f"m{i}" for i in range(20)]
DEPARTED_IDS = [f"gone{i}" for i in range(4)]
RESOURCE_IDS = [f"r{i}" for i in range(60)]
REMOVED_IDS = [f"old{i}" for i in range(10)]
ALL_ASSIGNORS = [sticky_balanced, round_robin]
PROPS = settings(max_examples=300, deadline=None)


@dataclass(frozen=True)
class Case:
    members: list[str]
    resources: dict[str, float]
    previous: dict[str, frozenset[str]]

    @property
    def uniform(self) -> bool:
        return len(set(self.resources.values())) <= 1


@st.composite
def cases(draw: st.DrawFn, weighted: bool | None = None, min_members: int = 0) -> Case:
    """Members m0..m19, resources with all-equal or random weights, and a previous partition
    of a universe that also holds departed members and removed resources."""
    members = draw(st.lists(st.sampled_from(MEMBER_IDS), min_size=min_members, unique=True))
    ids = draw(st.lists(st.sampled_from(RESOURCE_IDS), unique=True))
    if weighted is None:
        weighted = draw(st.booleans())
    if weighted:
        weight = st.floats(0.1, 10.0, allow_nan=False, allow_infinity=False)
        resources = {r: draw(weight) for r in ids}
    else:
        same = draw(st.sampled_from([1.0, 1.0, 2.5]))
        resources = {r: same for r in ids}
    owners = [*MEMBER_IDS, *DEPARTED_IDS, None]
    previous: dict[str, set[str]] = {}
    for r in [*RESOURCE_IDS, *REMOVED_IDS]:
        owner = draw(st.sampled_from(owners))
        if owner is not None:
            previous.setdefault(owner, set()).add(r)
    return Case(members, resources, {m: frozenset(rs) for m, rs in previous.items()})


def load(assignment: Mapping[str, AbstractSet[str]], weights: Mapping[str, float]) -> list[float]:
    return [math.fsum(weights[r] for r in rs) for rs in assignment.values()]


def kept(case: Case, member: str) -> frozenset[str]:
    """What ``member`` validly held before (the strategy never lists a resource twice)."""
    return case.previous.get(member, frozenset()) & case.resources.keys()


def check_cover(case: Case, result: Assignment) -> None:
    if not case.members:
        assert result == {}
        return
    assert set(result) == set(case.members)
    owned = [r for rs in result.values() for r in rs]
    assert sorted(owned) == sorted(case.resources), "every resource owned exactly once"


@PROPS
@given(case=cases())
@pytest.mark.parametrize("assignor", ALL_ASSIGNORS, ids=["sticky", "round_robin"])
def test_every_resource_has_exactly_one_owner(assignor: Assignor, case: Case) -> None:
    check_cover(case, assignor(case.members, case.resources, case.previous))


@PROPS
@given(case=cases(weighted=False, min_members=1))
@pytest.mark.parametrize("assignor", ALL_ASSIGNORS, ids=["sticky", "round_robin"])
def test_counts_differ_by_at_most_one(assignor: Assignor, case: Case) -> None:
    counts = [len(rs) for rs in assignor(case.members, case.resources, case.previous).values()]
    assert max(counts) - min(counts) <= 1, counts


@PROPS
@given(case=cases(min_members=1))
def test_loads_within_the_largest_weight(case: Case) -> None:
    result = sticky_balanced(case.members, case.resources, case.previous)
    loads = load(result, case.resources)
    heaviest = max(case.resources.values(), default=0.0)
    slack = 1e-6 * (1.0 + math.fsum(case.resources.values()))
    assert max(loads) - min(loads) <= heaviest + slack, (loads, heaviest)


@PROPS
@given(case=cases(weighted=False))
def test_equal_weights_move_exactly_the_minimum(case: Case) -> None:
    result = sticky_balanced(case.members, case.resources, case.previous)
    assert moved(case.previous, result) == minimum_moves(
        case.members, case.resources, case.previous
    )


@PROPS
@given(case=cases(weighted=True, min_members=1))
def test_weighted_only_members_above_fair_share_release(case: Case) -> None:
    result = sticky_balanced(case.members, case.resources, case.previous)
    fair = math.fsum(case.resources.values()) / len(case.members)
    for member in case.members:
        before = kept(case, member)
        if before - result[member]:
            held = math.fsum(case.resources[r] for r in before)
            assert held > fair, (member, held, fair)


@PROPS
@given(case=cases(), seed=st.integers(0, 2**32))
@pytest.mark.parametrize("assignor", ALL_ASSIGNORS, ids=["sticky", "round_robin"])
def test_same_input_in_another_order_gives_the_same_output(
    assignor: Assignor, case: Case, seed: int
) -> None:
    rnd = random.Random(seed)

    def shuffled(items: list[str]) -> list[str]:
        return rnd.sample(items, len(items))

    members = shuffled(case.members)
    resources = {r: case.resources[r] for r in shuffled(list(case.resources))}
    previous = {m: set(shuffled(sorted(case.previous[m]))) for m in shuffled(list(case.previous))}
    expected = assignor(case.members, case.resources, case.previous)
    assert assignor(tuple(members), resources, previous) == expected


@PROPS
@given(case=cases())
def test_its_own_output_is_kept_as_it_is(case: Case) -> None:
    first = sticky_balanced(case.members, case.resources, case.previous)
    assert sticky_balanced(case.members, case.resources, first) == first


@PROPS
@given(case=cases(weighted=False))
def test_minimum_moves_is_a_lower_bound_for_round_robin(case: Case) -> None:
    result = round_robin(case.members, case.resources, case.previous)
    assert moved(case.previous, result) >= minimum_moves(
        case.members, case.resources, case.previous
    )


def balanced_assignments(members: list[str], resources: list[str]) -> list[Assignment]:
    out = []
    for owners in itertools.product(members, repeat=len(resources)):
        counts = [owners.count(m) for m in members]
        if max(counts) - min(counts) <= 1:
            out.append(
                {
                    m: frozenset(r for r, o in zip(resources, owners, strict=True) if o == m)
                    for m in members
                }
            )
    return out


@settings(max_examples=100, deadline=None)
@given(
    members=st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=3, unique=True),
    resources=st.lists(st.sampled_from(["x", "y", "z", "u", "v"]), max_size=5, unique=True),
    owners=st.lists(st.sampled_from(["a", "b", "c", "d", "e", None]), min_size=6, max_size=6),
)
def test_minimum_moves_matches_brute_force(
    members: list[str], resources: list[str], owners: list[str | None]
) -> None:
    previous: dict[str, set[str]] = {}
    for r, o in zip(["x", "y", "z", "u", "v", "w"], owners, strict=True):
        if o is not None:
            previous.setdefault(o, set()).add(r)
    best = min(moved(previous, a) for a in balanced_assignments(members, resources))
    assert minimum_moves(members, dict.fromkeys(resources, 1.0), previous) == best


_ACROSS_PROCESSES = """
import json, random
from rebalancer_spark.core.assignors import sticky_balanced, round_robin
rnd = random.Random(7)
members = [f"m{i}" for i in range(7)]
equal = {f"r{i}": 1.0 for i in range(200)}
weighted = {f"r{i}": rnd.uniform(0.1, 10.0) for i in range(200)}
out = []
for resources in (equal, weighted):
    six = sticky_balanced(members[:6], resources, {})
    for result in (
        six,
        sticky_balanced(members, resources, six),
        sticky_balanced(members[1:6], resources, six),
        round_robin(members, resources, six),
    ):
        out.append({m: sorted(rs) for m, rs in result.items()})
print(json.dumps(out, sort_keys=True))
"""


def test_same_output_in_processes_with_different_string_hashing() -> None:
    """Set iteration order changes with PYTHONHASHSEED; a new coordinator must still agree."""
    src = Path(assignors_module.__file__).resolve().parents[2]
    outputs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(src)}
        done = subprocess.run(
            [sys.executable, "-c", _ACROSS_PROCESSES],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        outputs.add(done.stdout)
    assert len(outputs) == 1
    assert len(json.loads(outputs.pop())) == 8


def spread(n_members: int, n_resources: int) -> tuple[list[str], dict[str, float], Assignment]:
    members = [f"m{i}" for i in range(n_members)]
    resources = {f"r{i:04d}": 1.0 for i in range(n_resources)}
    return members, resources, sticky_balanced(members, resources, {})


def test_a_fifth_member_takes_a_fifth_and_nothing_else_moves() -> None:
    members, resources, before = spread(4, 1000)
    after = sticky_balanced([*members, "m4"], resources, before)
    assert moved(before, after) == 200
    assert minimum_moves([*members, "m4"], resources, before) == 200
    assert len(after["m4"]) == 200
    assert all(after[m] <= before[m] for m in members), "old members only give up resources"


def test_a_leave_moves_only_the_departed_members_resources() -> None:
    members, resources, before = spread(5, 1000)
    after = sticky_balanced(members[:-1], resources, before)
    changed = {r for m in members[:-1] for r in after[m] - before[m]}
    assert changed == before["m4"]
    assert moved(before, after) == 0
    assert sorted(len(rs) for rs in after.values()) == [250] * 4


@pytest.mark.parametrize(
    "members",
    [
        ["m1", "m2", "m3", "m4", "m5"],  # backups join
        ["m0", "m3", "m9"],  # backups leave, smaller and larger ids
        ["m3"],  # alone
    ],
)
def test_the_active_member_keeps_the_single_resource(members: list[str]) -> None:
    previous = {"m1": frozenset(), "m2": frozenset(), "m3": frozenset({"only"})}
    result = sticky_balanced(members, {"only": 1.0}, previous)
    assert result["m3"] == {"only"}
    assert moved(previous, result) == 0


def test_from_scratch_with_one_resource_the_smallest_id_takes_it() -> None:
    result = sticky_balanced(["b", "a", "c"], {"only": 1.0}, {})
    assert result == {"a": frozenset({"only"}), "b": frozenset(), "c": frozenset()}


def test_extra_slots_go_to_members_who_hold_more() -> None:
    previous = {"a": frozenset({"1", "2", "3", "4"}), "b": frozenset({"5", "6", "7"})}
    resources = dict.fromkeys("1234567", 1.0)
    result = sticky_balanced(["a", "b", "c"], resources, previous)
    assert sorted(len(rs) for rs in result.values()) == [2, 2, 3]
    assert len(result["a"]) == 3
    assert moved(previous, result) == 2 == minimum_moves(["a", "b", "c"], resources, previous)


def test_departed_members_removed_and_duplicated_resources_are_handled() -> None:
    previous = {"a": {"x", "y", "gone"}, "b": {"y", "z"}, "ghost": {"w"}}
    resources = dict.fromkeys(["x", "y", "z", "w"], 1.0)
    result = sticky_balanced(["b", "a"], resources, previous)
    assert result == {"a": frozenset({"x", "y"}), "b": frozenset({"z", "w"})}
    # "y" was listed twice: it counts as a's, the smaller id, so keeping it there is no move.
    assert moved(previous, result) == 0


def test_moved_ignores_departed_owners_and_new_resources() -> None:
    previous = {"a": {"1", "2"}, "gone": {"3"}}
    current = {"a": frozenset({"1"}), "b": frozenset({"2", "3", "4"})}
    assert moved(previous, current) == 1


def test_weighted_new_resources_go_to_the_least_loaded_heaviest_first() -> None:
    weights = {"a1": 5.0, "b1": 1.0, "new_heavy": 4.0, "new_light": 0.5}
    previous = {"a": frozenset({"a1"}), "b": frozenset({"b1"})}
    result = sticky_balanced(["a", "b"], weights, previous)
    assert result == {"a": frozenset({"a1", "new_light"}), "b": frozenset({"b1", "new_heavy"})}


def test_weighted_join_releases_from_the_members_above_fair_share() -> None:
    weights = {f"r{i}": 1.0 + i % 3 for i in range(30)}  # 60 in all
    before = sticky_balanced(["a", "b"], weights, {})
    after = sticky_balanced(["a", "b", "c"], weights, before)
    assert after["a"] <= before["a"]
    assert after["b"] <= before["b"]
    loads = load(after, weights)
    assert max(loads) - min(loads) <= 3.0


def test_no_members_gives_an_empty_assignment_and_no_resources_empty_sets() -> None:
    assert sticky_balanced([], {"x": 1.0}, {"a": {"x"}}) == {}
    assert round_robin([], {"x": 1.0}, {}) == {}
    assert sticky_balanced(["a"], {}, {"a": {"x"}}) == {"a": frozenset()}
    assert minimum_moves([], {"x": 1.0}, {"a": {"x"}}) == 0


def test_round_robin_deals_sorted_resources_to_sorted_members() -> None:
    result = round_robin(["b", "a"], dict.fromkeys(["r3", "r1", "r2"], 1.0), {"b": {"r1"}})
    assert result == {"a": frozenset({"r1", "r3"}), "b": frozenset({"r2"})}


@pytest.mark.parametrize("weight", [0.0, -1.0, math.nan, math.inf])
@pytest.mark.parametrize("assignor", ALL_ASSIGNORS, ids=["sticky", "round_robin"])
def test_a_weight_that_is_not_finite_and_positive_is_refused(
    assignor: Assignor, weight: float
) -> None:
    with pytest.raises(ConfigurationError, match=r"weight of resource 'bad' is .*above 0"):
        assignor(["a"], {"good": 1.0, "bad": weight}, {})


def test_get_assignor_by_name() -> None:
    assert get_assignor("sticky") is sticky_balanced
    assert get_assignor("round_robin") is round_robin
    assert sorted(ASSIGNORS) == ["round_robin", "sticky"]


def test_get_assignor_names_the_unknown_value_and_the_known_names() -> None:
    with pytest.raises(ConfigurationError) as info:
        get_assignor("range")
    message = str(info.value)
    assert "'range'" in message
    assert "'round_robin'" in message
    assert "'sticky'" in message
    assert isinstance(info.value, ValueError)
