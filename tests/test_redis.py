"""Redis-specific behaviour the contract suite cannot pin down: key space, epochs across data
loss, notifications, AUTH/ACL, TLS, secrets, scale, and faults of Redis itself.

Servers come from tests/servers/redis.py; fault tests start their own so that they can kill,
restart or pause it. Multi-process tests read the member processes' logs as witnesses.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from rebalancer_spark import EventKind, Member, MemberConfig, OwnershipEvent
from rebalancer_spark.backends import Backend, Capability, Session, open_backend
from rebalancer_spark.backends.base import Interest
from rebalancer_spark.backends.redis import RedisBackend
from rebalancer_spark.backends.redis.coordinator import CHANGE_LOG
from rebalancer_spark.backends.redis.store.runner import SCRIPT_MODULES, Lua
from rebalancer_spark.core.errors import (
    BackendUnavailable,
    ConfigurationError,
    CorruptStateError,
    FencedError,
    SessionExpired,
)
from rebalancer_spark.core.model import (
    MAX_RESOURCE_ID_BYTES,
    Freed,
    GroupState,
    Phase,
    Resource,
    Target,
    grant_epochs,
)
from tests.servers.redis import AclServer, RedisServer, TlsServer
from tests.support.clockshift import ClockShift
from tests.support.helpers import wait_for
from tests.support.procs import MemberProcesses

TTL = 30.0
T = TypeVar("T")


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:12]}"


def _join(store: Backend, group: str, member: str, ttl: float = TTL) -> Session:
    return store.join(group, member, info={"host": "test"}, ttl=ttl, static=False)


def _lead(store: Backend, session: Session) -> int:
    record = store.elect(session)
    assert record is not None and record.session_id == session.session_id
    return record.epoch


def _cycle(store: Backend, group: str) -> None:
    """Everything a member does once, through ``store``: proves a connection is usable."""
    session = _join(store, group, "m1")
    epoch = _lead(store, session)
    store.update_resources(group, replace=[Resource("a")])
    watch = store.watch(group)
    try:
        gen = store.publish(
            session, epoch, {"m1": ["a"]}, phase=Phase.RUNNING, resources_version=1
        ).generation
        assert watch.wait(5), "the watch missed the publication"
        assert grant_epochs(store.claim(session, ["a"], gen)) == {"a": 1}
        store.commit(session, "a", 1, {"offset": 7})
        assert store.progress(group, ["a"])["a"].value == {"offset": 7}
    finally:
        watch.close()
    store.leave(session)


@pytest.fixture
def store(redis_backend_url: str) -> Iterator[Backend]:
    with open_backend(redis_backend_url) as handle:
        yield handle


# -- the backend as registered -----------------------------------------------------------------


def test_capabilities_and_options_are_declared(redis_backend_url: str) -> None:
    with open_backend(
        redis_backend_url,
        require=[
            Capability.PUSH_NOTIFICATIONS,
            Capability.MULTI_HOST,
            Capability.AUTHENTICATION,
            Capability.PAUSE_TOLERANT,
        ],
    ) as handle:
        assert isinstance(handle, RedisBackend)
        assert Capability.DURABLE not in handle.capabilities  # progress is lost with Redis' data
    with pytest.raises(ConfigurationError, match="timeout"):
        open_backend(redis_backend_url + "?timout=3")


def test_every_script_has_a_header_naming_keys_argv_and_returns() -> None:
    for module in SCRIPT_MODULES:
        source = inspect.getsource(module)
        for name in module.__all__:
            header = source[: source.index(f"\n{name} = ")].rsplit("\n\n", 1)[-1]
            assert header.startswith(f"# {name} --"), f"{name} has no header comment"
            for part in ("KEYS[1]", "ARGV", "Returns"):
                assert part in header, f"the header of {name} does not state {part}"
        ast.parse(source)


def test_a_flushed_script_cache_is_reloaded(store: RedisBackend) -> None:
    group = _group()
    _join(store, group, "m1")
    store.client.script_flush()
    assert "m1" in store.state(group).members  # NOSCRIPT -> SCRIPT LOAD -> EVALSHA


def test_a_join_retried_with_the_same_session_id_is_not_a_duplicate(store: RedisBackend) -> None:
    group, sid = _group(), uuid.uuid4().hex
    args = ["m1", sid, 30_000, "{}", "0", 0, "", 0, -1]
    store.run(Lua.JOIN, group, args, "joining")
    store.run(Lua.JOIN, group, args, "joining")  # the reply of the first was lost
    assert store.state(group).members["m1"].session_id == sid


def test_the_lease_is_a_key_whose_expiry_redis_decides(store: RedisBackend) -> None:
    group = _group()
    session = _join(store, group, "m1", ttl=4.0)
    key = f"rb:{{{group}}}:lease:{session.session_id}"
    assert 3000 < store.client.pttl(key) <= 4000
    store.client.pexpire(key, 1)  # Redis, not the member, says when the lease is over
    wait_for(lambda: "m1" not in store.state(group).members, timeout=5, what="lease expiry")
    with pytest.raises(SessionExpired, match="'m1'"):
        store.renew(session)


# -- key space -----------------------------------------------------------------------------

SPECIAL_IDS = [
    "a:b",
    "{group}",
    "}{",
    "rb:{other}:meta",
    "*",
    "?[a]*",
    " ",
    "with space",
    "ключ/значение",
    "🙂" * 256,
    "x" * MAX_RESOURCE_ID_BYTES,
    "lease:0123",
]


def _resource_ids() -> st.SearchStrategy[str]:
    printable = st.characters(
        codec="utf-8", exclude_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs")
    )
    text = st.text(printable, min_size=1, max_size=300)
    return st.one_of(st.sampled_from(SPECIAL_IDS), text).filter(
        lambda s: s.isprintable() and len(s.encode()) <= MAX_RESOURCE_ID_BYTES
    )


@settings(max_examples=40, deadline=None)
@given(ids=st.lists(_resource_ids(), min_size=1, max_size=8, unique=True))
def test_resource_ids_stay_inside_the_group_key_space(
    redis_session_server: RedisServer, ids: list[str]
) -> None:
    db = 9  # a database of its own, so that every key in it belongs to this test
    with open_backend(redis_session_server.url(db)) as store:
        assert isinstance(store, RedisBackend)
        store.client.flushdb()
        group = _group()
        session = _join(store, group, "m:1@x")
        epoch = _lead(store, session)
        store.update_resources(group, replace=[Resource(i, 2.0) for i in ids])
        gen = store.publish(
            session, epoch, {"m:1@x": ids}, phase=Phase.RUNNING, resources_version=1
        ).generation
        assert grant_epochs(store.claim(session, ids, gen)) == dict.fromkeys(ids, 1)
        for i in ids:
            store.commit(session, i, 1, {"id": i})
        state = store.state(group)
        assert set(state.resources) == set(ids) and set(state.claims) == set(ids)
        assert {r: p.value for r, p in store.progress(group, ids).items()} == {
            i: {"id": i} for i in ids
        }
        assert store.member_view(session).target == frozenset(ids)
        keys = list(store.client.scan_iter(count=1000))
        head = f"rb:{{{group}}}:"
        assert keys and all(k.startswith(head) for k in keys), keys
        assert {key_slot(k.encode()) for k in keys} == {key_slot(f"{head}meta".encode())}
        sid = session.session_id
        assert {k[len(head) :] for k in keys} <= {
            *["meta", "members", "sessions", "info", "acked", "leaving", "static", "ttl"],
            *["resources", "tmembers", "owner", "epochs", "progress", "t:m:1@x"],
            *["chain", "deadline", "rlog", "rlog:1"],
            f"lease:{sid}",
            f"held:{sid}",
        }, "a resource id became part of a key name"
        store.client.flushdb()


def test_a_change_a_client_of_an_earlier_release_made_unlogged_is_not_read_as_none(
    store: RedisBackend,
) -> None:
    """A client of the release before the log changes the set with its own script, which
    logs nothing: readers behind it read the set whole, and the next change starts the log
    again after it."""
    group = _group()
    v1 = store.update_resources(group, replace=[Resource("a"), Resource("b")])
    v2 = store.update_resources(group, add=[Resource("c")])
    assert store.resource_changes(group, v1) is not None
    head = f"rb:{{{group}}}:"
    store.client.hset(f"{head}resources", "d", repr(1.0))  # as the older script does
    store.client.hincrby(f"{head}meta", "resources_version", 1)
    assert store.resource_changes(group, v2) is None
    assert store.resource_changes(group, v2 + 1) is None
    v4 = store.update_resources(group, remove=["a"])
    assert store.resource_changes(group, v2) is None
    assert store.resource_changes(group, v4 - 1) is None
    v5 = store.update_resources(group, remove=["b"])
    change = store.resource_changes(group, v4)
    assert change is not None and change.version == v5 and change.removed == {"b"}


def test_versions_a_jump_skipped_or_another_incarnation_numbered_are_not_read_as_logged(
    store: RedisBackend, redis_backend_url: str
) -> None:
    """After a loss (or a return to an older copy) the set's version jumps to the base: the
    versions skipped are no versions of the log. And a handle that joined one incarnation
    reads no change of another by its own versions."""
    group = _group()
    store.join(group, "m", info={}, ttl=30.0, static=False)
    v1 = store.update_resources(group, replace=[Resource("a")])
    v2 = store.update_resources(group, add=[Resource("b")])
    head = f"rb:{{{group}}}:"
    store.client.hset(f"{head}meta", "base", str(v2 + 1000))  # as a loss lifts it
    v3 = store.update_resources(group, add=[Resource("c")])
    assert v3 > v2 + 1000
    for since in (v1, v2, v2 + 1, v3 - 1):
        assert store.resource_changes(group, since) is None, since
    assert store.resource_changes(group, v3) is not None
    other = open_backend(redis_backend_url)
    try:
        assert isinstance(other, RedisBackend)
        for key in store.client.scan_iter(match=f"{head}*"):
            store.client.delete(key)  # the group is lost ...
        other.join(group, "n", info={}, ttl=30.0, static=False)  # ... and created again
        for i in range(5):
            other.update_resources(group, add=[Resource(f"new{i}")])
        assert store.resource_changes(group, 2) is None  # store joined the old incarnation
        assert other.resource_changes(group, other.resources(group)[0]) is not None
    finally:
        other.close()


def test_a_foreign_key_in_the_group_space_is_reported_as_corrupt(store: RedisBackend) -> None:
    group = _group()
    _join(store, group, "m1")
    store.client.delete(f"rb:{{{group}}}:members")
    store.client.set(f"rb:{{{group}}}:members", "not a hash")
    with pytest.raises(CorruptStateError, match="WRONGTYPE"):
        store.state(group)


def test_forged_session_ids_are_refused(store: Backend) -> None:
    forged = Session(_group(), "m1", "../../x:{y}", 1.0)
    with pytest.raises(SessionExpired, match="not issued"):
        store.renew(forged)


# -- notifications -------------------------------------------------------------------------------


def test_an_expiry_is_reported_even_when_a_write_comes_after_it(store: Backend) -> None:
    group = _group()
    _join(store, group, "dies", ttl=0.3)
    watch = store.watch(group)
    try:
        wait_for(lambda: "dies" not in store.state(group).members, timeout=5, what="expiry")
        store.update_resources(group, add=[Resource("x")])  # a write after the expiry
        assert watch.wait(1) is True
        assert watch.wait(0.3) is True, "the expiry itself was hidden by the later write"
        assert watch.wait(0.3) is False, "an expiry is reported once"
    finally:
        watch.close()


def test_the_watch_wakes_when_a_quarantine_ends(redis_server: RedisServer) -> None:
    # A lease long enough that renewals every 50 ms hold on a loaded machine.
    group, ttl = _group(), 2.0
    with open_backend(redis_server.url()) as store:
        assert isinstance(store, RedisBackend)
        _lead(store, _join(store, group, "m1", ttl))
        redis_server.restart()
        session = wait_for(lambda: _rejoined(store, group, "m1", ttl), timeout=5, what="rejoin")
        assert session is not None
        stop = threading.Event()

        def keep_renewing() -> None:
            while not stop.wait(0.05):
                store.renew(session)

        renewer = threading.Thread(target=keep_renewing)
        renewer.start()
        watch = store.watch(group)
        try:
            started = time.monotonic()
            assert watch.wait(5) is True
            assert time.monotonic() - started < ttl + 1.0, "woke at the quarantine's end"
            assert not store.client.exists(f"rb:{{{group}}}:quarantine")
        finally:
            stop.set()
            renewer.join()
            watch.close()


def test_a_members_view_reads_only_what_moved_since_its_last_view(
    store: RedisBackend,
    redis_backend_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A target published as a change is logged per member (P tchg:<generation>): a member's
    # next view gets its own entries since its last view, not its whole part. Whatever breaks
    # the log's chain (a whole publication, a generation written without a log, a store gone
    # back to another copy, a member past the log's length), a new session or an unreadable
    # entry makes the view read the part whole.
    group = _group()
    head = f"rb:{{{group}}}:"

    def logs() -> tuple[int, int]:
        return store.client.scard(head + "tgens"), len(
            list(store.client.scan_iter(head + "tchg:*"))
        )

    replies: list[list[object]] = []
    run = store._runner.run

    def recording(name: Lua, *args: object) -> object:
        reply = run(name, *args)  # type: ignore[arg-type]
        if name is Lua.MEMBER_VIEW:
            replies.append(list(reply))
        return reply

    monkeypatch.setattr(store._runner, "run", recording)
    with open_backend(redis_backend_url) as coordinator:
        lead = _join(coordinator, group, "lead")
        epoch = _lead(coordinator, lead)
        m = _join(store, group, "m")
        ids = [f"r{i:03d}" for i in range(300)]
        coordinator.update_resources(group, replace=[Resource(i) for i in ids])

        def publish(assignment: dict[str, list[str]], previous: Target | None) -> Target:
            return coordinator.publish(
                lead, epoch, assignment, phase=Phase.RUNNING, resources_version=1,
                previous=previous,
            )  # fmt: skip

        def view() -> tuple[frozenset[str], str, int]:
            replies.clear()
            part = store.member_view(m).target
            reply = replies[-1]  # (two after an unreadable entry: the second whole)
            part_sent = reply[2]
            assert isinstance(part_sent, list)
            return part, str(reply[6]), len(part_sent)

        t = publish({"lead": ids[:150], "m": ids[150:]}, None)
        assert view() == (frozenset(ids[150:]), "0", 150)  # the first view: whole
        assert view() == (frozenset(ids[150:]), "1", 0)  # same generation: nothing sent
        t = publish({"lead": ids[:140] + ids[290:], "m": ids[140:290]}, t)
        assert view() == (frozenset(ids[140:290]), "1", 1)  # one entry: 10 in, 10 out
        t = publish({"lead": ids[5:140] + ids[295:], "m": ids[140:295] + ids[:5]}, t)
        t = publish({"lead": ids[:140] + ids[295:], "m": ids[140:295]}, t)
        assert view() == (frozenset(ids[140:295]), "1", 2)  # two generations, one entry each
        t = publish({"lead": ids[:140] + ids[296:], "m": ids[140:295]}, t)  # m untouched
        assert view() == (frozenset(ids[140:295]), "1", 0)
        t = publish({"lead": ids[:150] + ids[290:]}, t)  # m dropped ...
        t = publish({"lead": ids[:150] + ids[290:], "m": ids[150:160]}, t)  # ... and back
        assert view() == (frozenset(ids[150:160]), "1", 2)
        assert logs() == (6, 6)  # one per change since the whole publication
        t = publish({"lead": ids[:150], "m": ids[150:]}, None)  # whole: the log starts again
        assert logs() == (0, 0)
        assert view() == (frozenset(ids[150:]), "0", 150)
        for i in range(CHANGE_LOG + 1):  # past the log's length: whole
            moved = ids[150 + i % 2 :]
            t = publish({"lead": sorted(set(ids) - set(moved)), "m": moved}, t)
        assert logs() == (CHANGE_LOG, CHANGE_LOG)
        assert view() == (frozenset(ids[150:]), "0", 150)  # the last of them gave m ids[150:]
        t = publish({"lead": ids[:151], "m": ids[151:]}, t)
        assert view() == (frozenset(ids[151:]), "1", 1)
        # A generation written with no log (as a publication by an older version does), seen
        # at once or under a change published on top of it ...
        store.client.sadd(head + "t:m", ids[0])
        store.client.hincrby(head + "meta", "generation", 1)
        assert view() == (frozenset([ids[0], *ids[151:]]), "0", 150)
        store.client.srem(head + "t:m", ids[0])
        store.client.hincrby(head + "meta", "generation", 1)
        t = dataclasses.replace(t, generation=t.generation + 2)
        t = publish({"lead": ids[:152], "m": ids[152:]}, t)
        assert store.client.hget(f"{head}tchg:{t.generation}", " from") == ""
        assert view() == (frozenset(ids[152:]), "0", 148)
        t = publish({"lead": ids[:150], "m": ids[150:]}, None)
        assert view() == (frozenset(ids[150:]), "0", 150)
        # ... a store gone back to another copy at the same generation, seen at once or
        # under a change published on top of it ...
        t = publish({"lead": ids[:151], "m": ids[151:]}, t)
        store.client.hset(head + "meta", "target_token", f"{t.generation}:another copy")
        assert view() == (frozenset(ids[151:]), "0", 149)
        store.client.hset(head + "meta", "target_token", f"{t.generation}:a third copy")
        t = publish({"lead": ids[:150], "m": ids[150:]}, t)
        assert view() == (frozenset(ids[150:]), "0", 150)
        # ... or an entry that is not what the library writes: read whole, with a warning.
        t = publish({"lead": ids[:150], "m": ids[150:]}, t)
        t = publish({"lead": ids[:150], "m": ids[150:]}, t)  # no change, but links
        assert view() == (frozenset(ids[150:]), "1", 0)
        t = publish({"lead": ids[:152], "m": ids[152:]}, t)
        store.client.hset(f"{head}tchg:{t.generation}", "m", "[1, 2")
        with caplog.at_level("WARNING", "rebalancer_spark.backends.redis"):
            assert view() == (frozenset(ids[152:]), "0", 148)
        assert [str(r[6]) for r in replies] == ["1", "0"]
        assert "change log is not what this library writes" in caplog.text
        store.leave(m)
        m = _join(store, group, "m")  # a new session: whole
        assert view() == (frozenset(ids[152:]), "0", 148)
        target = coordinator.target(group)
        assert target is not None and store.member_view(m).target == target.assignment["m"]


def test_a_members_watch_hears_neither_the_others_claims_nor_acks_nor_their_releases(
    redis_server: RedisServer,
) -> None:
    """Only the coordinator acts on claims and acknowledgements, and a release concerns the
    member whose target holds the resource: m3's reconciler watch is not even subscribed to
    them (at 100 members, every such message used to reach all 200 watches of the group), a
    release meant for m3 reaches it on its own channel, and a watch whose interest widens
    reports a change once it hears the wider channel."""
    group = _group()
    head = f"rb:{{{group}}}:"
    client = redis.Redis(port=redis_server.port, decode_responses=True)

    def listeners() -> dict[str, int]:
        channels = [f"{head}changes", f"{head}coord", f"{head}to:m3"]
        return {str(c).removeprefix(head): int(n) for c, n in client.pubsub_numsub(*channels)}

    with open_backend(redis_server.url()) as store, client:
        s1, s2, s3 = (_join(store, group, m) for m in ("m1", "m2", "m3"))
        e = _lead(store, s1)
        first = {"m1": ["x", "y", "z"], "m2": [], "m3": []}
        g1 = store.publish(s1, e, first, phase=Phase.RUNNING, resources_version=0).generation
        store.claim(s1, ["x", "y", "z"], g1)
        m3, witness = store.watch(group), store.watch(group)
        try:
            assert listeners() == {"changes": 2, "coord": 2, "to:m3": 0}
            m3.focus(Interest.MEMBER, "m3")
            wait_for(
                lambda: listeners() == {"changes": 2, "coord": 1, "to:m3": 1},
                timeout=5,
                what="m3's watch to hear its own channel instead of the coordinator's",
            )
            moved = {"m1": ["y"], "m2": ["x"], "m3": ["z"]}
            g2 = store.publish(s1, e, moved, phase=Phase.RUNNING, resources_version=0).generation
            assert witness.wait(5) and m3.wait(5), "a new target wakes every member"
            changes: dict[str, Callable[[], object]] = {
                "release": lambda: store.release(s1, {"x": 1}),  # meant for m2
                "claim": lambda: store.claim(s2, ["x"], g2),
                "ack": lambda: store.acknowledge(s2, g2),
            }
            for change, make in changes.items():
                make()
                assert witness.wait(5), change  # the message is out
                assert m3.wait(0.2) is False, change
            store.release(s1, {"z": 1})
            assert witness.wait(5) and m3.wait(5), "a release meant for m3 reaches it"
            assert set(store.claim(s3, ["z"], g2)) == {"z"}
            assert witness.wait(5) and m3.wait(0.2) is False, "m3's own claim"
            m3.focus(Interest.ALL)
            assert m3.wait(5), "a wider interest reports a change once it hears the wider channel"
            wait_for(
                lambda: listeners() == {"changes": 2, "coord": 2, "to:m3": 0},
                timeout=5,
                what="m3's watch to hear the coordinator's channel instead of its own",
            )
        finally:
            m3.close()
            witness.close()


def test_a_followers_watch_follows_the_coordinators_lease_alone(
    redis_server: RedisServer,
) -> None:
    """A member that does not coordinate acts on the coordinator going away: its watch reads
    the coordinator's lease only (at 100 members, 100 such watches each read 100 leases at
    every lease period and every join or leave), so another member's expiry does not wake it
    (a watch of everything, the witness, sees it), and the coordinator's does."""
    group = _group()
    with open_backend(redis_server.url()) as store:
        s1 = _join(store, group, "m1", ttl=6.0)
        _lead(store, s1)
        _join(store, group, "m2", ttl=1.0)
        s3 = _join(store, group, "m3", ttl=60.0)
        follower, witness = store.watch(group), store.watch(group)
        try:
            follower.focus(Interest.SUCCESSION)
            assert witness.wait(4), "m2's lease ran out (1 s)"
            assert follower.wait(0.5) is False, "m2 does not coordinate"
            assert follower.wait(10), "the coordinator's lease ran out (6 s)"
            assert store.elect(s3) is not None
        finally:
            follower.close()
            witness.close()


