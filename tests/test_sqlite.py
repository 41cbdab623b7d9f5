"""SQLite-specific behaviour the contract suite cannot pin down: clocks, boots, foreign files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rebalancer_spark.backends.base import Interest, Session
from rebalancer_spark.backends.sqlite import SqliteBackend
from rebalancer_spark.core.clock import ManualClock
from rebalancer_spark.core.errors import CorruptStateError
from rebalancer_spark.core.model import Freed, Grant, Phase, Resource, ResourceChange, Target
from rebalancer_spark.core.urls import parse_backend_url
from tests.support.helpers import wait_for

_OPENED: list[SqliteBackend] = []


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    """Close every store a test opened (Python 3.13 warns of an unclosed sqlite3 connection,
    and the warning is an error here)."""
    yield
    while _OPENED:
        _OPENED.pop().close()


def _pair(path: Path, clock: ManualClock) -> tuple[SqliteBackend, SqliteBackend]:
    url = parse_backend_url(f"sqlite://{path}?poll=0.001")
    pair = SqliteBackend(url, clock=clock), SqliteBackend(url, clock=clock)
    _OPENED.extend(pair)
    return pair


def test_an_expiry_is_reported_even_when_other_writes_come_after_it(sqlite_path: Path) -> None:
    clock = ManualClock()
    store, other = _pair(sqlite_path, clock)
    store.join("g", "dies", info={}, ttl=1.0, static=False)
    lives = other.join("g", "lives", info={}, ttl=30.0, static=False)
    watch = store.watch("g")
    try:
        assert watch.wait(0.01) is False
        clock.advance(1.5)  # "dies" has expired ...
        other.renew(lives)  # ... and an unrelated write changes the file afterwards
        assert watch.wait(0.2) is True, "the expiry was hidden by the later renewal"
        assert watch.wait(0.01) is False, "an expiry is reported once"
    finally:
        watch.close()
        store.close()
        other.close()


def test_a_watch_on_the_coordinator_alone_sleeps_through_a_join_and_wakes_when_it_goes(
    sqlite_path: Path,
) -> None:
    """A follower that gives no rejoin grace (``Interest.COORDINATOR``) reads the coordinator
    row when the file changes: joins, renewals and claims do not wake it; the coordinator's
    lease running out does (nothing is written then), once, and so does a new coordinator."""
    clock = ManualClock()
    store, other = _pair(sqlite_path, clock)
    coordinator = other.join("g", "c", info={}, ttl=1.0, static=False)
    assert other.elect(coordinator) is not None
    follower = store.join("g", "f", info={}, ttl=30.0, static=False)
    watch = store.watch("g")
    try:
        watch.focus(Interest.COORDINATOR)
        assert watch.wait(0.05) is False
        other.join("g", "j", info={}, ttl=30.0, static=False)  # a join ...
        clock.advance(0.5)
        other.renew(coordinator)  # ... and the coordinator's renewal
        assert watch.wait(0.1) is False, "woke for a join or a renewal"
        clock.advance(1.2)  # the renewed lease runs out: nothing is written
        assert watch.wait(0.2) is True, "the coordinator's lease ran out unnoticed"
        assert watch.wait(0.05) is False, "an expiry is reported once"
        record = store.elect(follower)
        assert record is not None and record.member_id == "f"
        assert watch.wait(0.1) is True, "a new coordinator did not wake it"
        watch.focus(Interest.ALL)  # elected: it widens, and the join held back wakes it
        assert watch.wait(0.1) is True
        assert watch.wait(0.05) is False
        store.leave(follower)  # the coordinator goes before the watch narrows again
        watch.focus(Interest.COORDINATOR)
        assert watch.wait(0.1) is True, "narrowing hid the coordinator's going"
    finally:
        watch.close()


def test_leases_are_judged_on_the_injected_clock(sqlite_path: Path) -> None:
    clock = ManualClock()
    store, _ = _pair(sqlite_path, clock)
    session = store.join("g", "m", info={}, ttl=5.0, static=False)
    clock.advance(4.9)
    store.renew(session)
    clock.advance(4.9)
    assert "m" in store.state("g").members
    clock.advance(0.2)
    assert "m" not in store.state("g").members


def test_sessions_of_a_previous_boot_are_dead(sqlite_path: Path) -> None:
    import sqlite3

    clock = ManualClock()
    store, _ = _pair(sqlite_path, clock)
    store.join("g", "m", info={}, ttl=600.0, static=False)
    store.close()
    conn = sqlite3.connect(sqlite_path)
    conn.execute("UPDATE rebalancer_meta SET value='another-boot' WHERE key LIKE 'boot_id:%'")
    conn.commit()
    conn.close()
    reopened, _ = _pair(sqlite_path, clock)
    assert reopened.state("g").members == {}


def test_opening_and_reading_need_no_write_lock(sqlite_path: Path) -> None:
    import sqlite3

    from rebalancer_spark.core.errors import BackendUnavailable

    clock = ManualClock()
    store, _ = _pair(sqlite_path, clock)
    store.join("g", "m", info={}, ttl=30.0, static=False)
    paused = sqlite3.connect(sqlite_path, isolation_level=None)
    paused.execute("BEGIN IMMEDIATE")  # as a member SIGSTOPped inside a write would
    try:
        url = parse_backend_url(f"sqlite://{sqlite_path}?busy_timeout=0.2")
        observer = SqliteBackend(url, clock=clock)
        assert set(observer.state("g").members) == {"m"}
        with pytest.raises(BackendUnavailable, match="locked"):
            observer.update_resources("g", replace=[])
        observer.close()
    finally:
        paused.execute("ROLLBACK")
        paused.close()
        store.close()


def test_a_write_waits_for_the_lock_in_short_steps_and_takes_it_once_free(
    sqlite_path: Path,
) -> None:
    # SQLite's own busy handler sleeps up to 100 ms between tries whether or not the lock came
    # free; the backend tries again after 0.2 ms, doubling up to WRITE_POLL_MAX, and keeps the
    # connection's busy timeout for its reads.
    import sqlite3

    from rebalancer_spark.backends.sqlite.store.connection import (
        WRITE_POLL_MAX,
        begin_write,
        connect,
    )

    store, _ = _pair(sqlite_path, ManualClock())  # the schema, in WAL mode
    store.close()
    holder = sqlite3.connect(sqlite_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    conn = connect(str(sqlite_path), 5.0)
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 12:
            holder.execute("COMMIT")

    try:
        begin_write(conn, 5.0, sleep=sleep)
        assert conn.in_transaction
        assert len(pauses) == 12  # taken at the first try after the holder's commit
        assert pauses[0] == pytest.approx(0.0002)
        assert pauses[1] == pytest.approx(0.0004)
        assert max(pauses) == pytest.approx(WRITE_POLL_MAX)
        conn.execute("ROLLBACK")
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    finally:
        conn.close()
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()


def test_a_member_process_started_while_the_file_is_locked_joins_once_it_is_free(
    sqlite_path: Path, tmp_path: Path
) -> None:
    # A process paused inside a write (a Spark driver under SIGSTOP, say) holds the file's
    # lock: a member process started meanwhile tries its join again instead of exiting.
    import sqlite3
    import subprocess

    from rebalancer_spark.testing import member_process

    store, _ = _pair(sqlite_path, ManualClock())
    store.join("g", "other", info={}, ttl=30.0, static=False)  # the schema exists
    store.close()
    paused = sqlite3.connect(sqlite_path, isolation_level=None)
    paused.execute("BEGIN IMMEDIATE")
    err = tmp_path / "m1.stderr"
    cmd = member_process.command(
        "g", f"sqlite://{sqlite_path}?busy_timeout=0.2", "m1", tmp_path / "m1.jsonl",
        resources=["a"],
    )  # fmt: skip
    with err.open("w") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        try:
            wait_for(lambda: "trying again" in err.read_text(), timeout=30, what="a retry")
            assert proc.poll() is None, err.read_text()
        finally:
            paused.execute("ROLLBACK")
            paused.close()
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready", err.read_text()
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == 0, err.read_text()


def _lead_and_give(store: SqliteBackend, session: Session, owner: str) -> int:
    record = store.elect(session)
    assert record is not None
    members = {owner: ["a"]} | ({} if owner == session.member_id else {session.member_id: []})
    return store.publish(
        session, record.epoch, members, phase=Phase.RUNNING, resources_version=0
    ).generation


def test_an_expired_holder_is_named_with_its_lease_deadline_in_wall_time(
    sqlite_path: Path,
) -> None:
    clock = ManualClock(start=1000.0, wall_start=1_700_000_000.0)
    store, other = _pair(sqlite_path, clock)
    dies = store.join("g", "dies", info={}, ttl=2.0, static=False)  # deadline 1002.0
    lives = other.join("g", "lives", info={}, ttl=600.0, static=False)
    store.claim(dies, ["a"], _lead_and_give(other, lives, "dies"))
    gen = _lead_and_give(other, lives, "lives")
    clock.advance(5.0)
    grant = other.claim(lives, ["a"], gen)["a"]
    assert grant == Grant(2, Freed.EXPIRED, "dies", dies.session_id, 1, 1_700_000_002.0)
    store.close()
    other.close()


def test_a_held_epoch_that_is_not_a_count_is_corrupt_data_naming_it(sqlite_path: Path) -> None:
    import sqlite3

    clock = ManualClock()
    store, _ = _pair(sqlite_path, clock)
    session = store.join("g", "m1", info={}, ttl=600.0, static=False)
    assert store.claim(session, ["a"], _lead_and_give(store, session, "m1"))["a"].epoch == 1
    assert store.member_view(session).owned == {"a": 1}
    db = sqlite3.connect(sqlite_path)
    try:
        with db:  # commits; closing is separate (Python 3.13 warns of an unclosed one)
            db.execute("UPDATE ownership SET epoch='one' WHERE resource_id='a'")
    finally:
        db.close()
    with pytest.raises(CorruptStateError, match="epoch of 'a' = 'one'"):
        store.member_view(session)


def test_a_free_row_whose_epoch_is_not_a_count_is_corrupt_data_not_a_grant(
    sqlite_path: Path,
) -> None:
    # A free row is granted by an UPDATE that adds one to its epoch: SQLite would make 'one'
    # + 1 into 1 and hand out an epoch already used. Such a row is left to the read by key,
    # which names it.
    import sqlite3

    clock = ManualClock()
    store, _ = _pair(sqlite_path, clock)
    session = store.join("g", "m1", info={}, ttl=600.0, static=False)
    generation = _lead_and_give(store, session, "m1")
    store.release(session, {"a": store.claim(session, ["a"], generation)["a"].epoch})
    db = sqlite3.connect(sqlite_path)
    try:
        with db:
            db.execute("UPDATE ownership SET epoch='one' WHERE resource_id='a'")
    finally:
        db.close()
    with pytest.raises(CorruptStateError, match="epoch of 'a' = 'one'"):
        store.claim(session, ["a"], generation)
    assert store.state("g").claims.get("a") is None  # nothing granted


def test_a_file_of_schema_version_1_gains_the_chain_columns(sqlite_path: Path) -> None:
    import sqlite3

    clock = ManualClock()
    store, _ = _pair(sqlite_path, clock)
    session = store.join("g", "m", info={}, ttl=600.0, static=False)
    store.claim(session, ["a"], _lead_and_give(store, session, "m"))
    store.close()
    conn = sqlite3.connect(sqlite_path)  # make it a file as version 1 wrote it
    for column in ("prev_member", "prev_session", "freed", "freed_at"):
        conn.execute(f"ALTER TABLE ownership DROP COLUMN {column}")
    conn.execute("ALTER TABLE members DROP COLUMN host")
    conn.execute("ALTER TABLE groups DROP COLUMN incarnation")
    conn.execute("DROP INDEX targets_given")
    conn.execute("ALTER TABLE targets DROP COLUMN gen")
    conn.execute("ALTER TABLE groups DROP COLUMN target_since")
    conn.execute("DROP TABLE target_away")
    conn.execute("ALTER TABLE groups DROP COLUMN away_since")
    conn.execute("ALTER TABLE groups DROP COLUMN away_upto")
    conn.execute("DROP TABLE resource_log")
    conn.execute("ALTER TABLE groups DROP COLUMN rlog_from")
    conn.execute("ALTER TABLE groups DROP COLUMN rlog_upto")
    conn.execute("UPDATE rebalancer_meta SET value='1' WHERE key='schema'")
    conn.commit()
    conn.close()
    reopened, _ = _pair(sqlite_path, clock)
    assert reopened.state("g").claims["a"].epoch == 1  # kept
    held = reopened.claim(session, ["a"], reopened.state("g").target.generation)  # type: ignore[union-attr]
    assert held["a"] == Grant(1, None, None, None, 0, None)  # its link predates the chain
    assert reopened.member_view(session).target == {"a"}  # its target rows, read whole
    reopened.release(session, {"a": 1})
    reopened.close()


def test_a_file_of_schema_version_5_logs_the_changes_after_its_current_set(
    sqlite_path: Path,
) -> None:
    import sqlite3

    clock = ManualClock()
    store, _ = _pair(sqlite_path, clock)
    v1 = store.update_resources("g", replace=[Resource("a"), Resource("b")])
    v2 = store.update_resources("g", add=[Resource("c")])
    store.close()
    conn = sqlite3.connect(sqlite_path)  # make it a file as version 5 wrote it
    conn.execute("DROP TABLE resource_log")
    conn.execute("ALTER TABLE groups DROP COLUMN rlog_from")
    conn.execute("ALTER TABLE groups DROP COLUMN rlog_upto")
    conn.execute("UPDATE rebalancer_meta SET value='5' WHERE key='schema'")
    conn.commit()
    conn.close()
    reopened, _ = _pair(sqlite_path, clock)
    assert reopened.resource_changes("g", v1) is None  # before the file logged anything
    assert reopened.resource_changes("g", v2) == ResourceChange(v2, v2, {}, frozenset())
    v3 = reopened.update_resources("g", remove=["a"])
    assert reopened.resource_changes("g", v2) == ResourceChange(v2, v3, {}, frozenset({"a"}))
    assert reopened.resources("g", (v2, {r: Resource(r) for r in "abc"})) == (
        v3,
        {"b": Resource("b"), "c": Resource("c")},
    )
    # A process of version 5 still running changes the set without logging it: readers
    # behind read the set whole, and the next change starts the log again after it.
    conn = sqlite3.connect(sqlite_path)
    conn.execute("INSERT INTO resources VALUES ('g', 'd', 1.0)")
    conn.execute("UPDATE groups SET resources_version=resources_version+1 WHERE name='g'")
    conn.commit()
    conn.close()
    assert reopened.resource_changes("g", v3) is None
    assert reopened.resource_changes("g", v3 + 1) is None
    v5 = reopened.update_resources("g", remove=["b"])
    assert reopened.resource_changes("g", v3) is None
    assert reopened.resource_changes("g", v5 - 1) is None  # the hole's version
    v6 = reopened.update_resources("g", remove=["c"])
    assert reopened.resource_changes("g", v5) == ResourceChange(v5, v6, {}, frozenset("c"))
    reopened.close()


def test_a_member_of_a_second_host_is_refused_and_the_first_hosts_sessions_stay(
    sqlite_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rebalancer_spark.backends.sqlite.host import HOST_ID_ENV
    from rebalancer_spark.core.errors import ConfigurationError

    clock = ManualClock()
    monkeypatch.setenv(HOST_ID_ENV, "host-a")
    first, _ = _pair(sqlite_path, clock)
    one = first.join("g", "a1", info={}, ttl=30.0, static=False)
    first.join("h", "a2", info={}, ttl=30.0, static=False)
    assert first.elect(one) is not None
    monkeypatch.setenv(HOST_ID_ENV, "host-b")  # the same file, opened from another host ...
    later = ManualClock(start=10_000.0)  # ... whose clock reads past every deadline of host a
    second, _ = _pair(sqlite_path, later)
    with pytest.raises(ConfigurationError) as refused:
        second.join("g", "b1", info={}, ttl=30.0, static=False)
    text = str(refused.value)
    for needed in ("one host's store", "'host-a'", "'host-b'", "g/a1", "zookeeper://", "redis://"):
        assert needed in text, f"{needed!r} missing from: {text}"
    assert set(second.state("g").members) == set(), "host a's deadlines mean nothing here"
    second.close()
    assert set(first.state("g").members) == {"a1"}
    assert set(first.state("h").members) == {"a2"}
    first.renew(one)
    first.leave(one)
    first.close()


def test_a_second_host_may_use_the_file_once_the_first_hosts_members_left(
    sqlite_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rebalancer_spark.backends.sqlite.host import HOST_ID_ENV

    clock = ManualClock()
    monkeypatch.setenv(HOST_ID_ENV, "host-a")
    first, _ = _pair(sqlite_path, clock)
    first.leave(first.join("g", "a1", info={}, ttl=30.0, static=False))
    first.close()
    monkeypatch.setenv(HOST_ID_ENV, "host-b")
    second, _ = _pair(sqlite_path, clock)
    second.join("g", "b1", info={}, ttl=30.0, static=False)
    assert set(second.state("g").members) == {"b1"}
    second.close()


def _led(path: Path) -> tuple[SqliteBackend, SqliteBackend, Session, Session, int]:
    """Member "m" on one handle and "lead", elected coordinator, on another: (m's store, the
    lead's store, lead, m, the coordinator epoch)."""
    store, coordinator = _pair(path, ManualClock())
    lead = coordinator.join("g", "lead", info={}, ttl=600.0, static=False)
    m = store.join("g", "m", info={}, ttl=600.0, static=False)
    record = coordinator.elect(lead)
    assert record is not None
    return store, coordinator, lead, m, record.epoch


def test_a_members_view_reads_only_its_own_moves_since_its_last_view(sqlite_path: Path) -> None:
    # A member's next view reads the target rows given to it since its last one (each row
    # carries the generation that wrote it) and the ids the away log says were taken from it
    # since: never its whole part, nor the rows that moved between other members. A view
    # older than the log's reach, or a log a publication did not write (a process of schema
    # version 4), makes it read its part whole.
    from rebalancer_spark.backends.sqlite.coordinator import AWAY_KEPT

    store, coordinator, lead, m, epoch = _led(sqlite_path)
    other = coordinator.join("g", "other", info={}, ttl=600.0, static=False)
    ids = [f"r{i:03d}" for i in range(300)]
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)

    def publish(assignment: dict[str, list[str]], previous: Target | None) -> Target:
        return coordinator.publish(
            lead,
            epoch,
            {"other": [], **assignment},
            phase=Phase.RUNNING,
            resources_version=0,
            previous=previous,
        )

    def view() -> tuple[frozenset[str], bool, int]:
        """m's part, whether it was read whole, and how many statements read its moves."""
        statements.clear()
        part = store.member_view(m).target
        whole = any(
            "FROM targets WHERE grp=" in s and "AND member_id=" in s and "gen >" not in s
            for s in statements
        )
        moves = [s for s in statements if "gen >" in s]
        assert all("member_id='m'" in s for s in moves), moves  # its own rows only
        return part, whole, len(moves)

    t = publish({"lead": ids[:150], "m": ids[150:]}, None)
    assert view()[:2] == (frozenset(ids[150:]), True)  # the first view reads the part whole
    assert view() == (frozenset(ids[150:]), False, 0)  # same generation: nothing read again
    t = publish({"lead": ids[:140] + ids[290:], "m": ids[140:290]}, t)
    assert view()[:2] == (frozenset(ids[140:290]), False)  # 10 moved in, 10 away
    t = publish({"lead": ids[5:140] + ids[295:], "m": ids[140:295] + ids[:5]}, t)
    t = publish({"lead": ids[:140] + ids[295:], "m": ids[140:295]}, t)  # two generations
    assert view()[:2] == (frozenset(ids[140:295]), False)
    t = publish({"lead": ids[:140] + ids[295:298], "m": ids[140:295]}, t)  # 2 ids deleted
    assert view()[:2] == (frozenset(ids[140:295]), False)  # not m's: nothing of it read
    t = publish({"lead": ids[:140] + ids[296:298], "m": ids[140:294], "other": ids[294:296]}, t)
    assert view()[:2] == (frozenset(ids[140:294]), False)  # 1 to another member, 1 deleted
    # 200 resources move between the lead and another member: m reads none of them.
    t = publish({"lead": ids[100:140], "m": ids[140:294], "other": ids[:100] + ids[294:298]}, t)
    assert view() == (frozenset(ids[140:294]), False, 2)
    # A view older than the log's reach reads whole: the log keeps AWAY_KEPT generations.
    for _ in range(AWAY_KEPT):
        t = publish({"lead": ids[100:140], "m": ids[140:294], "other": ids[:100]}, t)
    assert view() == (frozenset(ids[140:294]), False, 2)
    for _ in range(AWAY_KEPT + 1):
        t = publish({"lead": ids[100:140], "m": ids[140:294], "other": ids[:100]}, t)
    assert view()[:2] == (frozenset(ids[140:294]), True)
    # A publication that logged nothing (a process of schema version 4): read whole.
    t = publish({"lead": ids[100:140], "m": ids[140:290], "other": ids[:100]}, t)
    with coordinator._transaction("BEGIN IMMEDIATE") as db:
        db.execute("UPDATE groups SET away_upto=away_upto-1")
    assert view()[:2] == (frozenset(ids[140:290]), True)
    t = publish({"lead": ids[100:140], "m": ids[140:285], "other": ids[:100]}, t)
    assert view()[:2] == (frozenset(ids[140:285]), False)  # the log starts again
    store.leave(m)
    m = store.join("g", "m", info={}, ttl=600.0, static=False)  # a new session: read whole
    assert view()[:2] == (frozenset(ids[140:285]), True)
    assert store.member_view(m).target == coordinator.target("g").assignment["m"]  # type: ignore[union-attr]
    store.leave(other)
    store._conn.set_trace_callback(None)


