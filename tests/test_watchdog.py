"""The driver's watchdog on its own: probes, the verdict, the exit, and stop() (no spark-submit;
the jobs whose JVM dies are in test_driver_death.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from rebalancer_spark.spark.watchdog import (
    DEAD_DRIVER_EXIT,
    DriverWatchdog,
    GatewayProbe,
    child_exited,
    driver_probes,
    parent_changed,
    watch_driver,
)
from tests.support.helpers import wait_for


class Verdicts:
    """What the watchdog did: the reasons given to on_dead and the exit codes asked for."""

    def __init__(self, took_effect: bool = True) -> None:
        self.lock = threading.Lock()
        self.reasons: list[str] = []
        self.exits: list[int] = []
        self.took_effect = took_effect

    def on_dead(self, reason: str) -> bool:
        with self.lock:
            self.reasons.append(reason)
        return self.took_effect

    def exit(self, code: int) -> None:
        with self.lock:
            self.exits.append(code)


def test_a_probe_that_names_a_reason_gives_the_resources_up_then_exits() -> None:
    dead = threading.Event()
    verdicts = Verdicts()
    checks: list[int] = []

    def probe() -> str | None:
        checks.append(1)
        return "the JVM is gone" if dead.is_set() else None

    with DriverWatchdog([probe], verdicts.on_dead, interval=0.01, exit=verdicts.exit) as dog:
        wait_for(lambda: len(checks) >= 3, timeout=10, what="a few healthy checks")
        assert verdicts.reasons == [] and verdicts.exits == []
        dead.set()
        wait_for(lambda: verdicts.exits, timeout=10, what="the watchdog to exit")
        wait_for(lambda: not dog.thread.is_alive(), timeout=10, what="the watchdog to end")
    assert verdicts.reasons == ["the JVM is gone"]
    assert verdicts.exits == [DEAD_DRIVER_EXIT]
    assert dog.reason == "the JVM is gone"


def test_a_node_that_was_stopping_already_is_left_to_finish() -> None:
    verdicts = Verdicts(took_effect=False)
    dog = DriverWatchdog(
        [lambda: "dead"],
        verdicts.on_dead,
        interval=0.01,
        exit=verdicts.exit,
        exit_after=0.05,
        guard_exit=verdicts.exit,
    ).start()
    wait_for(lambda: not dog.thread.is_alive(), timeout=10, what="the watchdog to end")
    assert verdicts.reasons == ["dead"]
    # The guard that ends a hung on_dead was cancelled: no exit, even after its delay.
    time.sleep(0.3)  # the guard's delay passing, not a synchronisation
    assert verdicts.exits == []


def test_an_on_dead_that_hangs_still_ends_the_process() -> None:
    verdicts = Verdicts()
    release = threading.Event()

    def hang(reason: str) -> bool:
        release.wait(30)
        return True

    dog = DriverWatchdog(
        [lambda: "dead"],
        hang,
        interval=0.01,
        exit=verdicts.exit,
        exit_after=0.2,
        guard_exit=verdicts.exit,
    ).start()
    try:
        wait_for(lambda: verdicts.exits, timeout=10, what="the guard to exit")
        assert verdicts.exits == [DEAD_DRIVER_EXIT]
    finally:
        release.set()
        dog.stop()


def test_stop_returns_at_once_and_nothing_fires_after_it() -> None:
    verdicts = Verdicts()
    dog = DriverWatchdog([lambda: None], verdicts.on_dead, interval=60, exit=verdicts.exit)
    dog.start()
    began = time.monotonic()
    dog.stop()
    assert time.monotonic() - began < 1
    assert not dog.thread.is_alive()
    dog.stop()  # idempotent
    assert verdicts.reasons == [] and verdicts.exits == []


def test_a_probe_that_raises_does_not_stop_the_others() -> None:
    verdicts = Verdicts()

    def broken() -> str | None:
        raise RuntimeError("a bug in a probe")

    with DriverWatchdog(
        [broken, lambda: "the parent is gone"], verdicts.on_dead, interval=0.01, exit=verdicts.exit
    ):
        wait_for(lambda: verdicts.exits, timeout=10, what="the second probe to fire")
    assert verdicts.reasons == ["the parent is gone"]


def test_the_parent_probe_fires_when_the_parent_changes() -> None:
    parent = [4242]
    probe = parent_changed(4242, getppid=lambda: parent[0])
    assert probe() is None
    parent[0] = 1
    reason = probe()
    assert reason is not None and "4242" in reason and "now process 1" in reason


def test_the_child_probe_fires_when_the_jvm_child_exits() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        probe = child_exited(child)
        assert probe() is None
        child.kill()
        reason = wait_for(probe, timeout=10, what="the child probe to see the exit")
        assert reason is not None
        assert f"process {child.pid}" in reason and "exited with code -9" in reason
    finally:
        child.kill()
        child.wait(10)


def test_the_gateway_probe_never_waits_for_a_call_that_hangs() -> None:
    release = threading.Event()
    calls: list[int] = []

    def ask() -> bool:
        calls.append(1)
        release.wait(30)
        return False

    probe = GatewayProbe(ask)
    try:
        began = time.monotonic()
        for _ in range(5):
            assert probe() is None
        assert time.monotonic() - began < 1
        wait_for(lambda: calls, timeout=10, what="the call to start")
        assert len(calls) == 1, "a call in flight is not repeated"
    finally:
        release.set()
        probe.close()
    wait_for(lambda: probe.answers == 1, timeout=10, what="the call to return")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (ConnectionRefusedError(111, "Connection refused"), "does not accept Py4J calls"),
        (True, "stopped in the JVM"),
        (RuntimeError("an error raised by a live JVM"), None),
        (False, None),
    ],
)
def test_the_gateway_probe_reads_its_last_answer(answer: Any, expected: str | None) -> None:
    def ask() -> bool:
        if isinstance(answer, BaseException):
            raise answer
        return bool(answer)

    probe = GatewayProbe(ask)
    try:
        assert probe() is None  # the first call only starts the first question
        wait_for(lambda: probe.answers >= 1, timeout=10, what="the first answer")
        verdict = probe()
        if expected is None:
            assert verdict is None
        else:
            assert verdict is not None and expected in verdict
    finally:
        probe.close()


def test_a_live_spark_driver_passes_every_probe(spark: Any) -> None:
    """This test process launched its JVM as a child: the context, child and gateway probes."""
    probes = driver_probes(spark.sparkContext)
    assert len(probes) == 3
    gateway = probes[-1]
    assert isinstance(gateway, GatewayProbe)
    try:
        assert [p() for p in probes] == [None, None, None]
        wait_for(lambda: gateway.answers >= 1, timeout=30, what="the JVM to answer")
        assert [p() for p in probes] == [None, None, None]
    finally:
        gateway.close()


def test_a_stand_in_without_a_jvm_is_not_watched() -> None:
    from types import SimpleNamespace

    assert watch_driver(SimpleNamespace(_jsc=None), Verdicts().on_dead) is None


def test_the_watchdog_of_a_live_driver_stays_quiet_and_stops_at_once(spark: Any) -> None:
    verdicts = Verdicts()
    dog = watch_driver(spark.sparkContext, verdicts.on_dead, interval=0.01)
    assert dog is not None
    gateway = next(p for p in dog._probes if isinstance(p, GatewayProbe))
    wait_for(lambda: gateway.answers >= 3, timeout=30, what="a few answers from the JVM")
    began = time.monotonic()
    dog.stop()
    assert time.monotonic() - began < 1
    assert verdicts.reasons == [] and dog.reason is None


class _Session:
    """What :func:`stop_spark` calls: ``stop()``, failing as Py4J does once the JVM is gone."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1
        if self.error is not None:
            raise self.error