def test_a_coordinator_elected_and_expired_between_a_followers_reads_wakes_it(
    redis_server: RedisServer,
) -> None:
    """The follower read the leases while nobody coordinated; m2 is then elected and its lease
    runs out before the follower reads again. That read lists m2 with its lease gone: m2 was
    never known alive to this watch, and its expiry is reported all the same."""
    group = _group()
    with (
        open_backend(redis_server.url()) as store,
        redis.Redis(port=redis_server.port, decode_responses=True) as client,
    ):
        s1 = _join(store, group, "m1", ttl=60.0)
        e1 = _lead(store, s1)
        follower = store.watch(group)
        try:
            follower.focus(Interest.SUCCESSION)
            store.resign(s1, e1)
            assert follower.wait(5), "the coordinator resigned"
            s2 = _join(store, group, "m2", ttl=2.5)
            assert follower.wait(5), "m2 joined"
            follower.wait(0.2)  # reads the leases: nobody coordinates
            _lead(store, s2)
            assert follower.wait(5), "m2 was elected"
            wait_for(
                lambda: not client.exists(f"rb:{{{group}}}:lease:{s2.session_id}"),
                timeout=10,
                what="m2's lease to run out",
            )
            assert follower.wait(5), "the coordinator's lease ran out"
        finally:
            follower.close()


