"""The epoch chain check (core.chain) and the verdict on it: planted faults are each caught
with a precise message; a crashed owner's ownership ends where the store says; no bridging."""

from __future__ import annotations

from pathlib import Path

import pytest

from rebalancer_spark.audit import verify_events
from rebalancer_spark.core.audit import intervals
from rebalancer_spark.core.chain import check_chain

Event = dict[str, object]


def ev(
    kind: str,
    at: float,
    member: str,
    epoch: int,
    *,
    session: str | None = None,
    resource: str = "r",
    observed_at: float | None = None,
    **chain: object,
) -> Event:
    row: Event = {
        "kind": kind,
        "resource": resource,
        "member_id": member,
        "session_id": session or f"s-{member}",
        "epoch": epoch,
        "at": at,
        "observed_at": at if observed_at is None else observed_at,
        "prev_member_id": None,
        "prev_session_id": None,
        "prev_epoch": None,
        "freed": None,
        "freed_at": None,
    }
    row.update(chain)
    return row


def grant(
    at: float, member: str, epoch: int, prev: str | None, how: str, freed_at: float | None
) -> Event:
    row = ev("acquired", at, member, epoch)
    row.update(
        prev_member_id=prev,
        prev_session_id=None if prev is None else f"s-{prev}",
        prev_epoch=epoch - 1,
        freed=how,
        freed_at=freed_at,
    )
    return row


def clean_chain() -> list[Event]:
    """a owns r (new), releases it to b; b crashes (no row of its end); c takes it over once
    b's lease expired; d takes it after c released."""
    return [
        grant(10.0, "a", 1, None, "new", None),
        ev("released", 20.0, "a", 1),
        grant(20.1, "b", 2, "a", "released", 20.05),
        ev("released", 30.0, "x", 9, resource="other"),  # noise on another resource
        grant(35.2, "c", 3, "b", "expired", 35.0),
        ev("released", 40.0, "c", 3),
        grant(40.1, "d", 4, "c", "released", 40.02),
    ]


def test_a_clean_chain_is_ok_and_a_crashed_owner_ends_at_its_lease_expiry() -> None:
    trail = clean_chain()
    verdict = verify_events(trail)
    assert verdict.ok, verdict.report()
    assert verdict.chain is not None and verdict.chain.checked == 4
    crashed = next(i for i in intervals(trail)["r"] if i.member_id == "b")
    assert (crashed.end, crashed.closed_by) == (35.0, "expired")  # not c's start: no bridging
    assert "chain: 4 grants checked, 0 broken links" in verdict.report()


def test_a_forged_acquired_row_at_a_stale_epoch_is_caught() -> None:
    forged = grant(45.0, "mallory", 2, "a", "released", 20.05)
    verdict = verify_events([*clean_chain(), forged])
    assert not verdict.ok
    kinds = {f.kind for f in verdict.chain_faults}
    assert {"duplicate-epoch", "stale-epoch"} <= kinds, verdict.report()
    report = verdict.report()
    assert "r: epoch 2 was acquired twice: member b (session s-b) at" in report
    assert (
        "r: member mallory (session s-mallory) acquired epoch 2 at 1970-01-01T00:00:45.000Z, "
        "after epoch 4 had been acquired by member d (session s-d) at "
        "1970-01-01T00:00:40.100Z: a grant at a stale epoch"
    ) in report


def test_a_deleted_row_in_the_middle_of_a_chain_is_a_missing_link() -> None:
    trail = [e for e in clean_chain() if not (e["kind"] == "acquired" and e["epoch"] == 3)]
    verdict = verify_events(trail)
    assert not verdict.ok
    (fault,) = verdict.chain_faults
    assert fault.kind == "missing-link" and fault.epoch == 3
    assert fault.message == (
        "r: epoch 3 (c session s-c), superseded by member d (session s-d) at epoch 4, has no "
        "acquired row: a missing link of the chain"
    )
    # The rows around it are shown: b's grant (epoch 2), c's release (3), d's grant (4).
    assert {(r["member_id"], r["epoch"]) for r in fault.rows} == {("b", 2), ("c", 3), ("d", 4)}
    assert "[missing-link]" in verdict.report() and "rows around it:" in verdict.report()


def test_a_deleted_release_row_of_a_session_that_wrote_on_is_caught() -> None:
    trail = [e for e in clean_chain() if not (e["kind"] == "released" and e["member_id"] == "c")]
    trail.append(ev("acquired", 50.0, "c", 1, resource="other", observed_at=50.0))
    verdict = verify_events(trail)
    (fault,) = verdict.chain_faults
    assert fault.kind == "unreleased"
    assert "the table has no released row of it although that session wrote later rows" in (
        fault.message
    )


