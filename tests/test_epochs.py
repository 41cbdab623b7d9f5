"""The remembered resource set of :class:`~rebalancer_spark.backends.epochs.EpochMemory`: kept
with its version, brought up to date by changes only when they start at that version."""

from __future__ import annotations

from rebalancer_spark.backends.epochs import PENDING_CHANGES, EpochMemory
from rebalancer_spark.core.model import Resource, ResourceChange


def _change(
    since: int, put: tuple[str, ...] | list[str] = (), removed: tuple[str, ...] | list[str] = ()
) -> ResourceChange:
    return ResourceChange(since, since + 1, {r: Resource(r) for r in put}, frozenset(removed))


def test_changes_from_the_remembered_version_are_applied_when_the_set_is_built() -> None:
    memory = EpochMemory()
    loads: list[int] = []

    def load() -> list[Resource]:
        loads.append(1)
        return [Resource("a"), Resource("b")]

    memory.keep_resources("g", 4, load)
    assert memory.changed_resources("g", _change(4, put=["c"], removed=["a"]))
    assert memory.changed_resources("g", _change(5, put=["a"]))
    assert loads == []  # nothing built yet: a follower keeps the rows as read
    assert {r.id for r in memory.resources("g")} == {"a", "b", "c"}
    assert {r.id for r in memory.resources("g")} == {"a", "b", "c"} and loads == [1]


def test_a_change_from_another_version_is_refused_and_leaves_the_set() -> None:
    memory = EpochMemory()
    assert not memory.changed_resources("g", _change(0, put=["x"]))  # nothing remembered
    memory.saw_resources("g", {"a": Resource("a")}, 7)
    assert not memory.changed_resources("g", _change(6, put=["x"]))  # older than the set
    assert not memory.changed_resources("g", _change(8, put=["x"]))  # a version skipped
    assert [r.id for r in memory.resources("g")] == ["a"]
    memory.saw_resources("g", {}, 9)  # an empty set read is not kept: neither is its version
    assert not memory.changed_resources("g", _change(9, put=["x"]))
    assert memory.changed_resources("g", _change(7, put=["x"]))
    assert {r.id for r in memory.resources("g")} == {"a", "x"}


def test_many_changes_are_folded_into_the_set_instead_of_piling_up() -> None:
    memory = EpochMemory()
    memory.keep_resources("g", 0, lambda: [Resource("base")])
    for v in range(PENDING_CHANGES + 5):
        assert memory.changed_resources("g", _change(v, put=[f"r{v}"], removed=[f"r{v - 1}"]))
    kept = memory._resources["g"]
    assert len(kept.changes) <= PENDING_CHANGES and kept.version == PENDING_CHANGES + 5
    assert {r.id for r in memory.resources("g")} == {"base", f"r{PENDING_CHANGES + 4}"}


def test_no_change_applies_to_a_set_kept_from_another_incarnation() -> None:
    memory = EpochMemory()
    memory.joined("g", "one")
    memory.saw_resources("g", {"a": Resource("a")}, 3)
    memory.joined("g", "one")  # the same incarnation again: the set keeps its version
    assert memory.changed_resources("g", _change(3, put=["b"]))
    memory.joined("g", "two")  # the store lost the group: versions are numbered afresh
    assert not memory.changed_resources("g", _change(4, put=["c"]))
    assert {r.id for r in memory.resources("g")} == {"a", "b"}  # kept, to be declared again


def test_own_writes_apply_only_to_the_version_just_before_theirs() -> None:
    """This handle's own delta (Backend.update_resources) made ``version``: applied to the kept
    set when that set is at ``version - 1``; a set kept at an older version missed another
    writer's change in between, so the caller must read the set rather than keep the delta
    applied to it (the Redis test test_a_set_declared_again_after_a_loss_keeps_another_writers_
    change does that against a server)."""
    memory = EpochMemory()
    assert memory.wrote_resources("g", 3, True, {"x": Resource("x")}, [])  # nothing kept
    assert memory.resources("g") == []
    memory.saw_resources("g", {"a": Resource("a"), "b": Resource("b")}, 3)
    assert memory.wrote_resources("g", 4, True, {"c": Resource("c")}, ["a"])
    assert {r.id for r in memory.resources("g")} == {"b", "c"}
    assert memory.wrote_resources("g", 4, False, {"c": Resource("c")}, [])  # nothing to do
    # Another writer made 5; this handle's delta made 6: the kept set (4) cannot take it.
    assert not memory.wrote_resources("g", 6, True, {"d": Resource("d")}, [])
    assert {r.id for r in memory.resources("g")} == {"b", "c"}
    # A delta that changed nothing, answered with the other writer's version: not at it either.
    assert not memory.wrote_resources("g", 5, False, {"c": Resource("c")}, [])
    memory.saw_resources("g", {"b": Resource("b"), "c": Resource("c"), "e": Resource("e")}, 6)
    assert memory.wrote_resources("g", 5, False, {}, [])  # older than the set kept: nothing
    # An id both put and removed by one delta is removed (the order the stores apply them).
    assert memory.wrote_resources("g", 7, True, {"f": Resource("f"), "e": Resource("e")}, ["e"])
    assert {r.id for r in memory.resources("g")} == {"b", "c", "f"}
