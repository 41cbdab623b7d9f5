"""The queue loop on real brokers, a real group store and Spark: every message once per key in
the output Delta table (read with Spark's Delta reader), redelivery after a kill between write,
commit and ack, a stale owner that neither commits nor acknowledges, a stale owner's batch
refused by the table itself, and a commit that lost a race deduplicated again."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from rebalancer_spark import Member, MemberConfig
from rebalancer_spark.backends import open_backend
from rebalancer_spark.cli import main
from rebalancer_spark.core.status import assignment_statuses, group_status
from rebalancer_spark.sources.queues import QueueMessage
from rebalancer_spark.sources.rabbitmq import RabbitMqSource
from rebalancer_spark.sources.sqs import SqsSource
from rebalancer_spark.spark.delta_commit import Landing
from rebalancer_spark.spark.guard import WriteGuard
from rebalancer_spark.spark.outputs import DeltaOutput
from rebalancer_spark.spark.queue_loop import QueueLoop
from rebalancer_spark.spark.queue_output import QueueOutput, Transform
from tests.servers.cloud import RabbitMq, SqsPrefix
from tests.support.helpers import FlakyStore, GuardWith, read_delta, wait_for

# pyspark's collect() leaves its local socket to the garbage collector (tests/test_audit_delta.py)
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket.*127.0.0.1:pytest.PytestUnraisableExceptionWarning"
)


def _config(tmp_path: Path, group: str, member_id: str, **extra: Any) -> MemberConfig:
    return MemberConfig(
        group=group,
        backend=f"sqlite://{tmp_path}/groups.db?poll=0.005",
        member_id=member_id,
        stability_window=0.02,
        **extra,
    )


def _drain(loop: QueueLoop, done: Any, what: str, timeout: float = 60) -> None:
    """Run batches until ``done()`` holds."""
    wait_for(lambda: (loop.run_once(), done())[1], timeout=timeout, what=what)


def _output(spark: Any, path: Path, group: str, transform: Transform | None = None) -> QueueOutput:
    return QueueOutput(spark, DeltaOutput(spark, str(path), group), transform)


def _rows(spark: Any, path: Path) -> list[tuple[str, str]]:
    """(queue, key) of every row of the output, through Spark's Delta reader, with repeats."""
    return sorted(
        (r["_resource"], r["_key"])
        for r in read_delta(spark, path).select("_resource", "_key").collect()
    )


def _commits(path: Path) -> list[tuple[str, int, int]]:
    """(kind, epoch, batch) of the output's rebalancer commits, oldest first."""
    history = sorted(DeltaTable(str(path)).history(), key=lambda c: int(c["version"]))
    return [
        (c["rebalancer.kind"], int(c["rebalancer.epoch"]), int(c["rebalancer.batch"]))
        for c in history
        if "rebalancer.kind" in c
    ]


def _who(member: Member) -> dict[str, str]:
    session = member.session
    return {
        "member_id": member.member_id,
        "session_id": "" if session is None else session.session_id,
    }


def _one_queue(
    rabbitmq: RabbitMq,
    tmp_path: Path,
    group: str,
    members: list[Member],
    *,
    n: int,
    batch: int,
    member_id: str = "m1",
) -> tuple[str, RabbitMqSource, Member]:
    """A queue of ``n`` messages keyed ``k0``... and its source fetching ``batch`` at a time,
    owned by a started member ``member_id``."""
    queue = rabbitmq.declare("q")
    rabbitmq.publish(queue, [(f"k{i}", b"{}") for i in range(n)])
    source = RabbitMqSource(rabbitmq.source_url(queues=queue, batch=str(batch)))
    member = Member(_config(tmp_path, group, member_id), resources=[queue])
    members.append(member.start())
    wait_for(lambda: member.owns(queue) is not None, timeout=15, what=f"{member_id} to own it")
    return queue, source, member


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for member in reversed(started):
        member.stop(drain=False)