def test_a_claim_walks_the_members_part_outside_the_write_lock(sqlite_path: Path) -> None:
    # The part is walked in a snapshot; the write transaction grants by key only the rows
    # that walk found (free ones in one statement that returns their chain; the others read
    # again), and a claim that finds nothing to grant takes no write lock at all: the
    # releases of the others never wait behind a walk of thousands of rows.
    store, coordinator, lead, m, epoch = _led(sqlite_path)
    ids = [f"r{i:03d}" for i in range(200)]
    first = coordinator.publish(
        lead, epoch, {"lead": ids, "m": []}, phase=Phase.RUNNING, resources_version=0
    )
    held = coordinator.claim(lead, ids, first.generation)
    moved = coordinator.publish(
        lead,
        epoch,
        {"lead": ids[100:], "m": ids[:100]},
        phase=Phase.RUNNING,
        resources_version=0,
        previous=first,
    )
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)

    def locked() -> list[str]:
        """The statements run inside the write transaction of the last call."""
        begins = [i for i, s in enumerate(statements) if s.startswith("BEGIN IMMEDIATE")]
        return statements[begins[-1] :] if begins else []

    assert store.claim(m, ids[:100], moved.generation) == {}  # all held by the lead
    assert locked() == []
    coordinator.release(lead, {r: held[r].epoch for r in ids[:10]})
    statements.clear()
    granted = store.claim(m, ids[:100], moved.generation)
    assert sorted(granted) == ids[:10]
    assert all(g.epoch == 2 and g.prev_member_id == "lead" for g in granted.values())
    inside = [s for s in locked() if "ownership" in s]
    assert inside and all("resource_id IN (" in s for s in inside)
    assert sum(s.count("'r0") for s in inside) == 10  # exactly the rows the walk found
    assert [s for s in inside if s.startswith("UPDATE ownership") and "RETURNING" in s]
    assert not [s for s in inside if "FROM ownership o" in s]  # free: granted without a read
    assert not [s for s in locked() if "targets" in s]
    statements.clear()
    assert store.claim(m, ids[:100], moved.generation) == granted  # held: returned, no write
    assert locked() == []
    store._conn.set_trace_callback(None)