def test_rows_lost_with_a_killed_process_are_listed_not_faults() -> None:
    # c was killed -9 right after its grant: none of its rows reached the table.
    trail = [e for e in clean_chain() if e["member_id"] != "c"]
    trail[-1] = grant(41.0, "d", 4, "c", "expired", 40.9)
    verdict = verify_events(trail)
    assert verdict.ok, verdict.report()
    assert verdict.chain is not None
    (missing,) = verdict.chain.unrecorded
    assert missing.kind == "crash" and missing.epoch == 3
    assert "unrecorded links (not faults):" in verdict.report()


def numbered(trail: list[Event]) -> list[Event]:
    """``trail`` with each session's rows numbered 1, 2, … in time order, as the writer does."""
    counts: dict[object, int] = {}
    for e in sorted(trail, key=lambda e: float(str(e["observed_at"]))):
        counts[e["session_id"]] = counts.get(e["session_id"], 0) + 1
        e["seq"] = counts[e["session_id"]]
    return trail


def killed_after_writing_on() -> list[Event]:
    """b holds r2 since 5; a releases r at 20; b writes a row of r2 at 25 (after r's previous
    epoch ended), is granted r at 26 and killed before its writer flushed that grant; c takes
    r once b's lease expired. b's rows run 1, 2 without a gap."""
    return numbered(
        [
            grant(1.0, "a", 1, None, "new", None),
            ev("released", 20.0, "a", 1),
            {**grant(5.0, "b", 1, None, "new", None), "resource": "r2"},
            ev("released", 25.0, "b", 1, resource="r2"),
            grant(40.0, "c", 3, "b", "expired", 39.0),
        ]
    )


def test_a_grant_lost_with_a_killed_process_that_wrote_other_rows_first_is_not_a_fault() -> None:
    # Judged by time alone (no row numbers), b's row at 25, after r's epoch 1 ended at 20,
    # looked like proof that b's writer went on: the false alarm this check once raised.
    trail = killed_after_writing_on()
    verdict = verify_events(trail)
    assert verdict.ok, verdict.report()
    assert verdict.chain is not None
    (missing,) = verdict.chain.unrecorded
    assert (missing.kind, missing.resource, missing.epoch) == ("crash", "r", 2)
    assert "rows are all there up to its last one" in missing.message
    unnumbered = [{k: v for k, v in e.items() if k != "seq"} for e in trail]
    faults = verify_events(unnumbered).chain_faults
    assert [f.kind for f in faults] == ["missing-link"]


def test_a_row_removed_from_a_numbered_trail_is_caught_even_where_time_cannot_tell() -> None:
    trail = killed_after_writing_on()
    trail.append(ev("lost", 38.0, "b", 2, observed_at=41.0) | {"seq": 4})  # row 3 is gone
    verdict = verify_events(trail)
    assert not verdict.ok
    kinds = sorted(f.kind for f in verdict.chain_faults)
    assert kinds == ["missing-link", "missing-rows"], verdict.report()
    gap = next(f for f in verdict.chain_faults if f.kind == "missing-rows")
    assert gap.message.startswith("member b (session s-b): row 3 is missing from its trail")
    assert "yet row 4 (lost of r epoch 2 at" in gap.message
    assert "rows removed from the table" in gap.message


def test_a_numbered_row_written_twice_is_caught() -> None:
    trail = numbered(clean_chain())
    trail.append(dict(trail[1]))
    (fault,) = verify_events(trail).chain_faults
    assert fault.kind == "duplicate-rows"
    assert "has row 2 of its trail twice" in fault.message


def test_rows_of_no_session_from_several_processes_are_in_no_trail() -> None:
    # A stuck or lag row noted while its member had no session (the store was away): earlier
    # writers numbered them under session "", one count per process, so two processes' rows
    # both read "row 1 of session ''" (found by the Spark-driver chaos on Redis).
    trail = numbered(clean_chain())
    for member, at in (("a", 12.0), ("b", 13.0)):
        trail.append(ev("stuck", at, member, 1) | {"session_id": "", "seq": 1})
    assert verify_events(trail).ok, verify_events(trail).report()