@pytest.mark.timeout(900)  # ~20 Spark batches
def test_every_message_lands_once_per_key_and_is_acked(
    spark: Any, rabbitmq: RabbitMq, tmp_path: Path, group: str, members: list[Member]
) -> None:
    queues = [rabbitmq.declare(f"q{i}") for i in range(3)]
    expected: set[tuple[str, str]] = set()
    for q in queues:
        batch = [(f"{q}-{i}", json.dumps({"i": i}).encode()) for i in range(120)]
        rabbitmq.publish(q, batch)
        rabbitmq.publish(q, batch[:10])  # a producer that sent ten of them twice
        expected |= {(q, key) for key, _ in batch}
    source = RabbitMqSource(rabbitmq.source_url(queues=",".join(queues), batch="25"))
    member = Member(_config(tmp_path, group, "m1"), discover=source.discover)
    members.append(member.start())
    wait_for(lambda: len(member.assigned()) == 3, timeout=15, what="the member to own 3 queues")
    loop = QueueLoop(member, source, _output(spark, tmp_path / "out", group))
    try:
        _drain(
            loop,
            lambda: all(rabbitmq.depth(q) == 0 for q in queues),
            "every queue to be drained",
            timeout=180,
        )
    finally:
        loop.close()
    got = _rows(spark, tmp_path / "out")
    assert len(got) == len(set(got)), "a key written twice"
    assert set(got) == expected
    assert loop.stats.messages == 3 * 130 and loop.stats.duplicates == 30
    with open_backend(member.config.backend) as store:
        progress = store.progress(group, queues)
    assert all(p.value["messages"] == 130 for p in progress.values())


