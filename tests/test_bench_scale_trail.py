"""The scale benchmark reads its members' trails with three regular expressions instead of
the json module (``bench_scale.TrailFile``: a join's 17,600 lines took the harness 0.29 s of
the cores the members were measured on). What it reads must be what json reads, for any id
a member may write and for lines that arrive in pieces."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rebalancer_spark.core.events import EventKind, OwnershipEvent
from rebalancer_spark.testing.member_process import event_line, handed_line

# The benchmark imports its neighbours by name and puts the checkout on sys.path; the path
# is put back as it was, so that the subprocesses other tests start (PYTHONPATH built from
# sys.path) see what they would have seen without this module.
_saved = list(sys.path)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
try:
    import bench_scale
finally:
    sys.path[:] = _saved

IDS = [
    "s3://bucket/prefix/000123/",
    'odd "quoted" \\ id \u00e9\u4e2d \U0001f600\t',
    '"kind": "acquired", "at": 99, "resource": "x"',
    "\\",
    "r",
]


def _event(kind: EventKind, resource: str, at: float, reason: str) -> OwnershipEvent:
    return OwnershipEvent(
        kind=kind,
        group="g",
        resource=resource,
        member_id="m1",
        session_id="s1",
        epoch=3,
        at=at,
        observed_at=at + 0.5,
        reason=reason,
        freed="released",
        freed_at=at - 1.0,
    )


def test_a_trail_read_in_pieces_says_what_json_says(tmp_path: Path) -> None:
    lines: list[str] = []
    for k, rid in enumerate(IDS):
        lines.append(event_line(_event(EventKind.ACQUIRED, rid, 100.0 + k, '"at": 1e9')))
        lines.append(handed_line(rid, 3, {"kind": "acquired", "at": 5e9}, 200.0 + k))
    for k, rid in enumerate(IDS[::2]):
        kind = EventKind.RELEASED if k % 2 else EventKind.LOST
        lines.append(event_line(_event(kind, rid, 150.0 + k, 'the "resource": "r"')))
    text = "".join(lines).encode("utf-8")
    path = tmp_path / "m1.jsonl"
    trail = bench_scale.TrailFile(path)
    trail.poll()  # no file yet
    with path.open("wb") as out:
        for cut in (0, len(text) // 3, len(text) // 3 + 7, 2 * len(text) // 3, len(text)):
            out.write(text[out.tell() : cut])  # whole lines and pieces of one
            out.flush()
            trail.poll()
    trail.close()
    owned: set[str] = set()
    last = 0.0
    for line in text.decode("utf-8").splitlines():
        record = json.loads(line)
        if record["kind"] == "acquired":
            owned.add(record["resource"])
        elif record["kind"] in ("released", "lost"):
            owned.discard(record["resource"])
        else:
            continue
        last = max(last, record["at"])
    assert trail.owned == owned == set(IDS) - set(IDS[::2])
    assert trail.last == last == 152.0
