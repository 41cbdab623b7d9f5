"""Two ``spark-submit jobs/stream_files.py`` applications in one group; one is killed with -9
while its queries run, the other resumes its directories from their checkpoints, and every
record lands once (slow: two Spark applications)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rebalancer_spark.audit import verify_table
from rebalancer_spark.backends import open_backend
from rebalancer_spark.spark.packages import spark_submit_command
from rebalancer_spark.spark.streaming import read_stream_output
from tests.support.helpers import JOB_CONF, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <socket.socket.*:pytest.PytestUnraisableExceptionWarning"
    ),
]

REPO = Path(__file__).resolve().parents[1]
GROUP = "streams"


def _drop(landing: Path, resource: str, name: str, rows: int = 5) -> set[str]:
    folder = landing / resource
    folder.mkdir(parents=True, exist_ok=True)
    ids = {f"{resource}-{name}-{r}" for r in range(rows)}
    (folder / f".{name}.tmp").write_text("".join(f"{i},1\n" for i in sorted(ids)))
    (folder / f".{name}.tmp").rename(folder / f"{name}.csv")
    return ids


def _batches(folder: Path) -> int:
    return len([n for n in os.listdir(folder) if n[0].isdigit()]) if folder.is_dir() else 0


def _in_flight(checkpoints: Path, resource: str) -> bool:
    """A micro-batch of ``resource`` is planned (its offsets written) and not committed."""
    folder = checkpoints / GROUP / resource
    return _batches(folder / "offsets") > _batches(folder / "commits")


@pytest.mark.timeout(600)
def test_a_killed_streaming_job_is_resumed_from_its_checkpoints_exactly_once(
    spark: Any, tmp_path: Path
) -> None:
    landing, output = tmp_path / "landing", tmp_path / "out"
    dirs = [f"d{d}" for d in range(4)]
    expected: set[str] = set()
    for d in dirs:
        for f in range(10):
            expected |= _drop(landing, d, f"a{f}")
    backend = f"sqlite://{tmp_path.resolve()}/groups.db"
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    procs: dict[str, subprocess.Popen[bytes]] = {}
    store = open_backend(backend)

    def launch(name: str) -> None:
        cmd = spark_submit_command(
            REPO / "jobs" / "stream_files.py",
            "--group", GROUP, "--backend", backend, "--member-id", name,
            "--source", landing.resolve().as_uri() + "/", "--output", str(output),
            "--checkpoint-root", str(tmp_path / "checkpoints"), "--audit", str(tmp_path / "audit"),
            "--schema", "id STRING, value INT", "--max-files-per-batch", "2",
            "--poll-interval", "0.5s", "--discovery-interval", "2s",
            conf={**JOB_CONF, "spark.rebalancer.session-timeout": "4s"},
        )  # fmt: skip
        with (tmp_path / f"{name}.log").open("wb") as out:
            procs[name] = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def tail(name: str) -> str:
        return "\n".join((tmp_path / f"{name}.log").read_text().splitlines()[-40:])

    def owned_by(name: str) -> list[str]:
        for job, proc in procs.items():
            assert proc.poll() is None, f"{job} exited with {proc.returncode}:\n{tail(job)}"
        claims = store.state(GROUP).claims
        return sorted(r for r, c in claims.items() if c.member_id == name)

    try:
        launch("s-1")
        launch("s-2")
        # Kill s-2 while one of its micro-batches is in flight if the polling catches one
        # (planned in the checkpoint, not committed), else once it committed everything.
        checkpoints = tmp_path / "checkpoints"

        def moment() -> tuple[list[str], bool] | None:
            mine = owned_by("s-2")
            if not mine or not owned_by("s-1"):
                return None
            if any(_in_flight(checkpoints, r) for r in mine):
                return mine, True
            done = all(_batches(output / f"resource={r}" / "_spark_metadata") >= 5 for r in mine)
            return (mine, False) if done else None

        found = wait_for(moment, timeout=300, what="s-2 to stream its directories", interval=0.02)
        assert found is not None
        victim, mid_batch = found
        pid = int(store.state(GROUP).members["s-2"].info["pid"])
        os.kill(pid, signal.SIGKILL)  # the Python driver, where the member and queries live
        os.killpg(procs["s-2"].pid, signal.SIGKILL)  # and its JVM
        procs.pop("s-2").wait(60)
        for d in dirs:  # files keep arriving during the take-over
            expected |= _drop(landing, d, "b0")
        wait_for(lambda: owned_by("s-1") == dirs, timeout=120, what="s-1 to take over all")

        def landed() -> Counter[str] | None:
            owned_by("s-1")
            df = read_stream_output(spark, str(output))
            got = Counter() if df is None else Counter(r["id"] for r in df.select("id").collect())
            return got if set(got) >= expected else None

        wait_for(landed, timeout=300, what="every record in the output", interval=1.0)
        os.kill(int(store.state(GROUP).members["s-1"].info["pid"]), signal.SIGTERM)
        assert procs["s-1"].wait(120) == 0, tail("s-1")
        procs.clear()
    finally:
        for proc in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(60)
        store.close()
    df = read_stream_output(spark, str(output))
    assert df is not None
    got = Counter(r["id"] for r in df.select("id").collect())
    twice = sorted(i for i, n in got.items() if n > 1)
    assert not twice, f"{len(twice)} records twice, e.g. {twice[:5]} (killed s-2 owned {victim})"
    assert set(got) == expected
    verdict = verify_table(str(tmp_path / "audit"), group=GROUP)
    assert verdict.ok, verdict.report()
    print(f"killed s-2 owning {victim} {'mid-batch' if mid_batch else 'between batches'}")
