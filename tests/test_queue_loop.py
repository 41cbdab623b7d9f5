"""The queue loop on real brokers and a real group store: every message once per key in the
output, redelivery after a kill between write, commit and ack, and a stale owner that neither
commits nor acknowledges."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from rebalancer_spark import Member, MemberConfig
from rebalancer_spark.backends import open_backend
from rebalancer_spark.sources.rabbitmq import RabbitMqSource
from rebalancer_spark.sources.sqs import SqsSource
from rebalancer_spark.spark.queue_loop import QueueLoop, messages_table
from rebalancer_spark.spark.queue_output import KeyedDeltaOutput
from tests.helpers import FlakyStore, wait_for
from tests.servers.cloud import RabbitMq, SqsPrefix


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


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for member in reversed(started):
        member.stop(drain=False)


def test_every_message_lands_once_per_key_and_is_acked(
    rabbitmq: RabbitMq, tmp_path: Path, group: str, members: list[Member]
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
    output = KeyedDeltaOutput(str(tmp_path / "out"))
    loop = QueueLoop(member, source, output)
    try:
        _drain(
            loop,
            lambda: all(rabbitmq.depth(q) == 0 for q in queues),
            "every queue to be drained",
        )
    finally:
        loop.close()
    rows = DeltaTable(output.path).to_pyarrow_table(columns=["_resource", "_key"]).to_pylist()
    got = [(r["_resource"], r["_key"]) for r in rows]
    assert len(got) == len(set(got)), "a key written twice"
    assert set(got) == expected
    assert loop.stats.messages == 3 * 130 and loop.stats.duplicates == 30
    with open_backend(member.config.backend) as store:
        progress = store.progress(group, queues)
    assert all(p.value["messages"] == 130 for p in progress.values())


def test_a_batch_written_but_not_committed_is_redelivered_and_not_written_again(
    rabbitmq: RabbitMq, tmp_path: Path, group: str, members: list[Member]
) -> None:
    """A job killed after writing its batch and before committing: the messages come back and
    the new owner's write skips every key already in the table."""
    queue = rabbitmq.declare("q")
    rabbitmq.publish(queue, [(f"k{i}", b"{}") for i in range(40)])
    source = RabbitMqSource(rabbitmq.source_url(queues=queue, batch="15"))
    output = KeyedDeltaOutput(str(tmp_path / "out"))
    # the dead owner's part: it fetched 15, wrote them, and died holding them unacknowledged
    dead = source.consumer(queue)
    held = dead.fetch(15)
    assert output.write(queue, messages_table(queue, held)) == 15
    dead.close()  # what the broker does when the process dies
    member = Member(_config(tmp_path, group, "m1"), resources=[queue])
    members.append(member.start())
    wait_for(lambda: member.owns(queue) is not None, timeout=15, what="the queue to be owned")
    loop = QueueLoop(member, source, output)
    try:
        _drain(loop, lambda: rabbitmq.depth(queue) == 0, "the queue to be drained")
    finally:
        loop.close()
    assert output.keys(queue) == sorted(f"k{i}" for i in range(40))
    assert loop.stats.written == 25 and loop.stats.duplicates == 15


def test_a_stale_owner_neither_commits_nor_acks_and_its_batch_goes_to_the_new_owner(
    rabbitmq: RabbitMq, tmp_path: Path, group: str, members: list[Member]
) -> None:
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

    class CutOffAfterWriting(KeyedDeltaOutput):
        """A's write succeeds, then A is cut off from the store until b owns the queue."""

        def write(self, resource: str, table: pa.Table) -> int:
            written = super().write(resource, table)
            flaky.partitioned.set()
            wait_for(lambda: b.owns(queue) is not None, timeout=20, what="b to take the queue")
            return written

    output_path = str(tmp_path / "out")
    loop_a = QueueLoop(a, source, CutOffAfterWriting(output_path))
    assert loop_a.run_once()
    assert loop_a.stats.fenced == 1 and loop_a.stats.batches == 0
    # A never acknowledged: all 20 are back in the queue (A closed its consumer)
    wait_for(lambda: rabbitmq.depth(queue) == 20, timeout=10, what="A's 20 messages requeued")
    assert b.owns(queue).epoch > epoch_a  # type: ignore[union-attr]
    loop_b = QueueLoop(b, source, KeyedDeltaOutput(output_path))
    try:
        _drain(loop_b, lambda: rabbitmq.depth(queue) == 0, "b to drain the queue")
    finally:
        loop_b.close()
    assert loop_b.stats.messages == 20 and loop_b.stats.written == 0  # A's rows were kept
    assert KeyedDeltaOutput(output_path).keys() == sorted(f"k{i}" for i in range(20))
    with open_backend(config_a.backend) as store:
        progress = store.progress(group, [queue])[queue]
    assert progress.member_id == "b" and progress.value["messages"] == 20
    flaky.partitioned.clear()