def test_a_connection_redis_py_restores_on_its_own_still_reports_a_change(
    redis_server: RedisServer,
) -> None:
    """redis-py reconnects a pub/sub connection dropped once (CLIENT KILL, an idle timeout of
    a proxy) and subscribes again without telling its caller; messages sent meanwhile were
    lost, so the watch reports a change."""
    group = _group()
    with (
        open_backend(redis_server.url()) as store,
        redis.Redis(port=redis_server.port, decode_responses=True) as client,
    ):
        _join(store, group, "m1", ttl=60.0)
        watch = store.watch(group)
        try:
            watch.wait(0.3)  # whatever the join left behind
            assert watch.wait(0.3) is False, "nothing changed"
            assert client.client_kill_filter(_type="pubsub") >= 1
            assert watch.wait(5), "messages may have been lost while it reconnected"
        finally:
            watch.close()


def test_a_watch_survives_a_restart_and_never_raises(redis_server: RedisServer) -> None:
    group = _group()
    with open_backend(redis_server.url()) as store, open_backend(redis_server.url()) as other:
        watch = store.watch(group)
        try:
            redis_server.kill()
            started = time.monotonic()
            watch.wait(0.5)  # the connection dropped: a change may be reported, no error
            assert watch.wait(0.5) is False
            assert time.monotonic() - started < 3
            redis_server.start()
            assert watch.wait(10) is True, "no wake-up after the reconnection"
            other.update_resources(group, add=[Resource("a")])
            assert wait_for(lambda: watch.wait(0.2), timeout=5, what="the next publication")
        finally:
            watch.close()


