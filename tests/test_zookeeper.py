"""The ZooKeeper backend's own tests: negotiated timeouts, escaping, the 1 MB limit, security,
corrupt data, watches, connection loss and session expiry, and faults of a 3-server ensemble.

The shared contract suite (tests/contract) and the member tests run against this backend too;
these tests cover what only ZooKeeper has.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import make_digest_acl_credential

from rebalancer_spark import EventKind, Member, MemberConfig, OwnershipEvent
from rebalancer_spark.backends import Backend, Capability, Session, open_backend
from rebalancer_spark.backends.base import Interest
from rebalancer_spark.backends.zookeeper import ZookeeperBackend, coordination, ownership, sessions
from rebalancer_spark.backends.zookeeper.coordination import DELTA_CHAIN
from rebalancer_spark.backends.zookeeper.store import chain
from rebalancer_spark.backends.zookeeper.store.client import Opened, Settings, open_client
from rebalancer_spark.backends.zookeeper.store.layout import (
    CHUNK_BYTES,
    REQUEST_BYTES,
    GroupPaths,
    escape,
    unescape,
)
from rebalancer_spark.backends.zookeeper.watch import ZookeeperWatch
from rebalancer_spark.core import audit
from rebalancer_spark.core.errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    CorruptStateError,
    FencedError,
    SessionExpired,
)
from rebalancer_spark.core.model import (
    Freed,
    Grant,
    GroupState,
    Phase,
    Progress,
    Resource,
    ResourceChange,
    Target,
    grant_epochs,
    validate_resource_id,
)
from rebalancer_spark.core.urls import parse_backend_url
from tests.servers.zookeeper import Ensemble, TcpProxy, ZkServer, free_ports
from tests.support.helpers import quiet, wait_for
from tests.support.procs import MemberProcesses

TTL = 2.0
ETTL = 3.0
"""Session timeout of the ensemble fault tests (an election must fit in it comfortably)."""
RESOURCES = [f"res-{i:03d}" for i in range(24)]


# -- helpers -----------------------------------------------------------------------------------


def _raw(hosts: str, user: str | None = None, password: str | None = None) -> Any:
    auth = [("digest", f"{user}:{password}")] if user else None
    client = KazooClient(hosts=hosts, auth_data=auth)
    client.start(timeout=15)
    return client


@pytest.fixture
def raw(zookeeper_server: ZkServer) -> Iterator[Any]:
    """A plain kazoo client on the standalone server, with no identity."""
    client = _raw(f"127.0.0.1:{zookeeper_server.port}")
    yield client
    client.stop()
    client.close()


def _zk(store: Backend) -> ZookeeperBackend:
    assert isinstance(store, ZookeeperBackend)
    return store


def _walk(client: Any, path: str) -> Iterator[str]:
    yield path
    for child in client.get_children(path):
        yield from _walk(client, f"{path.rstrip('/')}/{child}")


def _lead(
    store: Backend, group: str, assignment: dict[str, list[str]]
) -> tuple[Session, int, Target]:
    """Join as the first member named, lead, declare the resources, publish ``assignment``."""
    session = store.join(group, next(iter(assignment)), info={}, ttl=10, static=False)
    record = store.elect(session)
    assert record is not None
    version = store.update_resources(
        group, replace=[Resource(r) for rs in assignment.values() for r in rs]
    )
    target = store.publish(
        session, record.epoch, assignment, phase=Phase.RUNNING, resources_version=version
    )
    return session, record.epoch, target


def _lead_and_publish(
    store: Backend, group: str, assignment: dict[str, list[str]]
) -> tuple[Session, int, int]:
    session, epoch, target = _lead(store, group, assignment)
    return session, epoch, target.generation


def _republish(
    store: Backend,
    session: Session,
    epoch: int,
    assignment: dict[str, list[str]],
    previous: Target | None,
) -> Target:
    """Publish ``assignment`` over the same resources as a change from ``previous``."""
    version = store.resources(session.group)[0]
    return store.publish(
        session, epoch, assignment, phase=Phase.RUNNING, resources_version=version,
        previous=previous,
    )  # fmt: skip


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deltas name the holders (hints) however young the target before them is."""
    monkeypatch.setattr(coordination, "HINT_SETTLE", 0.0)


# -- sessions: negotiated timeouts, expiry, connection loss --------------------------------------


def test_the_connection_loops_select_answers_as_kazoos_own() -> None:
    # Every kazoo client of the backend selects with poll_select instead of kazoo's
    # selector_select (one system call instead of an epoll object per call): same answers.
    import socket

    from kazoo.handlers.utils import selector_select

    from rebalancer_spark.backends.zookeeper.store.client import poll_select

    a, b = socket.socketpair()
    c, d = socket.socketpair()
    try:
        cases: list[tuple[list[Any], list[Any]]] = [([a, c], []), ([a], [b]), ([a, c], [d])]
        # Each case with nothing to read, then with data for a, then with c's peer gone.
        for rlist, wlist in cases:
            assert poll_select(rlist, wlist, [], 0.05) == selector_select(rlist, wlist, [], 0.05)
        b.send(b"x")
        for rlist, wlist in cases:
            assert poll_select(rlist, wlist, [], 0.05) == selector_select(rlist, wlist, [], 0.05)
        assert poll_select([a, c], [], [], 0.05) == ([a], [], [])
        d.close()
        for rlist, wlist in cases[:2]:
            assert poll_select(rlist, wlist, [], 0.05) == selector_select(rlist, wlist, [], 0.05)
        assert poll_select([c], [], [], 0.05) == ([c], [], [])  # a hang-up reads as readable
        started = time.monotonic()
        assert poll_select([b], [], [], 0.2) == ([], [], [])
        assert time.monotonic() - started >= 0.15  # waited for the timeout
        c.close()
        with pytest.raises(TypeError, match="Invalid file descriptor"):
            selector_select([c], [], [], 0)
        with pytest.raises(TypeError, match="Invalid file descriptor"):
            poll_select([c], [], [], 0)
    finally:
        for sock in (a, b, c, d):
            sock.close()


