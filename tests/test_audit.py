"""Proof from the trail (core.audit): events become intervals; overlaps and gaps are found."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rebalancer_spark.core import audit as audit_module
from rebalancer_spark.core.audit import Gap, Interval, Overlap, gaps, intervals, overlaps

Event = dict[str, object]
PROPS = settings(max_examples=200, deadline=None)
RESOURCES = ["r0", "r1", "s3://bucket/a/", "r3"]
MEMBERS = ["m0", "m1", "m2"]


def event(
    kind: str,
    at: object,
    *,
    resource: str = "r",
    member_id: str = "m1",
    session_id: str = "s1",
    epoch: object = 1,
    observed_at: object = None,
) -> Event:
    return {
        "kind": kind,
        "resource": resource,
        "member_id": member_id,
        "session_id": session_id,
        "epoch": epoch,
        "at": at,
        "observed_at": at if observed_at is None else observed_at,
    }


def owned(
    start: float,
    end: float | None,
    *,
    member_id: str = "m1",
    session_id: str = "s1",
    epoch: int = 1,
    kind: str = "released",
    resource: str = "r",
) -> list[Event]:
    """The events of one ownership: acquired at ``start``, closed by ``kind`` at ``end``
    (no closing event when ``end`` is None)."""
    who = {"resource": resource, "member_id": member_id, "session_id": session_id}
    opened = [event("acquired", start, epoch=epoch, **who)]
    return opened if end is None else [*opened, event(kind, end, epoch=epoch, **who)]


def test_public_surface_is_pinned() -> None:
    assert audit_module.__all__ == ["Gap", "Interval", "Overlap", "gaps", "intervals", "overlaps"]


# --- intervals from events ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["released", "lost"])
def test_an_acquired_interval_is_closed_by_its_release_or_loss(kind: str) -> None:
    found = intervals(owned(1.0, 4.5, kind=kind, epoch=7))
    assert found == {"r": [Interval("r", "m1", "s1", 7, 1.0, 4.5, kind)]}


def test_a_loss_ends_when_the_lease_did_not_when_the_member_noticed() -> None:
    events = [event("acquired", 1.0), event("lost", 5.0, observed_at=60.0)]
    assert intervals(events)["r"][0].end == 5.0


def test_a_closing_event_counts_only_for_its_own_session_and_epoch() -> None:
    events = [
        event("acquired", 1.0, session_id="s1", epoch=1),
        event("released", 2.0, session_id="s2", epoch=1),  # another session
        event("released", 3.0, session_id="s1", epoch=2),  # another epoch
        event("fenced", 4.0, session_id="s1", epoch=1),  # not an end of ownership
    ]
    assert intervals(events) == {"r": [Interval("r", "m1", "s1", 1, 1.0, math.inf, "open")]}


def test_an_unclosed_interval_is_superseded_by_the_next_higher_epoch() -> None:
    crashed = owned(0.0, None, member_id="m1", session_id="s1", epoch=3)
    successor = owned(7.0, 9.0, member_id="m2", session_id="s2", epoch=4)
    assert intervals([*successor, *crashed]) == {
        "r": [
            Interval("r", "m1", "s1", 3, 0.0, 7.0, "superseded"),
            Interval("r", "m2", "s2", 4, 7.0, 9.0, "released"),
        ]
    }


def test_the_last_unclosed_interval_stays_open() -> None:
    events = [*owned(0.0, 2.0, epoch=1), *owned(3.0, None, session_id="s2", epoch=2)]
    last = intervals(events)["r"][-1]
    assert (last.session_id, last.end, last.closed_by) == ("s2", math.inf, "open")


def test_intervals_are_grouped_by_resource_and_sorted_by_epoch() -> None:
    events = [
        *owned(5.0, 6.0, resource="a", session_id="s2", epoch=2),
        *owned(0.0, 1.0, resource="b", session_id="s1", epoch=9),
        *owned(0.0, 1.0, resource="a", session_id="s1", epoch=1),
    ]
    found = intervals(events)
    assert sorted(found) == ["a", "b"]
    assert [i.epoch for i in found["a"]] == [1, 2]
    assert [i.epoch for i in found["b"]] == [9]


def test_numbers_given_as_text_are_read() -> None:
    events = [event("acquired", "1.5", epoch="4"), event("released", 3, epoch=4)]
    assert intervals(events) == {"r": [Interval("r", "m1", "s1", 4, 1.5, 3.0, "released")]}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("epoch", True, "epoch True is not an integer"),
        ("epoch", None, "epoch None is not an integer"),
        ("at", False, "time False is not a number"),
        ("at", [1.0], r"time \[1.0\] is not a number"),
    ],
)
def test_malformed_numbers_are_refused_naming_the_value(
    field: str, value: object, message: str
) -> None:
    bad = event("acquired", 1.0)
    bad[field] = value
    with pytest.raises(ValueError, match=message):
        intervals([bad])


# --- overlaps and gaps ----------------------------------------------------------------------


def test_two_owners_at_once_are_an_overlap() -> None:
    first = owned(0.0, 10.0, member_id="m1", session_id="s1", epoch=1)
    second = owned(6.0, 15.0, member_id="m2", session_id="s2", epoch=2)
    found = intervals([*first, *second])
    a, b = found["r"]
    assert overlaps(found) == [Overlap("r", a, b, 4.0)]
    assert overlaps(found, tolerance=3.9) == [Overlap("r", a, b, 4.0)]


@pytest.mark.parametrize("tolerance", [4.0, 10.0])
def test_an_overlap_within_the_clock_skew_tolerance_is_not_reported(tolerance: float) -> None:
    first = owned(0.0, 10.0, session_id="s1", epoch=1)
    second = owned(6.0, 15.0, session_id="s2", epoch=2)
    assert overlaps(intervals([*first, *second]), tolerance=tolerance) == []


def test_an_owner_that_never_let_go_overlaps_everyone_after_it() -> None:
    # Same epoch twice: the store never granted it again, so the first session stays open.
    zombie = owned(0.0, None, session_id="s1", epoch=1)
    second = owned(5.0, 8.0, session_id="s2", epoch=1)
    found = intervals([*zombie, *second])
    a, b = found["r"]
    assert a.closed_by == "open"
    assert overlaps(found) == [Overlap("r", a, b, 3.0)]


def test_back_to_back_owners_neither_overlap_nor_leave_a_gap() -> None:
    events = [
        *owned(0.0, 10.0, session_id="s1", epoch=1),
        *owned(10.0, 20.0, session_id="s2", epoch=2),
        *owned(20.0, None, session_id="s3", epoch=3),
    ]
    found = intervals(events)
    assert overlaps(found) == []
    assert gaps(found) == []


def test_the_unowned_time_between_two_owners_is_a_gap() -> None:
    events = [
        *owned(0.0, 10.0, session_id="s1", epoch=1),
        *owned(13.5, 20.0, session_id="s2", epoch=2),
        *owned(20.0, 21.0, session_id="s3", epoch=3),
        *owned(30.0, None, session_id="s4", epoch=4),
    ]
    found = intervals(events)
    one, two, three, four = found["r"]
    assert gaps(found) == [Gap("r", one, two, 3.5), Gap("r", three, four, 9.0)]


def test_nothing_is_found_in_an_empty_trail() -> None:
    assert intervals([]) == {}
    assert overlaps({}) == []
    assert gaps({}) == []


def test_time_covered_by_an_overlapping_owner_is_not_a_gap() -> None:
    events = [
        *owned(0.0, 100.0, session_id="long", epoch=1),
        *owned(10.0, 20.0, session_id="s2", epoch=2),
        *owned(30.0, 40.0, session_id="s3", epoch=3),
    ]
    found = intervals(events)
    assert len(overlaps(found)) == 2
    assert gaps(found) == []  # r was owned by "long" from 0 to 100


# --- properties over generated histories ----------------------------------------------------


@dataclass(frozen=True)
class History:
    events: list[Event]
    expected: dict[str, list[Interval]]
    gap_seconds: dict[str, int]


@st.composite
def histories(draw: st.DrawFn) -> History:
    """Non-overlapping ownership histories: per resource, owners one after another with
    increasing epochs (steps of 2 or more, leaving room for an injected epoch), each released,
    lost or crashed (no closing event: it ends when its successor starts), the last possibly
    still open; random gaps (zero included) between a closed owner and its successor. Times
    are whole numbers, so sums are exact."""
    events: list[Event] = []
    expected: dict[str, list[Interval]] = {}
    gap_seconds: dict[str, int] = {}
    for resource in draw(st.lists(st.sampled_from(RESOURCES), min_size=1, unique=True)):
        count = draw(st.integers(1, 6))
        start = draw(st.integers(0, 1_000))
        epoch = draw(st.integers(1, 5))
        gap_seconds[resource] = 0
        items: list[Interval] = []
        for n in range(count):
            last = n == count - 1
            how = draw(st.sampled_from(["released", "lost", "open" if last else "superseded"]))
            length = draw(st.integers(1, 50))
            member = draw(st.sampled_from(MEMBERS))
            session = f"{resource}/{member}/{n}"
            end = start + length
            who = {"resource": resource, "member_id": member, "session_id": session}
            events.append(event("acquired", start, epoch=epoch, **who))
            if how in ("released", "lost"):
                late = draw(st.integers(0, 100))
                events.append(event(how, end, epoch=epoch, observed_at=end + late, **who))
            if draw(st.booleans()):
                events.append(event("fenced", start + length / 2, epoch=epoch, **who))
            ends = math.inf if how == "open" else end
            items.append(Interval(resource, member, session, epoch, start, ends, how))
            gap = 0 if how == "superseded" else draw(st.integers(0, 30))
            if not last:
                gap_seconds[resource] += gap
            start = end + gap
            epoch += draw(st.integers(2, 4))
        expected[resource] = items
    shuffled = draw(st.permutations(events))
    return History(list(shuffled), expected, gap_seconds)


@PROPS
@given(histories())
def test_generated_histories_become_the_intervals_they_were_made_of(history: History) -> None:
    assert intervals(history.events) == history.expected


@PROPS
@given(histories(), st.sampled_from([0.0, 0.5, 5.0]))
def test_sequential_owners_never_overlap(history: History, tolerance: float) -> None:
    assert overlaps(intervals(history.events), tolerance=tolerance) == []


@PROPS
@given(histories())
def test_gaps_add_up_to_the_unowned_time_generated(history: History) -> None:
    found = gaps(intervals(history.events))
    per_resource: dict[str, float] = defaultdict(float)
    for gap in found:
        assert gap.seconds > 0
        assert gap.after.end + gap.seconds == gap.before.start
        per_resource[gap.resource] += gap.seconds
    assert dict(per_resource) == {r: s for r, s in history.gap_seconds.items() if s}


def closed(items: Sequence[Interval]) -> list[Interval]:
    return [i for i in items if i.closed_by in ("released", "lost")]


@PROPS
@given(histories(), st.data())
def test_one_injected_second_owner_is_exactly_the_overlap_found(
    history: History, data: st.DataObject
) -> None:
    candidates = [i for items in history.expected.values() for i in closed(items)]
    assume(candidates)
    victim = data.draw(st.sampled_from(candidates), label="victim")
    start = data.draw(st.integers(int(victim.start), int(victim.end) - 1), label="start")
    end = data.draw(st.integers(start + 1, int(victim.end)), label="end")
    tolerance = data.draw(st.sampled_from([0.0, 0.5]), label="tolerance")
    # A second session granted the resource while the victim still held it (a split brain),
    # under an epoch between the victim's and its successor's.
    intruder = owned(
        start,
        end,
        resource=victim.resource,
        member_id="intruder",
        session_id="intruder-session",
        epoch=victim.epoch + 1,
    )
    found = intervals([*history.events, *intruder])
    injected = Interval(
        victim.resource,
        "intruder",
        "intruder-session",
        victim.epoch + 1,
        start,
        end,
        "released",
    )
    assert overlaps(found, tolerance=tolerance) == [
        Overlap(victim.resource, victim, injected, end - start)
    ]