def test_a_lease_gone_in_redis_before_its_local_deadline_is_reported(store: RedisBackend) -> None:
    # The watch's deadline is Redis' expiry plus the reply's travel time, so a forced re-read
    # (after a join message) can find a lease already gone that is not yet due locally: that
    # expiry must be reported, not dropped with the old deadlines.
    group = _group()
    dying = _join(store, group, "dying")
    watch = store.watch(group)
    try:
        store.client.pexpire(f"rb:{{{group}}}:lease:{dying.session_id}", 1)  # gone in Redis
        wait_for(lambda: "dying" not in store.state(group).members, timeout=5, what="expiry")
        _join(store, group, "other")  # a 'join': the watch reads every lease again
        assert watch.wait(5) is True  # the join
        assert watch.wait(1) is True, "the expiry found by the re-read was dropped"
        assert watch.wait(0.3) is False, "an expiry is reported once"
    finally:
        watch.close()


def test_watch_can_start_while_redis_is_down(redis_server: RedisServer) -> None:
    with open_backend(redis_server.url()) as store:
        redis_server.kill()
        watch = store.watch(_group())
        try:
            assert watch.wait(0.2) is False
            redis_server.start()
            assert watch.wait(10) is True
        finally:
            watch.close()


# -- epochs across data loss ---------------------------------------------------------------


def _renewed(store: Backend, session: Session) -> bool:
    try:
        store.renew(session)
    except BackendUnavailable:
        return False
    return True


def _rejoined(store: Backend, group: str, member: str, ttl: float) -> Session | None:
    try:
        return _join(store, group, member, ttl)
    except BackendUnavailable:
        return None


