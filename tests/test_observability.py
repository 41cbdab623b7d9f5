"""Metrics and structured logs of live members: two in-process members on a real SQLite store,
scraped as Prometheus would scrape them, and their log lines parsed as a log pipeline would."""

from __future__ import annotations

import io
import json
import logging
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rebalancer_spark import FencedError, Member, MemberConfig, Resource, SourceError
from rebalancer_spark.backends import open_backend
from rebalancer_spark.core.errors import ConfigurationError
from rebalancer_spark.core.status import member_health
from rebalancer_spark.member.logfields import (
    JsonFormatter,
    LogContext,
    MemberContextFilter,
    configure_logging,
    member_logger,
)
from tests.support.helpers import wait_for

GROUP = "metered"
RESOURCES = [f"r{i}" for i in range(6)]


def config(url: str, member_id: str, **more: object) -> MemberConfig:
    return MemberConfig.from_mapping(
        {
            "group": GROUP,
            "backend": url,
            "member_id": member_id,
            "session_timeout": 6.0,  # no lease lapses under load: the tests count exact roles
            "stability_window": 0.05,
            "max_rebalance_delay": 1.0,
            **more,
        },
        default_backend=url,
    )


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """(sample name, labels without group/member) -> value, from the Prometheus text."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = frozenset((k, v) for k, v in s.labels.items() if k not in ("group", "member"))
            out[(s.name, labels)] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, frozenset(labels.items()))]


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """JSON lines of every rebalancer_spark record written during the test."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.addFilter(MemberContextFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("rebalancer_spark")
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield buffer
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)


@pytest.fixture
def pair(tmp_path: Path, log_lines: io.StringIO) -> Iterator[tuple[Member, Member, str]]:
    """m1 (declares six resources, owns them all), then m2 joins: settled at three each."""
    url = f"sqlite://{tmp_path}/groups.db"
    m1 = Member(config(url, "m1"), resources=RESOURCES).start()
    m2 = Member(config(url, "m2"))
    try:
        assert m1.wait_until(lambda x: len(x.assigned()) == 6, timeout=15)
        m2.start()
        for m in (m1, m2):
            assert m.wait_until(lambda x: len(x.assigned()) == 3, timeout=15), m.member_id
        yield m1, m2, url
    finally:
        m2.stop()
        m1.stop()


