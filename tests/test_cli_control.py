"""Operator control as a user runs it: the CLI as a subprocess against live member processes.

One scenario per backend (SQLite, and Redis as the server backend), each step checked from the
store: pause freezes ownership through a crash and a join; resume rebalances; a threshold keeps
a join from moving anything until a forced rebalance; a pin holds, follows its member away and
back; drain reports done with the member owning nothing; every transition shows in
``status --json`` and in the Delta audit table, whose overlap proof still holds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark.audit import load_events
from rebalancer_spark.backends import open_backend
from rebalancer_spark.core.model import GroupState
from tests.support.helpers import wait_for
from tests.support.procs import MemberProcesses

TTL = 4.0
RESOURCES = [f"r{i:02d}" for i in range(12)]
WAIT = 40.0


@pytest.fixture(params=["sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path}/groups.db"
    found: str = request.getfixturevalue("redis_backend_url")
    return found


@pytest.fixture
def procs(url: str, group: str, tmp_path: Path) -> Iterator[MemberProcesses]:
    members = MemberProcesses(url, group, tmp_path, session_timeout=TTL, stability_window=0.05)
    yield members
    members.close()


def cli(procs: MemberProcesses, *args: str) -> subprocess.CompletedProcess[str]:
    return run(*args, "--group", procs.group, "--backend", procs.url)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "rebalancer_spark.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def ok(procs: MemberProcesses, *args: str) -> str:
    result = cli(procs, *args)
    assert result.returncode == 0, result
    return result.stdout


def claims(state: GroupState) -> dict[str, tuple[str, int]]:
    return {r: (c.member_id, c.epoch) for r, c in state.claims.items()}


def counts(state: GroupState) -> list[int]:
    owned = Counter(c.member_id for c in state.claims.values())
    return sorted(owned.get(m, 0) for m in state.members)


def owner_of(procs: MemberProcesses, resource: str) -> str | None:
    claim = procs.state().claims.get(resource)
    return None if claim is None else claim.member_id


def settled(procs: MemberProcesses, members: set[str], what: str) -> GroupState:
    """The group once exactly ``members`` are live and the assignment is stable."""

    def check() -> GroupState | None:
        state = procs.state()
        ok = set(state.members) == members and state.is_stable()
        return state if ok and set(state.claims) == set(RESOURCES) else None

    found = wait_for(check, timeout=WAIT, what=what, interval=0.05)
    assert found is not None
    return found


@pytest.mark.slow
def test_pause_resume_threshold_pin_drain_as_an_operator(procs: MemberProcesses) -> None:
    procs.start("a", RESOURCES)
    procs.start("b")
    procs.start("c")
    settled(procs, {"a", "b", "c"}, "three members sharing the resources")

    # Paused: a crash and a join move nothing that is owned; the orphans get an owner.
    assert "paused" in ok(procs, "pause")
    assert json.loads(ok(procs, "status", "--json"))["control"]["mode"] == "paused"
    frozen = claims(procs.state())
    procs.kill("c")
    after_crash = claims(settled(procs, {"a", "b"}, "c's resources owned again while paused"))
    for resource, (owner, epoch) in frozen.items():
        if owner != "c":
            assert after_crash[resource] == (owner, epoch), f"{resource} moved while paused"
    procs.start("d")
    joined = settled(procs, {"a", "b", "d"}, "d in the target while paused")
    assert claims(joined) == after_crash, "a join moved resources while paused"
    refused = cli(procs, "rebalance")
    assert refused.returncode == 3 and "paused" in refused.stderr, refused
    assert len(refused.stderr.splitlines()) == 1

    # Resumed: the join is balanced.
    assert "resumed" in ok(procs, "resume")
    wait_for(
        lambda: counts(settled(procs, {"a", "b", "d"}, "a balanced group")) == [4, 4, 4],
        timeout=WAIT,
        what="4 resources each after resume",
    )

    # Threshold 5: a fourth member (4, 4, 4, 0: imbalance 4) moves nothing until forced.
    assert "threshold set to 5" in ok(procs, "threshold", "5")
    before = claims(procs.state())
    procs.start("e")
    held = settled(procs, {"a", "b", "d", "e"}, "e in the target under the threshold")
    assert claims(held) == before and counts(held) == [0, 4, 4, 4]
    assert "rebalance requested" in ok(procs, "rebalance")
    wait_for(
        lambda: counts(settled(procs, {"a", "b", "d", "e"}, "forced balance")) == [3, 3, 3, 3],
        timeout=WAIT,
        what="3 resources each after a forced rebalance",
    )

    # Pin: the resource goes to its member, away while it is gone, back when it returns.
    resource = next(r for r, c in procs.state().claims.items() if c.member_id == "a")
    assert f"{resource} pinned to d" in ok(procs, "pin", resource, "d")
    wait_for(
        lambda: owner_of(procs, resource) == "d",
        timeout=WAIT,
        what=f"{resource} owned by d",
    )
    assert procs.stop("d") == 0
    away = settled(procs, {"a", "b", "e"}, "d's resources owned elsewhere")
    assert away.claims[resource].member_id != "d"
    procs.start("d")
    back = settled(procs, {"a", "b", "d", "e"}, "d back")
    wait_for(
        lambda: owner_of(procs, resource) == "d",
        timeout=WAIT,
        what=f"{resource} back on d",
    )
    assert back.control.pins == {resource: "d"}

    # Drain: the command waits, reports done; a stays in the group owning nothing.
    drained = cli(procs, "drain", "a", "--timeout", "60")
    assert drained.returncode == 0, drained
    assert "drain of a done: it owns nothing" in drained.stdout
    assert all(c.member_id != "a" for c in procs.state().claims.values())
    state = settled(procs, {"a", "b", "d", "e"}, "a's resources owned elsewhere")
    assert all(c.member_id != "a" for c in state.claims.values()), "a owns again"

    status: dict[str, Any] = json.loads(ok(procs, "status", "--json"))
    control = status["control"]
    assert control["mode"] == "active" and control["imbalance_threshold"] == 5
    assert control["drain"] == [{"member_id": "a", "owned": 0, "present": True}]
    assert control["pins"] == [{"member_id": "d", "owner": "d", "resource": resource}]
    whats = [h["what"].split(" by ")[0] for h in control["history"]]
    assert whats == [
        "pause",
        "resume",
        "imbalance threshold 5",
        "rebalance",
        f"pin {resource} to d",
        "drain a",
    ]
    human = ok(procs, "status")
    assert "control: active" in human and "draining: a (owns 0)" in human

    # Every transition is in the audit table, written by the coordinator (a, all along).
    for member in ("b", "d", "e", "a"):
        assert procs.stop(member) == 0
    events = load_events(str(procs.audit_path), group=procs.group)
    reasons = [str(e["reason"]).split(": ", 1)[1] for e in events if e["kind"] == "control"]
    for wanted in (
        "paused",
        "resumed",
        "imbalance threshold 5",
        "rebalance requested",
        "pin to d",
        "drain a",
        "drain done a",
    ):
        assert wanted in reasons, f"{wanted!r} not in the audit table's control rows {reasons}"
    procs.assert_trail_is_clean()


@pytest.mark.slow
def test_drain_times_out_with_exit_4_while_the_coordinator_is_stopped(
    redis_backend_url: str, group: str, tmp_path: Path
) -> None:
    # Redis, not SQLite: a process stopped inside a SQLite transaction would block the CLI.
    procs = MemberProcesses(redis_backend_url, group, tmp_path, session_timeout=20)
    try:
        procs.start("a", RESOURCES)
        procs.start("b")
        settled(procs, {"a", "b"}, "two members sharing the resources")
        coordinator = procs.state().coordinator
        assert coordinator is not None and coordinator.member_id == "a"
        procs.signal("a", signal.SIGSTOP)  # nobody can publish a new target now
        try:
            result = cli(procs, "drain", "b", "--timeout", "0.5")
        finally:
            procs.signal("a", signal.SIGCONT)
        assert result.returncode == 4, result
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and "timed out after 0.5 s" in lines[0], result.stderr
        assert "still owns or is assigned 6 resources" in lines[0]
        # Once the coordinator runs again the drain completes.
        again = cli(procs, "drain", "b", "--timeout", "60")
        assert again.returncode == 0 and "b already draining" not in again.stderr, again
        assert "drain of b done" in again.stdout
    finally:
        procs.close()


def _error(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rebalancer-spark: error: "), result.stderr
    return lines[0]


def test_control_commands_without_members_exit_codes_and_one_line_errors(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path}/g.db"
    where: tuple[str, ...] = ("--group", "g1", "--backend", url)
    assert "does not exist: check --backend" in _error(run("pause", *where), 2)
    assert not (tmp_path / "g.db").exists(), "a control command created a store"
    with open_backend(url) as store:  # the store exists once a job opened it
        store.state("g1")
    assert "check --group" in _error(run("pause", *where), 2)  # a group nobody runs
    where = (*where, "--force")
    assert run("pause", *where).stdout == "group g1: paused (control version 1)\n"
    assert run("pause", *where).stdout == "group g1: already paused (control version 1)\n"
    assert "resume --group g1" in _error(run("rebalance", *where), 3)
    assert "is paused" in _error(run("drain", "m1", *where), 3)
    assert "run 'rebalancer-spark resume" in _error(run("drain", "m1", *where), 3)
    assert "resumed" in run("resume", *where).stdout
    assert "'m1' is not a live member of group 'g1' (live: none)" in _error(
        run("drain", "m1", *where), 2
    )
    assert "resource 'r9' is not in group 'g1'" in _error(run("pin", "r9", "m1", *where), 2)
    assert "imbalance threshold '-1'" in _error(run("threshold", "-1", *where), 2)
    assert "imbalance threshold 'nan'" in _error(run("threshold", "nan", *where), 2)
    assert "member id 'bad/id'" in _error(run("undrain", "bad/id", *where), 2)
    assert "timeout '-2'" in _error(run("drain", "m1", "--timeout", "-2", *where), 2)
    assert "set to 3" in run("threshold", "3", *where).stdout
    reset = json.loads(run("reset", *where, "--json").stdout)
    assert reset["changed"] and reset["control"]["imbalance_threshold"] == 0
    assert [h["what"].split(" by ")[0] for h in reset["control"]["history"]] == [
        "pause",
        "resume",
        "imbalance threshold 3",
        "reset",
    ]
    assert "already at the default" in run("reset", *where).stdout
    secret = _error(run("pause", "--group", "g1", "--backend", "redis://u:s3cret@127.0.0.1:1"), 2)
    assert "s3cret" not in secret and "***" in secret
