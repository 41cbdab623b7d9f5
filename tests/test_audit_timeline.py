"""The audit table over time: rebalance statistics, current owners, the timeline PNG, and the
history / timeline / rebalances / owners commands run as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rebalancer_spark.audit import DeltaAuditLog, current_owners, load_events, rebalances
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.events import EventKind, OwnershipEvent

GROUP = "orders"
T0 = 1_790_000_000.0
RESOURCES = [f"r{i}" for i in range(6)]


def event(kind: str, at: float, resource: str, member: str, epoch: int) -> OwnershipEvent:
    return OwnershipEvent(
        kind=EventKind(kind),
        group=GROUP,
        resource=resource,
        member_id=member,
        session_id=f"{member}-s",
        epoch=epoch,
        at=T0 + at,
        observed_at=T0 + at,
        reason=f"{kind} by test",
        info={"host": f"host-{member}", "pid": "1"},
    )


def trail() -> list[OwnershipEvent]:
    """Three rebalances. At 0 s m1 and m2 split six resources; at 10 s m3 joins and takes r0
    from m1 and r3 from m2 (released at 10.0, acquired at 10.2); at 20 s m1's lease lapses
    (r1, r2 lost) and m2, m3 take them over at 21.0."""
    events = [
        event("acquired", 0.01 * i, r, "m1" if i < 3 else "m2", 1) for i, r in enumerate(RESOURCES)
    ]
    events += [
        event("released", 10.0, "r0", "m1", 1),
        event("released", 10.0, "r3", "m2", 1),
        event("acquired", 10.2, "r0", "m3", 2),
        event("acquired", 10.2, "r3", "m3", 2),
        event("fenced", 15.0, "r3", "m2", 1),
        event("lost", 20.0, "r1", "m1", 1),
        event("lost", 20.0, "r2", "m1", 1),
        event("acquired", 21.0, "r1", "m2", 2),
        event("acquired", 21.0, "r2", "m3", 2),
    ]
    return events


def control(at: float, resource: str) -> OwnershipEvent:
    """A control row (a pin, a pause) as a member writes it: no ownership."""
    return OwnershipEvent(
        kind=EventKind.CONTROL,
        group=GROUP,
        resource=resource,
        member_id="m1",
        session_id="m1-s",
        epoch=1,
        at=T0 + at,
        observed_at=T0 + at,
        reason="control v2: paused",
        info={"host": "host-m1", "pid": "1"},
    )


def rows() -> list[dict[str, object]]:
    return [
        {
            "group": e.group,
            "resource": e.resource,
            "member_id": e.member_id,
            "session_id": e.session_id,
            "kind": str(e.kind),
            "epoch": e.epoch,
            "at": e.at,
            "host": e.info["host"],
        }
        for e in trail()
    ]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("audit") / "ownership"
    with DeltaAuditLog(str(path), flush_interval=0) as log:
        for e in trail():
            log(e)
        assert log.flush(), log.last_error
    return str(path)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "rebalancer_spark.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


# -- statistics (pure) ---------------------------------------------------------------------


def test_rebalances_are_clusters_of_changes_with_their_moves() -> None:
    found = rebalances(rows())

    assert [(r.number, round(r.start - T0, 2), round(r.duration, 2)) for r in found] == [
        (1, 0.0, 0.05),
        (2, 10.0, 0.2),
        (3, 20.0, 1.0),
    ]
    first, join, lapse = found
    assert (first.assigned, first.moved, first.acquired) == (6, 0, 6)
    assert (join.moved, join.released, join.members) == (2, 2, ("m1", "m2", "m3"))
    assert (lapse.moved, lapse.lost, lapse.returned) == (2, 2, 0)


def test_a_narrow_window_splits_a_hand_over_and_a_bad_window_is_refused() -> None:
    assert len(rebalances(rows(), window=0.5)) == 4  # the lapse's 1 s hand-over splits
    assert len(rebalances(rows(), window=30)) == 1
    with pytest.raises(ConfigurationError, match="window 0"):
        rebalances(rows(), window=0)


def test_current_owners_as_the_trail_ends() -> None:
    owners = {
        r["resource"]: (r["member_id"], r["epoch"], r["host"]) for r in current_owners(rows())
    }

    assert owners == {
        "r0": ("m3", 2, "host-m3"),
        "r1": ("m2", 2, "host-m2"),
        "r2": ("m3", 2, "host-m3"),
        "r3": ("m3", 2, "host-m3"),
        "r4": ("m2", 1, "host-m2"),
        "r5": ("m2", 1, "host-m2"),
    }


# -- the timeline --------------------------------------------------------------------------


def test_timeline_png_has_a_lane_colour_per_member(table: str, tmp_path: Path) -> None:
    import numpy as np
    from matplotlib.colors import to_rgb
    from matplotlib.image import imread

    from rebalancer_spark.audit.timeline import member_colours

    out = tmp_path / "ownership.png"
    done = run("audit", "timeline", table, "--out", str(out), "--json")

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["width"], report["height"]) == (1200, 352)  # 12 in x (1.6 + 6 x 0.32) in
    assert (report["resources"], report["members"]) == (6, 3)
    assert out.stat().st_size > 10_000
    pixels = imread(str(out))[:, :, :3]
    assert pixels.shape == (352, 1200, 3)
    colours = member_colours(["m1", "m2", "m3"])
    assert len(set(colours.values())) == 3
    counts = {
        member: int(np.all(np.abs(pixels - np.array(to_rgb(hex_))) < 0.01, axis=2).sum())
        for member, hex_ in colours.items()
    }
    # m2 owns the most resource-seconds, m1 the least; each fills hundreds of pixels.
    assert min(counts.values()) > 500, counts
    assert counts["m2"] > counts["m1"], counts
    unused = to_rgb(member_colours([f"m{i}" for i in range(5)])["m4"])
    assert int(np.all(np.abs(pixels - np.array(unused)) < 0.01, axis=2).sum()) < 50


def test_timeline_errors_are_one_line(table: str, tmp_path: Path) -> None:
    empty = run("audit", "timeline", table, "--group", "nobody", "--out", str(tmp_path / "x.png"))
    assert empty.returncode == 2 and empty.stdout == ""
    assert len(empty.stderr.splitlines()) == 1 and "nothing to draw" in empty.stderr
    nowhere = run("audit", "timeline", table, "--out", str(tmp_path / "no" / "dir" / "x.png"))
    assert nowhere.returncode == 2 and "cannot write the timeline" in nowhere.stderr
    assert len(nowhere.stderr.splitlines()) == 1


def test_control_rows_are_neither_lanes_nor_events_of_the_timeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rebalancer_spark.audit.timeline import timeline_figure

    path = str(tmp_path / "audit")
    with DeltaAuditLog(path, flush_interval=0) as log:
        log(control(-100.0, ""))  # long before the first ownership: not the axis origin
        for e in trail()[:2]:  # r0 and r1 acquired by m1
            log(e)
        log(control(0.5, "r0"))
        assert log.flush(), log.last_error
    assert len(load_events(path)) == 4

    report = json.loads(
        here(capsys, "audit", "timeline", path, "--out", str(tmp_path / "t.png"), "--json")
    )
    assert (report["resources"], report["members"], report["events"]) == (2, 1, 2)
    text = here(capsys, "audit", "timeline", path, "--out", str(tmp_path / "t.png"))
    assert "2 resources, 1 members, 2 events" in text, text
    axes = timeline_figure(load_events(path)).axes[0]
    assert [t.get_text() for t in axes.get_yticklabels()] == ["r0", "r1"]
    assert axes.get_xlabel() == "seconds since 2026-09-21T14:13:20.000Z"  # T0, not T0 - 100
    with pytest.raises(ConfigurationError, match="nothing to draw"):
        timeline_figure([r for r in load_events(path) if r["kind"] == "control"])


# -- history, rebalances, owners from the command line ----------------------------------------


def test_history_is_a_top_level_command_with_since(table: str) -> None:
    top = run("history", "--audit", table, "--group", GROUP)
    assert top.returncode == 0, top.stderr
    assert top.stdout == run("audit", "history", table, "--group", GROUP).stdout
    assert len(top.stdout.splitlines()) == 15
    since = run("history", "--audit", table, "--since", "2026-09-21T14:13:38Z", "--json")
    kinds = [e["kind"] for e in json.loads(since.stdout)["events"]]
    assert kinds == ["lost", "lost", "acquired", "acquired"]
    only = run("history", "--audit", table, "--resource", "r3").stdout.splitlines()
    assert len(only) == 4 and "fenced" in only[3]
    recent = run("history", "--audit", table, "--since", "1h")  # the trail is from 2026-09
    assert recent.stdout.strip() == "no events"
    bad = run("history", "--audit", table, "--since", "yesterday")
    assert bad.returncode == 2 and "--since 'yesterday'" in bad.stderr
    assert len(bad.stderr.splitlines()) == 1
    missing = run("history")
    assert missing.returncode == 2 and "--audit" in missing.stderr


def here(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run the CLI in this process (the subprocess tests above cover the real entry point);
    return its standard output."""
    from rebalancer_spark.cli import main

    try:
        code = main(list(args))
    except SystemExit as exc:  # --help
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def test_rebalances_and_owners_commands(table: str, capsys: pytest.CaptureFixture[str]) -> None:
    lines = here(capsys, "audit", "rebalances", table).splitlines()
    assert lines[0].split()[:6] == ["#", "GROUP", "GEN", "TRIGGER", "START", "(UTC)"]
    assert lines[2].split()[5:8] == ["0.200", "2", "0"]  # rebalance 2: 0.2 s, 2 moved
    assert lines[4].startswith("3 rebalances (by generation where recorded)")
    assert lines[5].startswith("note: group orders: all its rebalances guessed by clustering")
    data = json.loads(here(capsys, "audit", "rebalances", table, "--json"))
    assert data["rebalances"] == 3 and data["moved"] == 4
    assert [i["moved"] for i in data["items"]] == [0, 2, 2]
    assert data["max_duration"] == pytest.approx(1.0)

    owners = json.loads(here(capsys, "audit", "owners", table, "--json"))["owners"]
    assert {o["resource"]: o["member_id"] for o in owners}["r1"] == "m2"
    table_text = here(capsys, "audit", "owners", table)
    assert table_text.splitlines()[0].split()[:3] == ["GROUP", "RESOURCE", "OWNER"]
    assert len(table_text.splitlines()) == 7


