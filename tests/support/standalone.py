"""A Spark standalone cluster on loopback for tests: a master and one worker, started with the
``spark-class`` of this Python's pyspark."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.helpers import wait_for

__all__ = ["standalone"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    """A Spark standalone master and one worker on loopback; yields the master URL."""
    spark_class = str(Path(sys.executable).parent / "spark-class")
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    logs = tmp_path / "cluster"
    logs.mkdir()
    procs: list[subprocess.Popen[bytes]] = []
    # A cluster sees what is installed, not this checkout: no PYTHONPATH for its executors.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        with (logs / "master.log").open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [
                        spark_class,
                        "org.apache.spark.deploy.master.Master",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--webui-port",
                        str(_free_port()),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
        wait_for(
            lambda: "I have been elected leader" in (logs / "master.log").read_text(),
            timeout=60,
            what="the standalone master",
        )
        with (logs / "worker.log").open("wb") as out:
            procs.append(
                subprocess.Popen(
                    [
                        spark_class,
                        "org.apache.spark.deploy.worker.Worker",
                        url,
                        "--host",
                        "127.0.0.1",
                        "--cores",
                        "2",
                        "--memory",
                        "2g",
                        "--webui-port",
                        str(_free_port()),
                        "--work-dir",
                        str(logs / "work"),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
        wait_for(
            lambda: "Successfully registered with master" in (logs / "worker.log").read_text(),
            timeout=60,
            what="the worker",
        )
        yield url
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