def test_epochs_keep_growing_and_stale_commits_stay_refused_after_data_loss(
    redis_server: RedisServer,
) -> None:
    group, ttl = _group(), 1.5
    a, b = open_backend(redis_server.url()), open_backend(redis_server.url())
    try:
        m1 = _join(a, group, "m1", ttl)
        _join(b, group, "m2", ttl)
        old_coordinator = _lead(a, m1)
        a.update_resources(group, replace=[Resource("r"), Resource("s")])
        gen = a.publish(
            m1, old_coordinator, {"m1": ["r", "s"], "m2": []}, phase=Phase.RUNNING,
            resources_version=1,
        ).generation  # fmt: skip
        old = grant_epochs(a.claim(m1, ["r", "s"], gen))
        a.commit(m1, "r", old["r"], "before")
        assert b.state(group).claims["r"].member_id == "m1"

        redis_server.restart()  # no persistence: everything is gone

        with pytest.raises(FencedError, match="'r'"):
            a.commit(m1, "r", old["r"], "stale")
        new_m1 = wait_for(lambda: _rejoined(a, group, "m1", ttl), timeout=5, what="rejoin")
        assert new_m1 is not None
        state = b.state(group)
        assert set(state.resources) == {"r", "s"}, "m1 re-declared the set it last saw"
        new_m2 = _join(b, group, "m2", ttl)
        epoch = _lead(b, new_m2)
        assert epoch > old_coordinator
        target = b.publish(
            new_m2, epoch, {"m2": ["r", "s"], "m1": []}, phase=Phase.RUNNING,
            resources_version=state.resources_version,
        )  # fmt: skip
        assert target.generation > gen
        assert b.claim(new_m2, ["r"], target.generation) == {}, "granted during the quarantine"
        started = time.monotonic()

        def claim() -> dict[str, int]:
            b.renew(new_m2)
            return grant_epochs(b.claim(new_m2, ["r", "s"], target.generation))

        granted = wait_for(claim, timeout=5, what="the end of the quarantine")
        assert time.monotonic() - started <= ttl + 0.5
        assert granted["r"] > old["r"] and granted["s"] > old["s"]
        for stale in (m1, new_m1):
            with pytest.raises(FencedError, match="'m2'"):
                a.commit(stale, "r", old["r"], "stale")
        b.commit(new_m2, "r", granted["r"], "after")
        assert a.progress(group, ["r"])["r"].value == "after"
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("added", ["from-a", "r"], ids=["a-change", "no-change"])
def test_a_set_declared_again_after_a_loss_keeps_another_writers_change(
    redis_server: RedisServer, added: str
) -> None:
    """Handle a remembers the set it read, b adds a resource, then a adds one as a delta: a
    used to apply its delta to the set it had read and forget b's resource, and declared that
    set into Redis when Redis lost the group. It now reads the set again when its delta did
    not make the version after the set it kept: a delta that changed the set made the version
    after b's, and one that changed nothing (``r`` again) returns b's version, the one after
    a's kept set, and must not pass for having made it."""
    group, ttl = _group(), 1.5
    a, b = open_backend(redis_server.url()), open_backend(redis_server.url())
    try:
        _join(a, group, "m1", ttl)
        a.update_resources(group, replace=[Resource("r")])
        assert set(a.state(group).resources) == {"r"}
        b.update_resources(group, add=[Resource("from-b")])
        a.update_resources(group, add=[Resource(added)])
        wanted = {"r", "from-b", added}
        assert set(b.state(group).resources) == wanted

        redis_server.restart()  # no persistence: everything is gone

        wait_for(lambda: _rejoined(a, group, "m1", ttl), timeout=5, what="rejoin")
        assert set(b.state(group).resources) == wanted, "a declared the set it last saw"
    finally:
        a.close()
        b.close()


def test_a_listing_sent_as_its_change_is_the_set_declared_again_after_a_loss(
    redis_server: RedisServer,
) -> None:
    """A coordinator's listing goes to Redis as its change against the set it keeps (mode
    ``change``); the set its handle remembers for a store that lost the group must be the
    listing, not the set before it."""
    group, ttl = _group(), 1.5
    a = open_backend(redis_server.url())
    try:
        _join(a, group, "m1", ttl)
        a.update_resources(group, replace=[Resource(f"r{i}") for i in range(10)])
        kept = a.resources(group)
        listing = [Resource(f"r{i}") for i in range(3, 13)]
        a.update_resources(group, replace=listing, known=kept)

        redis_server.restart()  # no persistence: everything is gone

        wait_for(lambda: _rejoined(a, group, "m1", ttl), timeout=5, what="rejoin")
        assert set(a.state(group).resources) == {r.id for r in listing}
    finally:
        a.close()


def test_fresh_jobs_with_audit_floors_get_epochs_above_redis_clock_after_each_loss(
    redis_server: RedisServer,
) -> None:
    # Two fresh processes, each knowing only the audit table's floors, each joining a group
    # Redis created again (it lost its data in between): both used to be granted floor + 1.
    group, ttl, floor = _group(), 1.5, 50
    granted = []
    for name in ("job-11", "job-12"):
        redis_server.restart()  # no persistence: the group is gone
        store = open_backend(redis_server.url())
        try:
            store.remember_epochs(group, {"r": floor})
            store.update_resources(group, replace=[Resource("r")])
            session = _join(store, group, name, ttl)
            epoch = _lead(store, session)
            gen = store.publish(
                session, epoch, {name: ["r"]}, phase=Phase.RUNNING, resources_version=1
            ).generation

            def claim(s: Session = session, g: int = gen, b: Backend = store) -> dict[str, int]:
                b.renew(s)
                return grant_epochs(b.claim(s, ["r"], g))

            granted.append(wait_for(claim, timeout=5, what="the end of the quarantine")["r"])
        finally:
            store.close()
    wall_us = time.time() * 1_000_000
    assert all(e > wall_us - 60_000_000 for e in granted), granted  # above Redis' clock
    assert granted[0] != granted[1]


def test_an_old_member_lifts_the_epochs_of_a_group_recreated_without_it(
    redis_server: RedisServer,
) -> None:
    group, ttl = _group(), 1.0
    with open_backend(redis_server.url()) as old, open_backend(redis_server.url()) as fresh:
        session = _join(old, group, "old", ttl)
        seen = [_lead(old, session)]
        for _ in range(3):
            old.resign(session, seen[-1])
            seen.append(_lead(old, session))
        redis_server.restart()
        # A process that never saw the group recreates it: it cannot know better.
        newcomer = wait_for(lambda: _rejoined(fresh, group, "new", ttl), timeout=5, what="join")
        assert newcomer is not None and _lead(fresh, newcomer) == 1
        fresh.resign(newcomer, 1)
        # The old member rejoins and presents what it saw: epochs jump above it.
        _join(old, group, "old", ttl)
        assert _lead(fresh, newcomer) > max(seen)


