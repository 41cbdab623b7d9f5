"""Torture: queue workers killed with -9 at random moments while they drain several queues.

Three member processes (``rebalancer_spark.testing.queue_worker``: the queue loop without Spark,
see its docstring for why) share six RabbitMQ queues of 500 messages each. Whenever the
messages left fall below the next of a few random thresholds, a random worker is killed with -9,
wherever it is (fetching, writing the Delta table, committing, acknowledging), and a new worker
joins. At the end every message is in the output exactly once, without any read-time dedupe,
and the audit table shows no resource ever had two owners at once.
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
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from rebalancer_spark.audit import verify_table
from tests.helpers import wait_for
from tests.servers.cloud import RabbitMq

QUEUES = 6
PER_QUEUE = 500
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
        with open(self.workdir / f"{member_id}.log", "a") as log:
            proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
        self.procs[member_id] = proc
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                line = proc.stdout.readline()
                if line.strip() == "ready":
                    return member_id
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
            text, _ = proc.communicate(timeout=60)
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


@pytest.fixture
def workers(rabbitmq: RabbitMq, tmp_path: Path, group: str) -> Iterator[Workers]:
    queues = [rabbitmq.declare(f"t{i}") for i in range(QUEUES)]
    for q in queues:
        rabbitmq.publish(
            q, [(f"{q}/{i}", json.dumps({"q": q, "i": i}).encode()) for i in range(PER_QUEUE)]
        )
    source = rabbitmq.source_url(queues=",".join(queues), batch="20")
    running = Workers(tmp_path, group, source)
    yield running
    running.close()


@pytest.mark.slow
def test_workers_killed_at_random_lose_nothing_and_write_each_message_once(
    workers: Workers, rabbitmq: RabbitMq
) -> None:
    queues = [rabbitmq.prefix + f"t{i}" for i in range(QUEUES)]
    total = QUEUES * PER_QUEUE
    rng = random.Random(os.environ.get("TORTURE_SEED", f"{time.time_ns()}"))
    thresholds = sorted(rng.sample(range(total // 10, total * 9 // 10), KILLS), reverse=True)
    started = time.monotonic()
    for _ in range(WORKERS):
        workers.start()

    def left() -> int:
        return sum(rabbitmq.depth(q) for q in queues)

    killed: list[tuple[str, int]] = []
    for threshold in thresholds:
        wait_for(
            lambda t=threshold: left() <= t,  # type: ignore[misc]
            timeout=60,
            what=f"fewer than {threshold} messages left (kills so far: {killed})",
            interval=0.005,
        )
        victim = rng.choice(sorted(workers.procs))
        workers.kill(victim)
        killed.append((victim, left()))
        workers.start()
    wait_for(lambda: left() == 0, timeout=90, what="every queue drained")
    drained = time.monotonic() - started
    codes = workers.stop_all()
    assert all(code == 0 for code, _ in codes.values()), codes

    table = DeltaTable(str(workers.output)).to_pyarrow_table(columns=["_resource", "_key"])
    resources, keys = table.column("_resource").to_pylist(), table.column("_key").to_pylist()
    rows = list(zip(resources, keys, strict=True))
    doubled = [row for row, n in Counter(rows).items() if n > 1]
    assert doubled == [], f"{len(doubled)} messages written twice, e.g. {doubled[:5]}"
    expected = {(q, f"{q}/{i}") for q in queues for i in range(PER_QUEUE)}
    missing = expected - set(rows)
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:5]}"
    assert len(rows) == total
    verdict = verify_table(str(workers.audit), group=workers.group)
    assert verdict.ok, verdict.report()
    assert verdict.events > 0
    redelivered = sum(
        int(m.group(1))
        for _, text in codes.values()
        for m in re.finditer(r"(\d+) duplicates", text)
    )
    print(
        f"\n{total} messages, {QUEUES} queues, {len(killed)} kill -9 at {killed}; drained in "
        f"{drained:.1f} s; surviving workers dropped {redelivered} already-written messages"
    )