def test_a_claim_of_a_small_share_of_the_part_looks_its_ids_up_and_finds_what_a_walk_finds(
    sqlite_path: Path,
) -> None:
    # A leave gives each member a few hundred resources of a part of thousands: its claim
    # seeks those ids in the member's index of the target instead of walking the whole part
    # (15 members walking 6,600 rows each at once took 70-110 ms per walk on two cores). The
    # rows found are exactly the walk's: free, never owned, held by this session or by an
    # expired one; not those of a live holder, nor ids outside the part.
    from rebalancer_spark.backends.sqlite import ownership

    store, coordinator, lead, m, epoch = _led(sqlite_path)
    clock = store._clock
    assert isinstance(clock, ManualClock)
    dies = coordinator.join("g", "dies", info={}, ttl=5.0, static=False)
    ids = [f"r{i:03d}" for i in range(120)]
    first = coordinator.publish(
        lead,
        epoch,
        {"lead": ids[:60], "dies": ids[60:90], "m": ids[90:100]},
        phase=Phase.RUNNING,
        resources_version=0,
    )
    held = coordinator.claim(lead, ids[:60], first.generation)
    coordinator.claim(dies, ids[60:90], first.generation)
    assert store.claim(m, ids[90:95], first.generation)  # m holds 90-94; 95-99 never owned
    clock.advance(10.0)  # "dies" expired, its rows not freed yet
    coordinator.renew(lead)
    store.renew(m)
    second = coordinator.publish(
        lead,
        epoch,
        {"lead": ids[:50], "m": ids[50:100], "dies": []},
        phase=Phase.RUNNING,
        resources_version=0,
        previous=first,
    )
    coordinator.release(lead, {r: held[r].epoch for r in ids[50:55]})  # 55-59: lead still
    part = len(store.member_view(m).target)
    assert part == 50
    wanted = [*ids[52:58], *ids[70:74], *ids[92:97], ids[5], "not-a-resource"]
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    with store._transaction("BEGIN") as db:
        by_ids = ownership.claimable(db, clock, m, wanted, second.generation, part)
        looked_up = list(statements)
        walked = ownership.claimable(db, clock, m, wanted, second.generation)
    store._conn.set_trace_callback(None)
    assert sorted(by_ids.resources) == sorted(walked.resources)
    assert sorted(by_ids.resources) == [*ids[52:55], *ids[70:74], *ids[92:97]]
    assert by_ids.held is None and walked.held is None  # some are to be granted
    assert any("t.resource_id IN (" in q for q in looked_up), looked_up
    assert not any("FROM targets" in q and "IN (" not in q for q in looked_up), looked_up
    granted = store.claim(m, wanted, second.generation)
    assert sorted(granted) == [*ids[52:55], *ids[70:74], *ids[92:97]]
    assert granted[ids[70]].freed is Freed.EXPIRED and granted[ids[52]].freed is Freed.RELEASED
    assert granted[ids[95]].freed is Freed.NEW and granted[ids[92]].epoch == 1


