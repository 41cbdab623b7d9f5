"""One Structured Streaming query per owned resource, on this process's one SparkSession.

Two members in one process stand for two jobs: each has its own RebalancerNode and
StreamManager, both on the shared session; a resource moves between them with its checkpoint.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark import MemberConfig
from rebalancer_spark.audit import verify_table
from rebalancer_spark.backends import open_backend
from rebalancer_spark.core.errors import RebalancerError
from rebalancer_spark.spark.options import JobConfig
from rebalancer_spark.spark.session import RebalancerNode, start
from rebalancer_spark.spark.streaming import StreamManager, StreamStats, read_stream_output
from tests.support.helpers import wait_for

pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <socket.socket.*127.0.0.1:pytest.PytestUnraisableExceptionWarning"
)

SCHEMA = "id STRING, value INT"


def _drop(landing: Path, resource: str, name: str, rows: int = 3) -> set[str]:
    """Publish one CSV file atomically (write a hidden name, rename); return its ids."""
    folder = landing / resource
    folder.mkdir(parents=True, exist_ok=True)
    ids = {f"{resource}-{name}-{r}" for r in range(rows)}
    tmp = folder / f".{name}.tmp"
    tmp.write_text("".join(f"{i},{n}\n" for n, i in enumerate(sorted(ids))))
    tmp.rename(folder / f"{name}.csv")
    return ids


def _job(tmp_path: Path, group: str, member_id: str, audit: bool = False) -> JobConfig:
    return JobConfig(
        member=MemberConfig(
            group=group,
            backend=f"sqlite://{tmp_path}/groups.db?poll=0.005",
            member_id=member_id,
            session_timeout=3.0,
            stability_window=0.02,
        ),
        source=(tmp_path / "landing").as_uri() + "/",
        output=str(tmp_path / "out"),
        checkpoint_root=str(tmp_path / "checkpoints"),
        audit=str(tmp_path / "audit") if audit else None,
        schema=SCHEMA,
        max_files_per_batch=2,
        poll_interval=0.2,
        discovery_interval=0.2,
    )


class _Runner:
    """A StreamManager's loop on its own thread, as a job's main thread runs it."""

    def __init__(self, manager: StreamManager) -> None:
        self.manager = manager
        self.stop = threading.Event()
        self.stats: list[StreamStats] = []
        self.thread = threading.Thread(target=lambda: self.stats.append(manager.run(self.stop)))
        self.thread.start()

    def end(self) -> StreamStats:
        self.stop.set()
        self.thread.join(120)
        assert not self.thread.is_alive(), "the manager's loop did not end within 120 s"
        return self.stats[0]


@pytest.fixture
def runners() -> Iterator[list[tuple[_Runner, RebalancerNode]]]:
    started: list[tuple[_Runner, RebalancerNode]] = []
    yield started
    for runner, node in started:
        runner.stop.set()
        node.stop()
        runner.thread.join(120)


def _ids(spark: Any, output: Path) -> Counter[str]:
    df = read_stream_output(spark, str(output))
    return Counter() if df is None else Counter(r["id"] for r in df.select("id").collect())


def _all_in(spark: Any, output: Path, expected: set[str]) -> Counter[str] | None:
    got = _ids(spark, output)
    return got if set(got) >= expected else None


def _exactly_once(got: Counter[str], expected: set[str]) -> None:
    twice = sorted(i for i, n in got.items() if n > 1)
    assert not twice, f"{len(twice)} records written more than once, e.g. {twice[:5]}"
    assert set(got) == expected, f"unexpected {sorted(set(got) - expected)[:5]}"


def test_each_owned_resource_streams_new_files_and_new_resources_get_a_query(
    spark: Any, tmp_path: Path, group: str, runners: list[tuple[_Runner, RebalancerNode]]
) -> None:
    landing, output = tmp_path / "landing", tmp_path / "out"
    expected = _drop(landing, "d00", "f1") | _drop(landing, "d01", "f1")
    node = start(spark, _job(tmp_path, group, "solo"))
    manager = StreamManager(
        spark, node, checkpoint_root=str(tmp_path / "checkpoints"), output=str(output)
    )
    runner = _Runner(manager)
    runners.append((runner, node))
    wait_for(lambda: _all_in(spark, output, expected), timeout=120, what="the first files",
             interval=0.5)  # fmt: skip
    assert sorted(manager.queries()) == ["d00", "d01"]
    # New files in a running resource: the same query picks them up.
    expected |= _drop(landing, "d00", "f2") | _drop(landing, "d00", "f3")
    # A resource that appears while the job runs gets a query of its own.
    expected |= _drop(landing, "d02", "f1")
    wait_for(lambda: _all_in(spark, output, expected), timeout=120, what="later files",
             interval=0.5)  # fmt: skip
    assert sorted(manager.queries()) == ["d00", "d01", "d02"]
    assert (tmp_path / "checkpoints" / group / "d02" / "offsets").is_dir()
    stats = runner.end()
    assert manager.queries() == {}, "run() stops its queries when it ends"
    assert (stats.started, stats.stopped, stats.lost, stats.failed) == (3, 3, 0, 0)
    _exactly_once(_ids(spark, output), expected)


def test_a_resource_moves_with_its_checkpoint_and_every_record_lands_once(
    spark: Any, tmp_path: Path, group: str, runners: list[tuple[_Runner, RebalancerNode]]
) -> None:
    landing, output, audit = tmp_path / "landing", tmp_path / "out", tmp_path / "audit"
    expected: set[str] = set()
    for d in ("d00", "d01"):
        for f in range(3):
            expected |= _drop(landing, d, f"a{f}")

    def member(name: str) -> tuple[RebalancerNode, StreamManager]:
        node = RebalancerNode(spark, _job(tmp_path, group, name, audit=True)).start()
        manager = StreamManager(
            spark, node, checkpoint_root=str(tmp_path / "checkpoints"), output=str(output)
        )
        runners.append((_Runner(manager), node))
        return node, manager

    node_a, manager_a = member("a")
    wait_for(lambda: _all_in(spark, output, expected), timeout=120, what="a to stream both",
             interval=0.5)  # fmt: skip
    assert sorted(manager_a.queries()) == ["d00", "d01"]

    # b joins: one directory moves to it, its query stopped on a before b resumes it.
    node_b, manager_b = member("b")
    moved = wait_for(
        lambda: [o.resource for o in node_b.member.assigned()] if manager_b.queries() else None,
        timeout=60,
        what="b to own a directory and stream it",
    )
    assert moved is not None and len(moved) == 1
    assert sorted(manager_a.queries()) == sorted({"d00", "d01"} - {*moved})
    for d in ("d00", "d01"):
        for f in range(3):
            expected |= _drop(landing, d, f"b{f}")
    got = wait_for(lambda: _all_in(spark, output, expected), timeout=120,
                   what="the second wave, split", interval=0.5)  # fmt: skip
    assert got is not None
    _exactly_once(got, expected)  # b resumed from a's checkpoint: the first wave not again

    # a leaves (drain): b takes both over and resumes the other one too.
    runners[0][0].end()
    node_a.stop()
    wait_for(lambda: sorted(manager_b.queries()) == ["d00", "d01"], timeout=60,
             what="b to stream both directories")  # fmt: skip
    for d in ("d00", "d01"):
        expected |= _drop(landing, d, "c0")
    got = wait_for(lambda: _all_in(spark, output, expected), timeout=120,
                   what="the third wave, on b", interval=0.5)  # fmt: skip
    runners[1][0].end()
    node_b.stop()
    _exactly_once(_ids(spark, output), expected)
    verdict = verify_table(str(audit), group=group)
    assert verdict.ok, verdict.report()


def test_a_streaming_job_without_a_schema_is_refused(
    spark: Any, tmp_path: Path, group: str
) -> None:
    job = JobConfig(
        member=MemberConfig(group=group, backend=f"sqlite://{tmp_path}/groups.db"),
        source=(tmp_path / "landing").as_uri() + "/",
        output=str(tmp_path / "out"),
    )
    (tmp_path / "landing").mkdir()
    node = RebalancerNode(spark, job)
    with pytest.raises(RebalancerError, match="--schema"):
        StreamManager(spark, node, checkpoint_root=str(tmp_path / "checkpoints"))


def test_a_lost_lease_stops_the_queries_and_the_rejoined_member_resumes_them(
    spark: Any, tmp_path: Path, group: str, runners: list[tuple[_Runner, RebalancerNode]]
) -> None:
    landing, output = tmp_path / "landing", tmp_path / "out"
    expected = _drop(landing, "d00", "f1")
    job = _job(tmp_path, group, "fenced")
    node = RebalancerNode(spark, job).start()
    manager = StreamManager(
        spark, node, checkpoint_root=str(tmp_path / "checkpoints"), output=str(output)
    )
    runners.append((_Runner(manager), node))
    wait_for(lambda: _all_in(spark, output, expected), timeout=120, what="the first file",
             interval=0.5)  # fmt: skip
    first = manager.queries()["d00"]
    before = node.member.owns("d00")
    session = node.member.session
    assert before is not None and session is not None
    # The store ends the member's session (as when its lease expired there): the member
    # self-fences, on_lost stops the query, and the member joins again.
    store = open_backend(job.member.backend)
    try:
        store.leave(session)
    finally:
        store.close()
    wait_for(lambda: not first.isActive, timeout=60, what="the query of the lost lease to stop")
    again = wait_for(
        lambda: (o := node.member.owns("d00")) is not None and o.epoch > before.epoch and o,
        timeout=60,
        what="the member to rejoin and own d00 again",
    )
    wait_for(lambda: "d00" in manager.queries(), timeout=60, what="a new query for d00")
    assert manager.queries()["d00"] is not first
    assert manager.stats.lost == 1, "stopped as lost, once"
    expected |= _drop(landing, "d00", "f2")
    got = wait_for(lambda: _all_in(spark, output, expected), timeout=120,
                   what="the file after the rejoin", interval=0.5)  # fmt: skip
    assert got is not None and again
    _exactly_once(got, expected)
