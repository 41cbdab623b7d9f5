"""The member process's trail lines are the JSON the tests and benchmarks parse: the formatted
lines say exactly what ``json.dumps(..., sort_keys=True)`` of their fields says."""

from __future__ import annotations

import io
import json

import pytest

from rebalancer_spark.core.events import EventKind, OwnershipEvent
from rebalancer_spark.testing.member_process import Trail, event_line, handed_line

_FIELDS = (
    "kind",
    "group",
    "resource",
    "member_id",
    "session_id",
    "epoch",
    "at",
    "observed_at",
    "reason",
    "generation",
    "prev_member_id",
    "prev_session_id",
    "prev_epoch",
    "freed",
    "freed_at",
)


def _expected(event: OwnershipEvent) -> str:
    fields = {name: getattr(event, name) for name in _FIELDS}
    fields["kind"] = event.kind.value
    return json.dumps(fields, sort_keys=True) + "\n"


@pytest.mark.parametrize(
    "event",
    [
        OwnershipEvent(
            kind=EventKind.ACQUIRED,
            group="scale-1",
            resource="s3://bucket/prefix/000123/",
            member_id="m16",
            session_id="2b0f6c1e9f0a4d3c",
            epoch=5,
            at=1764366462.123456,
            observed_at=1764366462.1235,
            reason="granted by the target",
            generation=12,
            coordinator_epoch=3,
            prev_member_id="m3",
            prev_session_id="a9",
            prev_epoch=4,
            freed="released",
            freed_at=1764366462.01,
        ),
        OwnershipEvent(
            kind=EventKind.RELEASED,
            group="g",
            resource='odd "quoted" \\ id \u00e9\u4e2d \U0001f600\t',
            member_id="m-1",
            session_id="s",
            epoch=1,
            at=1.5,
            observed_at=2.0,
            reason='the target moved it away: "join"',
        ),
        OwnershipEvent(
            kind=EventKind.LOST,
            group="g",
            resource="r",
            member_id="m",
            session_id="s",
            epoch=0,
            at=1e-07,
            observed_at=123456789012.25,
            reason="lease lapsed",
            generation=None,
            prev_epoch=None,
            freed="expired",
            freed_at=None,
        ),
    ],
)
def test_an_event_line_is_the_sorted_json_of_its_fields(event: OwnershipEvent) -> None:
    line = event_line(event)
    assert line == _expected(event)
    assert json.loads(line)["resource"] == event.resource


@pytest.mark.parametrize("progress", [None, 0, 41, 10**20, "text", {"files": ["a", "b"]}, 2.5])
def test_a_handed_line_is_the_sorted_json_of_its_fields(progress: object) -> None:
    line = handed_line('dir/\u00e9 "x"', 3, progress, 1764366462.5)
    record = {
        "kind": "handed",
        "resource": 'dir/\u00e9 "x"',
        "epoch": 3,
        "progress": progress,
        "at": 1764366462.5,
    }
    assert line == json.dumps(record, sort_keys=True) + "\n"


def test_a_trail_writes_the_events_of_one_change_in_one_write() -> None:
    stream = io.StringIO()
    events = [
        OwnershipEvent(
            kind=EventKind.ACQUIRED,
            group="g",
            resource=f"r{i}",
            member_id="m",
            session_id="s",
            epoch=1,
            at=1.0,
            observed_at=1.0,
            reason="granted",
        )
        for i in range(3)
    ]
    Trail(stream).emit_many(events)
    lines = stream.getvalue().splitlines()
    assert [json.loads(x)["resource"] for x in lines] == ["r0", "r1", "r2"]
