"""notebooks/ownership_audit.ipynb, executed as an analyst runs it: on an audit table written by
live members, in a real Jupyter kernel of this interpreter, its outputs checked."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark import Member, MemberConfig
from rebalancer_spark.audit import DeltaAuditLog, load_events, rebalances
from rebalancer_spark.core.events import EventKind, OwnershipEvent

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "ownership_audit.ipynb"
SRC = Path(__file__).resolve().parents[1] / "src"
KERNEL = "rebalancer-test-python"


def live_audit_table(tmp_path: Path) -> str:
    """m1 owns four resources alone, then m2 joins and takes two: the audit table then holds
    two rebalances and ends with two resources each."""
    path = str(tmp_path / "audit")
    url = f"sqlite://{tmp_path}/groups.db"
    audit = DeltaAuditLog(path, flush_interval=0.05)

    def config(member_id: str) -> MemberConfig:
        return MemberConfig(
            group="nb",
            backend=url,
            member_id=member_id,
            session_timeout=2.0,
            stability_window=0.05,
        )

    m1 = Member(config("m1"), resources=["a", "b", "c", "d"], event_sinks=[audit])
    m2 = Member(config("m2"), event_sinks=[audit])
    try:
        m1.start()
        assert m1.wait_until(lambda m: len(m.assigned()) == 4, timeout=15)
        m2.start()
        for m in (m1, m2):
            assert m.wait_until(lambda x: len(x.assigned()) == 2, timeout=15), m.member_id
        assert audit.flush(30), audit.last_error
    finally:
        audit.close()  # before the members leave: the table ends with both owning
        m2.stop(drain=False)
        m1.stop(drain=False)
    return path


def kernel_spec(where: Path) -> None:
    """A kernel spec named KERNEL that runs ipykernel on this interpreter."""
    spec = where / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "rebalancer test", "language": "python"})
    )


def text_of(cell: dict[str, Any]) -> str:
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts.append(output.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def written_table(tmp_path: Path, events: list[OwnershipEvent]) -> str:
    path = str(tmp_path / "audit")
    with DeltaAuditLog(path, flush_interval=0) as log:
        for e in events:
            log(e)
        assert log.flush(), log.last_error
    return path


def row(kind: EventKind, group: str, resource: str, member: str, epoch: int, at: float) -> Any:
    return OwnershipEvent(
        kind=kind,
        group=group,
        resource=resource,
        member_id=member,
        session_id=f"{member}-s",
        epoch=epoch,
        at=1_790_000_000.0 + at,
        observed_at=1_790_000_000.0 + at,
        reason="control v2: paused" if kind is EventKind.CONTROL else "test",
        info={"host": "h", "pid": "1"},
    )


def execute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, audit: str, group: str | None = None
) -> list[Any]:
    """Run the committed notebook (which must have no outputs) on ``audit``; its code cells,
    executed, with no error."""
    import nbformat
    from nbclient import NotebookClient

    kernel_spec(tmp_path / "jupyter")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", str(SRC))
    monkeypatch.setenv("REBALANCER_AUDIT", audit)
    if group is not None:
        monkeypatch.setenv("REBALANCER_GROUP", group)
    notebook = nbformat.read(NOTEBOOK, as_version=4)  # type: ignore[no-untyped-call]
    assert all(c.get("outputs", []) == [] for c in notebook.cells if c.cell_type == "code"), (
        "commit the notebook without outputs"
    )

    NotebookClient(notebook, kernel_name=KERNEL, timeout=120, allow_errors=False).execute()

    code = [c for c in notebook.cells if c.cell_type == "code"]
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    stray = [
        text_of(c) for c in code if "Series([]" in text_of(c) or "Empty DataFrame" in text_of(c)
    ]
    assert not stray, f"an empty pandas object printed: {stray}"
    return code


def images(code: list[Any]) -> int:
    return len([o for c in code for o in c.outputs if "image/png" in o.get("data", {})])


@pytest.mark.slow
def test_the_notebook_shows_owners_timeline_and_rebalances(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    audit = live_audit_table(tmp_path)

    code = execute(tmp_path, monkeypatch, audit)

    owners = next(c for c in code if "current_owners(" in c.source)
    shown = text_of(owners)
    assert "m1    2" in shown and "m2    2" in shown, shown
    assert images(code) == 2  # the timeline and the rebalance chart
    stats = text_of(next(c for c in code if "rebalances(" in c.source))
    expected = len(rebalances(load_events(audit), window=2.0))
    assert f"{expected} rebalances, 2 resources moved" in stats, stats
    verdict = text_of(code[-1])
    assert verdict.startswith("audit OK"), verdict


@pytest.mark.slow
@pytest.mark.parametrize("group", [None, "nobody"])
def test_the_notebook_says_so_when_there_is_no_ownership(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group: str | None
) -> None:
    """A table with only a control row, or a GROUP that matches nothing: every cell runs and
    says there is nothing, no empty chart is drawn."""
    audit = written_table(tmp_path, [row(EventKind.CONTROL, "nb", "", "m1", 1, 0.0)])

    code = execute(tmp_path, monkeypatch, audit, group)

    assert text_of(code[1]).startswith("0 events" if group else "1 events"), text_of(code[1])
    shown = "".join(text_of(c) for c in code)
    assert "no ownership events: no resource has had an owner" in shown
    assert "no ownership events: no timeline to draw" in shown
    assert "no rebalances: the table holds no ownership change" in shown
    assert "no rebalances to chart" in shown
    assert images(code) == 0
    assert text_of(code[-1]).startswith("audit OK"), text_of(code[-1])


@pytest.mark.slow
def test_the_notebook_charts_the_rebalances_of_several_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rebalance numbers restart in each group: the bars are coloured by group (the duration
    chart holds both groups' colours), not drawn per number on top of each other."""
    import base64
    import io

    import numpy as np
    from matplotlib.colors import to_rgb
    from matplotlib.image import imread

    from rebalancer_spark.audit.timeline import member_colours

    acquired, released = EventKind.ACQUIRED, EventKind.RELEASED
    audit = written_table(
        tmp_path,
        [
            row(acquired, "orders", "a", "m1", 1, 0.0),
            row(acquired, "orders", "b", "m1", 1, 0.5),
            row(acquired, "clicks", "x", "m1", 1, 1.0),
            row(acquired, "clicks", "y", "m1", 1, 1.4),
            row(released, "orders", "a", "m1", 1, 10.0),
            row(acquired, "orders", "a", "m2", 2, 10.3),
        ],
    )

    code = execute(tmp_path, monkeypatch, audit)

    stats = text_of(next(c for c in code if "rebalances(" in c.source))
    assert "3 rebalances, 1 resources moved" in stats, stats
    assert "orders" in stats and "clicks" in stats, stats
    assert images(code) == 2
    chart = next(c for c in code if "chart.savefig" in c.source)
    png = base64.b64decode(
        next(o for o in chart.outputs if "image/png" in o.get("data", {})).data["image/png"]
    )
    pixels = imread(io.BytesIO(png), format="png")[:, :, :3]
    duration = pixels[:, : pixels.shape[1] // 2]
    for group, colour in member_colours(["clicks", "orders"]).items():
        near = np.all(np.abs(duration - np.array(to_rgb(colour))) < 0.01, axis=2)
        assert int(near.sum()) > 200, group


@pytest.mark.slow
def test_the_notebook_shows_rebalances_by_generation_and_a_group_owning_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A table with the chain columns and the coordinator's rebalance rows: rebalances listed
    by generation with their trigger, no clustering note; every resource released at the end,
    so nobody owns anything now (said in words, no empty pandas object printed)."""
    from tests.support.audit_tables import row as chain_row
    from tests.support.audit_tables import write_audit
    from tests.test_audit_rebalances import T0, pin_then_drain

    audit = str(tmp_path / "audit")
    ends = [
        chain_row("released", T0 + 30, r, m, e, coordinator_epoch=1)  # a leave: no target
        for r, m, e in (("r0", "job-a", 1), ("r1", "job-a", 2), ("r2", "job-a", 2))
    ]
    write_audit(audit, [*pin_then_drain(), *ends])

    code = execute(tmp_path, monkeypatch, audit)

    shown = "".join(text_of(c) for c in code)
    assert "nobody owns anything now: all 3 resources were released or lost" in shown
    stats = text_of(next(c for c in code if "rebalances(" in c.source))
    assert "4 rebalances, 2 resources moved" in stats, stats
    assert "operator: drain job-b" in stats and "discovery" in stats, stats
    assert "note:" not in stats, stats
    assert images(code) == 2
    assert "no lag samples: the table holds none" in shown  # no lag rows in this table


@pytest.mark.slow
def test_the_notebook_draws_the_lag_over_time_from_the_lag_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twelve file resources and two queues, each behind then caught up: a chart of files
    (the ten furthest behind and the sum of all) and one of messages, next to the timeline."""
    events = []
    for i in range(12):
        resource = f"r{i:02d}"
        events.append(row(EventKind.ACQUIRED, "nb", resource, "m1", 1, float(i)))
        for t, files in ((i + 0.5, 10 + i), (i + 5.0, 3), (i + 9.0, 0)):
            lagging = row(EventKind.LAG, "nb", resource, "m1", 1, t)
            events.append(
                dataclasses.replace(lagging, pending_files=files, pending_bytes=files * 100)
            )
    for i, queue in enumerate(("q1", "q2")):
        events.append(row(EventKind.ACQUIRED, "nb", queue, "m2", 1, float(i)))
        for t, messages in ((i + 1.0, 500 * (i + 1)), (i + 6.0, 40), (i + 8.0, 0)):
            lagging = row(EventKind.LAG, "nb", queue, "m2", 1, t)
            events.append(dataclasses.replace(lagging, pending_messages=messages))

    code = execute(tmp_path, monkeypatch, written_table(tmp_path, events))

    cell = next(c for c in code if "pending_files" in c.source)
    text = text_of(cell)
    assert "36 lag samples of 12 resources; most files pending: r11 21" in text, text
    assert "6 lag samples of 2 resources; most messages pending: q2 1000, q1 500" in text, text
    assert images([cell]) == 2
    assert text_of(code[-1]).startswith("audit OK"), text_of(code[-1])