def test_a_claims_reread_under_the_lock_finds_each_row_by_its_key(sqlite_path: Path) -> None:
    # One lookup per id in the primary key of ownership (and of members), never a walk of an
    # index of the whole group: a re-read through targets walked a covering index of every
    # target row once per chunk of ids (130 ms for a claim of 5,900 of 100,000 resources).
    from rebalancer_spark.backends.sqlite.ownership import _BY_KEY

    store, _ = _pair(sqlite_path, ManualClock())
    query = _BY_KEY.format(marks="?,?,?")
    plan = [
        row[3] for row in store._conn.execute(f"EXPLAIN QUERY PLAN {query}", ("g", "a", "b", "c"))
    ]
    assert plan and all(step.startswith("SEARCH") for step in plan), plan
    assert any("ownership" in step and "resource_id=?" in step for step in plan), plan
    assert not [step for step in plan if "targets" in step], plan


def _given_to_m(sqlite_path: Path) -> tuple[ManualClock, SqliteBackend, Session, int]:
    """A group whose target gives "a" to member m (of ``store``), led by another handle's
    member: the clock, m's store, m's session and the target's generation."""
    clock = ManualClock()
    store, other = _pair(sqlite_path, clock)
    lives = other.join("g", "lives", info={}, ttl=600.0, static=False)
    m = store.join("g", "m", info={}, ttl=600.0, static=False)
    return clock, store, m, _lead_and_give(other, lives, "m")