def test_the_queue_lag_reaches_the_progress_status_assignments_and_metrics(
    spark: Any,
    rabbitmq: RabbitMq,
    tmp_path: Path,
    group: str,
    members: list[Member],
    capsys: pytest.CaptureFixture[str],
) -> None:
    queue, source, member = _one_queue(rabbitmq, tmp_path, group, members, n=60, batch=25)
    assert member.metrics is not None
    labels = {"group": group, "member": "m1", "resource": queue}

    def lag() -> tuple[int | None, int | None, float | None]:
        with open_backend(member.config.backend) as store:
            state, progress = store.state(group), store.progress(group, [queue])
        (row,) = assignment_statuses(state, progress)
        assert member.metrics is not None
        gauge = member.metrics.registry.get_sample_value("rebalancer_pending_messages", labels)
        return row.pending_messages, group_status(state, progress).pending_messages, gauge

    loop = QueueLoop(member, source, _output(spark, tmp_path / "out", group))
    try:
        assert loop.run_once()
        assert lag() == (35, 35, 35)  # 25 written and acknowledged, 35 left ready
        _drain(loop, lambda: rabbitmq.depth(queue) == 0, "the queue to be drained", timeout=120)
    finally:
        loop.close()
    assert lag() == (0, 0, 0)
    backend = ["--group", group, "--backend", member.config.backend]
    assert main(["assignments", *backend]) == 0
    assert "0 msg" in capsys.readouterr().out
    assert main(["status", *backend, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pending"]["messages"] == 0


def test_a_batch_written_but_not_committed_is_redelivered_and_not_written_again(
    spark: Any, rabbitmq: RabbitMq, tmp_path: Path, group: str, members: list[Member]
) -> None:
    """A job killed after its Delta commit and before its progress commit: the messages come
    back, the next batch ids continue after the table's, and the keys in the table are not
    written again."""
    queue, source, member = _one_queue(rabbitmq, tmp_path, group, members, n=40, batch=15)
    output = _output(spark, tmp_path / "out", group)
    epoch = member.owns(queue).epoch  # type: ignore[union-attr]
    # the dying attempt: it fetched 15, committed them to the table, and died holding them
    dead = source.consumer(queue)
    held = dead.fetch(15)
    landing = output.write(queue, epoch, 1, held, _who(member), GuardWith())
    assert landing == (Landing.COMMITTED, 15)
    dead.close()  # what the broker does when the process dies
    loop = QueueLoop(member, source, output)
    try:
        _drain(loop, lambda: rabbitmq.depth(queue) == 0, "the queue to be drained", timeout=120)
    finally:
        loop.close()
    assert _rows(spark, tmp_path / "out") == sorted((queue, f"k{i}") for i in range(40))
    assert loop.stats.written == 25 and loop.stats.duplicates == 15
    batches = [b for kind, _, b in _commits(tmp_path / "out") if kind == "data"]
    assert batches[0] == 1 and all(b > 1 for b in batches[1:]), batches


def test_a_stale_owner_neither_commits_nor_acks_and_its_batch_goes_to_the_new_owner(
    spark: Any, rabbitmq: RabbitMq, tmp_path: Path, group: str, members: list[Member]
) -> None:
    """A's Delta commit landed, then A was cut off: its progress commit is refused, it does
    not acknowledge, and b, getting the messages again, writes none of them twice."""
    queue = rabbitmq.declare("q")
    rabbitmq.publish(queue, [(f"k{i}", b"{}") for i in range(20)])
    source = RabbitMqSource(rabbitmq.source_url(queues=queue, batch="20"))
    config_a = _config(tmp_path, group, "a", session_timeout=1.0)
    flaky = FlakyStore(open_backend(config_a.backend))
    a = Member(config_a, resources=[queue], backend=flaky)
    members.append(a.start())
    wait_for(lambda: a.owns(queue) is not None, timeout=15, what="a to own the queue")
    b = Member(_config(tmp_path, group, "b", session_timeout=1.0))
    members.append(b.start())
    epoch_a = a.owns(queue).epoch  # type: ignore[union-attr]

    class CutOffAfterWriting(QueueOutput):
        """A's write lands, then A is cut off from the store until b owns the queue."""

        def write(self, *args: Any, **kwargs: Any) -> tuple[Landing, int]:
            landed = super().write(*args, **kwargs)
            flaky.partitioned.set()
            wait_for(lambda: b.owns(queue) is not None, timeout=20, what="b to take the queue")
            return landed

    out = tmp_path / "out"
    loop_a = QueueLoop(a, source, CutOffAfterWriting(spark, DeltaOutput(spark, str(out), group)))
    assert loop_a.run_once()
    assert loop_a.stats.fenced == 1 and loop_a.stats.batches == 0
    # A never acknowledged: all 20 are back in the queue (A closed its consumer)
    wait_for(lambda: rabbitmq.depth(queue) == 20, timeout=10, what="A's 20 messages requeued")
    assert b.owns(queue).epoch > epoch_a  # type: ignore[union-attr]
    loop_b = QueueLoop(b, source, _output(spark, out, group))
    try:
        _drain(loop_b, lambda: rabbitmq.depth(queue) == 0, "b to drain the queue", timeout=120)
    finally:
        loop_b.close()
    assert loop_b.stats.messages == 20 and loop_b.stats.written == 0  # A's rows were kept
    assert _rows(spark, out) == sorted((queue, f"k{i}") for i in range(20))
    with open_backend(config_a.backend) as store:
        progress = store.progress(group, [queue])[queue]
    assert progress.member_id == "b" and progress.value["messages"] == 20
    flaky.partitioned.clear()


def test_a_stale_owners_batch_is_refused_by_the_table_and_its_messages_land_once(
    spark: Any,
    rabbitmq: RabbitMq,
    tmp_path: Path,
    group: str,
    members: list[Member],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A zombie: A's files are written and its last ownership check passed, then A stalls
    until b owns the queue and has fenced the table. A's Delta commit is refused by the table
    itself; A acknowledges nothing, and b writes each message once."""
    queue = rabbitmq.declare("q")
    rabbitmq.publish(queue, [(f"k{i}", b"{}") for i in range(20)])
    source = RabbitMqSource(rabbitmq.source_url(queues=queue, batch="10"))
    config_a = _config(tmp_path, group, "a", session_timeout=1.0)
    flaky = FlakyStore(open_backend(config_a.backend))
    a = Member(config_a, resources=[queue], backend=flaky)
    members.append(a.start())
    wait_for(lambda: a.owns(queue) is not None, timeout=15, what="a to own the queue")
    epoch_a = a.owns(queue).epoch  # type: ignore[union-attr]
    out = tmp_path / "out"
    b = Member(_config(tmp_path, group, "b", session_timeout=1.0))
    loop_b = QueueLoop(b, source, _output(spark, out, group))

    def stall_until_b_fenced() -> None:
        flaky.partitioned.set()
        wait_for(lambda: b.owns(queue) is not None, timeout=30, what="b to take the queue")
        loop_b.run_once()  # b's first look: it fences the table (A holds the messages)
        assert ("fence", b.owns(queue).epoch, 1) in _commits(out)  # type: ignore[union-attr]

    class StallsBeforeItsCommit(QueueOutput):
        def write(self, resource: str, epoch: int, batch: int, messages: Sequence[QueueMessage],
                  who: Mapping[str, str], guard: WriteGuard) -> tuple[Landing, int]:  # fmt: skip
            if batch == 1:
                return super().write(resource, epoch, batch, messages, who, guard)
            # The last look passed (A still owns the queue and holds it), right before the
            # Delta commit, A stalls: its lease lapses, which no hold can keep.
            stalls = GuardWith(guard, inside_hold=stall_until_b_fenced)
            return super().write(resource, epoch, batch, messages, who, stalls)

    loop_a = QueueLoop(a, source, StallsBeforeItsCommit(spark, DeltaOutput(spark, str(out), group)))
    try:
        assert loop_a.run_once()  # batch 1: written, committed, acknowledged
        assert loop_a.stats.batches == 1
        members.append(b.start())
        assert loop_a.run_once()  # batch 2: written by Spark, refused by the table
        assert loop_a.stats.fenced == 1 and loop_a.stats.batches == 1
        assert "refused by the table" in caplog.text
    finally:
        loop_a.close()
    wait_for(lambda: rabbitmq.depth(queue) == 10, timeout=10, what="A's second batch requeued")
    try:
        _drain(loop_b, lambda: rabbitmq.depth(queue) == 0, "b to drain the queue", timeout=120)
    finally:
        loop_b.close()
    epoch_b = b.owns(queue).epoch  # type: ignore[union-attr]
    assert _rows(spark, out) == sorted((queue, f"k{i}") for i in range(20))
    commits = _commits(out)
    assert commits[:2] == [("data", epoch_a, 1), ("fence", epoch_b, 1)], commits
    assert all(epoch == epoch_b for _, epoch, _ in commits[1:]), "no commit of A after the fence"
    assert loop_b.stats.written == 10
    # A's refused files are in the table's directory, not in the table
    parquet = list((out / f"_resource={queue}").rglob("*.parquet"))
    assert len(parquet) > len([c for c in commits if c[0] == "data"])
    flaky.partitioned.clear()


def test_a_commit_that_lost_a_race_is_deduplicated_again_against_the_winner(
    spark: Any, tmp_path: Path, group: str
) -> None:
    """Between the key check of an attempt and its commit, another commit of the queue lands:
    the attempt's files are not committed; it checks the keys again on the new version."""
    out = tmp_path / "out"
    messages = [QueueMessage(f"k{i}", b"{}", i) for i in range(10)]
    other = _output(spark, out, group)
    assert other.write("q", 1, 1, messages[:2], {}, GuardWith()) == (Landing.COMMITTED, 2)
    prepared: list[int] = []

    class Raced(QueueOutput):
        def _without_present(self, frame: Any, dataset: Any, resource: str, keys: Any) -> Any:
            prepared.append(1)
            if len(prepared) == 1:  # the winner commits after this attempt read the table
                assert other.write("q", 1, 2, messages[:5], {}, GuardWith()) == (
                    Landing.COMMITTED,
                    3,
                )
            return super()._without_present(frame, dataset, resource, keys)

    raced = Raced(spark, DeltaOutput(spark, str(out), group))
    assert raced.write("q", 1, 3, messages, {}, GuardWith()) == (Landing.COMMITTED, 5)
    assert len(prepared) == 2
    assert _rows(spark, out) == sorted(("q", f"k{i}") for i in range(10))
    assert [c[2] for c in _commits(out)] == [1, 2, 3]
    # a batch whose rows are all in the table commits nothing
    assert raced.write("q", 1, 4, messages, {}, GuardWith()) == (Landing.EMPTY, 0)
    assert [c[2] for c in _commits(out)] == [1, 2, 3]


def test_the_loop_consumes_sqs_queues_and_deletes_after_commit(
    spark: Any, sqs_prefix: SqsPrefix, tmp_path: Path, group: str, members: list[Member]
) -> None:
    urls = [sqs_prefix.create(f"q{i}") for i in range(2)]
    for n, url in enumerate(urls):
        for start in range(0, 30, 10):
            sqs_prefix.client.send_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(j), "MessageBody": json.dumps({"id": f"{n}-{j}"})}
                    for j in range(start, start + 10)
                ],
            )
    source = SqsSource(
        f"sqs://us-east-1/{sqs_prefix.prefix}?endpoint_url={sqs_prefix.endpoint}"
        "&dedupe=json:id&batch=12&visibility_timeout=30"
    )
    member = Member(_config(tmp_path, group, "m1"), discover=source.discover)
    members.append(member.start())
    wait_for(lambda: len(member.assigned()) == 2, timeout=15, what="the member to own 2 queues")
    loop = QueueLoop(member, source, _output(spark, tmp_path / "out", group))

    def empty(url: str) -> bool:
        attrs = sqs_prefix.client.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return all(v == "0" for v in attrs.values())

    try:
        _drain(
            loop, lambda: all(empty(u) for u in urls), "both SQS queues to be empty", timeout=120
        )
    finally:
        loop.close()
    keys = [k for _, k in _rows(spark, tmp_path / "out")]
    assert keys == sorted(f"{n}-{j}" for n in range(2) for j in range(30))