def test_a_job_whose_jvm_died_while_it_stopped_ends_as_a_dead_driver_not_a_failure() -> None:
    """``kill -TERM`` of spark-submit: the JVM ends the Python driver with SIGTERM while it
    dies itself, so ``spark.stop()`` fails; the job then exits with DEAD_DRIVER_EXIT."""
    from rebalancer_spark.spark.jobs import stop_spark

    parents = iter([100, 100, 1])  # the JVM is still shutting down at the first two looks
    jvm = [parent_changed(100, getppid=lambda: next(parents))]
    gone = stop_spark(_Session(ConnectionError("Answer from Java side is empty")), jvm, wait=5)
    assert gone is not None and "process 100" in gone and "now process 1" in gone
    # Stopped cleanly, but the JVM had gone by then: a dead driver all the same.
    assert stop_spark(_Session(None), [parent_changed(100, getppid=lambda: 1)]) is not None
    assert stop_spark(_Session(None), [parent_changed(100, getppid=lambda: 100)]) is None


def test_a_failing_spark_stop_with_a_live_jvm_is_raised() -> None:
    from rebalancer_spark.spark.jobs import stop_spark

    session = _Session(RuntimeError("a real failure"))
    with pytest.raises(RuntimeError, match="a real failure"):
        stop_spark(session, [parent_changed(100, getppid=lambda: 100)], wait=0.2)
    assert session.stopped == 1