def test_every_client_of_the_backend_selects_with_poll(
    zookeeper_backend_url: str, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rebalancer_spark.backends.zookeeper.store import client as client_module

    calls: list[int] = []
    poll_select = client_module.poll_select

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return poll_select(*args, **kwargs)

    monkeypatch.setattr(client_module, "poll_select", counting)
    with open_backend(zookeeper_backend_url) as store:
        shared = len(calls)
        assert shared > 0  # the shared client's connection loop
        session = store.join(group, "m1", info={}, ttl=10, static=False)
        store.leave(session)
        assert len(calls) > shared  # and the session's own client's


@pytest.mark.parametrize(("asked", "granted"), [(0.6, 1.0), (2.0, 2.0), (30.0, 10.0)])
def test_the_session_ttl_is_the_timeout_the_server_negotiated(
    zookeeper_backend_url: str, group: str, asked: float, granted: float
) -> None:
    # The server clamps to [2, 20] x tickTime = [1, 10] s: the member must use what it got.
    with open_backend(zookeeper_backend_url) as store:
        session = store.join(group, "m1", info={}, ttl=asked, static=False)
        assert session.ttl == granted


def test_a_session_expired_by_zookeeper_is_over_for_good(
    zookeeper_backend_url: str, group: str, zookeeper_server: ZkServer
) -> None:
    with open_backend(zookeeper_backend_url) as store:
        session, _, generation = _lead_and_publish(store, group, {"m1": ["a"]})
        assert grant_epochs(store.claim(session, ["a"], generation)) == {"a": 1}
        hosted = _zk(store)._sessions.get(session.session_id)
        assert hosted is not None
        # kazoo's own way to expire a session: a second client resumes it, then closes it.
        thief = KazooClient(hosts=f"127.0.0.1:{zookeeper_server.port}", client_id=hosted.client_id)
        thief.start(timeout=15)
        thief.stop()
        thief.close()
        wait_for(lambda: "m1" not in store.state(group).members, timeout=5, what="expiry")
        assert store.state(group).claims == {}

        def renew_refused() -> bool:
            try:
                store.renew(session)
            except SessionExpired:
                return True
            except BackendUnavailable:
                return False
            return False

        wait_for(renew_refused, timeout=TTL + 5, what="renew to report the session expired")
        with pytest.raises(FencedError):
            store.commit(session, "a", 1, "late")
        with pytest.raises(SessionExpired):
            store.member_view(session)
        assert store.elect(session) is None
        # The member id is free again at once.
        assert store.join(group, "m1", info={}, ttl=TTL, static=True).ttl == TTL


def test_a_dropped_connection_is_unavailable_not_expired_then_resumes(
    zookeeper_server: ZkServer, group: str
) -> None:
    proxy = TcpProxy(zookeeper_server.port)
    url = f"zookeeper://127.0.0.1:{proxy.port}/rb-{uuid.uuid4().hex[:12]}?connect_timeout=2"
    try:
        with open_backend(url) as store:
            session = store.join(group, "m1", info={}, ttl=4.0, static=False)
            proxy.cut()

            def unavailable() -> bool:
                try:
                    store.renew(session)
                except BackendUnavailable:
                    return True
                return False

            wait_for(unavailable, timeout=4, what="renew to fail as unavailable")
            proxy.restore()

            def renewed() -> bool:
                try:
                    store.renew(session)
                except BackendUnavailable:
                    return False
                return True

            wait_for(renewed, timeout=4, what="the same session to be renewed again")
            assert store.state(group).members["m1"].session_id == session.session_id
    finally:
        proxy.close()


def _opens_then_drops(
    proxy: TcpProxy,
    meanwhile: Callable[[Opened], None],
    then: Callable[[Opened], None] = lambda _: None,
) -> Callable[[Settings, float], Opened]:
    """``open_client`` whose new connection is cut right after the connect answered; then
    ``meanwhile`` runs (the proxy still cut), the proxy is restored, and ``then`` runs."""

    def opened(settings: Settings, timeout: float) -> Opened:
        got = open_client(settings, timeout)
        proxy.cut()
        wait_for(
            lambda: got.client.client_id is None,
            timeout=5,
            what="the new session's connection to drop",
        )
        meanwhile(got)
        proxy.restore()
        then(got)
        return got

    return opened


def test_a_join_whose_connection_drops_as_its_session_opens_joins_in_that_session(
    zookeeper_server: ZkServer, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server restarting right after the connect answered: kazoo's client_id is None until
    # it reconnects. The join named its session from it and died of a TypeError, which ended
    # a member's thread for good (a chaos run's member that never came back).
    proxy = TcpProxy(zookeeper_server.port)
    url = f"zookeeper://127.0.0.1:{proxy.port}/rb-{uuid.uuid4().hex[:12]}?connect_timeout=2"
    dropped: list[tuple[int, bytes]] = []
    try:
        with open_backend(url) as store:
            opens = _opens_then_drops(proxy, lambda got: dropped.append(got.client_id))
            monkeypatch.setattr(sessions, "open_client", opens)
            session = store.join(group, "m1", info={}, ttl=4.0, static=False)
            monkeypatch.undo()
            assert [f"{i:016x}" for i, _ in dropped] == [session.session_id]
            assert store.state(group).members["m1"].session_id == session.session_id
            store.renew(session)
    finally:
        proxy.close()


def test_a_join_whose_session_ends_as_it_opens_is_unavailable_not_joined_in_the_next(
    zookeeper_server: ZkServer, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The connection drops right after the connect answered and the session ends meanwhile
    # (closed here by another client, as an expiry would): kazoo opens another session when
    # it reconnects. The join's znodes must not go into that one under the first one's name.
    proxy = TcpProxy(zookeeper_server.port)
    url = f"zookeeper://127.0.0.1:{proxy.port}/rb-{uuid.uuid4().hex[:12]}?connect_timeout=2"
    ended: list[Opened] = []

    def end(got: Opened) -> None:
        thief = KazooClient(hosts=f"127.0.0.1:{zookeeper_server.port}", client_id=got.client_id)
        thief.start(timeout=15)
        thief.stop()
        thief.close()
        ended.append(got)

    def replaced(got: Opened) -> None:
        wait_for(
            lambda: got.client.client_id not in (None, got.client_id),
            timeout=15,
            what="kazoo to open another session",
        )

    try:
        with open_backend(url) as store:
            monkeypatch.setattr(sessions, "open_client", _opens_then_drops(proxy, end, replaced))
            with pytest.raises(BackendUnavailable, match="expired as it was opened"):
                store.join(group, "m1", info={}, ttl=4.0, static=False)
            monkeypatch.undo()
            assert not ended[0].client.connected  # that other session was closed, not used
            assert "m1" not in store.state(group).members
            session = store.join(group, "m1", info={}, ttl=4.0, static=False)
            assert store.state(group).members["m1"].session_id == session.session_id
    finally:
        proxy.close()


def test_a_lease_not_renewed_ends_the_zookeeper_session(
    zookeeper_backend_url: str, group: str, raw: Any
) -> None:
    # kazoo would keep the session alive for ever with its pings: the backend ends it when
    # the member stops renewing, and ZooKeeper deletes its znodes at once.
    with open_backend(zookeeper_backend_url) as store:
        session = store.join(group, "m1", info={}, ttl=1.0, static=False)
        started = time.monotonic()
        wait_for(lambda: "m1" not in store.state(group).members, timeout=5, what="the lapse")
        assert time.monotonic() - started < 1.0 + 1.0
        chroot = parse_backend_url(zookeeper_backend_url).path
        assert raw.get_children(f"{chroot}/groups/{group}/sessions") == []
        with pytest.raises(SessionExpired, match="not renewed"):
            store.renew(session)


def test_servers_without_multiread_are_read_one_znode_at_a_time(
    zookeeper_backend_url: str, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ZooKeeper before 3.6 answers multiRead with "unimplemented"; the reader then falls back.
    monkeypatch.setattr(KazooClient, "_rebalancer_spark_no_multiread", True, raising=False)
    with open_backend(zookeeper_backend_url) as store:
        session, _, generation = _lead_and_publish(store, group, {"m1": ["a", "b"]})
        assert grant_epochs(store.claim(session, ["a", "b"], generation)) == {"a": 1, "b": 1}
        store.commit(session, "a", 1, {"n": 1})
        state = store.state(group)
        assert set(state.claims) == {"a", "b"} and set(state.resources) == {"a", "b"}
        assert store.member_view(session).owned == {"a": 1, "b": 1}
        assert store.progress(group, ["a", "b"])["a"].value == {"n": 1}


# -- escaping ------------------------------------------------------------------------------------


def _acceptable(text: str) -> bool:
    try:
        validate_resource_id(text)
    except ConfigurationError:
        return False
    return True


resource_ids = st.one_of(
    st.text(min_size=1, max_size=40),
    st.sampled_from([".", "..", "%", "%2F", "/", "a/../../b", "zookeeper", "é" * 512]),
    st.text(alphabet="/.%\\ é日\ufffd", min_size=1, max_size=20),
).filter(_acceptable)


@given(resource_ids)
def test_an_escaped_resource_id_is_one_plain_znode_name_and_round_trips(resource: str) -> None:
    name = escape(resource)
    assert "/" not in name and name not in (".", "..")
    assert re.fullmatch(r"[A-Za-z0-9._~%-]+", name), name
    assert len(name) <= 3 * 1024
    assert unescape(name, "/g/claims") == resource


@pytest.mark.parametrize("name", ["a%2", "a%2f", "a b", "%2E%2e", "caf%C3", "x%2D"])
def test_a_name_escape_never_writes_is_corrupt_data(name: str) -> None:
    with pytest.raises(CorruptStateError, match=re.escape(f"/g/claims/{name}")):
        unescape(name, "/g/claims")


def test_resource_ids_that_look_like_paths_stay_inside_the_group(
    zookeeper_backend_url: str, group: str, raw: Any
) -> None:
    ids = ["../../escape", "/abs", ".", "..", "%2F", "zookeeper", "x" * 1024, "é" * 512, "日本/語"]
    chroot = parse_backend_url(zookeeper_backend_url).path
    before = set(raw.get_children("/"))
    with open_backend(zookeeper_backend_url) as store:
        session, _, generation = _lead_and_publish(store, group, {"m1": ids})
        assert grant_epochs(store.claim(session, ids, generation)) == dict.fromkeys(ids, 1)
        for i in ids:
            store.commit(session, i, 1, {"id": i})
        assert {r: p.value for r, p in store.progress(group, ids).items()} == {
            i: {"id": i} for i in ids
        }
        assert set(store.state(group).claims) == set(ids)
        base = f"{chroot}/groups/{group}"
        for directory in ("epochs", "progress"):
            assert set(raw.get_children(f"{base}/{directory}")) == {escape(i) for i in ids}
        assert raw.get_children(f"{base}/claims") == []  # earlier releases' claims only
        assert all(p.startswith(chroot) for p in _walk(raw, chroot))
    assert set(raw.get_children("/")) == before | {chroot.strip("/")}


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(resource_ids, min_size=1, max_size=6, unique=True))
def test_any_resource_ids_round_trip_through_zookeeper(
    zookeeper_backend_url: str, ids: list[str]
) -> None:
    with open_backend(zookeeper_backend_url) as store:
        store.update_resources("hypothesis", replace=[Resource(i) for i in ids])
        assert set(store.state("hypothesis").resources) == set(ids)


_texts = st.text(max_size=40)
_floats = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(
    _texts,
    _texts,
    st.integers(min_value=0, max_value=2**63),
    st.sampled_from([None, *Freed]),
    st.none() | _texts,
    st.none() | _texts,
    st.none() | _floats,
)
def test_the_records_written_per_resource_are_what_the_general_encoder_writes(
    member: str,
    session: str,
    epoch: int,
    freed: Freed | None,
    prev_member: str | None,
    prev_session: str | None,
    freed_at: float | None,
) -> None:
    # A claim and a release write these from templates, once per resource: the bytes must be
    # those of encode() (compact, sorted JSON), which every reader and older files expect.
    from rebalancer_spark.backends.zookeeper.store.chain import grant_data, released_data
    from rebalancer_spark.backends.zookeeper.store.records import encode

    assert released_data(member, session, epoch) == encode(
        {"epoch": epoch, "member": member, "session": session, "released": True}
    )
    grant = Grant(epoch, freed, prev_member, prev_session, epoch - 1, freed_at)
    prev = (
        None
        if freed is None or freed is Freed.NEW
        else {
            "member": prev_member,
            "session": prev_session,
            "freed": freed.value,
            "at": freed_at if freed is Freed.RELEASED else None,
        }
    )
    assert grant_data(member, session, grant) == encode(
        {"epoch": epoch, "member": member, "session": session, "prev": prev}
    )


# -- the 1 MB limit ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("resources", "members", "id_of"),
    [
        (100_000, 100, lambda i: f"s3://lake/raw/orders/{i:06d}/"),
        (3_000, 30, lambda i: f"{i:06d}-x" + "é" * 508),  # 1024 UTF-8 bytes each
    ],
    ids=["100k-x-100", "1KB-ids"],
)
def test_no_znode_and_no_request_comes_near_1_mb(
    zookeeper_backend_url: str,
    group: str,
    raw: Any,
    monkeypatch: pytest.MonkeyPatch,
    resources: int,
    members: int,
    id_of: Callable[[int], str],
) -> None:
    sizes: list[int] = []
    send = KazooClient._call

    def measured(self: Any, request: Any, async_object: Any) -> Any:
        sizes.append(len(request.serialize()))
        return send(self, request, async_object)

    monkeypatch.setattr(KazooClient, "_call", measured)
    ids = [id_of(i) for i in range(resources)]
    names = [f"member-{k:03d}" for k in range(members)]
    assignment = {m: ids[k::members] for k, m in enumerate(names)}
    with open_backend(zookeeper_backend_url) as store:
        _lead_and_publish(store, group, assignment)
    with open_backend(zookeeper_backend_url) as reader:
        state = reader.state(group)
    assert state.target is not None
    assert state.target.assignment == {m: frozenset(rs) for m, rs in assignment.items()}
    assert set(state.resources) == set(ids)
    chroot = parse_backend_url(zookeeper_backend_url).path
    largest = max(raw.exists(p).dataLength for p in _walk(raw, chroot))
    assert largest <= CHUNK_BYTES < 1024 * 1024 // 8
    assert max(sizes) <= REQUEST_BYTES < 1024 * 1024 // 2


# -- security ------------------------------------------------------------------------------------


def test_digest_acls_keep_every_other_identity_out(
    zookeeper_server: ZkServer, group: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(1)  # everything, kazoo's dumps of every request included
    hosts = f"127.0.0.1:{zookeeper_server.port}"
    chroot = f"/rb-{uuid.uuid4().hex[:12]}"
    url = f"zookeeper://alice:s3cret-pw@{hosts}{chroot}"
    with open_backend(url) as store:
        session, _, generation = _lead_and_publish(store, group, {"m1": ["a", "b"]})
        store.claim(session, ["a"], generation)
        store.commit(session, "a", 1, {"offset": 1})
        alice = _raw(hosts, "alice", "s3cret-pw")
        try:
            paths = list(_walk(alice, chroot))
            digest = make_digest_acl_credential("alice", "s3cret-pw")
            for path in paths:
                acls, _ = alice.get_acls(path)
                assert [(a.perms, a.id.scheme, a.id.id) for a in acls] == [(31, "digest", digest)]
        finally:
            alice.stop()
            alice.close()
        assert any("/epochs/" in p for p in paths) and any("/progress/" in p for p in paths)
        for user, password in [(None, None), ("bob", "b0b-pw")]:
            other = _raw(hosts, user, password)
            try:
                for path in paths:
                    with pytest.raises(NoAuthError):
                        other.get(path)
                    with pytest.raises(NoAuthError):
                        other.get_children(path)
                    with pytest.raises(NoAuthError):
                        other.set(path, b"mine now")
                    with pytest.raises(NoAuthError):
                        other.create(f"{path}/intruder", b"")
                    if path != chroot:
                        with pytest.raises(NoAuthError):
                            other.delete(path)
            finally:
                other.stop()
                other.close()
        with pytest.raises(ConfigurationError, match="NoAuth") as refused:
            open_backend(f"zookeeper://bob:b0b-pw@{hosts}{chroot}")
        assert "b0b-pw" not in str(refused.value) and "bob:***@" in str(refused.value)
        assert store.progress(group, ["a"])["a"].value == {"offset": 1}
    # The test's own raw clients log through "kazoo.client"; the backend's through its child.
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name != "kazoo.client")
    assert "Auth(" in logged  # kazoo did log its requests, the digest packet included...
    for secret in ("s3cret-pw", digest.split(":", 1)[1], "b0b-pw"):
        assert secret not in logged  # ...with every credential redacted


def test_the_backend_can_be_required_to_have_its_capabilities(zookeeper_backend_url: str) -> None:
    with open_backend(zookeeper_backend_url, require=list(Capability)) as store:
        assert set(type(store).capabilities) == set(Capability)


def test_credentials_never_appear_in_errors(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(1)
    (port,) = free_ports(1)  # nothing listens there
    with pytest.raises(BackendUnavailable) as failed:
        open_backend(f"zookeeper://alice:s3cret-pw@127.0.0.1:{port}/x?connect_timeout=0.5")
    assert "s3cret-pw" not in str(failed.value) and "alice:***@" in str(failed.value)
    assert "s3cret-pw" not in caplog.text
    with pytest.raises(ConfigurationError, match="user name without a password"):
        open_backend(f"zookeeper://alice@127.0.0.1:{port}/x")
    with pytest.raises(ConfigurationError, match="conect_timeout"):
        open_backend(f"zookeeper://127.0.0.1:{port}/x?conect_timeout=1")


# -- corrupt and foreign data ------------------------------------------------------------------


def test_a_chroot_holding_someone_elses_tree_is_refused_and_left_alone(
    zookeeper_server: ZkServer, raw: Any
) -> None:
    chroot = f"/theirs-{uuid.uuid4().hex[:8]}"
    raw.create(f"{chroot}/app/config", b"their data", makepath=True)
    with pytest.raises(CorruptStateError, match=rf"{chroot}.*app") as refused:
        open_backend(f"zookeeper://127.0.0.1:{zookeeper_server.port}{chroot}")
    assert "another chroot" in str(refused.value) or "chroot of its own" in str(refused.value)
    assert raw.get_children(chroot) == ["app"]
    assert raw.get(f"{chroot}/app/config")[0] == b"their data"


def test_a_join_caught_in_a_recursive_delete_of_its_group_is_retried_not_a_crash(
    zookeeper_backend_url: str, group: str, raw: Any
) -> None:
    """A recursive delete of the chroot (the store losing its state) takes ``sessions/`` before
    ``members/``: a join in between finds a parent gone under its session znode. That is the
    group going away, to retry once the delete is over, not an error that kills the member."""
    base = f"{parse_backend_url(zookeeper_backend_url).path}/groups/{group}"
    with open_backend(zookeeper_backend_url) as store:
        store.leave(store.join(group, "m0", info={}, ttl=6.0, static=False))
        raw.delete(f"{base}/sessions")  # the delete is half way through the group
        with pytest.raises(BackendUnavailable, match="its znodes are gone"):
            store.join(group, "m1", info={}, ttl=6.0, static=False)
        assert raw.get_children(f"{base}/members") == []
        raw.delete(base, recursive=True)  # the delete is over
        session = store.join(group, "m1", info={}, ttl=6.0, static=False)
        assert set(store.state(group).members) == {"m1"}
        store.leave(session)


@pytest.mark.parametrize("where", ["target", "members/m1", "epochs/a", "resources", "epoch"])
def test_unreadable_data_is_a_clear_error_naming_the_znode_and_nothing_is_deleted(
    zookeeper_backend_url: str, group: str, raw: Any, where: str
) -> None:
    with open_backend(zookeeper_backend_url) as store:
        session, _, generation = _lead_and_publish(store, group, {"m1": ["a"]})
        store.claim(session, ["a"], generation)
        path = f"{parse_backend_url(zookeeper_backend_url).path}/groups/{group}/{where}"
        raw.set(path, b"{not json")
        with (
            open_backend(zookeeper_backend_url) as fresh,
            pytest.raises(CorruptStateError, match=re.escape(path)),
        ):
            fresh.state(group)
        assert raw.get(path)[0] == b"{not json"


def test_foreign_children_are_reported_not_deleted(
    zookeeper_backend_url: str, group: str, raw: Any
) -> None:
    with open_backend(zookeeper_backend_url) as store:
        _lead_and_publish(store, group, {"m1": ["a"]})
        base = f"{parse_backend_url(zookeeper_backend_url).path}/groups/{group}"
        raw.create(f"{base}/epochs/not%escaped", b"")
        with open_backend(zookeeper_backend_url) as fresh:
            with pytest.raises(CorruptStateError, match=re.escape(f"{base}/epochs/not%escaped")):
                fresh.state(group)
            raw.delete(f"{base}/epochs/not%escaped")
            raw.create(f"{base}/notes", b"mine")
        with (
            open_backend(zookeeper_backend_url) as fresh,
            pytest.raises(CorruptStateError, match=r"unexpected children \['notes'\]"),
        ):
            fresh.state(group)
        assert raw.get(f"{base}/notes")[0] == b"mine"


def test_a_member_rides_out_corrupt_data_without_crash_looping(
    zookeeper_backend_url: str, group: str, raw: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rebalancer_spark")
    config = MemberConfig(
        group=group,
        backend=zookeeper_backend_url,
        member_id="a",
        session_timeout=TTL,
        stability_window=0.05,
    )
    with Member(config, resources=["x", "y"]) as member:
        wait_for(lambda: len(member.assigned()) == 2, timeout=10, what="a to own x and y")
        base = f"{parse_backend_url(zookeeper_backend_url).path}/groups/{group}"
        good = raw.get(f"{base}/target")[0]
        caplog.clear()
        raw.set(f"{base}/target", b"garbage")
        raw.set(f"{base}/changes", b"")  # wake everyone
        wait_for(
            lambda: f"{base}/target" in caplog.text, timeout=5, what="the corrupt target reported"
        )
        started = time.monotonic()
        wait_for(lambda: time.monotonic() - started > 2, timeout=5, what="two seconds to pass")
        assert member.error is None and member.state.value == "running"
        assert len(caplog.records) < 40, "a tight retry loop"
        assert {o.resource for o in member.assigned()} == {"x", "y"}
        raw.set(f"{base}/target", good)
        raw.set(f"{base}/changes", b"")
        member.add_resources(["z"])
        wait_for(lambda: len(member.assigned()) == 3, timeout=10, what="recovery")


# -- watches -----------------------------------------------------------------------------------


ARM_DELAY = 0.5
"""How long the tests below hold back each request that sets a watch."""


def _delay_watch_requests(store: Backend, delay: float = ARM_DELAY) -> list[float]:
    """Stretch the transit of every watch-setting request of ``store``'s shared client to
    ``delay`` seconds, as a slow link (or a lagging server of an ensemble) would: the request
    is sent that much later, its answer handed over when the server gives it. Returns the
    send times of the delayed requests."""
    client = _zk(store)._client
    sent: list[float] = []

    def later(send: Callable[..., Any]) -> Callable[..., Any]:
        def call(path: str, watch: Any = None) -> Any:
            if watch is None:
                return send(path)
            result = client.handler.async_result()

            def relay(answer: Any) -> None:
                if answer.successful():
                    result.set(answer.value)
                else:
                    result.set_exception(answer.exception)

            def go() -> None:
                sent.append(time.monotonic())
                send(path, watch=watch).rawlink(relay)

            timer = threading.Timer(delay, go)
            timer.daemon = True
            timer.start()
            return result

        return call

    client.exists_async = later(client.exists_async)
    client.get_children_async = later(client.get_children_async)
    return sent


def test_a_change_racing_the_re_arm_of_a_watch_still_wakes_the_next_wait(
    zookeeper_backend_url: str, group: str
) -> None:
    # A change C1 fires the watch; the waiter wakes and reads its view through its session's
    # own connection; a change C2 lands before the re-arm reached the server. The waiter must
    # be woken only once the re-arm is registered, so that C2 fires it again. (C1 and C2 each
    # fire one watch, `changes`: no second re-arm can wake the waiter by chance.)
    with open_backend(zookeeper_backend_url) as a, open_backend(zookeeper_backend_url) as b:
        mine = a.join(group, "a", info={}, ttl=5, static=False)
        other = b.join(group, "b", info={}, ttl=5, static=False)
        watch = a.watch(group)
        try:
            time.sleep(ARM_DELAY)  # the first arm is answered (watch() now waits for it)
            assert watch.wait(0) is False
            sent = _delay_watch_requests(a)
            b.update_resources(group, add=[Resource("x")])  # C1
            assert watch.wait(5), "C1 did not wake the watch"
            re_armed_before_waking = bool(sent)
            a.member_view(mine)  # what the member reads right after a wake-up
            b.set_leaving(other)  # C2, while the re-arm may still be on its way
            started = time.monotonic()
            assert watch.wait(3 * ARM_DELAY + 2), "C2 was missed: it landed before the re-arm"
            assert time.monotonic() - started < 2 * ARM_DELAY + 1
            assert re_armed_before_waking, "the waiter was woken before the re-arm was sent"
            assert a.state(group).members["b"].leaving
        finally:
            watch.close()


def test_a_change_right_after_watch_returned_wakes_the_next_wait(
    zookeeper_backend_url: str, group: str
) -> None:
    with open_backend(zookeeper_backend_url) as a, open_backend(zookeeper_backend_url) as b:
        other = b.join(group, "b", info={}, ttl=5, static=False)
        a.state(group)  # the group exists for a
        _delay_watch_requests(a)
        watch = a.watch(group)
        try:
            b.set_leaving(other)
            assert watch.wait(3 * ARM_DELAY + 2), "a change made after watch() returned was missed"
        finally:
            watch.close()


def test_a_members_view_syncs_its_sessions_connection_ahead_of_its_reads(
    zookeeper_backend_url: str, group: str
) -> None:
    # In an ensemble the session's server may lag the one the watches are on: the view must
    # be read after a sync of the session's connection, sent ahead of the reads.
    with open_backend(zookeeper_backend_url) as store:
        session, _, generation = _lead_and_publish(store, group, {"m1": ["a", "b"]})
        assert grant_epochs(store.claim(session, ["a"], generation)) == {"a": 1}
        hosted = _zk(store)._sessions.get(session.session_id)
        assert hosted is not None
        client = hosted.client
        calls: list[str] = []
        sync, call = client.sync_async, client._call

        def spy_sync(path: str) -> Any:
            calls.append("sync")
            return sync(path)

        def spy_call(request: Any, result: Any) -> Any:
            calls.append(type(request).__name__)
            return call(request, result)

        client.sync_async, client._call = spy_sync, spy_call
        view = store.member_view(session)
        assert view.generation == generation and view.owned == {"a": 1}
        assert view.target == frozenset({"a", "b"})
        assert calls[0] == "sync" and "MultiRead" in calls[1:], calls


# -- what a rebalance reads ----------------------------------------------------------------------


def _count_reads(
    store: Backend,
    session: Session,
    paths: list[str] | None = None,
    requests: list[list[str]] | None = None,
) -> list[int]:
    """Spy on ``session``'s own client: the number of reads of each multiRead it sends (and
    the paths they read, into ``paths``; each multiRead's paths, into ``requests``)."""
    hosted = _zk(store)._sessions.get(session.session_id)
    assert hosted is not None
    client = hosted.client
    counts: list[int] = []
    call = client._call

    def spy(request: Any, result: Any) -> Any:
        if type(request).__name__ == "MultiRead":
            counts.append(len(request.operations))
            if requests is not None:
                requests.append([op.path for op in request.operations])
            if paths is not None:
                paths.extend(op.path for op in request.operations)
        elif paths is not None and hasattr(request, "path"):
            paths.append(request.path)
        return call(request, result)

    client._call = spy
    return counts


def _lead_and_claim(store: Backend, group: str, ids: list[str]) -> tuple[Session, int]:
    """Lead, give ``ids`` to the leader, claim them all; the session and the generation."""
    session, _, generation = _lead_and_publish(store, group, {"m1": ids})
    assert len(store.claim(session, ids, generation)) == len(ids)
    return session, generation


def test_a_members_view_reads_no_claim_its_own_requests_created(
    zookeeper_backend_url: str, group: str
) -> None:
    # Only the session rewrites the records of its claims while it lives: the view trusts the
    # answers of the requests that made them, so its reads do not grow with what the member owns.
    mine = [f"r{i:04d}" for i in range(600)]
    with open_backend(zookeeper_backend_url) as store:
        session, _ = _lead_and_claim(store, group, mine)
        reads = _count_reads(store, session)
        view = store.member_view(session)
        assert view.owned == dict.fromkeys(mine, 1) and view.target == frozenset(mine)
        # The session, the pointer, then the member's part of the target (one chunk).
        assert sum(reads) <= 4, reads


def test_a_release_of_claims_its_own_requests_made_reads_nothing_first(
    zookeeper_backend_url: str, group: str
) -> None:
    # The claim's answer told the session each epoch record's version (it wrote them), and
    # only this session rewrites them while it holds them: the release is fenced on those
    # versions, with no read round before it.
    mine = [f"r{i:04d}" for i in range(600)]
    with open_backend(zookeeper_backend_url) as store:
        session, generation = _lead_and_claim(store, group, mine)
        read: list[str] = []
        _count_reads(store, session, paths=read)
        store.release(session, dict.fromkeys(mine, 1))
        assert read == [], read[:5]
        assert store.state(group).claims == {}
        # Claimed again (versions 1 -> 2), released again: the versions follow.
        assert len(store.claim(session, mine, generation)) == 600
        read.clear()
        store.release(session, dict.fromkeys(mine, 2))
        assert read == [] and store.state(group).claims == {}


def test_a_release_fenced_on_a_record_rewritten_behind_its_back_reads_it_and_releases(
    zookeeper_backend_url: str, group: str, raw: Any
) -> None:
    # Someone rewrote two records (as a lift of the epochs does) while the session held
    # them: the release trusted the versions its claim wrote, is refused on those two, reads
    # them and releases them too; nothing stays claimed.
    mine = [f"r{i:03d}" for i in range(50)]
    with open_backend(zookeeper_backend_url) as store:
        session, _ = _lead_and_claim(store, group, mine)
        paths = _zk(store)._group(group)
        for r in ("r007", "r031"):
            data, _ = raw.get(paths.resource_epoch(r))
            raw.set(paths.resource_epoch(r), data)  # same content, next version
        read: list[str] = []
        _count_reads(store, session, paths=read)
        store.release(session, dict.fromkeys(mine, 1))
        assert store.state(group).claims == {}
        records = {p for p in read if p.startswith(paths.epochs + "/")}
        assert records == {paths.resource_epoch("r007"), paths.resource_epoch("r031")}


def test_a_member_reads_its_part_of_a_target_once(zookeeper_backend_url: str, group: str) -> None:
    # A target directory's chunks never change once written: views and claims of the same
    # target reuse the part read first, and a new target's part is read once again.
    ids = [f"r{i:04d}" for i in range(3000)]
    with open_backend(zookeeper_backend_url) as store:
        session, epoch, generation = _lead_and_publish(store, group, {"m1": ids[:2000]})
        paths = _zk(store)._group(group)
        read: list[str] = []
        _count_reads(store, session, paths=read)
        assert store.member_view(session).target == frozenset(ids[:2000])
        store.claim(session, ids[:10], generation)
        assert store.member_view(session).target == frozenset(ids[:2000])
        chunks = [p for p in read if p.startswith(paths.targets + "/")]
        assert len(chunks) == 1, chunks  # 2,000 ids: one chunk, read by the first view only
        version = store.update_resources(group, replace=[Resource(r) for r in ids])
        store.publish(
            session, epoch, {"m1": ids[1000:]}, phase=Phase.RUNNING, resources_version=version
        )
        for _ in range(2):
            assert store.member_view(session).target == frozenset(ids[1000:])
        chunks = [p for p in read if p.startswith(paths.targets + "/")]
        assert len(chunks) == 2 and chunks[0] != chunks[1], chunks


def _pointer(raw: Any, store: Backend, group: str) -> dict[str, Any]:
    data, _ = raw.get(_zk(store)._group(group).target)
    pointer: dict[str, Any] = json.loads(data)
    return pointer


def test_a_target_that_moves_few_ids_goes_out_as_a_delta_from_its_base(
    zookeeper_backend_url: str, group: str, raw: Any, settled: None
) -> None:
    # A join of m5 to four members of 10,000 ids moves 2,000: the delta names those ids (each
    # once gained, once lost), not the 10,000; every reader sees the whole new target.
    ids = [f"r{i:05d}" for i in range(10_000)]
    four = {f"m{k}": ids[k - 1 :: 4] for k in range(1, 5)}
    with open_backend(zookeeper_backend_url) as store:
        session, epoch, first = _lead(store, group, four)
        assert "deltas" not in _pointer(raw, store, group)
        base = _pointer(raw, store, group)["dir"]
        five = {m: rs[: len(rs) * 4 // 5] for m, rs in four.items()}
        five["m5"] = [r for rs in four.values() for r in rs[len(rs) * 4 // 5 :]]
        _republish(store, session, epoch, five, first)
        pointer = _pointer(raw, store, group)
        assert pointer["base"] == base and "dir" not in pointer and len(pointer["deltas"]) == 1
        paths = _zk(store)._group(group)
        delta = paths.target_dir(pointer["deltas"][0])
        assert sorted(raw.get_children(delta)) == sorted([*(f"{m}#0" for m in five), "m5#h"])
        written = [json.loads(raw.get(f"{delta}/{m}#0")[0]) for m in five]
        changes = [item for chunk in written for item in chunk]
        assert len(changes) == 2 * 2_000
        assert sorted(c[1:] for c in changes if c[0] == "+") == sorted(five["m5"])
        # The hints for m5: the session of the member that had each id it gains, for the
        # members that have one (m1 alone joined here).
        hints = json.loads(raw.get(f"{delta}/m5#h")[0])
        assert hints == {session.session_id: sorted(four["m1"][len(four["m1"]) * 4 // 5 :])}
        assert pointer["hinted"] == ["m5"]
        # Every reader: a fresh backend's snapshot, and a member's own view.
        with open_backend(zookeeper_backend_url) as reader:
            target = reader.state(group).target
        assert target is not None
        assert target.assignment == {m: frozenset(rs) for m, rs in five.items()}
        m5 = store.join(group, "m5", info={}, ttl=10, static=False)
        assert store.member_view(m5).target == frozenset(five["m5"])
        assert raw.exists(paths.target_dir(base)) is not None  # the pointer needs it


def test_a_chain_of_deltas_is_read_right_until_a_new_base_replaces_it(
    zookeeper_backend_url: str, group: str, raw: Any
) -> None:
    # One id at a time moves from m1 to m2 (and m3 comes and goes): each generation is one more
    # delta, until the chain is full and a base is written whole; a member that read every
    # generation, one that read every third, and a fresh reader all see each target exactly.
    ids = [f"r{i:04d}" for i in range(2_000)]
    with open_backend(zookeeper_backend_url) as store:
        session, epoch, previous = _lead(store, group, {"m1": ids[:1000], "m2": ids[1000:]})
        m2 = store.join(group, "m2", info={}, ttl=10, static=False)
        m3 = store.join(group, "m3", info={}, ttl=10, static=False)
        chains: list[int] = []
        for step in range(1, DELTA_CHAIN + 4):
            new = {"m1": ids[: 1000 - step], "m2": ids[1000 - step :]}
            if step % 4 == 1:
                new["m3"] = new["m2"][:5]
                new["m2"] = new["m2"][5:]
            previous = _republish(store, session, epoch, new, previous)
            chains.append(len(_pointer(raw, store, group).get("deltas", [])))
            expected = {m: frozenset(rs) for m, rs in new.items()}
            assert store.member_view(session).target == expected["m1"], step
            if step % 3 == 0:
                assert store.member_view(m2).target == expected["m2"], step
            assert store.member_view(m3).target == expected.get("m3", frozenset()), step
            with open_backend(zookeeper_backend_url) as reader:
                target = reader.state(group).target
            assert target is not None and target.assignment == expected, step
        assert max(chains) == DELTA_CHAIN and 0 in chains[DELTA_CHAIN:], chains
        # What is left: the current and the previous pointer's directories.
        targets = _zk(store)._group(group).targets
        pointer = _pointer(raw, store, group)
        assert len(raw.get_children(targets)) <= 2 + len(pointer.get("deltas", [])) * 2


def test_a_delta_being_removed_under_a_reader_makes_it_read_again_not_miss_a_change(
    zookeeper_backend_url: str, group: str, raw: Any
) -> None:
    # A reader that read the pointer a moment before the coordinator moved on finds the delta
    # directory marked for removal and its chunks going: it reads again (Changed) instead of
    # taking a chunk already removed for "no change".
    from rebalancer_spark.backends.zookeeper.reads import Changed, read_target_part
    from rebalancer_spark.backends.zookeeper.store.multiread import Reader
    from rebalancer_spark.backends.zookeeper.store.records import read_target_pointer
    from rebalancer_spark.backends.zookeeper.store.tree import REMOVING

    ids = [f"r{i:03d}" for i in range(200)]
    with open_backend(zookeeper_backend_url) as store:
        session, epoch, first = _lead(store, group, {"m1": ids[:100], "m2": ids[100:]})
        _republish(store, session, epoch, {"m1": ids[:90], "m2": ids[90:]}, first)
        zk = _zk(store)
        paths = zk._group(group)
        data, _ = raw.get(paths.target)
        pointer = read_target_pointer(data, paths.target, group=group)
        (delta,) = pointer.deltas

        def read() -> dict[str, frozenset[str]]:
            reader = Reader(zk._client, zk.settings, "test", RuntimeError("expired"))
            return read_target_part(reader, paths, pointer, ["m1"])()

        assert read() == {"m1": frozenset(ids[:90])}
        raw.set(paths.target_dir(delta), REMOVING)  # what delete_dir does first
        raw.delete(paths.target_chunk(delta, "m1", 0))
        with pytest.raises(Changed):
            read()


def test_a_target_far_from_its_base_or_from_another_coordinator_is_written_whole(
    zookeeper_backend_url: str, group: str, raw: Any
) -> None:
    ids = [f"r{i:05d}" for i in range(8_000)]
    with open_backend(zookeeper_backend_url) as store:
        session, epoch, previous = _lead(store, group, {"m1": ids[:4000], "m2": ids[4000:]})
        # Changes since the base may reach half the base's ids (a moved id counts twice):
        # 750 ids moved (1,500 changes), 1,500 (3,000), then 2,500 (5,000): a new base.
        for moved, kind in ((750, "deltas"), (1500, "deltas"), (2500, "dir")):
            new = {"m1": ids[: 4000 - moved], "m2": ids[4000 - moved :]}
            previous = _republish(store, session, epoch, new, previous)
            assert kind in _pointer(raw, store, group), (moved, _pointer(raw, store, group))
        bases = {_pointer(raw, store, group)["dir"]}
    # Another backend object elected after this one knows no base: it writes whole.
    with open_backend(zookeeper_backend_url) as other:
        session = other.join(group, "m3", info={}, ttl=10, static=False)
        record = other.elect(session)
        assert record is not None
        kept = other.state(group).target  # the new coordinator's copy, read from the store
        assert kept is not None
        new = {"m3": ids[:10], "m2": ids[10:]}
        _republish(other, session, record.epoch, new, kept)
        pointer = _pointer(raw, other, group)
        assert "dir" in pointer and pointer["dir"] not in bases
        target = other.state(group).target
        assert target is not None
        assert target.assignment == {m: frozenset(rs) for m, rs in new.items()}


def test_a_member_reads_only_the_changes_of_a_target_from_a_base_it_read(
    zookeeper_backend_url: str, group: str
) -> None:
    ids = [f"r{i:05d}" for i in range(6_000)]
    with open_backend(zookeeper_backend_url) as store:
        session, epoch, previous = _lead(store, group, {"m1": ids[:3000], "m2": ids[3000:]})
        paths = _zk(store)._group(group)
        read: list[str] = []
        _count_reads(store, session, paths=read)
        assert store.member_view(session).target == frozenset(ids[:3000])
        _republish(store, session, epoch, {"m1": ids[:2900], "m2": ids[2900:]}, previous)
        assert store.member_view(session).target == frozenset(ids[:2900])
        assert store.member_view(session).target == frozenset(ids[:2900])
        chunks = [p for p in read if p.startswith(paths.targets + "/") and "#" in p]
        # The base's one chunk, then the delta's (no hints: m1 gains nothing): the base is not
        # read again, nor the delta.
        assert len(chunks) == 2 and chunks[0].split("/")[-2] != chunks[1].split("/")[-2], read


def test_a_claim_removed_behind_the_sessions_back_is_noticed_at_its_next_write(
    zookeeper_backend_url: str, group: str, raw: Any
) -> None:
    with open_backend(zookeeper_backend_url) as store:
        session, _, generation = _lead_and_publish(store, group, {"m1": ["a", "b"]})
        assert grant_epochs(store.claim(session, ["a", "b"], generation)) == {"a": 1, "b": 1}
        paths = _zk(store)._group(group)
        raw.delete(paths.resource_epoch("a"))  # an operator with zkCli, say
        raw.set(paths.resource_epoch("b"), b'{"epoch":7}')
        # A commit reads the record and is refused; the next view reads it and drops it.
        with pytest.raises(FencedError):
            store.commit(session, "a", 1, {"n": 1})
        assert store.member_view(session).owned == {"b": 1}
        # A release finds it gone and forgets it too.
        store.release(session, {"b": 1})
        assert store.member_view(session).owned == {}


def test_the_cut_follows_a_live_holder_frees_a_gone_one_and_leaves_a_new_one_undecided(
    zookeeper_backend_url: str, group: str
) -> None:
    # A claim that read a record naming a holder it had not read reads that holder's session
    # znode, then the record again (ownership._cut). Held while the session lives; free once
    # it has ended; and a record that now names yet another session, not read before it, is
    # decided by no one: the claim leaves it for the next one (granting it could take a
    # resource from a live holder; following the old holder would wait for nothing).

    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        s1, _, generation = _lead_and_publish(store, group, {"m1": ["x"], "m3": ["y"]})
        s3 = store.join(group, "m3", info={}, ttl=10, static=False)
        store.claim(s1, ["x"], generation)
        store.claim(s3, ["y"], generation)
        s2 = other.join(group, "m2", info={}, ttl=10, static=False)
        zs = _zk(other)._hosted(s2)
        settings = _zk(other).settings
        stale = dict.fromkeys(["x", "y"], s1.session_id)  # y's holder as a claim once read it
        held, undecided = ownership._cut(zs, settings, stale, {})
        version = _zk(store)._hosted(s1).client.exists(zs.paths.session(s1.session_id)).version
        assert held == {"x": (s1.session_id, version)} and undecided == {"y"}
        store.leave(s1)
        epochs: dict[str, Any] = {}
        held, undecided = ownership._cut(zs, settings, {"x": s1.session_id}, epochs)
        assert held == {} and undecided == set()  # free: its holder's session has ended
        assert epochs["x"].holder == s1.session_id


def test_claims_of_a_member_of_an_earlier_release_are_respected_through_a_rolling_restart(
    zookeeper_backend_url: str, group: str, zookeeper_server: ZkServer
) -> None:
    # A member of a release before session 30 claimed with an ephemeral claims/<id> beside
    # the record that names it, and released by deleting it. A member of this release judges
    # by the record and the holder's session znode alone: it leaves a live old member's
    # resource alone and follows its session, takes it once released the old way, and takes
    # one whose old holder's session ended (docs/operations.md, the upgrade).
    from rebalancer_spark.backends.zookeeper.store.chain import grant_data, released_data
    from rebalancer_spark.backends.zookeeper.store.records import member_data

    with open_backend(zookeeper_backend_url) as store:
        s2, _, target = _lead(store, group, {"m2": ["x", "y"]})
        paths = _zk(store)._group(group)
        old = _raw(f"127.0.0.1:{zookeeper_server.port}")
        try:
            sid = f"{old.client_id[0]:016x}"
            old.create(paths.member("m1"), member_data(sid, {}, static=False), ephemeral=True)
            old.create(paths.session(sid), b"", ephemeral=True)
            for r in ("x", "y"):  # the earlier release's claim: a claim znode and the record
                claim = json.dumps({"epoch": 1, "member": "m1", "session": sid}).encode()
                old.create(f"{paths.claims}/{escape(r)}", claim, ephemeral=True)
                old.create(paths.resource_epoch(r), grant_data("m1", sid, Grant(1)))
            assert store.claim(s2, ["x", "y"], target.generation) == {}
            assert store.state(group).claims.keys() == {"x", "y"}  # m1's, by their records
            tx = old.transaction()  # the earlier release's release of x
            tx.set_data(paths.resource_epoch("x"), released_data("m1", sid, 1), version=0)
            tx.delete(f"{paths.claims}/{escape('x')}")
            tx.set_data(paths.session(sid), b"")
            tx.commit()
            (x,) = store.claim(s2, ["x", "y"], target.generation).values()
            assert (x.epoch, x.freed, x.prev_member_id) == (2, Freed.RELEASED, "m1")
        finally:
            old.stop()
            old.close()  # m1's session ends with y unreleased
        grants = wait_for(
            lambda: store.claim(s2, ["y"], target.generation),
            timeout=10,
            what="y once m1's session ended",
        )
        assert (grants["y"].epoch, grants["y"].freed) == (2, Freed.EXPIRED)
        assert {r: c.member_id for r, c in store.state(group).claims.items()} == {
            "x": "m2",
            "y": "m2",
        }


def test_a_claim_of_released_resources_reads_their_records_alone(
    zookeeper_backend_url: str, group: str
) -> None:
    moved = [f"r{i:04d}" for i in range(600)]
    with open_backend(zookeeper_backend_url) as store:
        old, epoch, generation = _lead_and_publish(store, group, {"m1": moved})
        assert len(store.claim(old, moved, generation)) == 600
        store.release(old, dict.fromkeys(moved, 1))
        new = store.join(group, "m2", info={}, ttl=10, static=False)
        version = store.resources(group)[0]
        target = store.publish(
            old, epoch, {"m2": moved}, phase=Phase.RUNNING, resources_version=version
        )
        reads = _count_reads(store, new)
        grants = store.claim(new, moved, target.generation)
        assert grant_epochs(grants) == dict.fromkeys(moved, 2)
        assert all(g.freed is Freed.RELEASED and g.prev_member_id == "m1" for g in grants.values())
        # The pointer, the session and the group's sessions listed, m1's session, the
        # target's part and 600 records, then 600 progress reads behind the claim's requests;
        # no claim znode is read.
        assert sum(reads) <= 3 + 1 + 1 + 600 + 600, reads


def test_focused_watches_sleep_through_what_their_interest_does_not_cover(
    zookeeper_backend_url: str, group: str
) -> None:
    # In a group of 100 members every claim and acknowledgement woke 200 watches, each of
    # which read the store: a member's watch follows the target, control, its own membership
    # and the holders of what it asked for (any release of such a holder wakes it); a
    # follower's the coordinator and membership.
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        s1, epoch, target = _lead(store, group, {"m1": ["x", "z"], "m4": ["y"]})
        s4 = store.join(group, "m4", info={}, ttl=10, static=False)
        store.claim(s1, ["x", "z"], target.generation)
        store.claim(s4, ["y"], target.generation)
        s2 = other.join(group, "m2", info={}, ttl=10, static=False)
        s3 = other.join(group, "m3", info={}, ttl=10, static=False)
        member, follower, witness = other.watch(group), other.watch(group), other.watch(group)
        try:
            member.focus(Interest.MEMBER, "m2")
            follower.focus(Interest.SUCCESSION)
            moved = {"m1": ["z"], "m2": ["x"], "m3": ["y"], "m4": []}
            target = _republish(store, s1, epoch, moved, target)
            assert member.wait(5), "a new target"
            assert witness.wait(5)
            for watch in (member, follower, witness):
                quiet(watch)
            assert other.claim(s2, ["x"], target.generation) == {}  # m1 holds it still
            changes: dict[str, Callable[[], object]] = {
                "an acknowledgement": lambda: other.acknowledge(s3, target.generation),
                "a release meant for m3": lambda: store.release(s4, {"y": 1}),
                "m3's claim": lambda: other.claim(s3, ["y"], target.generation),
            }
            for change, make in changes.items():
                make()
                assert witness.wait(5), change  # the change is out
                assert member.wait(0.3) is False, change
                assert follower.wait(0.01) is False, change
            store.release(s1, {"x": 1})
            assert member.wait(5), "the release of what m2 asked for"
            assert follower.wait(0.3) is False, "a release"
            store.leave(s1)
            assert follower.wait(5), "the coordinator left"
            for watch in (member, follower, witness):
                quiet(watch)
            # Others joining and leaving: nothing m2 acts on until a target says so.
            s5 = store.join(group, "m5", info={}, ttl=10, static=False)
            assert witness.wait(5) and follower.wait(5), "m5 joined"
            assert member.wait(0.3) is False, "m5 joined"
            store.leave(s5)
            assert witness.wait(5) and follower.wait(5), "m5 left"
            assert member.wait(0.3) is False, "m5 left"
            other.leave(s2)
            assert member.wait(5), "m2's own session ended"
            member.focus(Interest.ALL)
            assert member.wait(5), "a wider interest reports what it may have missed"
        finally:
            for watch in (member, follower, witness):
                watch.close()


def test_a_watch_asks_again_only_for_what_fired_and_follows_a_znode_once(
    zookeeper_backend_url: str, group: str, raw: Any
) -> None:
    # A publication fired each member's target watch; the member asked for its target,
    # control and membership watches again, two of which stood: 200 requests a join in a
    # group of 100. And a newcomer asked to follow each holder once per claim round.
    from kazoo.protocol.states import EventType, KeeperState, WatchedEvent

    with open_backend(zookeeper_backend_url) as store:
        s1, epoch, target = _lead(store, group, {"m1": ["x"], "m2": []})
        store.join(group, "m2", info={}, ttl=10, static=False)
        paths = _zk(store)._group(group)
        client = _zk(store)._client
        watch = store.watch(group)
        assert isinstance(watch, ZookeeperWatch)
        asked: list[str] = []
        exists = client.exists_async

        def spy(path: str, watch: Any = None) -> Any:
            asked.append(path)
            return exists(path, watch=watch)

        try:
            watch.focus(Interest.MEMBER, "m2")
            raw.set(paths.changes, b"")  # fires what the first interest watched, once
            assert watch.wait(5)
            quiet(watch)
            client.exists_async = spy
            _republish(store, s1, epoch, {"m1": [], "m2": ["x"]}, target)
            assert watch.wait(5), "a new target"
            assert asked == [paths.target]  # control and m2's membership are watched still
            asked.clear()
            holder = paths.session(s1.session_id)
            version = raw.exists(holder).version
            watch.follow({holder: version})
            watch.follow({holder: version})  # a second claim round, the holder unchanged
            assert asked == [holder]
            assert watch.wait(0.3) is False
            raw.set(holder, b"")  # what a release does
            assert watch.wait(5), "the holder released"
            watch.follow({holder: version + 1})  # fired: followed again
            assert asked == [holder, holder]
            quiet(watch)
            # A dropped connection: kazoo forgets every watch and fires each with no path.
            watch._fired(WatchedEvent(EventType.NONE, KeeperState.CONNECTING, None))
            assert watch.wait(5)
            watch.follow({holder: version + 1})
            assert asked.count(holder) == 3
        finally:
            client.exists_async = exists
            watch.close()


def test_a_followed_holder_found_moved_when_its_watch_is_registered_counts_as_moved(
    zookeeper_backend_url: str, group: str, raw: Any
) -> None:
    # A holder that released between the claim's read and the registration of its watch
    # wakes the member at once, and its records are read in the next claim's first read
    # (right behind its znode), as for one whose watch fired. One registered at the version
    # the claim read released nothing since.
    with open_backend(zookeeper_backend_url) as store:
        s1 = store.join(group, "m1", info={}, ttl=10, static=False)
        s3 = store.join(group, "m3", info={}, ttl=10, static=False)
        paths = _zk(store)._group(group)
        watch = store.watch(group)
        assert isinstance(watch, ZookeeperWatch)
        try:
            watch.focus(Interest.MEMBER, "m2")
            quiet(watch)
            still = paths.session(s1.session_id)
            watch.follow({still: raw.exists(still).version})
            assert watch.wait(0.5) is False, "registered at the version read"
            assert watch.take_moved() == set()
            moved = paths.session(s3.session_id)
            before = raw.exists(moved).version
            raw.set(moved, b"")  # a release between the claim's read and the follow
            watch.follow({moved: before})
            assert watch.wait(5), "registered at another version: wakes at once"
            assert watch.take_moved() == {moved}
            assert watch.take_moved() == set()
            raw.set(still, b"")  # a release after the registration: the watch fires
            assert watch.wait(5)
            assert watch.take_moved() == {still}
        finally:
            watch.close()


def test_a_follower_that_gives_no_grace_watches_the_coordinator_alone(
    zookeeper_backend_url: str, group: str
) -> None:
    # Interest.COORDINATOR: members joining and leaving wake the followers that keep static
    # members in mind (SUCCESSION), not those that give no rejoin grace; the coordinator
    # going away, and a new election, wake both.
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        s1, _, target = _lead(store, group, {"m1": ["x"]})
        s2 = other.join(group, "m2", info={}, ttl=10, static=False)
        follower, succession = other.watch(group), other.watch(group)
        try:
            follower.focus(Interest.COORDINATOR)
            succession.focus(Interest.SUCCESSION)
            # The watches of the wider interest a watch starts with stay registered until
            # they fire once (a change between a narrowing and its registration must wake):
            # a claim and a join fire them.
            store.claim(s1, ["x"], target.generation)
            other.join(group, "m9", info={}, ttl=10, static=False)
            for watch in (follower, succession):
                quiet(watch)
            s5 = store.join(group, "m5", info={}, ttl=10, static=True)
            assert succession.wait(5), "m5 joined"
            assert follower.wait(0.3) is False, "m5 joined"
            store.leave(s5)
            assert succession.wait(5), "m5 left"
            assert follower.wait(0.3) is False, "m5 left"
            store.leave(s1)  # the coordinator's session ends
            assert follower.wait(5), "the coordinator left"
            quiet(follower)
            assert other.elect(s2) is not None
            assert follower.wait(5), "m2 elected"
        finally:
            for watch in (follower, succession):
                watch.close()


def test_a_member_watch_wakes_when_the_holder_of_what_it_asked_for_ends(
    zookeeper_backend_url: str, group: str
) -> None:
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        s1, epoch, target = _lead(store, group, {"m1": ["x"]})
        store.claim(s1, ["x"], target.generation)
        s2 = other.join(group, "m2", info={}, ttl=10, static=False)
        member = other.watch(group)
        try:
            member.focus(Interest.MEMBER, "m2")
            target = _republish(store, s1, epoch, {"m1": [], "m2": ["x"]}, target)
            assert member.wait(5), "a new target"
            quiet(member)
            assert other.claim(s2, ["x"], target.generation) == {}
            assert member.wait(0.3) is False
            store.leave(s1)  # its session ends, unreleased
            assert member.wait(5), "the holder's session ended"
            grants = other.claim(s2, ["x"], target.generation)
            assert grants["x"].freed is Freed.EXPIRED
        finally:
            member.close()


def test_a_release_wakes_the_member_that_follows_it_at_once_and_its_watches_still_hold(
    zookeeper_backend_url: str, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A followed holder's release wakes the member without re-arming the watches of its
    # interest (they did not fire: a round trip less between a release and the next claim);
    # those watches are registered still, so a new target after it wakes the member too.
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        s1, epoch, target = _lead(store, group, {"m1": ["x", "z"]})
        store.claim(s1, ["x", "z"], target.generation)
        s2 = other.join(group, "m2", info={}, ttl=10, static=False)
        member = other.watch(group)
        try:
            member.focus(Interest.MEMBER, "m2")
            target = _republish(store, s1, epoch, {"m1": ["z"], "m2": ["x"]}, target)
            assert member.wait(5), "a new target"
            quiet(member)
            assert other.claim(s2, ["x"], target.generation) == {}  # m2 follows m1's session
            quiet(member)
            client = _zk(other)._client
            sent: list[str] = []
            exists = client.exists_async

            def spy(path: str, *args: Any, **kwargs: Any) -> Any:
                sent.append(path)
                return exists(path, *args, **kwargs)

            monkeypatch.setattr(client, "exists_async", spy)
            store.release(s1, {"x": 1})
            assert member.wait(5), "the release of what m2 asked for"
            assert member.wait(0.3) is False  # (a re-arm would be answered by now)
            assert sent == [], "woken without re-arming"
            monkeypatch.undo()
            assert set(other.claim(s2, ["x"], target.generation)) == {"x"}
            quiet(member)
            _republish(store, s1, epoch, {"m1": [], "m2": ["x", "z"]}, target)
            assert member.wait(5), "a new target after the release"
        finally:
            member.close()


def _held_by_m1_and_m3(
    store: Backend, other: Backend, group: str, count: int
) -> tuple[list[str], list[str], tuple[Session, Session, Session], int, Target]:
    """``count`` resources held by m1 (``a...``) and as many by m3 (``c...``), both of
    ``store``, and m2 joined through ``other``: the ids, the sessions of m1, m2 and m3, the
    coordinator epoch and the target."""
    a_ids = [f"a{i:03d}" for i in range(count)]
    c_ids = [f"c{i:03d}" for i in range(count)]
    s3 = store.join(group, "m3", info={}, ttl=10, static=False)  # a member before its target
    s1, epoch, target = _lead(store, group, {"m1": a_ids, "m3": c_ids})
    store.claim(s1, a_ids, target.generation)
    store.claim(s3, c_ids, target.generation)
    s2 = other.join(group, "m2", info={}, ttl=10, static=False)
    return a_ids, c_ids, (s1, s2, s3), epoch, target


def _all_moved_to_m2(
    store: Backend, other: Backend, group: str, count: int, *, hints: bool = True
) -> tuple[list[str], list[str], tuple[Session, Session, Session], Target]:
    """:func:`_held_by_m1_and_m3`, then a target that gives m2 everything m1 and m3 hold: as
    a delta, which names m1 and m3 as the holders (``hints``), or else written whole."""
    a_ids, c_ids, sessions, epoch, target = _held_by_m1_and_m3(store, other, group, count)
    moved = {"m1": [], "m2": a_ids + c_ids, "m3": []}
    previous = target if hints else None
    return a_ids, c_ids, sessions, _republish(store, sessions[0], epoch, moved, previous)


def test_a_claim_lists_the_sessions_only_for_as_many_unknown_holders_as_members(
    zookeeper_backend_url: str, group: str
) -> None:
    # Listing the group's sessions and reading each one's znode ahead of the records spares
    # a second read of the records, but costs a read per member: for the 2 resources of a
    # group of 3 (as for the 10 each member takes over from one that leaves a group of 100)
    # the claim reads the records, then their holders' znodes with the records again. (A
    # target written whole: a delta's hints would name the holders.)
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        a_ids, c_ids, (s1, s2, s3), target = _all_moved_to_m2(store, other, group, 1, hints=False)
        assert other.member_view(s2).target == frozenset(a_ids + c_ids)  # 3 members
        paths = _zk(other)._group(group)
        read: list[str] = []
        _count_reads(other, s2, paths=read)
        assert other.claim(s2, a_ids + c_ids, target.generation) == {}
        assert paths.sessions not in read
        records = [p for p in read if p.startswith(paths.epochs + "/")]
        assert len(records) == 4  # each read twice: before and after its holder's znode
        first = read.index(records[0])
        assert first < read.index(paths.session(s1.session_id))
        assert first < read.index(paths.session(s3.session_id))


def test_a_first_claim_takes_the_deltas_hints_and_reads_only_the_records_of_holders_that_wrote(
    zookeeper_backend_url: str, group: str, raw: Any, settled: None
) -> None:
    # The delta that gives m2 what m1 and m3 hold names their sessions. m3 releases 50 of
    # its 200 after the publication, m1 nothing: m2's first claim reads the two sessions'
    # znodes with the pointer (no list of the group's sessions), the records of m3's other
    # 150 behind them (the 50 come from the notes of m3's release, in its znode), and none
    # of m1's, taken as held by m1 (its znode has not been written since the publication).
    # m1's release then wakes the claim that grants its 200 from its notes, unread.
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        a_ids, c_ids, (s1, s2, s3), target = _all_moved_to_m2(store, other, group, 200)
        assert _pointer(raw, store, group).get("deltas"), "a delta (400 ids moved)"
        assert other.member_view(s2).target == frozenset(a_ids + c_ids)  # reads the hints
        store.release(s3, dict.fromkeys(c_ids[:50], 1))
        paths = _zk(other)._group(group)
        requests: list[list[str]] = []
        _count_reads(other, s2, requests=requests)
        assert sorted(other.claim(s2, a_ids + c_ids, target.generation)) == c_ids[:50]
        read = [path for request in requests for path in request]
        assert paths.sessions not in read
        assert paths.session(s1.session_id) in requests[0]
        assert paths.session(s3.session_id) in requests[0]
        records = [p for p in read if p.startswith(paths.epochs + "/")]
        assert sorted(records) == [paths.resource_epoch(r) for r in c_ids[50:]]
        # m1's are followed (its znode at the version read), as if their records said so.
        hosted = _zk(other)._sessions.get(s2.session_id)
        assert hosted is not None
        assert set(hosted.assumed) == set(a_ids)
        assert {hosted.held_by_others[a][0] for a in a_ids} == {s1.session_id}
        store.release(s1, dict.fromkeys(a_ids, 1))
        requests.clear()
        assert sorted(other.claim(s2, a_ids + c_ids[50:], target.generation)) == a_ids
        assert not [p for request in requests for p in request if p.startswith(paths.epochs)]


def test_a_hint_is_judged_by_when_its_delta_was_written_not_by_the_current_pointer(
    zookeeper_backend_url: str, group: str, raw: Any, settled: None
) -> None:
    # m2's view reads the delta that gives it a and b, naming m1. m1 then releases a, and
    # another delta (m3 gets c from m1) moves the pointer on before m2 claims: m1's znode is
    # older than that pointer, but newer than m2's hints, so m2 reads a's record (and gets
    # it), and takes b as held still.
    # (m4 holds d, which the first delta gives m2 too, and releases nothing: d is taken as
    # held without a read.)
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        s4 = store.join(group, "m4", info={}, ttl=10, static=False)
        s1, epoch, target = _lead(store, group, {"m1": ["a", "b", "c"], "m4": ["d"]})
        assert set(store.claim(s1, ["a", "b", "c"], target.generation)) == {"a", "b", "c"}
        assert set(store.claim(s4, ["d"], target.generation)) == {"d"}
        s2 = other.join(group, "m2", info={}, ttl=10, static=False)
        store.join(group, "m3", info={}, ttl=10, static=False)
        gave = {"m1": ["c"], "m2": ["a", "b", "d"], "m3": [], "m4": []}
        target = _republish(store, s1, epoch, gave, target)
        assert other.member_view(s2).target == frozenset({"a", "b", "d"})
        store.release(s1, {"a": 1})
        gave = {"m1": [], "m2": ["a", "b", "d"], "m3": ["c"], "m4": []}
        later = _republish(store, s1, epoch, gave, target)
        assert len(_pointer(raw, store, group)["deltas"]) == 2
        paths = _zk(other)._group(group)
        read: list[str] = []
        _count_reads(other, s2, paths=read)
        assert set(other.claim(s2, ["a", "b", "d"], later.generation)) == {"a"}
        assert paths.resource_epoch("d") not in read
        hosted = _zk(other)._sessions.get(s2.session_id)
        assert hosted is not None and set(hosted.assumed) == {"d"}


def test_a_delta_names_no_holder_of_a_young_target_nor_one_that_joined_again(
    zookeeper_backend_url: str, group: str, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A member given an id by a target out for less than HINT_SETTLE may not hold it yet, and
    # a member that joined again since the target before holds none of it under its new
    # session: a hint naming either would keep the id from its new owner for a second or two.
    with open_backend(zookeeper_backend_url) as store:
        s1, epoch, target = _lead(store, group, {"m1": ["a", "b"], "m3": ["c"]})
        store.join(group, "m2", info={}, ttl=10, static=False)
        s3 = store.join(group, "m3", info={}, ttl=10, static=False)
        target = _republish(store, s1, epoch, {"m1": ["a"], "m2": ["b"], "m3": ["c"]}, target)
        assert "hinted" not in _pointer(raw, store, group), "the target before is young"
        store.leave(s3)
        store.join(group, "m3", info={}, ttl=10, static=False)  # a new session
        monkeypatch.setattr(coordination, "HINT_SETTLE", 0.0)
        _republish(store, s1, epoch, {"m1": [], "m2": ["a", "b", "c"], "m3": []}, target)
        pointer = _pointer(raw, store, group)
        assert pointer["hinted"] == ["m2"]
        delta = _zk(store)._group(group).target_dir(pointer["deltas"][-1])
        hints = json.loads(raw.get(f"{delta}/m2#h")[0])
        assert hints == {s1.session_id: ["a"]}, "m3 joined again: its c is not named"


def test_no_hints_follow_a_stopping_phase(
    zookeeper_backend_url: str, group: str, raw: Any, settled: None
) -> None:
    # Under the global barrier every member releases everything in the stopping phase; the
    # running target after it names no holders: each would look as if it held still.
    with open_backend(zookeeper_backend_url) as store:
        s1, epoch, target = _lead(store, group, {"m1": ["a", "b"]})
        store.join(group, "m2", info={}, ttl=10, static=False)
        version = store.resources(group)[0]
        stopping = store.publish(
            s1, epoch, {"m1": ["a", "b"]}, phase=Phase.STOPPING, resources_version=version,
            previous=target,
        )  # fmt: skip
        _republish(store, s1, epoch, {"m1": ["a"], "m2": ["b"]}, stopping)
        pointer = _pointer(raw, store, group)
        assert pointer["phase"] == "running" and len(pointer["deltas"]) == 1
        assert "hinted" not in pointer
        delta = _zk(store)._group(group).target_dir(pointer["deltas"][0])
        assert sorted(raw.get_children(delta)) == ["m1#0", "m2#0"]
        # A move from a running target names the holders.
        _republish(store, s1, epoch, {"m1": ["b"], "m2": ["a"]}, store.state(group).target)
        assert _pointer(raw, store, group)["hinted"] == ["m1", "m2"]


def test_a_hint_naming_a_holder_that_never_held_the_resource_is_trusted_for_a_while_only(
    zookeeper_backend_url: str, group: str, monkeypatch: pytest.MonkeyPatch, settled: None
) -> None:
    # m1 had x and y in the target but never claimed them; the next target gives them to m2,
    # and its delta names m1 as their holder. m2's claims take that for HINT_TRUST seconds
    # (m1's znode does not move: it has nothing to release), then read the records: free.
    monkeypatch.setattr(ownership, "HINT_TRUST", 0.5)
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        s1, epoch, target = _lead(store, group, {"m1": ["w", "x", "y"]})
        assert set(store.claim(s1, ["w"], target.generation)) == {"w"}
        s2 = other.join(group, "m2", info={}, ttl=10, static=False)
        target = _republish(store, s1, epoch, {"m1": ["w"], "m2": ["x", "y"]}, target)
        assert other.member_view(s2).target == frozenset({"x", "y"})
        started = time.monotonic()
        assert other.claim(s2, ["x", "y"], target.generation) == {}, "taken as held by m1"
        wait_for(
            lambda: set(other.claim(s2, ["x", "y"], target.generation)) == {"x", "y"},
            timeout=5,  # m1's session (10 s) would end later and free them anyway
            what="the claim that no longer trusts the hint",
        )
        assert time.monotonic() - started >= 0.5


def test_a_claim_asked_again_reads_only_what_the_holders_releases_may_have_freed(
    zookeeper_backend_url: str, group: str
) -> None:
    # A joining member asks for 600 resources held by m1 and m3. m1 releases 200 of its 300:
    # the next attempt reads m1's session znode once, ahead of the rest, and with it the
    # notes of that release, which give the 200 records as released; then the records of
    # m1's other 100 once each (no second read with the session: the znode was read before
    # them), and grants the 200; m3's session znode has not moved, so m3's 300 records are
    # not read at all. m1's last 100 follow once it releases them.
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        a_ids, c_ids, (s1, s2, s3), target = _all_moved_to_m2(store, other, group, 300)
        assert other.claim(s2, a_ids + c_ids, target.generation) == {}
        store.release(s1, dict.fromkeys(a_ids[:200], 1))
        read: list[str] = []
        _count_reads(other, s2, paths=read)
        grants = other.claim(s2, a_ids + c_ids, target.generation)
        assert sorted(grants) == a_ids[:200]
        paths = _zk(other)._group(group)
        records = [p for p in read if p.startswith(paths.epochs + "/")]
        assert sorted(records) == [paths.resource_epoch(r) for r in a_ids[200:]], len(records)
        assert read.count(paths.session(s1.session_id)) == 1
        assert read.count(paths.session(s3.session_id)) == 1
        store.release(s1, dict.fromkeys(a_ids[200:], 1))
        assert sorted(other.claim(s2, a_ids[200:] + c_ids, target.generation)) == a_ids[200:]
        store.release(s3, dict.fromkeys(c_ids, 1))
        assert sorted(other.claim(s2, c_ids, target.generation)) == c_ids


def test_a_release_notes_what_it_released_in_its_sessions_znode_unless_that_is_too_much(
    zookeeper_backend_url: str, group: str, raw: Any
) -> None:
    # The release's multi-op sets the session's znode to the ids it released, each with its
    # epoch and the version its released record has: what a read of those records would
    # say. A release of more than NOTES_BYTES of them notes none (every member following the
    # holder reads its znode).
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        a_ids, _, (s1, _, _), _, _ = _held_by_m1_and_m3(store, other, group, 400)
        paths = _zk(store)._group(group)
        store.release(s1, dict.fromkeys(a_ids[:3], 1))
        notes = json.loads(raw.get(paths.session(s1.session_id))[0])
        assert notes["member"] == "m1" and sorted(notes["released"]) == a_ids[:3]
        for r in a_ids[:3]:
            data, stat = raw.get(paths.resource_epoch(r))
            assert json.loads(data) == {"epoch": 1, "member": "m1", "released": True,
                                        "session": s1.session_id}  # fmt: skip
            assert notes["released"][r] == [1, stat.version]
        store.release(s1, dict.fromkeys(a_ids[3:], 1))
        assert len(chain.notes_data("m1", {r: (1, 1) for r in a_ids[3:]})) == 0
        assert raw.get(paths.session(s1.session_id))[0] == b""


def _m2_follows_m1(
    store: Backend, other: Backend, group: str, count: int, released: int
) -> tuple[list[str], tuple[Session, Session, Session], Target, GroupPaths]:
    """:func:`_all_moved_to_m2`; m2 claims m1's ``count``, finds them held and follows m1,
    which then releases the first ``released``: m1's ids, the sessions, the target, and the
    group's paths."""
    a_ids, _, sessions, target = _all_moved_to_m2(store, other, group, count)
    assert other.claim(sessions[1], a_ids, target.generation) == {}
    store.release(sessions[0], dict.fromkeys(a_ids[:released], 1))
    return a_ids, sessions, target, _zk(other)._group(group)


def test_a_claim_grants_from_release_notes_as_from_the_records_and_reads_a_stale_note_again(
    zookeeper_backend_url: str, group: str, raw: Any, settled: None
) -> None:
    # m2 follows m1 for 10 resources; m1 releases 5 of them. Meanwhile one of the 5, a000,
    # was claimed by m3 (its record names m3's live session, at a later version than m1's
    # notes say). m2's claim grants the other 4 from the notes, as a read of their records
    # would (the predecessor released at the release's store time); a000's grant is refused
    # by its record's version, and the claim that follows reads that record, finds it m3's
    # and leaves it to m3.
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        a_ids, (s1, s2, s3), target, paths = _m2_follows_m1(store, other, group, 10, 5)
        released_at = {r: raw.get(paths.resource_epoch(r))[1].mtime / 1000 for r in a_ids[:5]}
        taken = {"epoch": 2, "member": "m3", "prev": None, "session": s3.session_id}
        raw.set(paths.resource_epoch("a000"), json.dumps(taken).encode())
        read: list[str] = []
        _count_reads(other, s2, paths=read)
        grants = other.claim(s2, a_ids, target.generation)
        assert sorted(grants) == a_ids[1:5]
        # The 5 from the notes; m1's other 5 (its znode moved: released before, or not).
        records = [p for p in read if p.startswith(paths.epochs + "/")]
        assert sorted(records) == [paths.resource_epoch(r) for r in a_ids[5:]]
        for r in a_ids[1:5]:
            g = grants[r]
            assert (g.epoch, g.freed, g.prev_member_id) == (2, Freed.RELEASED, "m1")
            assert g.prev_session_id == s1.session_id and g.freed_at == released_at[r]
            record = json.loads(raw.get(paths.resource_epoch(r))[0])
            assert record["prev"] == {"at": released_at[r], "freed": "released",
                                      "member": "m1", "session": s1.session_id}  # fmt: skip
        read.clear()
        assert other.claim(s2, ["a000"], target.generation) == {}
        assert paths.resource_epoch("a000") in read  # not the note again
        assert json.loads(raw.get(paths.resource_epoch("a000"))[0]) == taken
        hosted = _zk(other)._sessions.get(s2.session_id)
        assert hosted is not None and hosted.held_by_others["a000"][0] == s3.session_id


def test_a_release_split_over_requests_notes_the_last_and_the_rest_are_read(
    zookeeper_backend_url: str, group: str, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A release of three ids sent as three requests: each request notes its own id, so the
    # znode keeps the last one's. The claim that follows grants that one from the notes and
    # reads the records of the other two (and of m1's other ids: its znode moved).
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        a_ids, (s1, s2, _), target, paths = _m2_follows_m1(store, other, group, 6, 0)
        monkeypatch.setattr(ownership, "REQUEST_BYTES", 1)  # a request per resource
        store.release(s1, dict.fromkeys(a_ids[:3], 1))
        notes = json.loads(raw.get(paths.session(s1.session_id))[0])
        assert list(notes["released"]) == [a_ids[2]]
        assert raw.get(paths.session(s1.session_id))[1].version == 3
        read: list[str] = []
        _count_reads(other, s2, paths=read)
        assert sorted(other.claim(s2, a_ids, target.generation)) == a_ids[:3]
        records = sorted(p for p in read if p.startswith(paths.epochs + "/"))
        assert records == [paths.resource_epoch(r) for r in a_ids if r != a_ids[2]]


def test_notes_that_are_not_this_librarys_are_read_as_none(
    zookeeper_backend_url: str, group: str, raw: Any, settled: None
) -> None:
    # A session znode whose data is not release notes (another version's, or written by
    # hand): the claim reads the records, as without notes, and grants what they free.
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        a_ids, (s1, s2, _), target, paths = _m2_follows_m1(store, other, group, 4, 4)
        for data in (b"not json", b'{"member": "m1", "released": ["a000"]}', b"[]"):
            raw.set(paths.session(s1.session_id), data)
            assert chain.read_notes(data, s1.session_id, raw.get(paths.epochs)[1]) == {}
        read: list[str] = []
        _count_reads(other, s2, paths=read)
        assert sorted(other.claim(s2, a_ids, target.generation)) == a_ids
        assert sorted(p for p in read if p.startswith(paths.epochs + "/")) == [
            paths.resource_epoch(r) for r in a_ids
        ]


def test_a_claim_woken_by_a_holders_release_reads_its_records_with_its_znode(
    zookeeper_backend_url: str, group: str
) -> None:
    # The member's watch knows which holder's znode fired: the claim that follows reads that
    # holder's records in its first multiRead, right after the holders' znodes, instead of in
    # a second one once it found the znode moved. One round trip less from a release to the
    # grant; m3's records, whose holder did not fire, are still not read. A first claim,
    # which knows no holder, lists the group's sessions in its first multiRead and reads
    # their znodes before every record in its second, each record once.
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        # 150 each: the 300 records fit in one multiRead.
        a_ids, c_ids, (s1, s2, _), epoch, target = _held_by_m1_and_m3(store, other, group, 150)
        member = other.watch(group)
        try:
            member.focus(Interest.MEMBER, "m2")
            moved = {"m1": [], "m2": a_ids + c_ids, "m3": []}
            target = _republish(store, s1, epoch, moved, target)
            paths = _zk(other)._group(group)
            read: list[str] = []
            requests: list[list[str]] = []
            _count_reads(other, s2, paths=read, requests=requests)
            assert other.claim(s2, a_ids + c_ids, target.generation) == {}
            # The first claim knows no holder: it lists the sessions, then reads their
            # znodes ahead of every record (no cut reads the records again).
            assert paths.sessions in requests[0]
            second = requests[1]
            records = [p for p in second if p.startswith(paths.epochs + "/")]
            assert sorted(records) == sorted(paths.resource_epoch(r) for r in a_ids + c_ids)
            assert second.index(paths.session(s1.session_id)) < second.index(records[0])
            assert len([p for p in read if p.startswith(paths.epochs + "/")]) == len(records)
            quiet(member)
            store.release(s1, dict.fromkeys(a_ids[:100], 1))
            assert member.wait(5), "m1's release"
            read.clear()
            requests.clear()
            grants = other.claim(s2, a_ids + c_ids, target.generation)
            assert sorted(grants) == a_ids[:100]
            first = requests[0]  # the first multiRead: the znodes, then m1's records
            records = [p for p in first if p.startswith(paths.epochs + "/")]
            assert sorted(records) == [paths.resource_epoch(r) for r in a_ids], len(records)
            assert first.index(paths.session(s1.session_id)) < first.index(records[0])
            everywhere = [p for p in read if p.startswith(paths.epochs + "/")]
            assert len(everywhere) == len(records)  # none read again, and none of m3's
        finally:
            member.close()


def test_a_grant_refused_by_its_record_wakes_the_member_to_try_again(
    zookeeper_backend_url: str, group: str, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A member's watch follows no record: a grant refused because the record moved on
    # between the read and the request (another write to it) must wake it at once, or the
    # resource waits for an unrelated change.

    with open_backend(zookeeper_backend_url) as store:
        s1, _, target = _lead(store, group, {"m1": ["x"]})
        member = store.watch(group)
        try:
            member.focus(Interest.MEMBER, "m1")
            quiet(member)
            record = _zk(store)._group(group).resource_epoch("x")
            plan = ownership._plan_claims

            def plan_then_touch(*args: Any) -> Any:
                planned = plan(*args)
                raw.ensure_path(record)
                raw.set(record, raw.get(record)[0])  # the record moves on
                return planned

            monkeypatch.setattr(ownership, "_plan_claims", plan_then_touch)
            assert store.claim(s1, ["x"], target.generation) == {}
            monkeypatch.setattr(ownership, "_plan_claims", plan)
            assert member.wait(5), "the refused grant"
        finally:
            member.close()


def test_a_follower_remembers_the_resource_set_without_building_it(
    zookeeper_backend_url: str, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 100 followers each built 100,000 resources, together, when a group of 100 started: a
    # follower keeps the chunks as read, and the set is built only if a store that lost the
    # group needs it declared again.
    from rebalancer_spark.backends.zookeeper import reads
    from rebalancer_spark.backends.zookeeper.store import records

    ids = [f"r{i:05d}" for i in range(3000)]
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        version = store.update_resources(group, replace=[Resource(i) for i in ids])
        built: list[str] = []
        parse = records.read_resource_chunk

        def counting(data: bytes, path: str) -> list[Resource]:
            built.append(path)
            return parse(data, path)

        monkeypatch.setattr(reads, "read_resource_chunk", counting)
        assert other.remember_resources(group) == version
        assert built == []
        assert sorted(r.id for r in other.epochs.resources(group)) == ids
        chunks = len(built)
        assert chunks >= 1
        assert len(other.epochs.resources(group)) == len(ids) and len(built) == chunks  # once


def test_a_claim_of_resources_a_live_member_holds_reads_its_session_once(
    zookeeper_backend_url: str, group: str
) -> None:
    # While the holder's session znode exists it holds what its records name: a joining
    # member that asks before the releases land lists the group's sessions, reads the
    # holder's session and then each record once (a consistent cut: the version read is what
    # the member's watch follows); once the holder is gone, its resources are granted on
    # their records alone. (Before the list, the holder's session was read after the
    # records, which the claim then read a second time with it: 1,204 reads, not 605.)
    moved = [f"r{i:04d}" for i in range(600)]
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        old, epoch, generation = _lead_and_publish(store, group, {"m1": moved})
        assert len(store.claim(old, moved, generation)) == 600
        new = other.join(group, "m2", info={}, ttl=10, static=False)
        version = store.resources(group)[0]
        target = store.publish(
            old, epoch, {"m2": moved}, phase=Phase.RUNNING, resources_version=version
        )
        read: list[str] = []
        reads = _count_reads(other, new, paths=read)
        assert other.claim(new, moved, target.generation) == {}
        paths = _zk(other)._group(group)
        assert not [p for p in read if p.startswith(paths.claims + "/")]
        assert read.count(paths.session(old.session_id)) == 1
        # The pointer, the session and the group's sessions listed; the holder's session,
        # the target's part and 600 records.
        assert sum(reads) <= 3 + 1 + 1 + 600, reads
        assert len([p for p in read if p.startswith(paths.epochs + "/")]) == 600
        store.leave(old)  # its session ends, unreleased: its records name a session gone
        read.clear()
        reads.clear()
        grants = other.claim(new, moved, target.generation)
        assert grant_epochs(grants) == dict.fromkeys(moved, 2)
        assert all(g.freed is Freed.EXPIRED and g.prev_member_id == "m1" for g in grants.values())
        # The pointer, the session and m1's session (gone: its znode fired); the target's
        # part and the 600 records; then 600 progress reads behind the claim's requests.
        # Nothing under claims/ is read or written.
        assert not [p for p in read if p.startswith(paths.claims + "/")]
        assert sum(reads) <= 3 + 1 + 600 + 600, reads


def test_a_claim_keeps_two_requests_in_flight_and_one_refused_resource_spares_the_rest(
    zookeeper_backend_url: str, group: str, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rebalancer_spark.backends.zookeeper.store import fence
    from rebalancer_spark.backends.zookeeper.store.ops import Op

    monkeypatch.setattr(ownership, "REQUEST_BYTES", 4096)  # many small requests
    with open_backend(zookeeper_backend_url) as store:
        session, _, _ = _lead_and_publish(store, group, {"m1": ["a"]})
        zs = _zk(store)._sessions.get(session.session_id)
        assert zs is not None
        base = _zk(store)._group(group).base
        names = [f"n{i:03d}" for i in range(120)]
        units = [(n, [Op("create", f"{base}/progress/{n}", b"1", tag=n)]) for n in names]
        raw.create(f"{base}/progress/n007", b"taken")  # refuses its unit: NodeExists
        raw.create(f"{base}/progress/n093", b"taken")
        events: list[str] = []
        call, answer = zs.client._call, fence.session_answer

        def spy_call(request: Any, result: Any) -> Any:
            if type(request).__name__ == "Transaction":
                events.append("send")
            return call(request, result)

        def spy_answer(*args: Any) -> Any:
            events.append("answer")
            return answer(*args)

        zs.client._call = spy_call
        monkeypatch.setattr(ownership, "session_answer", spy_answer)
        applied, refused, stopped = ownership._apply(
            zs, _zk(store).settings, units, [], lambda _: [Op("check", f"{base}/changes")], "test"
        )
        assert stopped is None and refused == {"n007", "n093"}
        assert set(applied) == set(names) - refused
        assert all(raw.get(f"{base}/progress/{n}")[0] == b"1" for n in applied)
        # The server always has the next request (IN_FLIGHT are sent before the first answer
        # is awaited), and never more than IN_FLIGHT unanswered: a renewal of the session is
        # answered behind them, not behind the whole claim.
        assert ownership.IN_FLIGHT == 2 and events.count("send") > 5
        assert events.index("answer") == ownership.IN_FLIGHT, events
        outstanding = [
            events[: i + 1].count("send") - events[:i].count("answer")
            for i, e in enumerate(events)
            if e == "send"
        ]
        assert max(outstanding) == ownership.IN_FLIGHT, events
        # A refused frame operation stops it: nothing more is written.
        more = [(n, [Op("create", f"{base}/progress/x{n}", b"1", tag=n)]) for n in names]
        applied, refused, stopped = ownership._apply(
            zs,
            _zk(store).settings,
            more,
            [Op("check", f"{base}/no-such-znode")],
            lambda _: [],
            "test",
        )
        assert applied == {} and stopped is not None and stopped.path.endswith("no-such-znode")
        assert not any(n.startswith("x") for n in raw.get_children(f"{base}/progress"))


# -- faults: a member cut off, an expired session ---------------------------------------------


class Events:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[OwnershipEvent] = []

    def __call__(self, event: OwnershipEvent) -> None:
        with self.lock:
            self.items.append(event)

    def of(self, kind: EventKind) -> dict[str, float]:
        with self.lock:
            return {e.resource: e.at for e in self.items if e.kind is kind}

    def records(self) -> list[dict[str, object]]:
        with self.lock:
            return [
                {
                    "kind": e.kind.value,
                    "resource": e.resource,
                    "member_id": e.member_id,
                    "session_id": e.session_id,
                    "epoch": e.epoch,
                    "at": e.at,
                }
                for e in self.items
            ]


def _member(url: str, group: str, member_id: str, events: Events, **extra: Any) -> Member:
    config = MemberConfig(
        group=group,
        backend=url,
        member_id=member_id,
        session_timeout=TTL,
        stability_window=0.05,
        max_rebalance_delay=1.0,
    )
    return Member(config, event_sinks=[events], **extra).start()


def _stable(store: Backend, group: str, members: int, timeout: float) -> GroupState:
    def check() -> GroupState | None:
        try:
            state = store.state(group)
        except BackendError:
            return None
        live = [m for m in state.members.values() if not m.leaving]
        return state if len(live) == members and state.is_stable() else None

    state = wait_for(check, timeout=timeout, what=f"a stable group of {members} members")
    assert state is not None
    return state


def test_a_member_cut_off_past_its_timeout_stops_first_then_rejoins_under_its_id(
    zookeeper_server: ZkServer, group: str
) -> None:
    proxy = TcpProxy(zookeeper_server.port)
    chroot = f"/rb-{uuid.uuid4().hex[:12]}"
    direct = f"zookeeper://127.0.0.1:{zookeeper_server.port}{chroot}"
    cut_off = f"zookeeper://127.0.0.1:{proxy.port}{chroot}?connect_timeout=2"
    a_events, b_events = Events(), Events()
    a = _member(cut_off, group, "a", a_events, resources=RESOURCES)
    b = _member(direct, group, "b", b_events)
    try:
        with open_backend(direct) as observer:
            before = _stable(observer, group, 2, timeout=10)
            mine = {r for r, c in before.claims.items() if c.member_id == "a"}
            wait_for(
                lambda: {o.resource for o in a.assigned()} == mine,
                timeout=5,
                what="a's memory to catch up with its claims",
            )
            proxy.cut()
            wait_for(
                lambda: mine <= set(b_events.of(EventKind.ACQUIRED)),
                timeout=TTL + 5,
                what="b to take a's resources",
            )
            # a's member thread records its losses (as of its lease deadline) when it gets to
            # run, which under load may be after b took over: wait for them before comparing.
            wait_for(
                lambda: mine <= set(a_events.of(EventKind.LOST)),
                timeout=TTL + 5,
                what="a to record the loss of its resources",
            )
            lost, taken = a_events.of(EventKind.LOST), b_events.of(EventKind.ACQUIRED)
            assert all(lost[r] <= taken[r] for r in mine), (lost, taken)
            proxy.restore()
            after = _stable(observer, group, 2, timeout=TTL + 10)
            assert after.members["a"].session_id != before.members["a"].session_id
        overlaps = audit.overlaps(audit.intervals(a_events.records() + b_events.records()))
        assert overlaps == []
    finally:
        a.stop(drain=False)
        b.stop(drain=False)
        proxy.close()


def test_a_session_closed_behind_a_members_back_fences_its_commits_and_it_rejoins(
    zookeeper_backend_url: str, group: str, zookeeper_server: ZkServer
) -> None:
    # kazoo's way to expire a session: a second client resumes it and closes it. ZooKeeper
    # then deletes the member's znodes at once, not a timeout after its last renewal, so the
    # member cannot have stopped first (an operator deleting its znodes is the same case):
    # what protects the data is the store refusing every write of the old session.
    a_events, b_events = Events(), Events()
    a = _member(zookeeper_backend_url, group, "a", a_events, resources=RESOURCES)
    b = _member(zookeeper_backend_url, group, "b", b_events)
    try:
        with open_backend(zookeeper_backend_url) as observer:
            before = _stable(observer, group, 2, timeout=10)
            mine = {r: c for r, c in before.claims.items() if c.member_id == "a"}
            wait_for(
                lambda: {o.resource for o in a.assigned()} == set(mine),
                timeout=5,
                what="a's memory to catch up with its claims",
            )
            backend = cast(ZookeeperBackend, a._backend)
            assert a.session is not None
            old = a.session
            hosted = backend._sessions.get(old.session_id)
            assert hosted is not None
            thief = KazooClient(
                hosts=f"127.0.0.1:{zookeeper_server.port}", client_id=hosted.client_id
            )
            thief.start(timeout=15)
            thief.stop()
            thief.close()
            expired_at = time.monotonic()
            resource, claim = next(iter(mine.items()))
            with pytest.raises(FencedError):
                observer.commit(old, resource, claim.epoch, "from the closed session")
            after = _stable(observer, group, 2, timeout=TTL + 10)
            assert time.monotonic() - expired_at < TTL + 1.0
            assert after.members["a"].session_id != old.session_id
            wait_for(
                lambda: set(a_events.of(EventKind.LOST)) == set(mine),
                timeout=TTL + 5,
                what="a to record the loss of its resources",
            )
            assert all(
                after.claims[r].epoch > c.epoch for r, c in mine.items() if r in after.claims
            )
    finally:
        a.stop(drain=False)
        b.stop(drain=False)


# -- faults of a three-server ensemble ----------------------------------------------------------


@pytest.fixture
def ensemble_procs(
    zookeeper_ensemble: Ensemble, group: str, tmp_path: Path
) -> Iterator[MemberProcesses]:
    url = zookeeper_ensemble.url(query="connect_timeout=2")
    procs = MemberProcesses(url, group, tmp_path, session_timeout=ETTL, stability_window=0.05)
    yield procs
    procs.close()


@pytest.mark.slow
def test_progress_read_on_a_follower_that_lags_holds_every_acknowledged_commit(
    tmp_path: Path, group: str
) -> None:
    """A server answers reads from what it has applied, and a follower the leader's messages
    have not reached yet answers without commits the others acknowledged. ``progress()`` sends
    a ``sync`` ahead of its reads: the follower answers once it caught up, with every commit
    acknowledged before the call (the chaos runner's final read, on whichever server its
    client found, once saw commits go missing this way)."""
    ensemble, proxies = Ensemble.with_a_slow_follower(tmp_path / "zk")
    chroot = f"/rb-{uuid.uuid4().hex[:12]}"
    quorum = ",".join(f"127.0.0.1:{s.port}" for s in ensemble.servers[:2])
    lagging = f"127.0.0.1:{ensemble.servers[2].port}"
    raw = KazooClient(hosts=lagging, timeout=5.0)
    try:
        ensemble.start_slow_follower()
        raw.start(timeout=30)  # a session is created through the leader: before the hold
        with (
            open_backend(f"zookeeper://{quorum}{chroot}") as store,
            open_backend(f"zookeeper://{lagging}{chroot}") as observer,
        ):
            session, _, generation = _lead_and_publish(store, group, {"m1": ["a"]})
            assert grant_epochs(store.claim(session, ["a"], generation)) == {"a": 1}
            store.commit(session, "a", 1, 1)
            assert observer.progress(group, ["a"])["a"].value == 1
            for proxy in proxies:
                proxy.hold()  # the follower hears nothing from the leader from now on
            store.commit(session, "a", 1, 2)  # acknowledged by the other two
            # The follower lags: a plain read there still answers the first commit.
            data, _ = raw.get(f"{chroot}/groups/{group}/progress/a")
            assert json.loads(data)["value"] == 1
            answer: dict[str, Progress] = {}
            failed: list[BaseException] = []

            def read() -> None:
                try:
                    answer.update(observer.progress(group, ["a"]))
                except BaseException as exc:  # reported below, not lost in the thread
                    failed.append(exc)

            reader = threading.Thread(target=read)
            reader.start()
            reader.join(1.0)
            assert reader.is_alive(), (answer, failed)  # it waits for the leader, through sync
            for proxy in proxies:
                proxy.flow()
            reader.join(10)
            assert not reader.is_alive() and not failed, failed
            assert answer["a"].value == 2
    finally:
        raw.stop()
        raw.close()
        for proxy in proxies:
            proxy.close()
        ensemble.close()


@pytest.mark.slow
def test_killing_the_ensemble_leader_during_a_rebalance(
    zookeeper_ensemble: Ensemble, ensemble_procs: MemberProcesses
) -> None:
    procs = ensemble_procs
    procs.start("m0", RESOURCES)
    procs.start("m1")
    procs.start("m2")
    procs.wait_stable(3, timeout=15)
    leader = zookeeper_ensemble.leader()
    procs.start("m3")  # the rebalance to four members starts now...
    leader.kill()  # ...and the leader dies in the middle of it
    zookeeper_ensemble.leader(timeout=30)
    recovered = time.monotonic()
    procs.wait_stable(4, timeout=ETTL + 1.0)
    assert time.monotonic() - recovered < ETTL + 1.0
    procs.assert_trail_is_clean()


@pytest.mark.slow
def test_stopping_the_whole_ensemble_past_the_session_timeout(
    zookeeper_ensemble: Ensemble, ensemble_procs: MemberProcesses
) -> None:
    procs = ensemble_procs
    procs.start("m0", RESOURCES)
    procs.start("m1")
    procs.start("m2")
    before = procs.wait_stable(3, timeout=15)
    for server in zookeeper_ensemble.servers:
        server.stop()
    stopped = time.monotonic()
    wait_for(
        lambda: (
            {r["resource"] for r in procs.records() if r["kind"] == "lost"} >= set(before.claims)
        ),
        timeout=ETTL + 5,
        what="every member to stop work on everything it held",
    )
    wait_for(
        lambda: time.monotonic() - stopped > ETTL + 0.5,
        timeout=ETTL + 5,
        what="the outage to outlast the session timeout",
    )
    for server in zookeeper_ensemble.servers:
        server.start()
    zookeeper_ensemble.wait_quorum()
    recovered = time.monotonic()
    procs.wait_stable(3, timeout=ETTL + 1.0)
    assert time.monotonic() - recovered < ETTL + 1.0
    procs.assert_trail_is_clean()


@pytest.mark.slow
def test_kill_9_and_sigstop_members_of_an_ensemble_group(
    zookeeper_ensemble: Ensemble, ensemble_procs: MemberProcesses
) -> None:
    procs = ensemble_procs
    procs.start("m0", RESOURCES)
    procs.start("m1")
    procs.start("m2")
    procs.wait_stable(3, timeout=15)
    killed = time.monotonic()
    procs.kill("m1")
    procs.wait_stable(2, timeout=ETTL + 1.0)
    assert time.monotonic() - killed < ETTL + 1.0
    procs.signal("m2", signal.SIGSTOP)
    paused = time.monotonic()
    procs.wait_stable(1, timeout=ETTL + 1.0)
    assert time.monotonic() - paused < ETTL + 1.0
    procs.signal("m2", signal.SIGCONT)
    procs.wait_stable(2, timeout=ETTL + 10)
    procs.assert_trail_is_clean()


# -- the resource set's change log -------------------------------------------------------------


def test_the_set_s_log_outlives_the_orphan_collection_and_a_dropped_change_reads_as_none(
    zookeeper_backend_url: str, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every writer removes the set directories nobody points to once they are older than
    ORPHAN_MS: never a change the pointer's log names. A change removed under a reader (a
    later writer dropped it from the log) makes that reader read the set whole."""
    from rebalancer_spark.backends.zookeeper import resources as zk_resources

    monkeypatch.setattr(zk_resources, "ORPHAN_MS", -1)  # every directory is old enough
    monkeypatch.setattr(zk_resources, "CHAIN", 1)  # v3 is written whole, its log kept
    with open_backend(zookeeper_backend_url) as store:
        v1 = store.update_resources(group, replace=[Resource("a"), Resource("b")])
        v2 = store.update_resources(group, add=[Resource("c")])
        v3 = store.update_resources(group, remove=["a"])
        change = store.resource_changes(group, v1)
        assert change == ResourceChange(v1, v3, {"c": Resource("c")}, frozenset({"a"}))
        zk = _zk(store)
        paths = zk._paths(group)
        assert paths is not None
        sets = zk._client.get_children(paths.resource_sets)
        assert len([n for n in sets if n.startswith("log-")]) == 3 and len(sets) == 4
        assert len([n for n in sets if n.startswith(f"v{v3}-")]) == 1  # v1's set removed
        logged = sorted(n for n in sets if n.startswith(f"log-v{v2}-"))
        zk._client.delete(paths.resource_set(logged[0]), recursive=True)
        assert store.resource_changes(group, v1) is None
        assert store.resource_changes(group, v2) is not None
        assert store.resources(group, (v1, {"a": Resource("a")}))[1] == {
            "b": Resource("b"),
            "c": Resource("c"),
        }


def test_a_pointer_written_before_the_log_reads_as_a_log_that_starts_at_its_version(
    zookeeper_backend_url: str, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rebalancer_spark.backends.zookeeper import resources as zk_resources

    monkeypatch.setattr(zk_resources, "CHAIN", 0)  # every set written whole, as before
    with open_backend(zookeeper_backend_url) as store:
        v1 = store.update_resources(group, replace=[Resource("a")])
        v2 = store.update_resources(group, add=[Resource("b")])
        zk = _zk(store)
        paths = zk._paths(group)
        assert paths is not None
        data, _ = zk._client.get(paths.resources)
        old = {k: v for k, v in json.loads(data).items() if k in ("version", "set", "chunks")}
        zk._client.set(paths.resources, json.dumps(old).encode())  # as an earlier release
        assert store.resource_changes(group, v1) is None
        assert store.resource_changes(group, v2) == ResourceChange(v2, v2, {}, frozenset())
        v3 = store.update_resources(group, add=[Resource("c")])  # the log starts again
        assert store.resource_changes(group, v2) == ResourceChange(
            v2, v3, {"c": Resource("c")}, frozenset()
        )


def test_changes_are_written_alone_behind_the_set_until_the_chain_is_full(
    zookeeper_backend_url: str, group: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing written against the set its writer knows adds only its change (a directory
    of a few ids), up to CHAIN changes behind the set written whole; the next writes the set
    whole again. A chained pointer names its set ``base``, not ``set``: a reader of an earlier
    release, which would read the set without its chain, takes it for corrupt instead."""
    from rebalancer_spark.backends.zookeeper import resources as zk_resources

    monkeypatch.setattr(zk_resources, "CHAIN", 3)
    with open_backend(zookeeper_backend_url) as store, open_backend(zookeeper_backend_url) as other:
        listing = [Resource(f"r{i}") for i in range(2000)]
        kept = (store.update_resources(group, replace=listing), {r.id: r for r in listing})
        zk = _zk(store)
        paths = zk._paths(group)
        assert paths is not None
        pointers = []
        for i in range(5):
            listing = [*listing[1:], Resource(f"n{i}")]
            v = store.update_resources(group, replace=listing, known=kept)
            kept = (v, {r.id: r for r in listing})
            pointers.append(json.loads(zk._client.get(paths.resources)[0]))
            assert other.resources(group) == kept
        assert ["set" in p for p in pointers] == [False, False, False, True, False]
        assert [p["set_version"] for p in pointers] == [1, 1, 1, 5, 5]
        sets = [n for n in zk._client.get_children(paths.resource_sets) if n[0] == "v"]
        assert sets == [pointers[-1]["base"]]  # the set written before the last is removed


def test_no_chain_is_written_while_a_member_of_an_earlier_release_lives(
    zookeeper_backend_url: str, group: str
) -> None:
    """A member of an earlier release takes a chained pointer for corrupt and stops: while
    one lives (its record says nothing of chains), every change is written with the set whole;
    once it is gone, changes are chained again. A pointer whose chain is broken, or whose set
    is named for another version, is corrupt."""
    from rebalancer_spark.backends.zookeeper.store.records import read_resources_pointer

    with open_backend(zookeeper_backend_url) as store:
        zk = _zk(store)
        old = store.join(group, "old", info={}, ttl=30.0, static=False)
        store.join(group, "new", info={}, ttl=30.0, static=False)
        paths = zk._paths(group)
        assert paths is not None
        record = json.loads(zk._client.get(paths.member("old"))[0])
        assert record.pop("chains") is True
        zk._client.set(paths.member("old"), json.dumps(record).encode())  # as it wrote it
        listing = [Resource(f"r{i}") for i in range(100)]
        kept = (store.update_resources(group, replace=listing), {r.id: r for r in listing})
        listing = [*listing[1:], Resource("x")]
        v = store.update_resources(group, replace=listing, known=kept)
        pointer = json.loads(zk._client.get(paths.resources)[0])
        assert "set" in pointer and pointer["set_version"] == v  # written whole
        store.leave(old)
        kept = (v, {r.id: r for r in listing})
        listing = [*listing[1:], Resource("y")]
        v = store.update_resources(group, replace=listing, known=kept)
        pointer = json.loads(zk._client.get(paths.resources)[0])
        assert "base" in pointer and pointer["set_version"] == v - 1  # chained
        assert store.resources(group) == (v, {r.id: r for r in listing})
        for broken in (
            {**pointer, "log": pointer["log"][:-1]},  # the chain lacks its change
            {**pointer, "set_version": v + 1},  # a set newer than the pointer
            {"set": pointer["base"], **{k: x for k, x in pointer.items() if k != "base"}},
        ):
            with pytest.raises(CorruptStateError, match="resources"):
                read_resources_pointer(json.dumps(broken).encode(), paths.resources)