def test_a_spark_job_transforms_batches_and_writes_them_once(
    spark: Any, rabbitmq: RabbitMq, tmp_path: Path, group: str
) -> None:
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as sf

    from rebalancer_spark.spark.options import JobConfig
    from rebalancer_spark.spark.queues import run_queue_ingest
    from rebalancer_spark.spark.session import start

    queues = [rabbitmq.declare(f"q{i}") for i in range(2)]
    for q in queues:
        rabbitmq.publish(q, [(f"{q}-{i}", json.dumps({"n": i}).encode()) for i in range(30)])
    url = rabbitmq.source_url(queues=",".join(queues), batch="20")
    source = RabbitMqSource(url)
    out = tmp_path / "out"
    job = JobConfig(
        member=_config(tmp_path, group, "driver-1", session_timeout=3.0),
        source=url,
        output=str(out),
        audit=str(tmp_path / "audit"),
        poll_interval=0.05,
        discovery_interval=0.2,
    )

    def transform(df: DataFrame) -> DataFrame:
        parsed = sf.from_json(sf.col("_body").cast("string"), "n INT")
        return df.select("_key", parsed.getField("n").alias("n"))

    node = start(spark, job, source)
    stop = threading.Event()
    result: list[Any] = []
    runner = threading.Thread(
        target=lambda: result.append(
            run_queue_ingest(spark, node, source, str(out), stop, transform=transform)
        )
    )
    runner.start()
    try:
        wait_for(
            lambda: (
                all(rabbitmq.depth(q) == 0 for q in queues)
                and (out / "_delta_log").exists()
                and len(_rows(spark, out)) == 60
            ),
            timeout=180,
            what="both queues ingested",
        )
    finally:
        stop.set()
        runner.join(60)
        node.stop()
    df = read_delta(spark, out)
    assert sorted(df.columns) == ["_batch", "_key", "_resource", "n"]
    rows = sorted((r["_key"], r["n"]) for r in df.collect())
    assert rows == sorted((f"{q}-{i}", i) for q in queues for i in range(30))
    assert result and result[0].fenced == 0 and result[0].messages == 60
    from rebalancer_spark.audit import verify_table

    assert verify_table(str(tmp_path / "audit"), group=group).ok


