"""A member that never saw its group grants nothing below the epochs the audit table records
(the store may have lost its state before this process started), on every backend."""

from __future__ import annotations

from pathlib import Path

from rebalancer_spark import Member, MemberConfig
from rebalancer_spark.audit.reader import epoch_floors
from tests.support.audit_tables import row, write_audit


def test_the_audit_tables_epochs_are_floors_for_a_new_member(
    backend_url: str, group: str, tmp_path: Path
) -> None:
    audit = str(tmp_path / "audit")
    assert epoch_floors(audit, group) == {}, "no table yet: no floors"
    write_audit(
        audit,
        [
            row("acquired", 1.0, "a", "old", 41, group=group),
            row("released", 2.0, "a", "old", 41, group=group),
            row("acquired", 3.0, "b", "old", 7, group=group),
            row("acquired", 4.0, "a", "other-group", 99, group="elsewhere"),
            # The coordinator's rows carry its own epoch (and group-wide ones no resource):
            # never a floor (a '' resource id made every job started on the table exit 2).
            row("rebalance", 5.0, "", "old", 500, group=group, generation=3),
            row("control", 6.0, "", "old", 500, group=group, reason="control v2: paused"),
            row("control", 7.0, "b", "old", 500, group=group, reason="control v3: pin b"),
            row("lag", 8.0, "c", "old", 5, group=group),
        ],
    )
    floors = epoch_floors(audit, group)
    assert floors == {"a": 41, "b": 7, "c": 5}
    config = MemberConfig.from_mapping(
        {"group": group, "backend": backend_url, "session_timeout": 6.0, "stability_window": 0.05},
        default_backend=backend_url,
    )
    with Member(config, resources=["a", "b", "c"], epoch_floors=floors) as member:
        assert member.wait_until(lambda m: len(m.assigned()) == 3, timeout=20)
        epochs = {o.resource: o.epoch for o in member.assigned()}
    assert epochs["a"] > 41 and epochs["b"] > 7, epochs