def test_a_claim_rereads_under_the_lock_what_its_snapshot_found(sqlite_path: Path) -> None:
    # What the snapshot found may have changed before the write lock was taken (here, a claim
    # of the same session in between): the write transaction judges each row as it is then,
    # so a resource is granted once, at one epoch.
    from rebalancer_spark.backends.sqlite import ownership

    clock, store, m, gen = _given_to_m(sqlite_path)
    with store._transaction("BEGIN") as db:
        found = ownership.claimable(db, clock, m, ["a"], gen)
    assert found == ownership.Claimable(["a"], None)  # "a" is free: to be granted
    assert store.claim(m, ["a"], gen)["a"].epoch == 1
    with store._transaction("BEGIN IMMEDIATE") as db:
        again = ownership.claim(db, clock, m, found.resources, gen)
    assert [(f.resource, f.epoch, f.new) for f in again] == [("a", 1, False)]  # held already
    assert store.member_view(m).owned == {"a": 1}


def test_a_claim_reads_the_progress_it_hands_over_after_its_write_and_never_a_successor_s(
    sqlite_path: Path,
) -> None:
    # The grants' progress is read after the write lock is let go. By then only the holder's
    # commits are accepted; if this session lapsed meanwhile and a successor committed, that
    # later epoch's progress is not handed to a grant this session never works on.
    from rebalancer_spark.backends.sqlite import ownership

    clock, store, m, gen = _given_to_m(sqlite_path)
    granted = store.claim(m, ["a"], gen)
    assert granted["a"].epoch == 1 and granted["a"].progress is None
    store.commit(m, "a", 1, "7")
    with store._transaction("BEGIN IMMEDIATE") as db:
        held = ownership.claim(db, clock, m, ["a"], gen)
    with store._transaction("BEGIN") as db:
        assert ownership.grants(db, m, held)["a"].progress is not None  # its own, at epoch 1
        earlier = [held[0]._replace(epoch=0)]  # as if a successor's commit were the later one
        assert ownership.grants(db, m, earlier)["a"].progress is None