def test_a_restart_from_an_older_snapshot_hands_out_no_number_twice(
    redis_server: RedisServer,
) -> None:
    # Redis' default persistence is RDB snapshots: after kill -9 it reloads the last one, with
    # the same incarnation id, older counters and claims that were released since.
    group, ttl = _group(), 1.5
    with open_backend(redis_server.url()) as a, open_backend(redis_server.url()) as b:
        assert isinstance(a, RedisBackend) and isinstance(b, RedisBackend)
        a.update_resources(group, replace=[Resource("r")])
        m1, m2 = _join(a, group, "m1", ttl), _join(b, group, "m2", ttl)
        epoch = _lead(a, m1)
        gen1 = a.publish(
            m1, epoch, {"m1": ["r"], "m2": []}, phase=Phase.RUNNING, resources_version=1
        ).generation
        first = grant_epochs(a.claim(m1, ["r"], gen1))
        a.client.save()  # the snapshot, as a `save` rule would write it
        a.release(m1, first)
        gen2 = a.publish(
            m1, epoch, {"m1": [], "m2": ["r"]}, phase=Phase.RUNNING, resources_version=1
        ).generation
        second = grant_epochs(b.claim(m2, ["r"], gen2))
        assert second["r"] > first["r"]
        b.commit(m2, "r", second["r"], "after the snapshot")

        redis_server.restart()  # kill -9, then the server loads the older snapshot
        assert b.client.hget(f"rb:{{{group}}}:owner", "r") == m1.session_id, "no snapshot?"

        with pytest.raises(SessionExpired):  # b saw numbers Redis no longer has: rejoin
            wait_for(lambda: _renewed(b, m2), timeout=5, what="Redis to answer")
        new_m2 = _join(b, group, "m2", ttl)
        assert "r" not in b.state(group).claims, "the claim released after the snapshot is back"
        with pytest.raises(SessionExpired):
            a.member_view(m1)  # every session of the snapshot was ended
        assert b.client.exists(f"rb:{{{group}}}:quarantine"), "no quarantine"
        new_epoch = _lead(b, new_m2)
        assert new_epoch > epoch
        target = b.publish(
            new_m2, new_epoch, {"m2": ["r"]}, phase=Phase.RUNNING, resources_version=1
        )
        assert target.generation > gen2
        assert b.claim(new_m2, ["r"], target.generation) == {}, "granted during the quarantine"

        def claim() -> dict[str, int]:
            b.renew(new_m2)
            return grant_epochs(b.claim(new_m2, ["r"], target.generation))

        granted = wait_for(claim, timeout=ttl + 5, what="the end of the quarantine")
        assert granted["r"] > second["r"], "a resource epoch was handed out twice"
        with pytest.raises(FencedError):
            b.commit(m2, "r", second["r"], "stale")


