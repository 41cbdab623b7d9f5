"""The output check: an output Delta table's commits judged against the audit table, on tables
the tests write themselves (formats of docs/audit.md). Each planted fault is caught by its
rule, at the offending version, with a message that names it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark.audit.output_check import parse_history, verify_output
from rebalancer_spark.cli import main
from rebalancer_spark.core.errors import ConfigurationError, CorruptStateError
from rebalancer_spark.core.output_rules import OutputCommit, check_commits, grants
from tests.servers.cloud import ACCESS_KEY, REGION, SECRET_KEY, S3Bucket
from tests.support.audit_tables import (
    GROUP,
    OutputTable,
    as_events,
    row,
    write_audit,
    write_log_commits,
)


@pytest.fixture
def tables(tmp_path: Path) -> tuple[str, OutputTable]:
    return str(tmp_path / "audit"), OutputTable(str(tmp_path / "out")).create()


def handover(audit: str, t: float, *, chain: bool = True) -> None:
    """r0 owned by job-a at epoch 1 from t-60, released at t-30 and granted to job-b at
    epoch 2 (t-29, still open); r1 owned by job-a at epoch 1 since t-60 (open)."""
    extra: dict[str, Any] = {"generation": 1} if chain else {}
    write_audit(
        audit,
        [
            row("acquired", t - 60, "r0", "job-a", 1, **extra),
            row("acquired", t - 60, "r1", "job-a", 1, **extra),
            row("released", t - 30, "r0", "job-a", 1, **extra),
            row("acquired", t - 29, "r0", "job-b", 2, **extra),
        ],
        chain=chain,
    )


def test_a_clean_table_verifies(tables: tuple[str, OutputTable]) -> None:
    audit, out = tables
    handover(audit, time.time())
    out.fence("r0", "job-b", 2, 0)
    out.data("r0", "job-b", 2, 1)
    out.data("r1", "job-a", 1, 1)
    out.data("r1", "job-a", 1, 2)
    out.foreign()
    verdict = verify_output(audit, out.path)
    assert verdict.ok, verdict.report()
    assert (verdict.data_commits, verdict.fence_commits, verdict.resources) == (3, 1, 2)
    assert [(f.version, f.operation) for f in verdict.foreign] == [
        (0, "CREATE TABLE"),
        (5, "WRITE"),
    ]
    report = verdict.report()
    assert report.startswith("output OK:"), report
    assert "foreign commits (not by the fenced writer, not judged): 2: v0 CREATE TABLE" in report


def test_a_commit_after_its_epoch_ended_is_caught(tables: tuple[str, OutputTable]) -> None:
    audit, out = tables
    handover(audit, time.time())
    out.data("r1", "job-a", 1, 1)
    late = out.data("r0", "job-a", 1, 1)  # epoch 1 of r0 was released 30 s ago
    verdict = verify_output(audit, out.path)
    assert not verdict.ok
    first = verdict.first_violation
    assert first is not None and first.rule == "inside"
    assert first.commit.version == late
    report = verdict.report()
    assert f"first offending commit: version {late} (data) at " in report, report
    assert "resource r0 epoch 1 batch 1 by member job-a (session job-a-s, group orders)" in report
    assert "broke rule 2: every data commit falls inside its epoch's ownership interval" in report
    assert "s after it ended (released)" in report


def test_the_same_batch_committed_twice_is_caught(tables: tuple[str, OutputTable]) -> None:
    audit, out = tables
    handover(audit, time.time())
    first = out.data("r1", "job-a", 1, 7)
    again = out.data("r1", "job-a", 1, 7)
    verdict = verify_output(audit, out.path)
    assert [(v.rule, v.commit.version) for v in verdict.violations] == [("batch-once", again)]
    assert f"batch 7 of r1 was already committed by version {first} (epoch 1, member job-a)" in (
        verdict.report()
    )


def test_a_stale_epoch_after_a_newer_one_is_caught(tables: tuple[str, OutputTable]) -> None:
    audit, out = tables
    t = time.time()
    # job-a's epoch 1 of r0 has no end recorded (killed); job-b holds epoch 2 from t-29.
    write_audit(
        audit,
        [row("acquired", t - 60, "r0", "job-a", 1), row("acquired", t - 29, "r0", "job-b", 2)],
    )
    fence = out.fence("r0", "job-b", 2, 0)
    stale = out.data("r0", "job-a", 1, 1)
    verdict = verify_output(audit, out.path)
    first = verdict.first_violation
    assert first is not None and (first.rule, first.commit.version) == ("epoch-order", stale)
    assert (
        f"epoch 1 after version {fence} committed epoch 2 (fence by job-b): a stale owner "
        "committed after a newer one"
    ) in verdict.report()


def test_a_data_commit_by_an_epoch_never_granted_is_caught(
    tables: tuple[str, OutputTable],
) -> None:
    audit, out = tables
    handover(audit, time.time())
    forged = out.data("r1", "job-a", 5, 1)
    verdict = verify_output(audit, out.path)
    assert [(v.rule, v.commit.version) for v in verdict.violations] == [("granted", forged)]
    assert "no acquired row for epoch 5 of r1 in group orders: the audit table never granted" in (
        verdict.report()
    )


def test_a_commit_by_another_member_than_the_grantee_is_caught(
    tables: tuple[str, OutputTable],
) -> None:
    audit, out = tables
    handover(audit, time.time())
    wrong = out.data("r1", "job-b", 1, 1)
    verdict = verify_output(audit, out.path)
    assert [(v.rule, v.commit.version) for v in verdict.violations] == [("granted", wrong)]
    assert "epoch 1 of r1 was granted to job-a (session job-a-s), not to job-b" in verdict.report()


def test_the_predecessors_lease_expiry_ends_its_interval(tables: tuple[str, OutputTable]) -> None:
    """job-a was killed (no lost row); job-b's grant says job-a's lease expired at t-20 and was
    granted at t-10... then a commit of job-a now is late by 20 s, not by 10."""
    audit, out = tables
    t = time.time()
    write_audit(
        audit,
        [
            row("acquired", t - 60, "r0", "job-a", 1, generation=1, prev_epoch=0, freed="new"),
            row(
                "acquired",
                t + 3600,  # a grant recorded later than the commit: only freed_at ends epoch 1
                "r0",
                "job-b",
                2,
                generation=2,
                prev_member_id="job-a",
                prev_session_id="job-a-s",
                prev_epoch=1,
                freed="expired",
                freed_at=t - 20,
            ),
        ],
    )
    late = out.data("r0", "job-a", 1, 1)
    verdict = verify_output(audit, out.path)
    first = verdict.first_violation
    assert first is not None and (first.rule, first.commit.version) == ("inside", late)
    assert "s after it ended (expired)" in first.detail
    assert not any("predates the chain columns" in n for n in verdict.notes)


def test_an_old_audit_table_verifies_and_says_what_it_lacks(
    tables: tuple[str, OutputTable],
) -> None:
    audit, out = tables
    handover(audit, time.time(), chain=False)
    out.data("r1", "job-a", 1, 1)
    verdict = verify_output(audit, out.path)
    assert verdict.ok, verdict.report()
    assert "note: the audit table predates the chain columns" in verdict.report()


def test_malformed_metadata_is_a_violation() -> None:
    entries = [
        {"version": 0, "timestamp": 1000, "operation": "CREATE TABLE"},
        {
            "version": 1,
            "timestamp": 2000,
            "operation": "WRITE",
            "rebalancer.kind": "data",
            "rebalancer.group": GROUP,
            "rebalancer.resource": "r0",
            "rebalancer.member_id": "job-a",
            "rebalancer.session_id": "s",
            "rebalancer.epoch": "one",
        },
    ]
    log = parse_history(entries)
    assert [c.problem for c in log.commits] == [
        "rebalancer.batch missing; rebalancer.epoch 'one' is not a whole number"
    ]


def test_the_cli_names_the_first_offending_commit(
    tables: tuple[str, OutputTable], capsys: pytest.CaptureFixture[str]
) -> None:
    audit, out = tables
    handover(audit, time.time(), chain=False)  # the ownership verifier of main reads old tables
    out.data("r1", "job-a", 1, 1)
    assert main(["audit", "verify", audit, "--output", out.path]) == 0
    assert "output OK:" in capsys.readouterr().out
    twice = out.data("r1", "job-a", 1, 1)
    assert main(["audit", "verify", audit, "--output", out.path, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True  # no two owners at once...
    assert data["output"]["ok"] is False  # ...but a batch written twice
    first = data["output"]["first_violation"]
    assert (first["rule"], first["commit"]["version"]) == ("batch-once", twice)


def test_the_job_script_checks_the_output(tables: tuple[str, OutputTable]) -> None:
    audit, out = tables
    handover(audit, time.time(), chain=False)
    out.data("r1", "job-b", 1, 1)
    done = subprocess.run(
        [sys.executable, "jobs/verify_audit.py", "--audit", audit, "--output", out.path],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "output FAILED: 1 violation (" in done.stdout
    assert "was granted to job-a (session job-a-s), not to job-b" in done.stdout


def test_bad_paths_are_named(tables: tuple[str, OutputTable], tmp_path: Path) -> None:
    audit, out = tables
    handover(audit, time.time())
    with pytest.raises(ConfigurationError, match=r"no Delta output table at .*nowhere"):
        verify_output(audit, str(tmp_path / "nowhere"))
    with pytest.raises(CorruptStateError, match="not a rebalancer-spark audit table"):
        verify_output(out.path, out.path)
    with pytest.raises(ConfigurationError, match="has no _resource or _batch column: it is not"):
        verify_output(audit, audit)


def test_thousands_of_commits_are_read_in_seconds(tmp_path: Path) -> None:
    audit, out = str(tmp_path / "audit"), OutputTable(str(tmp_path / "out")).create()
    t = time.time()
    resources = [f"r{i:03d}" for i in range(100)]
    write_audit(audit, [row("acquired", t - 60, r, "job-a", 1) for r in resources])
    metas = [
        {
            "rebalancer.kind": "data",
            "rebalancer.group": GROUP,
            "rebalancer.resource": resources[i % 100],
            "rebalancer.member_id": "job-a",
            "rebalancer.session_id": "job-a-s",
            "rebalancer.epoch": "1",
            "rebalancer.batch": str(i // 100 + 1),
            "rebalancer.rows": "10",
        }
        for i in range(5000)
    ]
    write_log_commits(Path(out.path), metas)
    started = time.monotonic()
    verdict = verify_output(audit, out.path)
    took = time.monotonic() - started
    assert verdict.ok, verdict.report()
    assert verdict.data_commits == 5000
    assert took < 10.0, f"reading 5000 commits took {took:.2f} s"  # about 1 s here


@pytest.mark.slow
def test_tables_on_s3_are_read_with_storage_options(s3_bucket: S3Bucket) -> None:
    options = {
        "AWS_ENDPOINT_URL": s3_bucket.endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_ALLOW_HTTP": "true",
    }
    audit = f"s3://{s3_bucket.name}/audit"
    out = OutputTable(f"s3://{s3_bucket.name}/out", storage_options=options).create()
    t = time.time()
    write_audit(audit, [row("acquired", t - 60, "r0", "job-a", 1)], storage_options=options)
    for batch in range(1, 41):
        out.data("r0", "job-a", 1, batch)
    twice = out.data("r0", "job-a", 1, 40)
    started = time.monotonic()
    verdict = verify_output(audit, out.path, storage_options=options)
    took = time.monotonic() - started
    assert [(v.rule, v.commit.version) for v in verdict.violations] == [("batch-once", twice)]
    assert took < 10.0, f"reading 42 commits from S3 took {took:.2f} s"
    assert SECRET_KEY not in verdict.report()


# -- the rules alone (no tables) ------------------------------------------------------------


def commit(version: int, at: float, member: str, epoch: int, batch: int) -> OutputCommit:
    return OutputCommit(version, at, "data", GROUP, "r0", member, f"{member}-s", epoch, batch)


def test_a_killed_owner_of_an_old_table_ends_at_the_next_grant() -> None:
    """No lost row, no chain columns: epoch 1 ended when epoch 2 was granted at 10 s."""
    granted = grants(
        as_events([row("acquired", 0, "r0", "a", 1), row("acquired", 10, "r0", "b", 2)])
    )
    assert granted[(GROUP, "r0", 1)][0].ended_by == "superseded"
    assert check_commits([commit(1, 9.0, "a", 1, 1)], granted) == []
    late = check_commits([commit(1, 12.0, "a", 1, 1)], granted)
    assert [(v.rule, v.commit.version) for v in late] == [("inside", 1)]
    assert "2.000 s after it ended (superseded)" in late[0].detail


def test_the_tolerance_covers_clock_skew_and_nothing_more() -> None:
    granted = grants(
        as_events([row("acquired", 0, "r0", "a", 1), row("released", 5, "r0", "a", 1)])
    )
    assert check_commits([commit(1, 5.5, "a", 1, 1)], granted, tolerance=1.0) == []
    assert check_commits([commit(1, -0.5, "a", 1, 1)], granted, tolerance=1.0) == []
    early = check_commits([commit(1, -0.5, "a", 1, 1)], granted)
    assert "0.500 s before it began" in early[0].detail
    assert check_commits([commit(1, 5.0005, "a", 1, 1)], granted) == []  # Delta's 1 ms
    assert [v.rule for v in check_commits([commit(1, 5.01, "a", 1, 1)], granted)] == ["inside"]


def test_a_fence_raises_the_epoch_and_a_later_data_commit_below_it_is_stale() -> None:
    granted = grants(
        as_events([row("acquired", 0, "r0", "a", 1), row("acquired", 10, "r0", "b", 2)])
    )
    fence = OutputCommit(1, 10.1, "fence", GROUP, "r0", "b", "b-s", 2, 3)
    ok = [fence, commit(2, 10.2, "b", 2, 4)]
    assert check_commits(ok, granted) == []
    stale = check_commits([fence, commit(2, 9.0, "a", 1, 4)], granted)
    assert [(v.rule, v.commit.version) for v in stale] == [("epoch-order", 2)]


def test_a_storage_option_without_a_value_is_refused(
    tables: tuple[str, OutputTable], capsys: pytest.CaptureFixture[str]
) -> None:
    audit, out = tables
    handover(audit, time.time(), chain=False)
    with pytest.raises(SystemExit) as exited:
        main(["audit", "verify", audit, "--output", out.path, "--storage-option", "AWS_REGION"])
    assert exited.value.code == 2
    assert "--storage-option 'AWS_REGION' is not KEY=VALUE" in capsys.readouterr().err
