"""The operator CLI, run as a user runs it: a subprocess against a real SQLite store prepared
through the library, and against Delta audit tables written by DeltaAuditLog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark.backends import open_backend
from rebalancer_spark.core.events import EventKind, OwnershipEvent
from rebalancer_spark.core.model import Phase, Resource, grant_epochs

GROUP = "orders"
T0 = 1_790_000_000.0


def run(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REBALANCER_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "rebalancer_spark.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("rebalancer-spark: error: ")
    return lines[0]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """$REBALANCER_HOME holding a settled group: m1 (coordinator, owns a and b) and m2
    (owns c); progress committed for a."""
    url = f"sqlite://{tmp_path}/groups.db"
    with open_backend(url) as store:
        info = {"host": "h1", "pid": "101", "spark_app_id": "app-0001"}
        m1 = store.join(GROUP, "m1", info=info, ttl=300, static=False)
        m2 = store.join(GROUP, "m2", info={"host": "h2", "pid": "202"}, ttl=300, static=True)
        coordinator = store.elect(m1)
        assert coordinator is not None and coordinator.member_id == "m1"
        version = store.update_resources(GROUP, replace=[Resource(r) for r in "abc"])
        target = store.publish(
            m1,
            coordinator.epoch,
            {"m1": ["a", "b"], "m2": ["c"]},
            phase=Phase.RUNNING,
            resources_version=version,
        )
        granted = store.claim(m1, ["a", "b"], target.generation)
        assert grant_epochs(store.claim(m2, ["c"], target.generation)) == {"c": 1}
        store.commit(m1, "a", granted["a"].epoch, {"offset": 42})
    return tmp_path


def test_status_names_members_coordinator_epoch_and_owners(home: Path) -> None:
    result = run("status", "--group", GROUP, "--backend", f"sqlite://{home}/groups.db", home=home)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "coordinator: m1 (epoch 1)" in out
    assert "m1: a (epoch 1), b (epoch 1)" in out
    assert "m2: c (epoch 1)" in out
    assert "app-0001" in out and "h2" in out
    assert "stable: yes" in out and "imbalance: 1" in out and "unowned: none" in out
    header = next(line for line in out.splitlines() if line.startswith("MEMBER"))
    m2_row = next(line for line in out.splitlines() if line.startswith("m2 "))
    assert header.index("HOST") == m2_row.index("h2"), "columns are aligned"


def test_status_json_has_the_numbers(home: Path) -> None:
    result = run("status", "--group", GROUP, "--json", home=home)  # default backend: $HOME
    assert result.returncode == 0, result.stderr
    status: dict[str, Any] = json.loads(result.stdout)
    assert [m["member_id"] for m in status["members"]] == ["m1", "m2"]
    m1, m2 = status["members"]
    assert (m1["coordinator"], m1["owned"], m1["spark_app_id"]) == (True, 2, "app-0001")
    assert (m2["static"], m2["leaving"], m2["owned"], m2["pid"]) == (True, False, 1, "202")
    assert status["coordinator"] == {"member_id": "m1", "epoch": 1}
    assert status["target"]["generation"] == 1 and status["target"]["phase"] == "running"
    assert status["resources"] == {"count": 3, "version": 1}
    assert status["owners"]["m2"] == [{"resource": "c", "epoch": 1}]
    assert (status["unowned"], status["imbalance"], status["stable"]) == ([], 1, True)


def test_status_shows_unowned_resources_and_instability(home: Path) -> None:
    with open_backend(f"sqlite://{home}/groups.db") as store:
        store.update_resources(GROUP, add=[Resource("d")])
    result = run("status", "--group", GROUP, "--json", home=home)
    status = json.loads(result.stdout)
    assert (status["unowned"], status["stable"]) == (["d"], False)
    human = run("status", "--group", GROUP, home=home).stdout
    assert "unowned: d" in human and "stable: no" in human


def test_members_and_assignments(home: Path) -> None:
    members = json.loads(run("members", "--group", GROUP, "--json", home=home).stdout)
    assert [m["member_id"] for m in members["members"]] == ["m1", "m2"]
    table = run("assignments", "--group", GROUP, home=home)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "RESOURCE",
        "OWNER",
        "EPOCH",
        "TARGET",
        "OWNER",
        "PROGRESS",
        "EPOCH",
        "PENDING",
        "BYTES",
        "STUCK",
    ]
    assert lines[1].split() == ["a", "m1", "1", "m1", "1", "-", "-", "-"]
    assert lines[3].split() == ["c", "m2", "1", "m2", "-", "-", "-", "-"]
    rows = json.loads(run("assignments", "--group", GROUP, "--json", home=home).stdout)
    a = rows["assignments"][0]
    assert (a["resource"], a["progress_epoch"], a["progress_member"]) == ("a", 1, "m1")


@pytest.mark.parametrize("command", ["status", "members", "assignments"])
def test_an_unknown_group_is_exit_2_and_one_line(home: Path, command: str) -> None:
    line = one_error_line(run(command, "--group", "ordres", home=home))
    assert "group 'ordres' is unknown" in line and "check --group" in line


@pytest.mark.parametrize("command", ["status", "members", "assignments"])
def test_a_missing_store_is_exit_2_and_is_not_created(tmp_path: Path, command: str) -> None:
    where = tmp_path / "never" / "groups.db"
    result = run(command, "--group", GROUP, "--backend", f"sqlite://{where}", home=tmp_path)
    line = one_error_line(result)
    assert f"store sqlite://{where} does not exist: check --backend" in line
    assert not where.parent.exists()
    # Without --backend: the default store in $REBALANCER_HOME, named in the message.
    assert str(tmp_path) in one_error_line(run(command, "--group", GROUP, home=tmp_path))


def test_a_group_known_only_by_its_control_record_is_shown(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/g.db"
    paused = run("pause", "--group", "g1", "--backend", url, "--force", home=tmp_path)
    assert paused.returncode == 2, paused  # no store yet: a control command never creates one
    with open_backend(url) as store:
        store.state("g1")
    assert run("pause", "--group", "g1", "--backend", url, "--force", home=tmp_path).returncode == 0
    result = run("members", "--group", "g1", "--backend", url, home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no members" in result.stdout


@pytest.mark.parametrize(
    "url", ["sqlite://u:secret@host/x", "redis://:secret@h/0", "zk://u:secret@h:2181/x"]
)
def test_bad_backend_url_is_one_line_without_the_password(tmp_path: Path, url: str) -> None:
    line = one_error_line(run("status", "--group", GROUP, "--backend", url, home=tmp_path))
    assert "secret" not in line and "***" in line


def test_pin_to_a_member_not_in_the_group_needs_force(home: Path) -> None:
    line = one_error_line(run("pin", "a", "m3", "--group", GROUP, home=home))
    assert "member 'm3' is not a live member of group 'orders' (live: m1, m2)" in line
    assert "--force" in line
    assert "a pinned to m2" in run("pin", "a", "m2", "--group", GROUP, home=home).stdout
    forced = run("pin", "b", "m3", "--group", GROUP, "--force", home=home)
    assert forced.returncode == 0 and "b pinned to m3" in forced.stdout, forced


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    assert "group name" in one_error_line(run("status", "--group", "a/b", home=tmp_path))
    assert "--group" in one_error_line(run("members", home=tmp_path))
    one_error_line(run(home=tmp_path))
    one_error_line(
        run("audit", "verify", str(tmp_path / "none"), "--tolerance", "x", home=tmp_path)
    )
    line = one_error_line(run("audit", "verify", str(tmp_path / "none"), home=tmp_path))
    assert "no Delta audit table" in line
    junk = tmp_path / "junk.db"
    junk.write_text("not a database")
    store = f"sqlite://{junk}"
    assert "not an SQLite file" in one_error_line(
        run("members", "--group", GROUP, "--backend", store, home=tmp_path)
    )


def test_help_and_version(tmp_path: Path) -> None:
    result = run("--help", home=tmp_path)
    assert result.returncode == 0
    for word in ("status", "members", "assignments", "audit", "exit status"):
        assert word in result.stdout
    assert "verify" in run("audit", "--help", home=tmp_path).stdout
    assert run("--version", home=tmp_path).stdout.startswith("rebalancer-spark ")


# -- the audit table ------------------------------------------------------------------------


def event(kind: EventKind, at: float, resource: str, member: str, epoch: int) -> OwnershipEvent:
    return OwnershipEvent(
        kind=kind,
        group=GROUP,
        resource=resource,
        member_id=member,
        session_id=f"{member}-s",
        epoch=epoch,
        at=at,
        observed_at=at,
        reason=f"{kind} by test",
        info={"host": "h1", "pid": "1"},
    )


def audit_table(path: Path, events: list[OwnershipEvent]) -> str:
    from rebalancer_spark.audit import DeltaAuditLog

    with DeltaAuditLog(str(path), flush_interval=0) as log:
        for item in events:
            log(item)
        assert log.flush(), log.last_error
    return str(path)


HANDOVER = [
    event(EventKind.ACQUIRED, T0, "r", "m1", 1),
    event(EventKind.ACQUIRED, T0, "s", "m2", 1),
    event(EventKind.RELEASED, T0 + 1, "r", "m1", 1),
    event(EventKind.ACQUIRED, T0 + 1.5, "r", "m2", 2),
]


def test_audit_verify_clean_table(tmp_path: Path) -> None:
    path = audit_table(tmp_path / "audit", HANDOVER)
    result = run("audit", "verify", path, "--group", GROUP, home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("audit OK")
    verdict = json.loads(run("audit", "verify", path, "--json", home=tmp_path).stdout)
    assert (verdict["ok"], verdict["events"], verdict["overlaps"]) == (True, 4, [])


def test_audit_verify_overlap_fails(tmp_path: Path) -> None:
    overlap = [
        event(EventKind.ACQUIRED, T0, "r", "m1", 1),
        event(EventKind.ACQUIRED, T0 + 1, "r", "m2", 2),
        event(EventKind.RELEASED, T0 + 2, "r", "m1", 1),
    ]
    path = audit_table(tmp_path / "audit", overlap)
    result = run("audit", "verify", path, home=tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith("audit FAILED: 1 overlap")
    verdict = json.loads(run("audit", "verify", path, "--json", home=tmp_path).stdout)
    assert verdict["ok"] is False
    assert verdict["overlaps"][0]["second"]["end"] is None  # still open: no Infinity in JSON
    assert run("audit", "verify", path, "--tolerance", "5", home=tmp_path).returncode == 0


def test_audit_history(tmp_path: Path) -> None:
    path = audit_table(tmp_path / "audit", HANDOVER)
    result = run("audit", "history", path, home=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4
    assert "released" in lines[2] and "member=m1" in lines[2] and "epoch=1" in lines[2]
    only_r = run("audit", "history", path, "--resource", "r", home=tmp_path).stdout
    assert len(only_r.splitlines()) == 3
    data = json.loads(
        run("audit", "history", path, "--json", "--group", GROUP, home=tmp_path).stdout
    )
    assert [e["kind"] for e in data["events"]][-1] == "acquired"
    other = run("audit", "history", path, "--group", "other", home=tmp_path)
    assert other.stdout.strip() == "no events"


def test_status_with_the_audit_table_shows_the_last_rebalance(home: Path, tmp_path: Path) -> None:
    events = [
        event(EventKind.ACQUIRED, T0, "a", "m1", 1),
        event(EventKind.ACQUIRED, T0 + 0.2, "c", "m2", 1),
        # 10 s later (more than the 2 s window): a second rebalance, c moves from m2 to m1.
        event(EventKind.RELEASED, T0 + 10.0, "c", "m2", 1),
        event(EventKind.ACQUIRED, T0 + 10.4, "c", "m1", 2),
    ]
    path = audit_table(tmp_path / "audit", events)
    result = run("status", "--group", GROUP, "--audit", path, "--json", home=home)
    assert result.returncode == 0, result.stderr
    last = json.loads(result.stdout)["last_rebalance"]
    assert (last["number"], last["duration"], last["moved"]) == (2, 0.4, 1)
    human = run("status", "--group", GROUP, "--audit", path, home=home).stdout
    assert "last rebalance: #2" in human and "took 0.400 s, 1 moved" in human
    plain = json.loads(run("status", "--group", GROUP, "--json", home=home).stdout)
    assert plain["last_rebalance"] is None


def test_backend_url_options_are_the_backends_own(home: Path) -> None:
    db = f"sqlite://{home}/groups.db"
    ok = run("status", "--group", GROUP, "--backend", f"{db}?busy_timeout=5&poll=0.1", home=home)
    assert ok.returncode == 0, ok.stderr
    bad = one_error_line(run("status", "--group", GROUP, "--backend", f"{db}?s=1", home=home))
    assert "unknown option 's'" in bad and "busy_timeout, poll" in bad
    # A Redis URL's own options pass the check; the store being down is the only complaint.
    down = "redis://u:s3cret@127.0.0.1:1/0?timeout=0.5&connect_timeout=0.5"
    line = one_error_line(run("status", "--group", GROUP, "--backend", down, home=home))
    assert "unknown option" not in line and "s3cret" not in line


def test_status_imbalance_leaves_out_drained_members(home: Path) -> None:
    from rebalancer_spark.member.control import GroupControl

    with open_backend(f"sqlite://{home}/groups.db") as store:
        GroupControl(store, GROUP, actor="test").drain("m2")
    status = json.loads(run("status", "--group", GROUP, "--json", home=home).stdout)
    assert status["imbalance"] == 0  # only m1 may own: nothing to compare it with


def test_status_shows_the_health_members_publish(home: Path) -> None:
    with open_backend(f"sqlite://{home}/groups.db") as store:
        m3 = store.join(GROUP, "m3", info={"host": "h3"}, ttl=300, static=False)
        store.update_info(
            m3, {"host": "h3", "callback_overruns": "on_revoked=2", "audit_backlog": "17"}
        )
    url = f"sqlite://{home}/groups.db"
    out = run("status", "--group", GROUP, "--backend", url, home=home)
    assert out.returncode == 0, out.stderr
    assert (
        "WARNING: member m3: on_revoked did not return within callback_timeout 2 times; "
        "17 ownership events not in the audit table yet"
    ) in out.stdout
    assert "WARNING: member m1" not in out.stdout
    shown = json.loads(run("status", "--group", GROUP, "--json", home=home).stdout)
    assert shown["member_health"] == [
        {"member_id": "m3", "callback_overruns": {"on_revoked": 2}, "audit_backlog": 17}
    ]
    assert shown["store_warnings"] == []


def test_lift_epochs_raises_free_resources_above_a_floor_or_the_audit_tables(
    home: Path, tmp_path: Path
) -> None:
    from tests.support.audit_tables import row, write_audit

    url = f"sqlite://{home}/groups.db"
    with open_backend(url) as store:
        store.update_resources(GROUP, add=[Resource("d"), Resource("e")])
    out = run("lift-epochs", "--group", GROUP, "--backend", url, "--floor", "50", home=home)
    assert out.returncode == 0, out.stderr
    assert "2 of 5 resource epochs lifted" in out.stdout  # a, b, c are held: left alone
    audit = str(tmp_path / "audit")
    write_audit(audit, [row("acquired", 1.0, "e", "old", 70, group=GROUP)])
    shown = run("lift-epochs", "--group", GROUP, "--audit", audit, "--json", home=home)
    assert json.loads(shown.stdout)["lifted"] == 1
    import sqlite3

    db = sqlite3.connect(home / "groups.db")  # the epochs the next grants follow
    try:
        epochs = dict(db.execute("SELECT resource_id, epoch FROM ownership WHERE grp=?", (GROUP,)))
    finally:
        db.close()
    assert epochs == {"a": 1, "b": 1, "c": 1, "d": 50, "e": 70}
    bad = run("lift-epochs", "--group", GROUP, "--floor", "0", home=home)
    assert "floor '0' is not an epoch" in one_error_line(bad)