def test_the_loop_consumes_sqs_queues_and_deletes_after_commit(
    sqs_prefix: SqsPrefix, tmp_path: Path, group: str, members: list[Member]
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
    output = KeyedDeltaOutput(str(tmp_path / "out"))
    loop = QueueLoop(member, source, output)

    def empty(url: str) -> bool:
        attrs = sqs_prefix.client.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return all(v == "0" for v in attrs.values())

    try:
        _drain(loop, lambda: all(empty(u) for u in urls), "both SQS queues to be empty")
    finally:
        loop.close()
    assert output.keys() == sorted(f"{n}-{j}" for n in range(2) for j in range(30))


# Spark's toArrow() leaves its local socket to the garbage collector.
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket.*127.0.0.1:pytest.PytestUnraisableExceptionWarning"
)
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
    job = JobConfig(
        member=_config(tmp_path, group, "driver-1", session_timeout=3.0),
        source=url,
        output=str(tmp_path / "out"),
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
            run_queue_ingest(spark, node, source, str(tmp_path / "out"), stop, transform=transform)
        )
    )
    runner.start()
    try:
        wait_for(
            lambda: (
                all(rabbitmq.depth(q) == 0 for q in queues)
                and len(KeyedDeltaOutput(str(tmp_path / "out")).keys()) == 60
            ),
            timeout=120,
            what="both queues ingested",
        )
    finally:
        stop.set()
        runner.join(60)
        node.stop()
    table = DeltaTable(str(tmp_path / "out")).to_pyarrow_table()
    assert sorted(table.column_names) == ["_key", "_resource", "n"]
    rows = sorted(zip(table.column("_key").to_pylist(), table.column("n").to_pylist(), strict=True))
    assert rows == sorted((f"{q}-{i}", i) for q in queues for i in range(30))
    assert result and result[0].fenced == 0 and result[0].messages == 60
    from rebalancer_spark.audit import verify_table

    assert verify_table(str(tmp_path / "audit"), group=group).ok


def test_a_queue_revoked_mid_batch_is_not_written_and_its_messages_go_to_the_new_owner(
    rabbitmq: RabbitMq, tmp_path: Path, group: str, members: list[Member]
) -> None:
    queue = rabbitmq.declare("q")
    rabbitmq.publish(queue, [(f"k{i}", b"{}") for i in range(30)])
    source = RabbitMqSource(rabbitmq.source_url(queues=queue, batch="10"))
    a = Member(_config(tmp_path, group, "a"), resources=[queue])
    members.append(a.start())
    wait_for(lambda: a.owns(queue) is not None, timeout=15, what="a to own the queue")
    b = Member(_config(tmp_path, group, "b"))
    members.append(b.start())
    leaving = threading.Thread(target=a.stop)  # a graceful leave revokes the queue from a

    def revoke_during_the_batch(resource: str, epoch: int, table: pa.Table) -> pa.Table:
        leaving.start()
        wait_for(lambda: b.owns(queue) is not None, timeout=20, what="b to get the queue")
        return table

    output_path = str(tmp_path / "out")
    loop_a = QueueLoop(a, source, KeyedDeltaOutput(output_path))
    try:
        assert loop_a.run_once()  # batch 1: written, committed, acknowledged
        assert loop_a.open_consumers == [(queue, a.owns(queue).epoch)]  # type: ignore[union-attr]
        loop_a.process = revoke_during_the_batch
        assert loop_a.run_once()  # batch 2: revoked before it was written
        assert loop_a.stats.fenced == 1 and loop_a.stats.written == 10
        assert loop_a.open_consumers == []
    finally:
        loop_a.close()
        leaving.join(30)
    wait_for(lambda: rabbitmq.depth(queue) == 20, timeout=10, what="a's second batch requeued")
    loop_b = QueueLoop(b, source, KeyedDeltaOutput(output_path))
    try:
        _drain(loop_b, lambda: rabbitmq.depth(queue) == 0, "b to drain the queue")
        assert loop_b.open_consumers != []
        b.stop(drain=False)  # b owns nothing now: its next look closes the consumer
        assert not loop_b.run_once()
        assert loop_b.open_consumers == []
    finally:
        loop_b.close()
    assert loop_b.stats.written == 20 and loop_b.stats.duplicates == 0
    assert KeyedDeltaOutput(output_path).keys() == sorted(f"k{i}" for i in range(30))
