"""Torture: queue workers killed with -9 at random moments while they drain several queues.

Three member processes (``rebalancer_spark.testing.queue_worker``: the queue loop and the Spark
output of the queue jobs, each in a small Spark application of its own) share six RabbitMQ
queues of 200 messages each (or four SQS queues of 200, with a 2 s visibility timeout).
Whenever the messages left fall below the next of a few random thresholds, a random worker is
killed with -9, wherever it is (fetching, Spark writing the batch, the Delta commit, committing,
acknowledging), and a new worker joins. At the end every message is in the output Delta table
exactly once (read with deltalake: this test process runs no Spark), without any read-time
dedupe, no commit of a queue came from an older epoch than one before it, and the audit table
shows no resource ever had two owners at once.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from rebalancer_spark.audit import verify_table
from tests.servers.cloud import RabbitMq, SqsPrefix
from tests.support.helpers import wait_for

QUEUES = 6
PER_QUEUE = 200
WORKERS = 3
KILLS = 8


class Workers:
    """Queue worker processes of one group; every one is ended by its PID at the end."""

    def __init__(self, workdir: Path, group: str, source: str) -> None:
        self.workdir = workdir
        self.group = group
        self.source = source
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self._ids = itertools.count()

    @property
    def output(self) -> Path:
        return self.workdir / "out"

    @property
    def audit(self) -> Path:
        return self.workdir / "audit"

    def start(self) -> str:
        member_id = f"w{next(self._ids)}"
        cmd = [
            sys.executable,
            "-m",
            "rebalancer_spark.testing.queue_worker",
            "--group",
            self.group,
            "--backend",
            f"sqlite://{self.workdir}/groups.db?poll=0.005",
            "--member-id",
            member_id,
            "--source",
            self.source,
            "--output",
            str(self.output),
            "--audit",
            str(self.audit),
            "--option",
            "session_timeout=2",
            "--option",
            "stability_window=0.05",
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(sys.path),
            "PYSPARK_PYTHON": sys.executable,
        }
        env.pop("PYSPARK_SUBMIT_ARGS", None)  # the worker's Spark needs no Delta jars
        with open(self.workdir / f"{member_id}.log", "a") as log:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        self.procs[member_id] = proc
        return member_id

    def wait_ready(self, member_id: str) -> None:
        """Until the worker joined (it starts its Spark application first)."""
        proc = self.procs[member_id]
        assert proc.stdout is not None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                line = proc.stdout.readline()
                if line.strip() == "ready":
                    return
                if not line:
                    break
        raise AssertionError(f"worker {member_id} did not start: {self.log(member_id)[-2000:]}")

    def log(self, member_id: str) -> str:
        return (self.workdir / f"{member_id}.log").read_text(errors="replace")

    def kill(self, member_id: str) -> None:
        proc = self.procs.pop(member_id)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()

    def stop_all(self) -> dict[str, tuple[int, str]]:
        """SIGTERM every worker (graceful leave); their exit codes and last words."""
        for proc in self.procs.values():
            os.kill(proc.pid, signal.SIGTERM)
        out: dict[str, tuple[int, str]] = {}
        for member_id, proc in list(self.procs.items()):
            text, _ = proc.communicate(timeout=120)
            out[member_id] = (proc.returncode, text)
        self.procs.clear()
        return out

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        self.procs.clear()


def _keys(output: Path) -> list[str]:
    """Every ``_key`` in the output Delta table, with repeats (none before it exists)."""
    if not (output / "_delta_log").exists():
        return []
    column = DeltaTable(str(output)).to_pyarrow_table(columns=["_key"]).column("_key")
    return [str(k) for k in column.to_pylist()]


@dataclass
class Scenario:
    """Queues of ``per_queue`` messages keyed ``<queue>/<i>`` on one broker, and their depth."""

    source: str
    queues: list[str]
    per_queue: int
    kills: int
    left: Callable[[], int]
    """Messages not yet acknowledged (SQS: in flight too)."""
    close: Callable[[], None] = lambda: None


def _rabbitmq(rabbitmq: RabbitMq) -> Scenario:
    queues = [rabbitmq.declare(f"t{i}") for i in range(QUEUES)]
    for q in queues:
        rabbitmq.publish(
            q, [(f"{q}/{i}", json.dumps({"id": f"{q}/{i}"}).encode()) for i in range(PER_QUEUE)]
        )
    depths = _Depths(rabbitmq, queues)
    return Scenario(
        rabbitmq.source_url(queues=",".join(queues), batch="100"),
        queues,
        PER_QUEUE,
        KILLS,
        depths,
        depths.close,
    )


class _Depths:
    """Messages left in the queues, on one connection for the many looks (a new one when the
    broker dropped it: it goes idle, heartbeats unserviced, while Spark workers start)."""

    def __init__(self, rabbitmq: RabbitMq, queues: list[str]) -> None:
        self.rabbitmq = rabbitmq
        self.queues = queues
        self.channel: Any = None

    def __call__(self) -> int:
        import pika

        try:
            if self.channel is None or not self.channel.connection.is_open:
                self.channel = self.rabbitmq.connection().channel()
            return sum(
                self.channel.queue_declare(q, passive=True).method.message_count
                for q in self.queues
            )
        except pika.exceptions.AMQPConnectionError:
            self.channel = None
            return sum(self.rabbitmq.depth(q) for q in self.queues)

    def close(self) -> None:
        if self.channel is not None and self.channel.connection.is_open:
            self.channel.connection.close()


def _sqs(sqs: SqsPrefix) -> Scenario:
    """Fewer messages and kills: a killed worker's messages wait out a 2 s visibility timeout."""
    per_queue = 200
    queues = [sqs.prefix + f"t{i}" for i in range(4)]
    urls = [sqs.create(f"t{i}") for i in range(4)]
    for q, url in zip(queues, urls, strict=True):
        for start in range(0, per_queue, 10):
            sqs.client.send_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "MessageBody": json.dumps({"id": f"{q}/{i}"})}
                    for i in range(start, start + 10)
                ],
            )

    def left() -> int:
        total = 0
        for url in urls:
            attrs = sqs.client.get_queue_attributes(
                QueueUrl=url,
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                ],
            )["Attributes"]
            total += sum(int(v) for v in attrs.values())
        return total

    source = (
        f"sqs://us-east-1/{sqs.prefix}?endpoint_url={sqs.endpoint}&dedupe=json:id&batch=20"
        "&visibility_timeout=2"
    )
    return Scenario(source, queues, per_queue, 4, left)