def test_a_queue_revoked_mid_batch_is_not_written_and_its_messages_go_to_the_new_owner(
    spark: Any, rabbitmq: RabbitMq, tmp_path: Path, group: str, members: list[Member]
) -> None:
    queue, source, a = _one_queue(rabbitmq, tmp_path, group, members, n=30, batch=10, member_id="a")
    b = Member(_config(tmp_path, group, "b"))
    members.append(b.start())
    leaving = threading.Thread(target=a.stop)  # a graceful leave revokes the queue from a

    def revoke_during_the_batch(df: Any) -> Any:
        leaving.start()
        wait_for(lambda: b.owns(queue) is not None, timeout=20, what="b to get the queue")
        return df

    out = tmp_path / "out"
    output_a = _output(spark, out, group)
    loop_a = QueueLoop(a, source, output_a)
    try:
        assert loop_a.run_once()  # batch 1: written, committed, acknowledged
        assert loop_a.open_consumers == [(queue, a.owns(queue).epoch)]  # type: ignore[union-attr]
        output_a.transform = revoke_during_the_batch
        assert loop_a.run_once()  # batch 2: revoked before it was written
        assert loop_a.stats.fenced == 1 and loop_a.stats.written == 10
        assert loop_a.open_consumers == []
    finally:
        loop_a.close()
        leaving.join(30)
    wait_for(lambda: rabbitmq.depth(queue) == 20, timeout=10, what="a's second batch requeued")
    loop_b = QueueLoop(b, source, _output(spark, out, group))
    try:
        _drain(loop_b, lambda: rabbitmq.depth(queue) == 0, "b to drain the queue", timeout=120)
        assert loop_b.open_consumers != []
        b.stop(drain=False)  # b owns nothing now: its next look closes the consumer
        assert not loop_b.run_once()
        assert loop_b.open_consumers == []
    finally:
        loop_b.close()
    assert loop_b.stats.written == 20 and loop_b.stats.duplicates == 0
    assert _rows(spark, out) == sorted((queue, f"k{i}") for i in range(30))