def test_a_server_up_since_before_the_loss_does_not_shorten_the_quarantine(
    redis_server: RedisServer, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # The URL comes to reach another, empty server that has been running for a while (a
    # DNS/VIP switch to a standby, a promoted empty replica): its start time says nothing
    # about when the group's data was lost, so the quarantine must run a full ttl from now.
    standby = RedisServer(tmp_path / "standby")
    standby.start()
    request.addfinalizer(standby.stop)
    group, ttl = _group(), 1.5
    with open_backend(redis_server.url()) as store:
        assert isinstance(store, RedisBackend)
        _lead(store, _join(store, group, "m1", ttl))
        with redis.Redis(port=standby.port) as peek:
            wait_for(
                lambda: int(peek.info("server")["uptime_in_seconds"]) >= ttl + 1.5,
                timeout=10,
                what="the standby to have been up a while",
            )
        redis_server.kill()
        pool = store.client.connection_pool
        pool.disconnect()
        pool.connection_kwargs["port"] = standby.port  # the switch
        pool.reset()
        _join(store, group, "m1", ttl)
        left = store.client.pttl(f"rb:{{{group}}}:quarantine")
        assert left > ttl * 1000 - 500, f"quarantine of {left} ms after a switch"


# -- security ----------------------------------------------------------------------------------


def test_an_acl_user_can_do_everything_the_backend_needs(redis_acl_server: AclServer) -> None:
    password = quote(redis_acl_server.password, safe="")
    url = redis_acl_server.server.url(user="rebalancer", password=password)
    with open_backend(url, require=[Capability.AUTHENTICATION]) as store:
        _cycle(store, _group())
        assert redis_acl_server.password not in repr(store)
        # ... including what it does when Redis comes back empty.
        group = _group()
        old = _join(store, group, "m1", 1.0)
        _lead(store, old)
        store.update_resources(group, replace=[Resource("a")])
        redis_acl_server.server.restart()
        with pytest.raises(SessionExpired):
            wait_for(lambda: _renewed(store, old), timeout=5, what="Redis to answer")
        assert wait_for(lambda: _rejoined(store, group, "m1", 1.0), timeout=5, what="rejoin")
        assert store.state(group).resources == {"a": Resource("a")}


def test_another_acl_identity_is_kept_out_of_the_group(redis_acl_server: AclServer) -> None:
    server, pw = redis_acl_server.server, redis_acl_server.intruder_password
    with open_backend(server.url(user="intruder", password=pw)) as intruder:
        with pytest.raises(BackendUnavailable, match="ACL user 'intruder'") as caught:
            intruder.state(_group())
        assert pw not in str(caught.value)


@pytest.mark.parametrize(
    "password", ["wrong", "p@ss:w/rd#?", "s3cr3t-Pw:@#/?x-not", "ünïcødé-密码", "%41%42"]
)
def test_a_wrong_password_fails_at_open_without_showing_it(
    redis_acl_server: AclServer, password: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = redis_acl_server.server.url(user="rebalancer", password=quote(password, safe=""))
    with caplog.at_level("DEBUG"), pytest.raises(BackendUnavailable, match="credentials") as caught:
        open_backend(url)
    for shown in (str(caught.value), repr(caught.value), caplog.text):
        assert password not in shown and quote(password, safe="") not in shown
    assert "***" in str(caught.value)


def test_no_credentials_is_a_clear_error(redis_acl_server: AclServer) -> None:
    with pytest.raises(BackendUnavailable, match=r"credentials|NOAUTH|disabled"):
        open_backend(redis_acl_server.server.url())


@settings(max_examples=25, deadline=None)
@given(secret=st.text(st.characters(codec="utf-8"), min_size=1, max_size=40))
def test_secrets_never_appear_in_errors_or_reprs(secret: str) -> None:
    password = "pw-" + secret  # "pw-" appears nowhere else in a message
    url = f"redis://user:{quote(password, safe='')}@127.0.0.1:1/0?timeout=1&connect_timeout=1"
    with pytest.raises((BackendUnavailable, ConfigurationError)) as caught:
        open_backend(url)
    shown = f"{caught.value} {caught.value!r}"
    assert password not in shown and quote(password, safe="") not in shown


def test_tls_with_a_verified_certificate(redis_tls: TlsServer) -> None:
    files = redis_tls.files
    with open_backend(redis_tls.server.url(query=f"ca_file={quote(str(files.ca))}")) as store:
        _cycle(store, _group())
    mutual = f"ca_file={files.ca}&cert_file={files.client_cert}&key_file={files.client_key}"
    with open_backend(redis_tls.server.url(query=mutual)) as store:
        _cycle(store, _group())


def test_tls_refuses_a_certificate_from_an_unknown_ca(redis_tls: TlsServer) -> None:
    url = redis_tls.server.url(query=f"ca_file={redis_tls.files.other_ca}&connect_timeout=3")
    with pytest.raises(BackendUnavailable, match="certificate"):
        open_backend(url)


def test_tls_options_need_rediss_and_readable_files(redis_tls: TlsServer) -> None:
    plain = redis_tls.server.url().replace("rediss://", "redis://")
    with pytest.raises(ConfigurationError, match="rediss://"):
        open_backend(f"{plain}?ca_file={redis_tls.files.ca}")
    with pytest.raises(ConfigurationError, match="not a readable file"):
        open_backend(redis_tls.server.url(query="ca_file=/nonexistent/ca.pem"))
    with pytest.raises(BackendUnavailable):
        open_backend(plain + "?timeout=2&connect_timeout=2")  # plain text to a TLS port


# -- scale -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_100k_resources_and_100_members_publish_and_read_back(
    redis_backend_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    group, n_res, n_mem = _group(), 100_000, 100
    members = [f"m{i:03d}" for i in range(n_mem)]
    ids = [f"s3://bucket/prefix/{i:06d}/" for i in range(n_res)]
    assignment = {m: ids[k::n_mem] for k, m in enumerate(members)}
    timings: dict[str, float] = {}

    def timed(name: str, call: Callable[[], T]) -> T:
        started = time.perf_counter()
        result = call()
        timings[name] = time.perf_counter() - started
        return result

    with open_backend(redis_backend_url) as store:
        assert isinstance(store, RedisBackend)
        sessions = {m: _join(store, group, m) for m in members}
        resources = [Resource(i) for i in ids]
        timed("update_resources", lambda: store.update_resources(group, replace=resources))
        epoch, lead = _lead(store, sessions[members[0]]), sessions[members[0]]
        timed("publish", lambda: store.publish(lead, epoch, assignment, phase=Phase.RUNNING,
                                               resources_version=1))  # fmt: skip
        state = timed("state", lambda: store.state(group))
        assert len(state.resources) == n_res and state.target is not None
        assert state.target.assignment == {m: frozenset(rs) for m, rs in assignment.items()}
        view = timed("member_view", lambda: store.member_view(sessions["m042"]))
        assert view.target == frozenset(assignment["m042"])
        granted = timed("claim 1000", lambda: store.claim(
            sessions["m042"], assignment["m042"], view.generation))  # fmt: skip
        assert len(granted) == n_res // n_mem
        timed("republish", lambda: store.publish(lead, epoch, assignment, phase=Phase.RUNNING,
                                                 resources_version=1))  # fmt: skip
        store.client.delete(*store.client.keys(f"rb:{{{group}}}:*"))
    with capsys.disabled():
        print("\n100k x 100 on Redis:", ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
    assert sum(timings.values()) < 120


# -- faults of member processes and of Redis itself -------------------------------------------
# These check safety and that ownership comes back; how soon (the session timeout + 1 s) is a
# benchmark figure (``crash`` in benchmarks/bench_rebalance.py, bench_scale.py, bench_chaos.py),
# not a timed assertion, which a loaded machine can break. The times are printed (``-s``).

FAULT_TTL = 2.0
FAULT_RESOURCES = [f"res-{i:03d}" for i in range(24)]


@pytest.fixture
def procs(redis_server: RedisServer, tmp_path: Path) -> Iterator[MemberProcesses]:
    members = MemberProcesses(
        redis_server.url(),
        _group(),
        tmp_path,
        observer_url=redis_server.url() + "?timeout=1&connect_timeout=1",
        session_timeout=FAULT_TTL,
        stability_window=0.05,
    )
    yield members
    members.close()


def _start_three(procs: MemberProcesses) -> GroupState:
    procs.start("m0", FAULT_RESOURCES)
    procs.start("m1")
    procs.start("m2")
    return procs.wait_stable(3, timeout=20)


@pytest.mark.slow
def test_kill_9_and_sigstop_of_members(procs: MemberProcesses) -> None:
    _start_three(procs)
    killed = time.monotonic()
    procs.kill("m1")
    state = procs.wait_stable(2, timeout=FAULT_TTL + 10, resources=FAULT_RESOURCES)
    took = time.monotonic() - killed
    assert set(state.claims) == set(FAULT_RESOURCES)
    print(f"owned again {took:.2f} s after kill -9")  # shown with -s
    procs.signal("m2", signal.SIGSTOP)
    stopped = time.monotonic()
    state = procs.wait_stable(1, timeout=FAULT_TTL + 10, resources=FAULT_RESOURCES)
    took = time.monotonic() - stopped
    procs.signal("m2", signal.SIGCONT)
    assert set(state.claims) == set(FAULT_RESOURCES)
    print(f"owned again {took:.2f} s after SIGSTOP")  # shown with -s
    state = procs.wait_stable(2, timeout=FAULT_TTL + 10, resources=FAULT_RESOURCES)
    assert set(state.claims) == set(FAULT_RESOURCES)
    procs.assert_trail_is_clean()


@pytest.mark.slow
def test_a_redis_restart_without_persistence_loses_no_safety(
    procs: MemberProcesses, redis_server: RedisServer
) -> None:
    before = _start_three(procs)
    old_epochs = {r: c.epoch for r, c in before.claims.items()}
    redis_server.restart()
    recovered = time.monotonic()
    state = procs.wait_stable(3, timeout=FAULT_TTL + 15, resources=FAULT_RESOURCES)
    took = time.monotonic() - recovered
    assert set(state.claims) == set(FAULT_RESOURCES)
    assert all(state.claims[r].epoch > e for r, e in old_epochs.items()), "an epoch went back"
    print(f"owned again {took:.2f} s after the restart")  # shown with -s
    procs.assert_trail_is_clean(progress_survives=False)  # lost with the data: documented


@pytest.mark.slow
def test_redis_paused_past_the_lease(procs: MemberProcesses, redis_server: RedisServer) -> None:
    before = _start_three(procs)
    redis_server.pause()
    paused = time.monotonic()
    try:

        def all_stopped() -> bool:
            lost = {r["resource"] for r in procs.records() if r["kind"] == "lost"}
            return lost >= set(before.claims) and time.monotonic() - paused > FAULT_TTL + 0.5

        # A member thread blocked in a command when Redis stopped answering reports its
        # losses (dated at the lease's end) once the command gives up: after the URL's timeout
        # (5 s), twice when it was re-sent on a new connection. assigned() and commit() stop
        # at the lease's end whatever that thread does (member/node.py).
        wait_for(all_stopped, timeout=FAULT_TTL + 2 * 5 + 10, what="every member to stop its work")
    finally:
        redis_server.resume()
    resumed = time.monotonic()
    state = procs.wait_stable(3, timeout=FAULT_TTL + 15, resources=FAULT_RESOURCES)
    took = time.monotonic() - resumed
    assert set(state.claims) == set(FAULT_RESOURCES)
    print(f"owned again {took:.2f} s after SIGCONT")  # shown with -s
    procs.assert_trail_is_clean()


def test_an_evicting_server_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> None:
    server = RedisServer(tmp_path / "evicting", ["--maxmemory", "64mb", "--maxmemory-policy",
                                                "volatile-lru"])  # fmt: skip
    server.start()
    request.addfinalizer(server.stop)
    with caplog.at_level("WARNING"), open_backend(server.url()):
        pass
    assert "maxmemory-policy noeviction" in caplog.text


def test_an_unreachable_server_is_a_clear_error() -> None:
    with pytest.raises(BackendUnavailable, match=r"redis://127\.0\.0\.1:1/0.*cannot be reached"):
        open_backend("redis://127.0.0.1:1/0?connect_timeout=1")


def test_raw_keys_are_only_under_the_prefix(store: RedisBackend) -> None:
    group = _group()
    _cycle(store, group)
    keys = [str(k) for k in store.client.keys(f"*{group}*")]
    assert keys and all(k.startswith(f"rb:{{{group}}}:") for k in keys)
    assert isinstance(store.client, redis.Redis)


def _sid(member: Member) -> str | None:
    return None if member.session is None else member.session.session_id


@pytest.fixture
def stepped_redis(tmp_path: Path) -> Iterator[tuple[RedisServer, ClockShift]]:
    """A server of this test's own whose wall clock the test steps (tests/support/clockshift.py)."""
    clock = ClockShift.create(tmp_path / "clock")
    if clock is None:
        pytest.skip("no C compiler to build the clock shim (scripts/setup.sh installs one)")
    server = RedisServer(tmp_path / "redis", clock=clock)
    server.start()
    yield server, clock
    server.stop()


def test_a_step_forward_of_the_servers_clock_ends_leases_early(
    stepped_redis: tuple[RedisServer, ClockShift],
) -> None:
    # Redis ends keys, the leases, by its host's wall clock: a step forward (an NTP step, a
    # virtual machine resumed) ends every session at once, long before its timeout. The
    # members find out at their next renewal and join again; the grants that follow name the
    # predecessor's end no later than the grant itself, whatever Redis' clock said.
    server, clock = stepped_redis
    events: list[OwnershipEvent] = []
    lock = threading.Lock()

    def sink(event: OwnershipEvent) -> None:
        with lock:
            events.append(event)

    def member(name: str, resources: list[str] | None = None) -> Member:
        config = MemberConfig(
            group="clock", backend=server.url(), member_id=name, session_timeout=10.0,
            stability_window=0.05, max_rebalance_delay=1.0,
        )  # fmt: skip
        return Member(config, resources=resources, event_sinks=[sink]).start()

    resources = [f"r{i}" for i in range(4)]
    a = member("a", resources)
    b = member("b")
    try:
        wait_for(lambda: len(a.assigned()) == 2 and len(b.assigned()) == 2, timeout=15,
                 what="two resources each")  # fmt: skip
        before = {_sid(a), _sid(b)}
        stepped = time.monotonic()
        clock.step(60_000)
        wait_for(lambda: {_sid(a), _sid(b)}.isdisjoint(before)
                 and len(a.assigned()) + len(b.assigned()) == 4,
                 timeout=15, what="both members back under new sessions")  # fmt: skip
        assert time.monotonic() - stepped < 6.0, "ended by the step, not by the 10 s timeout"
        with lock:
            lost = [e for e in events if e.kind is EventKind.LOST and e.session_id in before]
            later = [e for e in events if e.kind is EventKind.ACQUIRED and e.freed_at is not None]
        assert {e.resource for e in lost} == set(resources)
        assert later and all(e.freed_at <= e.at for e in later if e.freed_at is not None)
    finally:
        a.stop(drain=False)
        b.stop(drain=False)


def test_a_grant_names_its_predecessors_end_on_the_members_clock(
    stepped_redis: tuple[RedisServer, ClockShift],
) -> None:
    # Redis answers how long ago the predecessor ended, not when on its own clock: a release
    # made while Redis' clock was a minute behind still ends just before the next grant.
    server, clock = stepped_redis
    store = open_backend(server.url())
    try:
        group = _group()
        a = _join(store, group, "a", 30.0)
        epoch = _lead(store, a)
        store.update_resources(group, replace=[Resource("r")])
        gen = store.publish(a, epoch, {"a": ["r"]}, phase=Phase.RUNNING, resources_version=1)
        assert grant_epochs(store.claim(a, ["r"], gen.generation)) == {"r": 1}
        clock.step(-60_000)
        assert isinstance(store, RedisBackend)
        wait_for(lambda: store.client.time()[0] < time.time() - 50, timeout=5,
                 what="Redis' clock a minute behind")  # fmt: skip
        store.release(a, {"r": 1})
        released = time.time()
        b = _join(store, group, "b", 30.0)
        gen = store.publish(a, epoch, {"b": ["r"]}, phase=Phase.RUNNING, resources_version=1)
        grant = store.claim(b, ["r"], gen.generation)["r"]
        assert grant.freed is Freed.RELEASED and grant.freed_at is not None
        assert abs(grant.freed_at - released) < 2.0, grant.freed_at - released
    finally:
        store.close()


def test_status_warns_when_redis_persists_nothing(
    redis_backend_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    import json
    import subprocess
    import sys

    with open_backend(redis_backend_url) as store:  # the test server: --save '' --appendonly no
        (warning,) = store.store_warnings()
    assert "persists nothing (appendonly no, save '')" in warning
    assert "appendfsync always" in warning
    group = _group()
    with open_backend(redis_backend_url) as store:  # status answers exit 2 for unknown groups
        _join(store, group, "m1")
    shown = subprocess.run(
        [sys.executable, "-m", "rebalancer_spark.cli", "status", "--json", "--group", group,
         "--backend", redis_backend_url],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert json.loads(shown.stdout)["store_warnings"] == [warning]
    human = subprocess.run(
        [sys.executable, "-m", "rebalancer_spark.cli", "status", "--group", group,
         "--backend", redis_backend_url],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert f"WARNING: {warning}" in human.stdout
    durable = RedisServer(tmp_path / "aof", ["--appendonly", "yes", "--appendfsync", "always"])
    durable.start()
    request.addfinalizer(durable.stop)
    with open_backend(durable.url()) as store:
        assert store.store_warnings() == []
