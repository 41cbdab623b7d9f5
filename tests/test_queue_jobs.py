"""The queue jobs under spark-submit (slow: one Spark application each)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from rebalancer_spark.audit import verify_table
from rebalancer_spark.audit.rows import load_rows
from rebalancer_spark.backends import open_backend
from rebalancer_spark.spark.packages import spark_submit_command
from tests.servers.cloud import RabbitMq, SqsPrefix
from tests.support.helpers import JOB_CONF, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _keys(output: Path) -> list[str]:
    """Every ``_key`` in the output Delta table, with repeats, sorted (read with deltalake:
    this test process runs no Spark)."""
    if not (output / "_delta_log").exists():
        return []
    column = DeltaTable(str(output)).to_pyarrow_table(columns=["_key"]).column("_key")
    return sorted(column.to_pylist())


def _submit(job: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            spark_submit_command(ROOT / "jobs" / job, *args, conf=JOB_CONF),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def _finish(proc: subprocess.Popen[bytes], log: Path, backend: str, group: str) -> str:
    """SIGTERM to the Python driver, where the member lives (spark-submit's JVM does not pass
    it on): a graceful drain; the job must exit 0. Returns the job's output."""
    if proc.poll() is None:
        with open_backend(backend) as store:
            pids = wait_for(
                lambda: {int(m.info["pid"]) for m in store.state(group).members.values()},
                timeout=30,
                what="the driver's member in the store",
            )
        assert len(pids) == 1, pids
        os.kill(pids.pop(), signal.SIGTERM)
    try:
        code = proc.wait(90)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        raise
    text = log.read_text(errors="replace")
    assert code == 0, text[-3000:]
    return text


def _backend(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path}/groups.db"


def _common(tmp_path: Path, group: str, source: str) -> list[str]:
    return [
        "--group",
        group,
        "--backend",
        _backend(tmp_path),
        "--source",
        source,
        "--output",
        str(tmp_path / "out"),
        "--audit",
        str(tmp_path / "audit"),
        "--poll-interval",
        "0.2s",
        "--session-timeout",
        "10s",
    ]


@pytest.mark.timeout(1200)  # two Spark applications on a shared machine
def test_spark_submit_ingest_rabbitmq_and_sqs(
    rabbitmq: RabbitMq, sqs_prefix: SqsPrefix, tmp_path: Path, group: str
) -> None:
    """Both jobs at once (two Spark applications side by side take less time than in turn)."""
    queues = [rabbitmq.declare(f"q{i}") for i in range(2)]
    for q in queues:
        rabbitmq.publish(q, [(f"{q}-{i}", b'{"n": 1}') for i in range(40)])
    url = sqs_prefix.create("q")
    for start in range(0, 30, 10):
        sqs_prefix.client.send_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(start, start + 10)],
        )
    rabbit_dir, sqs_dir = tmp_path / "rabbitmq", tmp_path / "sqs"
    rabbit_dir.mkdir()
    sqs_dir.mkdir()
    rabbit_source = rabbitmq.source_url(queues=",".join(queues), batch="15")
    sqs_source = (
        f"sqs://us-east-1/{sqs_prefix.prefix}?endpoint_url={sqs_prefix.endpoint}&dedupe=body"
    )
    rabbit_job = _submit(
        "ingest_rabbitmq.py", _common(rabbit_dir, group, rabbit_source), rabbit_dir / "job.log"
    )
    sqs_job = _submit("ingest_sqs.py", _common(sqs_dir, group, sqs_source), sqs_dir / "job.log")
    rabbit_out, sqs_out = rabbit_dir / "out", sqs_dir / "out"
    texts: dict[str, str] = {}
    try:
        wait_for(
            lambda: (
                rabbit_job.poll() is not None
                or sqs_job.poll() is not None
                or (len(_keys(rabbit_out)) == 80 and len(_keys(sqs_out)) == 30)
            ),
            timeout=900,
            what="the jobs to write 80 RabbitMQ and 30 SQS messages",
            interval=0.5,
        )
        wait_for(
            lambda: rabbit_job.poll() is not None or all(rabbitmq.depth(q) == 0 for q in queues),
            timeout=30,
            what="the RabbitMQ job to acknowledge every message",
            interval=0.2,
        )
    finally:
        try:
            texts["rabbitmq"] = _finish(
                rabbit_job, rabbit_dir / "job.log", _backend(rabbit_dir), group
            )
        finally:
            texts["sqs"] = _finish(sqs_job, sqs_dir / "job.log", _backend(sqs_dir), group)
    rabbit_text, sqs_text = texts["rabbitmq"], texts["sqs"]
    assert "guest:guest" not in rabbit_text  # the password is redacted in the printed options
    # every message counted once in the acknowledged batches (a batch fenced under load would
    # be redelivered and counted when acknowledged)
    assert re.search(r"stopped: \d+ batches, 80 messages", rabbit_text), rabbit_text[-2000:]
    assert _keys(rabbit_out) == sorted(f"{q}-{i}" for q in queues for i in range(40))
    history = DeltaTable(str(rabbit_out)).history()
    kinds = [c.get("rebalancer.kind") for c in history if c.get("operation") != "CREATE TABLE"]
    assert kinds and set(kinds) <= {"data", "fence"}, history  # every commit is fenced
    assert verify_table(str(rabbit_dir / "audit"), group=group).ok
    # each queue's lag, sampled into the audit table: behind at its first fetch, then drained
    rows = load_rows(str(rabbit_dir / "audit"), group=group).rows
    for q in queues:
        lag = [r["pending_messages"] for r in rows if r["kind"] == "lag" and r["resource"] == q]
        assert lag and lag[0] > 0 and lag[-1] == 0, (q, lag)  # type: ignore[operator]
    assert re.search(r"stopped: \d+ batches, 30 messages", sqs_text), sqs_text[-2000:]
    keys = _keys(sqs_out)
    assert len(keys) == len(set(keys)) == 30
