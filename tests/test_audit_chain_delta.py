"""The epoch chain in a real Delta audit table: written by real members, checked by the
verifier; planted faults (a forged row at a stale epoch, a deleted row) caught; a table written
before the chain columns gains them on the next append and keeps every row."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from rebalancer_spark import Member, MemberConfig
from rebalancer_spark.audit import DeltaAuditLog, load_events, verify_table
from rebalancer_spark.audit.delta import AUDIT_COLUMNS, CHAIN_COLUMNS, audit_schema
from rebalancer_spark.core.events import EventKind, OwnershipEvent
from tests.support.helpers import wait_for


@pytest.fixture
def chain_table(tmp_path: Path) -> Path:
    """Resource r handed a -> b -> c by drains, the rebalances and ownership rows in a Delta
    table written by the members themselves (SQLite backend)."""
    path = tmp_path / "audit"
    url = f"sqlite:///{tmp_path / 'groups.db'}"
    with DeltaAuditLog(str(path), flush_interval=0.0) as log:

        def start(member_id: str, resources: list[str] | None = None) -> Member:
            config = MemberConfig(
                group="g", backend=url, member_id=member_id, session_timeout=3.0,
                stability_window=0.05, drain_timeout=15.0,
            )  # fmt: skip
            return Member(config, resources=resources, event_sinks=[log]).start()

        a = start("a", ["r"])
        wait_for(lambda: [o.epoch for o in a.assigned()] == [1], timeout=15, what="a owns r")
        b = start("b")
        a.stop()
        wait_for(lambda: [o.epoch for o in b.assigned()] == [2], timeout=15, what="b owns r")
        c = start("c")
        b.stop()
        wait_for(lambda: [o.epoch for o in c.assigned()] == [3], timeout=15, what="c owns r")
        c.stop(drain=False)
        assert log.flush(), log.last_error
    return path


def _rows(path: Path, kind: str) -> list[dict[str, object]]:
    return [e for e in load_events(str(path)) if e["kind"] == kind and e["resource"] == "r"]


def test_members_record_an_unbroken_chain_and_the_rebalances(chain_table: Path) -> None:
    verdict = verify_table(str(chain_table))
    assert verdict.ok, verdict.report()
    assert verdict.chain is not None and verdict.chain.checked == 3
    assert not verdict.chain.unrecorded and not verdict.chain.unchained
    grants = sorted(_rows(chain_table, "acquired"), key=lambda e: int(str(e["epoch"])))
    links = [(g["member_id"], g["prev_member_id"], g["prev_epoch"], g["freed"]) for g in grants]
    assert links == [("a", None, 0, "new"), ("b", "a", 1, "released"), ("c", "b", 2, "released")]
    for g in grants:
        assert isinstance(g["generation"], int) and isinstance(g["coordinator_epoch"], int)
    released = {int(str(e["epoch"])): e for e in _rows(chain_table, "released")}
    for g in grants[1:]:  # the store's release time follows the member's released row
        before = released[int(str(g["prev_epoch"]))]
        assert float(str(before["at"])) <= float(str(g["freed_at"])) <= float(str(g["at"]))
    rebalances = [e for e in load_events(str(chain_table)) if e["kind"] == "rebalance"]
    assert rebalances and rebalances[0]["trigger"] == "start"
    # a join and a drain may be one rebalance or two: the drain always shows as a leave
    assert "leave" in {e["trigger"] for e in rebalances} <= {"start", "join", "leave"}
    for e in rebalances:
        assert str(e["reason"]).startswith(f"{e['trigger']}: "), e
        assert isinstance(e["moves"], int) and isinstance(e["generation"], int)
    assert sum(int(str(e["moves"])) for e in rebalances) == 2  # r moved twice


def test_a_forged_acquired_row_at_a_stale_epoch_is_caught(chain_table: Path) -> None:
    latest = max(float(str(e["at"])) for e in load_events(str(chain_table)))
    forged = OwnershipEvent(
        kind=EventKind.ACQUIRED, group="g", resource="r", member_id="mallory",
        session_id="forged", epoch=2, at=latest + 1, observed_at=latest + 1, reason="forged",
        prev_member_id="a", prev_epoch=1, freed="released", freed_at=latest,
    )  # fmt: skip
    with DeltaAuditLog(str(chain_table)) as log:
        log(forged)
    verdict = verify_table(str(chain_table))
    assert not verdict.ok
    assert {f.kind for f in verdict.chain_faults} >= {"duplicate-epoch", "stale-epoch"}
    report = verdict.report()
    assert "r: epoch 2 was acquired twice: member b (session" in report
    assert "member mallory (session forged) acquired epoch 2 at" in report
    assert "after epoch 3 had been acquired by member c" in report


def test_a_row_deleted_in_the_middle_of_the_chain_is_caught(chain_table: Path) -> None:
    DeltaTable(str(chain_table)).delete("resource = 'r' AND kind = 'acquired' AND epoch = 2")
    verdict = verify_table(str(chain_table))
    assert not verdict.ok
    # The numbers of b's rows skip the deleted one, and the chain misses it.
    gap, fault = sorted(verdict.chain_faults, key=lambda f: f.kind != "missing-rows")
    assert gap.kind == "missing-rows" and "row 1 is missing from its trail" in gap.message
    assert fault.kind == "missing-link" and fault.epoch == 2
    assert fault.message.startswith("r: epoch 2 (b session ")
    assert (
        fault.message.endswith("has no acquired row: a missing link of the chain")
        and "superseded by member c" in fault.message
    )
    # The rows around it: a's epoch 1, b's release of epoch 2, c's grant of epoch 3.
    assert {(r["member_id"], r["epoch"], r["kind"]) for r in fault.rows} >= {
        ("a", 1, "acquired"), ("b", 2, "released"), ("c", 3, "acquired")
    }  # fmt: skip


def _legacy_table(path: Path) -> None:
    """A table as written before the chain columns: the first twelve columns only."""
    legacy = pa.schema([f for f in audit_schema() if f.name not in CHAIN_COLUMNS])
    rows = [
        {"group": "g", "resource": "r", "member_id": m, "session_id": f"s-{m}", "kind": k,
         "epoch": e, "at": t * 1_000_000, "observed_at": t * 1_000_000, "reason": "old",
         "host": None, "pid": None, "spark_app_id": None}
        for m, k, e, t in [("a", "acquired", 1, 1.0), ("b", "acquired", 2, 5.0)]
    ]  # fmt: skip
    write_deltalake(str(path), pa.Table.from_pylist(rows, schema=legacy))


def test_a_table_without_the_chain_columns_gains_them_and_keeps_its_rows(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old-audit"
    _legacy_table(path)
    verdict = verify_table(str(path))  # verifiable as it is, with what its columns allow
    assert verdict.ok and verdict.chain is None
    assert "chain check skipped: the table predates the chain columns" in verdict.report()
    assert all(e["freed"] is None for e in load_events(str(path)))

    event = OwnershipEvent(
        kind=EventKind.ACQUIRED, group="g", resource="r", member_id="c", session_id="s-c",
        epoch=3, at=9.0, observed_at=9.0, reason="new", generation=4, coordinator_epoch=1,
        prev_member_id="b", prev_session_id="s-b", prev_epoch=2, freed="expired", freed_at=8.0,
    )  # fmt: skip
    with DeltaAuditLog(str(path)) as log:
        log(event)
        assert log.flush(), log.last_error
    table = DeltaTable(str(path))
    assert [f.name for f in table.schema().fields] == list(AUDIT_COLUMNS)
    events = load_events(str(path))
    assert [(e["member_id"], e["freed"]) for e in events] == [
        ("a", None), ("b", None), ("c", "expired")
    ]  # fmt: skip
    verdict = verify_table(str(path))
    assert verdict.ok, verdict.report()
    assert verdict.chain is not None and verdict.chain.checked == 1
    assert verdict.chain.unchained == 2  # the old rows: their links are not checked
    b = "member b epoch 2"
    assert b not in verdict.report()  # b's ownership ended when c's grant says: no overlap
