"""The queue jobs under spark-submit (slow: one Spark application each)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rebalancer_spark.audit import verify_table
from rebalancer_spark.backends import open_backend
from rebalancer_spark.spark.queue_output import KeyedDeltaOutput
from tests.helpers import wait_for
from tests.servers.cloud import RabbitMq, SqsPrefix

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _submit(job: str, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                str(Path(sys.executable).parent / "spark-submit"),
                "--master",
                "local[1]",
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                "spark.driver.memory=512m",
                str(ROOT / "jobs" / job),
                *args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def _finish(proc: subprocess.Popen[bytes], log: Path, backend: str, group: str) -> str:
    """SIGTERM to the Python driver, where the member lives (spark-submit's JVM does not pass
    it on): a graceful drain; the job must exit 0. Returns the job's output."""
    if proc.poll() is None:
        with open_backend(backend) as store:
            pids = [int(m.info["pid"]) for m in store.state(group).members.values()]
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGTERM)
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
        "4s",
    ]


def test_spark_submit_ingest_rabbitmq(rabbitmq: RabbitMq, tmp_path: Path, group: str) -> None:
    queues = [rabbitmq.declare(f"q{i}") for i in range(2)]
    for q in queues:
        rabbitmq.publish(q, [(f"{q}-{i}", b'{"n": 1}') for i in range(40)])
    log = tmp_path / "job.log"
    source = rabbitmq.source_url(queues=",".join(queues), batch="15")
    proc = _submit("ingest_rabbitmq.py", _common(tmp_path, group, source), log)
    output = KeyedDeltaOutput(str(tmp_path / "out"))
    try:
        wait_for(
            lambda: proc.poll() is not None or len(output.keys()) == 80,
            timeout=150,
            what="the job to write 80 messages",
            interval=0.5,
        )
        wait_for(
            lambda: proc.poll() is not None or all(rabbitmq.depth(q) == 0 for q in queues),
            timeout=30,
            what="the job to acknowledge every message",
            interval=0.2,
        )
    finally:
        text = _finish(proc, log, _backend(tmp_path), group)
    assert "guest:guest" not in text  # the password is redacted in the printed options
    assert "80 messages, 80 rows written, 0 duplicates dropped, 0 fenced" in text, text[-2000:]
    assert output.keys() == sorted(f"{q}-{i}" for q in queues for i in range(40))
    assert verify_table(str(tmp_path / "audit"), group=group).ok


def test_spark_submit_ingest_sqs(sqs_prefix: SqsPrefix, tmp_path: Path, group: str) -> None:
    url = sqs_prefix.create("q")
    for start in range(0, 30, 10):
        sqs_prefix.client.send_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(i), "MessageBody": f"m{i}"} for i in range(start, start + 10)],
        )
    log = tmp_path / "job.log"
    source = f"sqs://us-east-1/{sqs_prefix.prefix}?endpoint_url={sqs_prefix.endpoint}&dedupe=body"
    proc = _submit("ingest_sqs.py", _common(tmp_path, group, source), log)
    output = KeyedDeltaOutput(str(tmp_path / "out"))
    try:
        wait_for(
            lambda: proc.poll() is not None or len(output.keys()) == 30,
            timeout=150,
            what="the job to write 30 messages",
            interval=0.5,
        )
    finally:
        text = _finish(proc, log, _backend(tmp_path), group)
    assert "30 messages, 30 rows written" in text, text[-2000:]
    assert len(set(output.keys())) == 30