def test_the_writer_numbers_no_row_of_no_session(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from rebalancer_spark import EventKind, OwnershipEvent
    from rebalancer_spark.audit import DeltaAuditLog

    def event(session: str, kind: EventKind) -> OwnershipEvent:
        return OwnershipEvent(kind=kind, group="g", resource="r", member_id="m", session_id=session,
                              epoch=1, at=10.0, observed_at=10.0, reason="")  # fmt: skip

    audit = DeltaAuditLog(str(tmp_path / "audit"))
    for e in (
        event("", EventKind.STUCK),
        event("s1", EventKind.ACQUIRED),
        event("", EventKind.STUCK),
    ):
        audit(e)
    audit.close()
    rows = DeltaTable(str(tmp_path / "audit")).to_pyarrow_table(columns=["session_id", "seq"])
    assert sorted(zip(rows["session_id"].to_pylist(), rows["seq"].to_pylist(), strict=True),
                  key=str) == [("", None), ("", None), ("s1", 1)]  # fmt: skip


def test_row_numbers_count_control_and_rebalance_rows_too() -> None:
    trail = numbered(
        [
            *clean_chain(),
            ev("rebalance", 15.0, "a", 0, resource=""),
            ev("control", 16.0, "a", 0, resource=""),
        ]
    )
    assert verify_events(trail).ok
    without = [e for e in trail if e["kind"] != "rebalance"]
    (fault,) = verify_events(without).chain_faults
    assert fault.kind == "missing-rows"
    assert "row 2 is missing from its trail" in fault.message


def test_a_grant_before_the_predecessor_lease_ran_out_is_a_violation() -> None:
    trail = clean_chain()
    trail[4] = grant(35.2, "c", 3, "b", "expired", 37.0)  # lease valid until 37.0
    verdict = verify_events(trail, tolerance=0.5)
    (fault,) = verdict.chain_faults
    assert fault.kind == "early-grant"
    assert "lasted until 1970-01-01T00:00:37.000Z: 1.800 s of two owners" in fault.message


def test_epochs_grow_by_exactly_one_and_name_the_right_predecessor() -> None:
    trail = clean_chain()
    trail[4] = {**trail[4], "prev_epoch": 1}
    found = check_chain(trail)
    assert [f.kind for f in found.faults] == ["broken-link"]
    assert "superseding epoch 1: epochs must grow by exactly one (expected 2)" in (
        found.faults[0].message
    )
    trail = clean_chain()
    trail[4] = {**trail[4], "prev_member_id": "a", "prev_session_id": "s-a"}
    (fault,) = check_chain(trail).faults
    assert fault.kind == "wrong-predecessor"
    assert "superseding a (session s-a), but epoch 2 was acquired by member b" in fault.message


def test_a_chained_successor_never_bridges_an_owner_it_does_not_name() -> None:
    trail = clean_chain()
    trail[4] = {**trail[4], "prev_member_id": "a", "prev_session_id": "s-a"}
    verdict = verify_events(trail)
    b = next(i for i in intervals(trail)["r"] if i.member_id == "b")
    assert b.closed_by == "open"  # b's end is unknown: it overlaps everyone after it
    assert verdict.overlaps and not verdict.ok


def test_a_store_that_lost_its_records_starts_the_chain_again() -> None:
    trail = [
        grant(10.0, "a", 1, None, "new", None),
        # Redis restarted without its data: epochs lifted to the base, every lease ended by
        # the end of the quarantine.
        ev(
            "acquired",
            20.0,
            "b",
            1_700_000_000_000_001,
            prev_epoch=None,
            freed="expired",
            freed_at=19.0,
        ),
    ]
    verdict = verify_events(trail)
    assert verdict.ok, verdict.report()
    a = next(i for i in intervals(trail)["r"] if i.member_id == "a")
    assert (a.end, a.closed_by) == (19.0, "expired")


def test_an_unchained_grant_ends_a_crashed_owner_before_a_later_reset_does() -> None:
    """a crashed (no row of its end); the store lost its records and b's grant, lifted to a
    floor, names nothing; much later c's grant says the store started again. a ended by b's
    grant at the latest, not only by c's reset (the chaos runner found this on Redis)."""
    trail = [
        grant(10.0, "a", 2, None, "new", None),
        ev("acquired", 20.0, "b", 1_000, prev_epoch=999),  # unchained: no freed
        ev("released", 30.0, "b", 1_000),
        ev("acquired", 80.0, "c", 5_000, prev_epoch=None, freed="expired", freed_at=79.0),
    ]
    verdict = verify_events(trail)
    assert not verdict.overlaps, verdict.report()
    a = next(i for i in intervals(trail)["r"] if i.member_id == "a")
    assert (a.end, a.closed_by) == (20.0, "superseded")


def test_a_table_without_the_chain_columns_verifies_and_says_the_check_was_skipped() -> None:
    old = [{k: v for k, v in e.items() if k in {"kind", "resource", "member_id", "session_id",
            "epoch", "at", "observed_at"}} for e in clean_chain()]  # fmt: skip
    verdict = verify_events(old)
    assert verdict.ok and verdict.chain is None
    assert "chain check skipped: the table predates the chain columns" in verdict.report()
    b = next(i for i in intervals(old)["r"] if i.member_id == "b")
    assert (b.end, b.closed_by) == (35.2, "superseded")


@pytest.mark.parametrize("kind", ["control", "rebalance"])
def test_control_and_rebalance_rows_are_not_ownership(kind: str) -> None:
    row = ev(kind, 15.0, "a", 3, resource="", generation=2, trigger="join", moves=1)
    verdict = verify_events([*clean_chain(), row])
    assert verdict.ok and verdict.events == len(clean_chain())
