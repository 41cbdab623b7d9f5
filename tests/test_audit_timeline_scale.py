"""The timeline stays readable for thousands of resources (lanes aggregated by prefix, by member
or by ranges of ids) and marks rebalances and control events above the lanes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgb
from matplotlib.image import imread

from rebalancer_spark.audit.timeline import member_colours, save_timeline, timeline_figure
from rebalancer_spark.cli import main
from rebalancer_spark.core.errors import ConfigurationError
from tests.support.audit_tables import as_events, row, write_audit

T0 = 1_790_000_000.0


def many(names: list[str], members: int) -> list[dict[str, object]]:
    """Each resource acquired at 0 s by member i % members; at 10 s member m0 loses its
    resources, taken over by m1 at 11 s (a 1 s gap)."""
    rows = []
    for i, name in enumerate(names):
        owner = f"m{i % members}"
        rows.append(row("acquired", T0 + i * 1e-4, name, owner, 1, generation=1))
        if owner == "m0":
            rows.append(row("lost", T0 + 10, name, "m0", 1, generation=2))
            rows.append(row("acquired", T0 + 11, name, "m1", 2, generation=2))
    rows.append(row("released", T0 + 20, names[-1], f"m{(len(names) - 1) % members}", 1))
    return as_events(rows)


def pixels_of(path: Path, colour: str) -> int:
    pixels = imread(str(path))[:, :, :3]
    return int(np.all(np.abs(pixels - np.array(to_rgb(colour))) < 0.01, axis=2).sum())


def test_thousands_of_resources_with_prefixes_get_one_lane_per_prefix(tmp_path: Path) -> None:
    names = [f"day-{d:02d}/part-{i:04d}" for d in range(30) for i in range(100)]
    out = tmp_path / "t.png"
    started = time.monotonic()
    image = save_timeline(many(names, 4), out)
    took = time.monotonic() - started
    assert (image.lanes, image.lane_count) == ("prefix", 30)
    assert image.height <= 1300 and image.width == 1200, image
    assert took < 30, f"drawing 3000 resources took {took:.1f} s"
    for member, colour in member_colours(["m0", "m1", "m2", "m3"]).items():
        assert pixels_of(out, colour) > 2000, member
    axes = timeline_figure(many(names, 4)).axes[0]
    labels = [t.get_text() for t in axes.get_yticklabels()]
    assert labels[:2] == ["day-00/ (100)", "day-01/ (100)"]


def test_thousands_of_resources_without_prefixes_get_a_lane_per_member(tmp_path: Path) -> None:
    names = [f"queue-{i:04d}" for i in range(4000)]
    image = save_timeline(many(names, 5), tmp_path / "t.png")
    assert (image.lanes, image.lane_count) == ("member", 5)
    axes = timeline_figure(many(names, 5)).axes[0]
    assert [t.get_text() for t in axes.get_yticklabels()] == ["m0", "m1", "m2", "m3", "m4"]


def test_too_many_members_too_get_ranges_of_ids(tmp_path: Path) -> None:
    names = [f"queue-{i:04d}" for i in range(3000)]
    image = save_timeline(many(names, 100), tmp_path / "t.png")
    assert (image.lanes, image.lane_count) == ("prefix", 60)
    axes = timeline_figure(many(names, 100)).axes[0]
    assert axes.get_yticklabels()[0].get_text() == "queue-0000 … queue-0049 (50)"
    assert image.height <= 2400  # 60 lanes and 10 rows of legend for 100 members


def test_one_lane_per_resource_is_refused_for_thousands() -> None:
    names = [f"queue-{i:04d}" for i in range(3000)]
    with pytest.raises(ConfigurationError, match="3000 resources are too many to draw one per"):
        timeline_figure(many(names, 4), lanes="resource")


def test_rebalances_and_control_events_are_marked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    audit = str(tmp_path / "audit")
    write_audit(
        audit,
        [
            row("rebalance", T0, "", "m1", 0, generation=1, trigger="start", moves=0),
            row("acquired", T0 + 0.1, "r0", "m1", 1, generation=1),
            row("acquired", T0 + 0.1, "r1", "m1", 1, generation=1),
            row("control", T0 + 5, "", "m1", 1, reason="control v1: paused by op@host"),
            row("control", T0 + 7, "", "m1", 1, reason="control v2: resumed by op@host"),
            row("rebalance", T0 + 8, "", "m1", 0, generation=2, trigger="join", moves=1),
            row("released", T0 + 8.1, "r1", "m1", 1, generation=2),
            row("acquired", T0 + 8.2, "r1", "m2", 2, generation=2),
        ],
    )
    out = tmp_path / "t.png"
    assert main(["audit", "timeline", audit, "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["lanes"], data["lane_count"], data["marks"], data["events"]) == (
        "resource",
        2,
        4,
        4,
    )
    from rebalancer_spark.audit.rows import load_rows

    figure = timeline_figure(load_rows(audit).rows)
    lanes_axes, strip = figure.axes[0], figure.axes[1]
    assert [t.get_text() for t in lanes_axes.get_yticklabels()] == ["r0", "r1"]
    assert [t.get_text() for t in strip.get_yticklabels()] == ["rebalance", "control"]
    texts = [t.get_text().strip() for t in strip.texts]
    assert texts == [
        "g1 start",
        "control v1: paused by op@hos",
        "control v2: resumed by op@ho",
        "g2 join",
    ]
    assert main(["audit", "timeline", audit, "--out", str(out), "--lanes", "member"]) == 0
    assert "2 lanes by member, 4 rebalance and control marks" in capsys.readouterr().out