@pytest.fixture(params=["rabbitmq", "sqs"])
def scenario(request: pytest.FixtureRequest) -> Iterator[Scenario]:
    if request.param == "rabbitmq":
        made = _rabbitmq(request.getfixturevalue("rabbitmq"))
    else:
        made = _sqs(request.getfixturevalue("sqs_prefix"))
    yield made
    made.close()


@pytest.fixture
def workers(scenario: Scenario, tmp_path: Path, group: str) -> Iterator[Workers]:
    running = Workers(tmp_path, group, scenario.source)
    yield running
    running.close()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a Spark application per worker, a few Spark jobs per batch
def test_workers_killed_at_random_lose_nothing_and_write_each_message_once(
    workers: Workers, scenario: Scenario
) -> None:
    queues = scenario.queues
    total = len(queues) * scenario.per_queue
    # A fixed seed in the test command; TORTURE_SEED=N replays, TORTURE_SEED=random explores.
    chosen = os.environ.get("TORTURE_SEED") or "20261121"
    seed = time.time_ns() if chosen == "random" else int(chosen)
    print(f"\nqueue torture seed {seed} (replay with TORTURE_SEED={seed})")
    rng = random.Random(seed)
    thresholds = sorted(rng.sample(range(total // 10, total * 9 // 10), scenario.kills))
    thresholds.reverse()
    started = time.monotonic()
    for member_id in [workers.start() for _ in range(WORKERS)]:
        workers.wait_ready(member_id)
    left = scenario.left
    killed: list[tuple[str, int]] = []
    for threshold in thresholds:
        wait_for(
            lambda t=threshold: left() <= t,  # type: ignore[misc]
            timeout=300,
            what=f"fewer than {threshold} messages left (kills so far: {killed})",
            interval=0.01,
        )
        victim = rng.choice(sorted(workers.procs))
        workers.kill(victim)
        killed.append((victim, left()))
        workers.start()  # not awaited: the next kill may hit it while it starts
    wait_for(
        lambda: left() == 0 and len(_keys(workers.output)) >= total,
        timeout=300,
        what="every queue drained and every message written",
        interval=0.05,
    )
    drained = time.monotonic() - started
    codes = workers.stop_all()
    assert all(code == 0 for code, _ in codes.values()), codes

    table = DeltaTable(str(workers.output)).to_pyarrow_table(columns=["_resource", "_key"])
    resources, keys = table.column("_resource").to_pylist(), table.column("_key").to_pylist()
    rows = list(zip(resources, keys, strict=True))
    doubled = [row for row, n in Counter(rows).items() if n > 1]
    assert doubled == [], f"{len(doubled)} messages written twice, e.g. {doubled[:5]}"
    expected = {(q, f"{q}/{i}") for q in queues for i in range(scenario.per_queue)}
    missing = expected - set(rows)
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:5]}"
    assert len(rows) == total
    history = sorted(DeltaTable(str(workers.output)).history(), key=lambda c: int(c["version"]))
    epochs: dict[str, int] = {}
    for commit in (c for c in history if "rebalancer.kind" in c):
        queue, epoch = commit["rebalancer.resource"], int(commit["rebalancer.epoch"])
        assert epoch >= epochs.get(queue, 0), f"a stale epoch committed after a newer: {commit}"
        epochs[queue] = epoch
    verdict = verify_table(str(workers.audit), group=workers.group)
    assert verdict.ok, verdict.report()
    assert verdict.events > 0
    redelivered = sum(
        int(m.group(1))
        for _, text in codes.values()
        for m in re.finditer(r"(\d+) duplicates", text)
    )
    print(
        f"\n{total} messages, {len(queues)} queues, {len(killed)} kill -9 at {killed}; drained in "
        f"{drained:.1f} s; surviving workers dropped {redelivered} already-written messages"
    )
