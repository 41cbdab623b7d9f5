"""Fixtures shared by every test: backend URLs for the contract suite, fresh group names."""

from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from rebalancer_spark.backends import Backend, open_backend
from tests.support.helpers import SqliteMembers

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# Hypothesis' per-example deadline (200 ms) and its "data generation is too slow" health check
# measure the machine's load, not the code: CI shares two cores with servers and Spark, so no
# example is judged by its time.
settings.register_profile("rebalancer", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# scripts/test.sh runs the core again on every other Python with fewer examples: what differs
# between Pythons is whether the code runs, not which examples find a bug.
settings.register_profile("other-python", settings.get_profile("rebalancer"), max_examples=15)
settings.load_profile(os.environ.get("REBALANCER_HYPOTHESIS_PROFILE", "rebalancer"))

# The tests' default store and audit outboxes live in a directory of this run, not in the
# user's ~/.local/state/rebalancer-spark (member processes and Spark jobs inherit it).
_HOME = tempfile.mkdtemp(prefix="rebalancer-home-")
os.environ["REBALANCER_HOME"] = _HOME


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_HOME, ignore_errors=True)


# Each server backend's fixtures (real servers on free ports) live in their own plugin module.
pytest_plugins = [
    "tests.servers.zookeeper",
    "tests.servers.redis",
    "tests.servers.cloud",
    "tests.support.standalone",  # a Spark standalone master and worker
]

# Every backend the contract suite (and every test taking ``backend_url``) runs against. A
# backend whose server cannot be started here shows up as a visible skip with its reason,
# never as a silent pass.
BACKEND_KINDS = ["sqlite", "zookeeper", "redis"]

_counter = itertools.count()


@pytest.fixture
def group(request: pytest.FixtureRequest) -> str:
    """A group name no other test uses (stores are shared between tests of one session)."""
    name = request.node.name.split("[")[0][-40:].replace("_", "-").strip("-")
    return f"{name}-{os.getpid()}-{next(_counter)}"


@pytest.fixture
def members(tmp_path: Path, group: str) -> Iterator[SqliteMembers]:
    """Members of ``group`` on a SQLite file of this test, started with ``members.start(name)``
    and stopped at the end."""
    started = SqliteMembers(tmp_path / "groups.db", group)
    yield started
    started.stop_all()


@pytest.fixture(params=BACKEND_KINDS)
def backend_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    kind: str = request.param
    if kind == "sqlite":
        path = tmp_path_factory.mktemp("sqlite") / "groups.db"
        return f"sqlite://{path}?poll=0.005"
    # tests/servers/<kind>.py provides "<kind>_backend_url": a URL on a server it started.
    url: str = request.getfixturevalue(f"{kind}_backend_url")
    return url


@pytest.fixture
def open_store(backend_url: str) -> Iterator[Callable[[], Backend]]:
    """Opens independent backend handles on the same store, as separate processes would."""
    opened: list[Backend] = []

    def factory() -> Backend:
        handle = open_backend(backend_url)
        opened.append(handle)
        return handle

    yield factory
    for handle in opened:
        handle.close()


@pytest.fixture
def store(open_store: Callable[[], Backend]) -> Backend:
    return open_store()


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    return tmp_path / "groups.db"


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The one SparkSession of this test process (local[2], no UI), started on first use, with
    Spark's Delta reader and ``s3a://`` (the jars fetched by scripts/setup.sh)."""
    from pyspark.sql import SparkSession

    from rebalancer_spark.core.errors import ConfigurationError
    from rebalancer_spark.spark import packages

    try:
        jars = packages.spark_conf()
    except ConfigurationError as exc:
        pytest.fail(f"the Spark tests need Delta and hadoop-aws: {exc}", pytrace=False)
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    builder = SparkSession.builder
    for key, value in jars.items():
        builder = builder.config(key, value)
    session = (
        builder.master("local[2]")
        .appName("rebalancer-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.databricks.delta.snapshotPartitions", "2")  # tiny tables: not 50 tasks
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
