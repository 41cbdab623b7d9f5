"""The driver's watchdog: a driver that cannot work any more stops owning, and exits.

The Python driver can outlive its JVM: ``kill -TERM`` of ``spark-submit`` ends the JVM, and the
Python process it started lives on with parent pid 1, renewing its lease and holding resources
that nobody works on. A small thread of the driver checks, every ``interval`` seconds:

- **the parent**, in ``spark-submit job.py``: there the JVM *is* the driver's parent
  (spark-submit execs java, which starts python with ``PYSPARK_GATEWAY_PORT`` set), and the
  kernel reparents an orphan at the instant its parent dies, so ``os.getppid()`` no longer
  being its value at start means the JVM is gone. Cheap (one system call) and certain;
- **the child**, in ``python job.py``: there pyspark launched the JVM as a child process
  (``SparkContext._gateway.proc``, the ``spark-submit`` that execs java); ``poll()`` sees it exit;
- **the SparkContext**: ``sc.stop()`` by user code sets ``sc._jsc`` to None (no JVM call);
- **the JVM itself**, through Py4J: ``sc._jsc.sc().isStopped()`` answers for a context stopped
  on the JVM side, and a refused or broken connection (:class:`py4j.protocol.Py4JNetworkError`,
  :class:`ConnectionError`) means the JVM is gone, whatever launched it.

The Py4J call never blocks the watchdog: it runs on a helper thread of its own, one call at a
time, and the watchdog only reads its last answer. A JVM that does not answer (a long GC pause,
a stopped process) is *not* taken for dead; only a refused or broken connection is.

**Detection bound**: a parent or child JVM that exits, or a stop through ``sc.stop()``, is seen
within ``interval`` seconds (:data:`CHECK_INTERVAL`, 0.5 s); a dead gateway or a context stopped
on the JVM side within two intervals plus one Py4J round trip.

Then ``on_dead(reason)`` runs once, on the watchdog thread: the node gives every resource up at
once, without draining (:meth:`rebalancer_spark.member.Member.abandon`), and closes its audit
log. If it returns True the process ends at once with :data:`DEAD_DRIVER_EXIT`; if False (the
node was being stopped gracefully already) the watchdog just ends. Should ``on_dead`` hang, the
process still ends ``exit_after`` seconds later (``os._exit``, which needs no lock). A
stand-in for a SparkContext (not a pyspark one: no JVM) is not watched.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

from rebalancer_spark.shutdown import exit_process

if TYPE_CHECKING:
    from subprocess import Popen

    from pyspark import SparkContext

__all__ = [
    "CHECK_INTERVAL",
    "DEAD_DRIVER_EXIT",
    "DriverWatchdog",
    "GatewayProbe",
    "Probe",
    "child_exited",
    "context_stopped",
    "driver_probes",
    "jvm_probes",
    "parent_changed",
    "watch_driver",
]

log = logging.getLogger("rebalancer_spark.watchdog")

CHECK_INTERVAL = 0.5
"""Seconds between two checks of the driver."""

DEAD_DRIVER_EXIT = 3
"""The exit code of a driver that gave its resources up because it cannot work any more."""


class Probe(Protocol):
    """One check of the driver: why it cannot work any more, or None while it can. Must not
    block."""

    def __call__(self) -> str | None: ...


def parent_changed(expected: int, getppid: Callable[[], int] = os.getppid) -> Probe:
    """The parent process ``expected`` (the JVM of ``spark-submit``) is gone."""

    def probe() -> str | None:
        now = getppid()
        if now == expected:
            return None
        return (
            f"the parent process {expected} (the Spark JVM that spark-submit started) is gone; "
            f"the driver's parent is now process {now}"
        )

    return probe


def child_exited(proc: Popen[Any]) -> Probe:
    """The JVM that pyspark launched as a child of this driver exited."""

    def probe() -> str | None:
        code = proc.poll()
        if code is None:
            return None
        return f"the Spark JVM (process {proc.pid}, started by this driver) exited with code {code}"

    return probe


def context_stopped(sc: SparkContext) -> Probe:
    """The SparkContext was stopped from Python (``sc.stop()``) without stopping the node."""

    def probe() -> str | None:
        if getattr(sc, "_jsc", None) is not None:
            return None
        return (
            "the SparkContext was stopped (sc.stop()) while the rebalancer node ran; stop the "
            "SparkSession (spark.stop()) or the node instead to hand the resources over gracefully"
        )

    return probe


class GatewayProbe:
    """Calls ``ask()`` (True if the JVM says its context is stopped) on a helper thread, one
    call at a time, and answers from the last call's result without ever waiting for one.
    ``dead`` are the errors that mean the JVM is gone (a refused or broken connection)."""

    def __init__(
        self, ask: Callable[[], bool], dead: tuple[type[BaseException], ...] = (ConnectionError,)
    ) -> None:
        self._ask = ask
        self._dead = dead
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._closed = False
        self._busy = False
        self._verdict: str | None = None
        self.answers = 0
        """How many calls have returned (answered or failed) so far."""
        self._thread = threading.Thread(target=self._run, name="rebalancer-jvm-probe", daemon=True)

    def __call__(self) -> str | None:
        with self._lock:
            verdict = self._verdict
            if not self._busy and not self._closed:
                self._busy = True
                if not self._thread.is_alive():
                    self._thread.start()
                self._wanted.set()
        return verdict

    def close(self) -> None:
        """End the helper thread once its call in flight (if any) returns; never waits."""
        with self._lock:
            self._closed = True
        self._wanted.set()

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            self._wanted.clear()
            with self._lock:
                if self._closed:
                    return
            verdict: str | None = None
            try:
                if self._ask():
                    verdict = "the SparkContext was stopped in the JVM while the node ran"
            except self._dead as exc:
                verdict = f"the Spark JVM does not accept Py4J calls any more: {exc}"
            except Exception as exc:  # an answer from a live JVM, however odd
                log.debug("Py4J probe of the SparkContext raised %s; the JVM answers", exc)
            with self._lock:
                self._verdict = self._verdict or verdict
                self.answers += 1
                self._busy = False


def jvm_probes(sc: SparkContext) -> list[Probe]:
    """The probes of the JVM *process* of this driver, as it was launched: its parent under
    ``spark-submit``, its child under ``python job.py`` (none for a JVM it did not launch
    and is not the child of). Cheap, and true whatever state the SparkContext is in: a job
    that ends asks them whether it ends because its JVM died."""
    proc: Popen[Any] | None = getattr(sc._gateway, "proc", None)
    if proc is not None:
        return [child_exited(proc)]
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        return [parent_changed(os.getppid())]
    return []


def driver_probes(sc: SparkContext) -> list[Probe]:
    """The probes that fit how this driver was launched (see the module docstring)."""
    from py4j.protocol import Py4JNetworkError

    probes: list[Probe] = [context_stopped(sc), *jvm_probes(sc)]

    def ask() -> bool:
        jsc = sc._jsc
        return jsc is None or bool(jsc.sc().isStopped())

    probes.append(GatewayProbe(ask, (Py4JNetworkError, ConnectionError)))
    return probes


class DriverWatchdog:
    """Runs ``probes`` every ``interval`` seconds on its own thread until one names a reason;
    then ``on_dead(reason)`` and, if it returns True, ``exit(DEAD_DRIVER_EXIT)``. See the
    module docstring."""

    def __init__(
        self,
        probes: Sequence[Probe],
        on_dead: Callable[[str], bool],
        *,
        interval: float = CHECK_INTERVAL,
        exit: Callable[[int], object] = exit_process,
        exit_after: float = 45.0,
        guard_exit: Callable[[int], object] = os._exit,
    ) -> None:
        self._probes = list(probes)
        self._on_dead = on_dead
        self._interval = interval
        self._exit = exit
        self._exit_after = exit_after
        self._guard_exit = guard_exit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rebalancer-watchdog", daemon=True)
        self.reason: str | None = None
        """Why the driver was found dead, once it was."""

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching; returns at once (never waits for a Py4J call). Idempotent; may be
        called from ``on_dead`` itself."""
        self._stop.set()
        for probe in self._probes:
            close = getattr(probe, "close", None)
            if callable(close):
                close()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            reason = self._check()
            if reason is not None and not self._stop.is_set():
                self._fire(reason)
                return

    def _check(self) -> str | None:
        for probe in self._probes:
            try:
                reason = probe()
            except Exception:  # a broken probe must not stop the others
                log.exception("driver probe %r raised; ignoring it this time", probe)
                continue
            if reason is not None:
                return reason
        return None

    def _fire(self, reason: str) -> None:
        # Nothing here logs before on_dead: the driver's output may be a pipe that its dying
        # JVM no longer reads, where a write blocks (and with it every thread that logs).
        self.reason = reason
        guard = threading.Timer(self._exit_after, self._guard_exit, args=(DEAD_DRIVER_EXIT,))
        guard.daemon = True
        guard.start()
        try:
            took_effect = self._on_dead(reason)
        except Exception:
            log.exception("giving up the resources of a dead driver failed; exiting anyway")
            took_effect = True
        if took_effect:
            log.error(
                "this Spark driver cannot work any more: %s. It gave its resources up and "
                "exits with code %d",
                reason,
                DEAD_DRIVER_EXIT,
            )
            self._exit(DEAD_DRIVER_EXIT)
            guard.cancel()  # reached only when ``exit`` returns (a test's stand-in)
        else:
            guard.cancel()
            log.info("the node was stopping already; the watchdog leaves it to finish")


def watch_driver(
    sc: SparkContext | object, on_dead: Callable[[str], bool], *, interval: float = CHECK_INTERVAL
) -> DriverWatchdog | None:
    """Start watching this driver (``sc``): see :class:`DriverWatchdog`. None for a stand-in
    that is not a pyspark ``SparkContext`` (no JVM to watch)."""
    from pyspark import SparkContext

    if not isinstance(sc, SparkContext):
        log.info("no watchdog: %r is not a pyspark SparkContext", type(sc).__name__)
        return None
    return DriverWatchdog(driver_probes(sc), on_dead, interval=interval).start()