def test_rebalances_since_counts_moves_from_the_whole_trail(
    table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hand-over just after --since is a move: the previous owner is before the cut."""
    from datetime import UTC, datetime

    cut = datetime.fromtimestamp(T0 + 5.0, UTC).isoformat().replace("+00:00", "Z")
    data = json.loads(here(capsys, "audit", "rebalances", table, "--since", cut, "--json"))

    assert data["rebalances"] == 2 and data["moved"] == 4
    items = [(i["number"], i["moved"], i["assigned"]) for i in data["items"]]
    assert items == [(2, 2, 0), (3, 2, 0)]
    late = datetime.fromtimestamp(T0 + 30.0, UTC).isoformat()
    assert here(capsys, "audit", "rebalances", table, "--since", late).strip() == "no rebalances"


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (("history", "--help"), ("audit", "timeline", "--help")):
        text = here(capsys, *args)
        assert "exit status: 0 ok; 2 bad input" in " ".join(text.split())


def test_load_events_feeds_the_statistics(table: str) -> None:
    assert len(rebalances(load_events(table, group=GROUP))) == 3


def test_upkeep_as_documented_keeps_the_table_readable_and_writable(tmp_path: Path) -> None:
    """docs/operations.md: compact, checkpoint and vacuum with deltalake while the table is in
    use; every event is still there and members can go on appending."""
    from deltalake import DeltaTable

    path = str(tmp_path / "audit")
    with DeltaAuditLog(path, flush_interval=0) as log:
        for e in trail():  # one commit per event: many small files
            log(e)
            assert log.flush(), log.last_error
        table = DeltaTable(path)
        before = len(table.file_uris())
        assert table.optimize.compact()["numFilesRemoved"] == before
        table.create_checkpoint()
        table.cleanup_metadata()
        removed = table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        assert len(removed) == before
        log(event("released", 30.0, "r4", "m2", 1))  # the same writer appends after upkeep
        assert log.flush(), log.last_error
    assert len(DeltaTable(path).file_uris()) == 2
    assert len(load_events(path)) == len(trail()) + 1
