"""notebooks/ownership_audit.ipynb, executed as an analyst runs it: on an audit table written by
live members, in a real Jupyter kernel of this interpreter, its outputs checked."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark import Member, MemberConfig
from rebalancer_spark.audit import DeltaAuditLog, load_events, rebalances

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


@pytest.mark.slow
def test_the_notebook_shows_owners_timeline_and_rebalances(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nbformat
    from nbclient import NotebookClient

    audit = live_audit_table(tmp_path)
    kernel_spec(tmp_path / "jupyter")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", str(SRC))
    monkeypatch.setenv("REBALANCER_AUDIT", audit)
    notebook = nbformat.read(NOTEBOOK, as_version=4)  # type: ignore[no-untyped-call]
    assert all(c.get("outputs", []) == [] for c in notebook.cells if c.cell_type == "code"), (
        "commit the notebook without outputs"
    )

    NotebookClient(notebook, kernel_name=KERNEL, timeout=120, allow_errors=False).execute()

    code = [c for c in notebook.cells if c.cell_type == "code"]
    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    owners = next(c for c in code if "current_owners(" in c.source)
    shown = text_of(owners)
    assert "m1    2" in shown and "m2    2" in shown, shown
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2  # the timeline and the rebalance chart
    stats = text_of(next(c for c in code if "rebalances(" in c.source))
    expected = len(rebalances(load_events(audit), window=2.0))
    assert f"{expected} rebalances, 2 resources moved" in stats, stats
    verdict = text_of(code[-1])
    assert verdict.startswith("audit OK"), verdict