def test_a_file_with_the_indexes_of_an_earlier_release_gains_the_covering_ones(
    sqlite_path: Path,
) -> None:
    import sqlite3

    from rebalancer_spark.backends.sqlite.ownership import _CLAIMABLE, _CLAIMABLE_IDS
    from rebalancer_spark.backends.sqlite.store.schema import INDEXES

    clock = ManualClock()
    store, _ = _pair(sqlite_path, clock)
    session = store.join("g", "m", info={}, ttl=600.0, static=False)
    store.claim(session, ["a"], _lead_and_give(store, session, "m"))
    store.close()
    conn = sqlite3.connect(sqlite_path)  # the indexes as the release before wrote them
    for name in INDEXES:
        conn.execute(f"DROP INDEX {name}")
    conn.execute("CREATE INDEX targets_by_member ON targets(grp, member_id)")
    conn.execute("CREATE INDEX targets_by_gen ON targets(grp, gen)")
    conn.execute("CREATE INDEX ownership_by_session ON ownership(session_id)")
    conn.execute("CREATE INDEX targets_since ON targets(grp, gen, member_id, resource_id)")
    conn.commit()
    conn.close()
    reopened, _ = _pair(sqlite_path, clock)
    query = "SELECT name FROM sqlite_master WHERE type='index'"
    names = {r[0] for r in reopened._conn.execute(query)}
    assert names >= INDEXES.keys()
    replaced = {"targets_by_member", "targets_by_gen", "ownership_by_session", "targets_since"}
    assert not names & replaced
    plan = reopened._conn.execute(
        f"EXPLAIN QUERY PLAN {_CLAIMABLE}", ("g", "m", "s", 0.0)
    ).fetchall()
    # Either covering index of the member's rows serves a walk of its part.
    assert "COVERING INDEX targets_of_member" in plan[0][3] or "targets_given" in plan[0][3]
    by_ids = _CLAIMABLE_IDS.format(marks="?,?")
    plan = reopened._conn.execute(
        f"EXPLAIN QUERY PLAN {by_ids}", ("g", "m", "s", 0.0, "a", "b")
    ).fetchall()
    assert (
        "COVERING INDEX targets_of_member (grp=? AND member_id=? AND resource_id=?)" in (plan[0][3])
    )
    owned = "SELECT resource_id, epoch FROM ownership WHERE grp=? AND session_id=?"
    plan = reopened._conn.execute(f"EXPLAIN QUERY PLAN {owned}", ("g", "s")).fetchall()
    assert "COVERING INDEX ownership_of_session" in plan[0][3]
    assert reopened.member_view(session).target == {"a"}
    reopened.close()


def test_without_returning_a_claim_grants_the_same_through_the_read_by_key(
    sqlite_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite before 3.35 has no UPDATE ... RETURNING: every row takes the read by key.
    from rebalancer_spark.backends.sqlite import ownership

    monkeypatch.setattr(ownership, "_RETURNING", False)
    _, store, m, gen = _given_to_m(sqlite_path)
    first = store.claim(m, ["a"], gen)["a"]
    store.release(m, {"a": first.epoch})
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    again = store.claim(m, ["a"], gen)["a"]
    store._conn.set_trace_callback(None)
    assert not [s for s in statements if "RETURNING" in s]
    assert [s for s in statements if "FROM ownership o" in s]  # the read by key
    assert (first.epoch, again.epoch) == (1, 2)
    assert again.freed is Freed.RELEASED and again.prev_member_id == "m"