def test_metrics_of_a_live_group(pair: tuple[Member, Member, str]) -> None:
    m1, m2, url = pair
    coordinator = wait_for(
        lambda: next((m for m in (m1, m2) if m.is_coordinator), None),
        timeout=10,
        what="a coordinator",
    )
    assert coordinator is not None
    other = m2 if coordinator is m1 else m1
    wait_for(
        lambda: value(m1.metrics_text(), "rebalancer_lease_renew_seconds_count") >= 2,
        timeout=10,
        what="two lease renewals of m1",
    )
    # The store drops one of m1's claims behind its back: m1's next commit is refused, by the
    # store or, if m1 noticed first, by m1 itself.
    victim = m1.assigned()[0]
    session = m1.session
    assert session is not None
    with open_backend(url) as store:
        store.release(session, {victim.resource: victim.epoch})
    with pytest.raises(FencedError):
        m1.commit(victim.resource, {"offset": 1})

    lead = coordinator.metrics_text()
    assert value(lead, "rebalancer_group_members") == 2
    assert value(lead, "rebalancer_group_resources") == len(RESOURCES)
    assert value(lead, "rebalancer_is_coordinator") == 1
    assert value(lead, "rebalancer_coordinator_epoch") >= 1
    assert value(lead, "rebalancer_rebalances_total") >= 2  # m1 alone, then m1 and m2
    rebalances = value(lead, "rebalancer_rebalance_duration_seconds_count")
    assert rebalances == value(lead, "rebalancer_rebalances_total")
    assert 0 <= value(lead, "rebalancer_rebalance_duration_seconds_sum") < 5 * rebalances
    assert value(lead, "rebalancer_resources_moved_total") >= 3  # three went to the joiner
    follower = other.metrics_text()
    assert value(follower, "rebalancer_group_members") == 0  # only the coordinator counts
    assert value(follower, "rebalancer_group_resources") == 0
    assert value(follower, "rebalancer_is_coordinator") == 0
    assert value(follower, "rebalancer_rebalances_total") == 0

    text = m1.metrics_text()
    assert 'rebalancer_owned_resources{group="metered",member="m1"}' in text
    assert value(text, "rebalancer_fenced_writes_total") == 1
    assert value(text, "rebalancer_ownership_events_total", kind="fenced") in (0, 1)
    with pytest.raises(FencedError):
        m1.commit("no-such-resource", {"offset": 1})
    assert value(m1.metrics_text(), "rebalancer_fenced_writes_total") == 2
    assert value(text, "rebalancer_ownership_events_total", kind="acquired") >= 3
    renewals = value(text, "rebalancer_lease_renew_seconds_count")
    assert 0 < value(text, "rebalancer_lease_renew_seconds_sum") < renewals * 1.0
    assert value(text, "rebalancer_lease_renew_seconds_bucket", le="+Inf") == renewals
    m2_owned = value(m2.metrics_text(), "rebalancer_owned_resources")
    assert m2_owned == len(m2.assigned())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_metrics_over_http_on_metrics_port(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/groups.db"
    port = free_port()
    with Member(config(url, "m1", metrics_port=str(port)), resources=["a", "b"]) as member:
        assert member.wait_until(lambda m: len(m.assigned()) == 2, timeout=15)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            body = answer.read().decode()
        assert value(body, "rebalancer_owned_resources") == 2
    with pytest.raises(urllib.error.URLError, match="refused"):  # closed with the member
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_a_taken_metrics_port_is_a_warning_with_a_fallback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite://{tmp_path}/groups.db"
    with socket.socket() as holder:  # another driver on this host holds the port
        holder.bind(("0.0.0.0", 0))  # noqa: S104 - the member binds every address too
        holder.listen()
        port = int(holder.getsockname()[1])
        caplog.set_level(logging.WARNING, logger="rebalancer_spark.metrics")
        with Member(config(url, "m2", metrics_port=port), resources=["a"]) as member:
            assert member.metrics is not None
            bound = member.metrics.port
            assert bound is not None and bound != port
            assert member.wait_until(lambda m: len(m.assigned()) == 1, timeout=15)
            with urllib.request.urlopen(f"http://127.0.0.1:{bound}/metrics", timeout=10) as got:
                assert value(got.read().decode(), "rebalancer_owned_resources") == 1
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(f"metrics port {port} " in w and f":{bound}/metrics" in w for w in warned)


def test_a_failing_listing_shows_in_the_metrics_and_revokes_nothing(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/groups.db"
    broken = threading.Event()

    def discover() -> list[Resource]:
        if broken.is_set():
            raise SourceError("the source's endpoint refused the connection (by the test)")
        return [Resource(r) for r in RESOURCES]

    member = Member(config(url, "m1"), discover=discover, discovery_interval=0.05)
    with member:
        assert member.wait_until(lambda m: len(m.assigned()) == len(RESOURCES), timeout=15)
        assert value(member.metrics_text(), "rebalancer_discovery_failing") == 0
        broken.set()
        wait_for(
            lambda: value(member.metrics_text(), "rebalancer_discovery_failing") == 1,
            timeout=15,
            what="the failing listing to show in the metrics",
        )
        assert "refused the connection" in (member.discovery_error or "")
        assert len(member.assigned()) == len(RESOURCES), "a failed listing revoked resources"
        broken.clear()
        wait_for(
            lambda: value(member.metrics_text(), "rebalancer_discovery_failing") == 0,
            timeout=15,
            what="the metric to clear once the listing works again",
        )


@pytest.mark.parametrize("port", ["99999", "-1", True, "http"])
def test_a_bad_metrics_port_is_refused(tmp_path: Path, port: object) -> None:
    with pytest.raises(ConfigurationError, match=r"metrics_port = .* is not a TCP port"):
        config(f"sqlite://{tmp_path}/g.db", "m1", metrics_port=port)


def test_json_log_lines_carry_group_member_and_epoch(
    pair: tuple[Member, Member, str], log_lines: io.StringIO
) -> None:
    _, m2, _ = pair
    records = [json.loads(line) for line in log_lines.getvalue().splitlines()]
    published = [r for r in records if "published at epoch" in r["message"]]
    assert published, records
    for record in published:
        assert record["group"] == GROUP
        assert record["member"] in ("m1", "m2")
        assert record["epoch"] == int(record["message"].split("published at epoch ")[1].split()[0])
        assert record["thread"] == "rebalancer-coordinator"
        assert record["ts"].endswith("Z") and record["level"] == "INFO"
    threads = [r for r in records if r["thread"].startswith("rebalancer-")]
    assert threads and all(r["member"] in ("m1", "m2") for r in threads)

    wait_for(lambda: m2.log_context.fields()["epoch"], timeout=10, what="m2 to see an epoch")
    adapter = member_logger(logging.getLogger("rebalancer_spark.user"), m2.log_context)
    adapter.info("batch done")
    last = json.loads(log_lines.getvalue().splitlines()[-1])
    assert (last["group"], last["member"], last["message"]) == (GROUP, "m2", "batch done")
    assert last["epoch"] == m2.log_context.fields()["epoch"] is not None


def test_configure_logging_text_and_json() -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    out = io.StringIO()
    try:
        configure_logging("json", stream=out)
        logging.getLogger("rebalancer_spark.x").warning("plain %s", "line")
        configure_logging("text", stream=out)
        context = LogContext("g", "m9", lambda: 7)
        member_logger(logging.getLogger("rebalancer_spark.x"), context).warning("tagged")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    first, second = out.getvalue().splitlines()
    record = json.loads(first)
    assert record["message"] == "plain line" and record["group"] is None
    assert "[group=g member=m9 epoch=7] tagged" in second
    with pytest.raises(ConfigurationError, match="log format 'xml'"):
        configure_logging("xml")


def test_the_job_thread_that_started_the_node_logs_with_the_member_fields(
    tmp_path: Path, log_lines: io.StringIO
) -> None:
    """A Spark job's main loop (run_ingest, QueueLoop, StreamManager) runs on the driver thread
    that started the node: its lines carry group, member and epoch; other threads' do not,
    and neither do the thread's lines once the node stopped."""
    from types import SimpleNamespace

    from rebalancer_spark.spark.options import JobConfig
    from rebalancer_spark.spark.session import start

    spark = SimpleNamespace(
        sparkContext=SimpleNamespace(applicationId="app-1", appName="fake", master="local[1]"),
        stop=lambda: None,
    )
    job = JobConfig(member=config(f"sqlite://{tmp_path}/groups.db", "driver-1"), resources=("a",))
    job_log = logging.getLogger("rebalancer_spark.spark.ingest")
    node = start(spark, job)  # type: ignore[arg-type]
    try:
        assert node.member.wait_until(lambda m: len(m.assigned()) == 1, timeout=15)
        wait_for(lambda: node.member.log_context.fields()["epoch"], timeout=10, what="an epoch")
        job_log.info("batch on the job thread")
        other = threading.Thread(target=lambda: job_log.info("batch on another thread"))
        other.start()
        other.join()
    finally:
        node.stop()
    job_log.info("after the node stopped")

    records = {r["message"]: r for r in map(json.loads, log_lines.getvalue().splitlines())}
    joined = records["member driver-1 joined group metered (spark app app-1)"]
    assert (joined["group"], joined["member"]) == (GROUP, "driver-1")
    mine = records["batch on the job thread"]
    assert (mine["group"], mine["member"]) == (GROUP, "driver-1")
    assert mine["epoch"] == node.member.log_context.fields()["epoch"] is not None
    for message in ("batch on another thread", "after the node stopped"):
        assert records[message]["group"] is records[message]["member"] is None, records[message]


class _SlowSink:
    """An event sink that keeps what it is given, as an audit log whose table is down would."""

    def __init__(self) -> None:
        self.kept: list[object] = []

    def __call__(self, event: object) -> None:
        self.kept.append(event)

    @property
    def backlog(self) -> int:
        return len(self.kept)


def test_stuck_callbacks_and_the_audit_backlog_show_in_the_metrics(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/groups.db"
    release = threading.Event()
    sink = _SlowSink()

    def hang(owned: object) -> None:
        release.wait(30)

    member = Member(
        config(url, "m1", callback_timeout=0.3),
        resources=RESOURCES,
        on_assigned=hang,
        event_sinks=[sink],
    )
    try:
        with member:
            wait_for(
                lambda: member.callback_overruns.get("on_assigned", 0) >= 1,
                timeout=15,
                what="on_assigned to overrun callback_timeout",
            )
            text = member.metrics_text()
            assert value(text, "rebalancer_callback_overruns", callback="on_assigned") >= 1
            assert value(text, "rebalancer_callback_overruns", callback="on_revoked") == 0
            assert sink.backlog > 0, "the member emitted no event"
            assert value(text, "rebalancer_audit_backlog") == sink.backlog == member.audit_backlog()
            with open_backend(url) as store:  # what `status` reads: the published info
                health = wait_for(
                    lambda: member_health(store.state(GROUP)),
                    timeout=15,
                    what="the member to publish its health after a renewal",
                )
            (m1,) = health
            assert m1.callback_overruns.get("on_assigned", 0) >= 1 and m1.audit_backlog > 0
            assert "on_assigned did not return within callback_timeout" in m1.text()
    finally:
        release.set()
