"""The chaos runner (benchmarks/chaos_runner.py) for 100 faults on SQLite, Redis and a
three-server ZooKeeper ensemble, and 40 on one ZooKeeper server: kill -9 and SIGSTOP of members
past their lease, store servers restarted and paused, Redis' clock stepped, the ensemble's
leader killed; no double ownership in the members' trails, no lost commit. The 1,000-fault
figures of every backend are in docs/benchmarks.md."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.slow

# ZooKeeper injects 0.1 to 0.2 faults a second here: a restarted server is a JVM that starts
# in seconds, and a killed member is restarted only once its session expired. 100 faults took
# 500 to 1,000 s on a loaded machine, a third of the whole suite; 40 draw from the same five
# fault kinds in a third of the time.
FAULTS = {"sqlite": 100, "zookeeper": 40, "zookeeper-ensemble": 100, "redis": 100}
EXTRA = {"zookeeper-ensemble": ["--store-fault-share", "0.4"]}
"""A leader kill stalls nothing (a quorum remains): a larger share of store faults."""


def _runner() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "chaos_runner.py"
    spec = importlib.util.spec_from_file_location("chaos_runner", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos_runner"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("backend", ["sqlite", "zookeeper", "zookeeper-ensemble", "redis"])
def test_a_run_of_faults_makes_no_double_owner_and_loses_no_commit(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = _runner()
    faults = ["--faults", str(FAULTS[backend]), "--max-seconds", "600"]
    args = runner.parser().parse_args(
        ["--backend", backend, "--members", "6", *faults, *EXTRA.get(backend, [])]
    )
    figures = runner.run_one(backend, args, lambda _: None)
    with capsys.disabled():
        print("\n" + "\n".join(figures.lines()))
    assert sum(figures.faults.values()) >= FAULTS[backend], figures.lines()
    # The figures as one message: a list of them is cut short in the report, the examples with it.
    report = "\n".join(figures.lines())
    assert figures.double_ownerships == 0, report
    assert figures.lost_commits == 0, report
    assert figures.acquisitions > 0


@pytest.mark.timeout(1500)
def test_spark_drivers_killed_and_paused_lose_and_duplicate_no_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Whole spark-submit applications as victims beside the members (tests/support/
    spark_chaos.py): 100 member faults, and kill -9 or SIGSTOP past the lease of a driver
    until 6 such faults, while a feeder writes new files; then every row written is in the
    output exactly once, and the drivers' audit table and output check verify."""
    runner = _runner()
    argv = ["--backend", "sqlite", "--members", "6", "--faults", "100", "--max-seconds", "900",
            "--spark-jobs", "2", "--driver-faults", "6", "--driver-gap", "6"]  # fmt: skip
    args = runner.parser().parse_args(argv)
    figures = runner.run_one("sqlite", args, lambda _: None)
    with capsys.disabled():
        print("\n" + "\n".join(figures.lines()))
    drivers = figures.drivers
    assert drivers is not None
    assert sum(drivers.faults.values()) >= 6, figures.lines()
    assert drivers.rows_in > 0 and drivers.rows_out == drivers.rows_in, figures.lines()
    assert drivers.plans > 0, "no batch went through the plans table"
    assert drivers.lost == 0 and drivers.duplicated == 0, figures.lines()
    assert drivers.audit_double_ownerships == 0 and drivers.audit_ok, figures.lines()
    assert drivers.output_check == "ok", figures.lines()
    assert set(drivers.stop_codes.values()) == {0}, drivers.stop_codes
    assert figures.double_ownerships == 0 and figures.lost_commits == 0, figures.lines()
