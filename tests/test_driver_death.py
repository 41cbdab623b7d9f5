"""A driver that cannot work stops owning: its JVM killed, or its SparkContext stopped.

Two ``jobs/ingest_files.py`` applications of one group share a directory source on the SQLite
backend. One of them loses its Spark JVM while its Python driver lives on: (a) the JVM of a
``spark-submit`` driver (its parent) killed with SIGKILL or SIGTERM, (b) the JVM child of a
``python``-launched driver killed, (c) user code stopping the SparkContext (through Python's
``sc.stop()`` or on the JVM side). In each, the victim's Python process exits with
``DEAD_DRIVER_EXIT`` promptly, the other job owns its directories again within the session
timeout + 1 s (the figure is printed: ``pytest -s``), and every input file, also those written
after the kill, lands in the output exactly once. The Delta audit table verifies. A job whose
member thread fails (a bug) exits with ``MEMBER_FAILED_EXIT`` the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from rebalancer_spark.audit import load_events, verify_table
from rebalancer_spark.backends import Backend, open_backend
from rebalancer_spark.sources.files import FileShareSource
from rebalancer_spark.spark.jobs import MEMBER_FAILED_EXIT
from rebalancer_spark.spark.watchdog import DEAD_DRIVER_EXIT
from rebalancer_spark.testing.spark_demo import SCHEMA, generate_landing
from tests.support.helpers import wait_for

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
GROUP = "deaths"
DIRS, FILES, ROWS = 4, 6, 5
SESSION_TIMEOUT = 6.0
PR_SET_CHILD_SUBREAPER = 36
REAPED_BY_ITS_JVM = -1000
"""An exit code the test cannot know: the driver exited before its JVM, which reaped it."""

# A job that does ``ACTION`` once its marker file (env ``JOB_MARKER``) appears.
MARKED_JOB = """
import os, sys, threading
from pathlib import Path
from rebalancer_spark.shutdown import exit_process
from rebalancer_spark.spark.ingest import run_ingest
from rebalancer_spark.spark.jobs import job_main

MARKER = Path(os.environ["JOB_MARKER"])

def when_told(ctx):
ACTION

def loop(ctx):
    def wait_for_the_marker():
        while not ctx.stop.wait(0.1):  # a job's own poll of a file, not a test's sleep
            if MARKER.exists():
                when_told(ctx)
                return
    threading.Thread(target=wait_for_the_marker, daemon=True).start()
    stats = run_ingest(ctx.spark, ctx.node, ctx.stop)
    return f"{stats.batches} batches"

exit_process(job_main(sys.argv[1:], "marked_job.py", loop, schemes=("file",)))
"""

STOP_CONTEXT = """
    sc = ctx.spark.sparkContext
    if os.environ["STOP_CONTEXT_HOW"] == "python":
        sc.stop()
    else:
        sc._jsc.sc().stop()
"""
"""User code stops the SparkContext."""

BREAK_MEMBER = """
    def bug(backend):
        raise RuntimeError("a bug in the member thread")
    ctx.node.member._reconciler._step = bug
"""
"""The member thread's step replaced by one that raises, as a bug of this library would."""


@dataclass
class _Job:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class _Run:
    workdir: Path
    store: Backend
    jobs: dict[str, _Job] = field(default_factory=dict)

    @property
    def landing(self) -> Path:
        return (self.workdir / "landing").resolve()

    @property
    def backend(self) -> str:
        return f"sqlite://{self.workdir.resolve()}/groups.db"

    def start(
        self, name: str, *, launcher: str = "spark-submit", script: Path | None = None, **env: str
    ) -> _Job:
        script = script or REPO / "jobs" / "ingest_files.py"
        args = [
            str(script), "--group", GROUP, "--backend", self.backend, "--member-id", name,
            "--source", self.landing.as_uri() + "/", "--output", str(self.workdir / "output"),
            "--audit", str(self.workdir / "audit"), "--schema", SCHEMA,
            "--max-files-per-batch", "2", "--poll-interval", "0.5s",
            "--discovery-interval", "2s", "--session-timeout", f"{SESSION_TIMEOUT}s",
        ]  # fmt: skip
        spark_args = ["--master", "local[1]", "--conf", "spark.ui.enabled=false",
                      "--conf", "spark.driver.memory=512m"]  # fmt: skip
        full_env = {
            **os.environ,
            **env,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
        }
        if launcher == "spark-submit":
            cmd = [str(Path(sys.executable).parent / "spark-submit"), *spark_args, *args]
        else:  # pyspark launches the JVM as a child of this Python driver
            cmd = [sys.executable, *args]
            full_env["PYSPARK_SUBMIT_ARGS"] = " ".join([*spark_args, "pyspark-shell"])
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            # A session of its own: the test can end the job's processes as one group.
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
            )
        self.jobs[name] = job = _Job(name, proc, log)
        return job

    def check_alive(self, *names: str) -> None:
        for name in names:
            job = self.jobs[name]
            if job.proc.poll() is not None:
                raise AssertionError(f"{name} exited with {job.proc.returncode}:\n{job.tail()}")

    def driver_pid(self, name: str) -> int:
        record = self.store.state(GROUP).members.get(name)
        assert record is not None, f"{name} is not in the group"
        return int(record.info["pid"])

    def wait_split(self) -> None:
        """Both jobs joined, the directories split, and the victim committed some work."""

        def split() -> bool:
            self.check_alive(*self.jobs)
            state = self.store.state(GROUP)
            owners = Counter(c.member_id for c in state.claims.values())
            return state.is_stable() and sorted(owners.values()) == [2, 2] and len(owners) == 2

        wait_for(split, timeout=240, what="two jobs to split the directories", interval=0.2)
        wait_for(
            lambda: _committed(self.store, FileShareSource(self.landing.as_uri() + "/"))[0] >= 4,
            timeout=120,
            what="some files to be committed",
            interval=0.2,
        )

    def watch_death(
        self, victim: str, survivor: str, since: float, exit_code: Callable[[], int | None]
    ) -> tuple[int, float, float]:
        """Wait until the victim's driver exited (``exit_code()`` not None) and ``survivor``
        alone owns every directory; return the exit code and the seconds from ``since`` to
        each."""
        seen: dict[str, float] = {}
        code: list[int] = []

        def taken() -> bool:
            self.check_alive(survivor)
            state = self.store.state(GROUP)
            return (
                victim not in state.members
                and len(state.claims) == DIRS
                and {c.member_id for c in state.claims.values()} == {survivor}
                and state.is_stable()
            )

        def both() -> bool:
            now = time.monotonic() - since
            if "taken" not in seen and taken():
                seen["taken"] = now
            if "exited" not in seen:
                got = exit_code()
                if got is not None:
                    code.append(got)
                    seen["exited"] = now
            return len(seen) == 2

        try:
            wait_for(
                both,
                timeout=SESSION_TIMEOUT + 60,
                what=f"{victim} to exit and {survivor} to own every directory",
                interval=0.02,
            )
        except AssertionError as exc:
            state = self.store.state(GROUP)
            owners = {r: c.member_id for r, c in state.claims.items()}
            raise AssertionError(
                f"{exc}; seen after: {seen}; members: {sorted(state.members)}; owners: {owners}"
            ) from None
        return code[0], seen["exited"], seen["taken"]

    def finish(self, survivor: str) -> int:
        """Wait until every file is committed, then stop the survivor gracefully."""
        source = FileShareSource(self.landing.as_uri() + "/")

        def done() -> bool:
            self.check_alive(survivor)
            files, idle = _committed(self.store, source)
            return files == len(list(self.landing.rglob("*.csv"))) and idle

        wait_for(done, timeout=180, what="every file to be committed", interval=0.2)
        os.kill(self.driver_pid(survivor), signal.SIGTERM)
        return self.jobs.pop(survivor).proc.wait(120)

    def cleanup(self) -> None:
        for job in self.jobs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait(60)
        self.jobs.clear()
        self.store.close()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[_Run]:
    generate_landing(tmp_path / "landing", DIRS, FILES, ROWS)
    r = _Run(tmp_path, open_backend(f"sqlite://{tmp_path.resolve()}/groups.db"))
    try:
        yield r
    finally:
        r.cleanup()


def _committed(store: Backend, source: FileShareSource) -> tuple[int, bool]:
    """How many input files are committed, and whether no batch is left planned."""
    resources = [r.id for r in source.discover()]
    progress = store.progress(GROUP, resources)
    done, idle = 0, True
    for resource in resources:
        value = progress[resource].value if resource in progress else None
        if not value:
            idle = False
            continue
        done += int(value["files"])
        idle = idle and value.get("batch") is None
    return done, idle


def _write_new_files(landing: Path) -> None:
    """Files that arrive after the kill, in every directory."""
    for d in range(DIRS):
        rows = [f"late-{d:02d}-{r:04d},{r}" for r in range(ROWS)]
        (landing / f"dir-{d:02d}" / "part-late.csv").write_text("\n".join(rows) + "\n")


def assert_every_file_landed_once(output: Path, landing: Path) -> None:
    """Every row of every input file is in the output once, and each file in one batch.

    The one place that reads the output: adapt it when the output format changes."""
    from deltalake import DeltaTable

    expected: set[str] = set()
    for path in landing.rglob("*.csv"):
        expected |= {line.split(",")[0] for line in path.read_text().splitlines() if line}
    table = DeltaTable(str(output)).to_pyarrow_table(columns=["id", "_file", "_resource", "_batch"])
    got = Counter(table.column("id").to_pylist())
    duplicates = {i: n for i, n in got.items() if n > 1}
    assert not duplicates, f"rows landed more than once: {sorted(duplicates.items())[:10]}"
    assert set(got) == expected, f"missing rows: {sorted(expected - set(got))[:10]}"
    batches_of: dict[str, set[tuple[str, int]]] = {}
    for file, resource, batch in zip(
        table.column("_file").to_pylist(),
        table.column("_resource").to_pylist(),
        table.column("_batch").to_pylist(),
        strict=True,
    ):
        batches_of.setdefault(str(file), set()).add((str(resource), int(batch)))
    assert len(batches_of) == len(list(landing.rglob("*.csv")))
    several = {f: b for f, b in batches_of.items() if len(b) > 1}
    assert not several, f"files in several batches: {several}"


def _check_audit(
    workdir: Path, since: float, *, drained: bool, lost_as: str = "abandoned: "
) -> None:
    """The audit verifies, and the victim's two resources ended after ``since`` (wall clock) in
    events saying why: ``lost`` as "abandoned: …" by the watchdog, or, when ``drained`` may
    be, ``released`` by a stop. (SIGTERM to spark-submit: the JVM's shutdown also ends the
    Python driver with SIGTERM, so the job may stop as if asked to, draining, before its
    watchdog sees the SparkContext gone; see ``jobs.stop_spark``.) Its audit log was flushed
    before it exited; its stdout may be gone with its JVM."""
    verdict = verify_table(str(workdir / "audit"), group=GROUP)
    assert verdict.ok, verdict.report()
    ended = [
        e
        for e in load_events(str(workdir / "audit"), group=GROUP)
        if e["member_id"] == "job-1"
        and cast(float, e["at"]) >= since
        and e["kind"] in ("lost", "released")
    ]
    assert len(ended) == 2 and len({e["resource"] for e in ended}) == 2, ended
    abandoned = all(e["kind"] == "lost" and str(e["reason"]).startswith(lost_as) for e in ended)
    released = all(e["kind"] == "released" for e in ended)
    assert abandoned or (drained and released), ended
    print(f"the victim's resources ended {'lost as ' + repr(lost_as) if abandoned else 'released'}")


def _children() -> set[int]:
    me = str(os.getpid())
    out: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if stat.read_text().rsplit(")", 1)[1].split()[1] == me:
                out.add(int(stat.parent.name))
    return out


@contextlib.contextmanager
def _subreaper() -> Iterator[None]:
    """Make this process the reaper of orphans below it, so that the exit code of a Python
    driver orphaned by its JVM reaches the test (Linux ``PR_SET_CHILD_SUBREAPER``). At the end,
    the orphans adopted meanwhile and still unreaped (the Python workers of a dead JVM) are
    ended and reaped; this process's own children from before are left alone."""
    before = _children()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0, os.strerror(ctypes.get_errno())
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid in _children() - before:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _orphan_exit_code(pid: int) -> Callable[[], int | None]:
    """The exit code of ``pid`` once it ended (negative: the signal that ended it), read by
    this process after adopting it (see :func:`_subreaper`); None before."""

    def check() -> int | None:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            # Not ours: either not adopted yet (its JVM parent is not dead yet), or it exited
            # while the JVM still lived and the JVM reaped it (SIGTERM: the JVM's shutdown hook
            # stops the SparkContext first, which the watchdog sees before the JVM is gone).
            return None if Path(f"/proc/{pid}").exists() else REAPED_BY_ITS_JVM
        return os.waitstatus_to_exitcode(status) if got == pid else None

    return check


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _jvm_child_of(pid: int) -> int:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            child = int(stat.parent.name)
            cmdline = (stat.parent / "cmdline").read_bytes()
            if _parent_of(child) == pid and b"SparkSubmit" in cmdline:
                return child
    raise AssertionError(f"driver {pid} has no Spark JVM child")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "term"])
def test_a_spark_submit_driver_whose_jvm_dies_stops_owning_and_exits(
    run: _Run, sig: signal.Signals
) -> None:
    run.start("job-1")
    run.start("job-2")
    run.wait_split()
    victim = run.jobs.pop("job-1")
    driver = run.driver_pid("job-1")
    assert _parent_of(driver) == victim.proc.pid, "the JVM should be the driver's parent"
    with _subreaper():
        since = time.time()
        os.kill(victim.proc.pid, sig)  # the JVM only: its Python driver lives on
        killed_at = time.monotonic()
        victim.proc.wait(60)
        code, exited, taken = run.watch_death(
            "job-1", "job-2", killed_at, _orphan_exit_code(driver)
        )
    _check_death(f"spark-submit JVM killed with {sig.name}", victim, code, exited, taken)
    _check_exactly_once(run, since, drained=sig is signal.SIGTERM)


@pytest.mark.timeout(600)
def test_a_python_driver_whose_jvm_child_dies_stops_owning_and_exits(run: _Run) -> None:
    victim = run.start("job-1", launcher="python")
    run.start("job-2")
    run.wait_split()
    del run.jobs["job-1"]
    try:
        since = time.time()
        os.kill(_jvm_child_of(victim.proc.pid), signal.SIGKILL)
        killed_at = time.monotonic()
        code, exited, taken = run.watch_death("job-1", "job-2", killed_at, victim.proc.poll)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait(60)
    _check_death("python driver's JVM child killed with SIGKILL", victim, code, exited, taken)
    _check_exactly_once(run, since)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", ["python", "jvm"])
def test_a_driver_whose_user_code_stops_the_spark_context_stops_owning_and_exits(
    run: _Run, how: str
) -> None:
    # spark-submit's JVM outlives the SparkContext and ends with its driver's exit code.
    victim, since, (code, exited, taken) = _told(run, STOP_CONTEXT, STOP_CONTEXT_HOW=how)
    _check_death(f"SparkContext stopped by user code ({how})", victim, code, exited, taken)
    _check_exactly_once(run, since)


def _told(run: _Run, action: str, **env: str) -> tuple[_Job, float, tuple[int, float, float]]:
    """Start job-1 as :data:`MARKED_JOB` doing ``action`` and job-2 as the reference job; once
    they split the directories, tell job-1 and watch it die (:meth:`_Run.watch_death`). The
    victim, the wall-clock time it was told, and what ``watch_death`` returned."""
    script = run.workdir / "marked_job.py"
    script.write_text(MARKED_JOB.replace("ACTION", action.strip("\n")))
    marker = run.workdir / "the-marker"
    victim = run.start("job-1", script=script, JOB_MARKER=str(marker), **env)
    run.start("job-2")
    run.wait_split()
    del run.jobs["job-1"]
    try:
        since = time.time()
        marker.touch()
        told_at = time.monotonic()
        return victim, since, run.watch_death("job-1", "job-2", told_at, victim.proc.poll)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait(60)


@pytest.mark.timeout(600)
def test_a_job_whose_member_thread_fails_exits_with_its_code_and_its_work_moves(
    run: _Run,
) -> None:
    # The member left its group for good: a job that ran on owning nothing would hide it. It
    # exits with MEMBER_FAILED_EXIT instead, for its supervisor to start it again.
    victim, since, (code, exited, taken) = _told(run, BREAK_MEMBER)
    print(
        f"\nmember thread failed: the job exited (code {code}) {exited:.2f} s after it; its "
        f"directories were owned again after {taken:.2f} s"
    )
    assert code == MEMBER_FAILED_EXIT, f"exit code {code}:\n{victim.tail()}"
    assert "a bug in the member thread" in victim.tail(200), victim.tail()
    # The member leaves at once (no session timeout): its work moves within a rebalance.
    assert taken <= SESSION_TIMEOUT, f"owned again only after {taken:.2f} s"
    _check_exactly_once(run, since, lost_as="member thread failed")


def _check_death(case: str, victim: _Job, code: int, exited: float, taken: float) -> None:
    print(
        f"\n{case}: the victim exited (code {code}) {exited:.2f} s after it; its directories "
        f"were owned again after {taken:.2f} s (session timeout {SESSION_TIMEOUT:g} s)"
    )
    # A driver reaped by its still living JVM leaves no exit code here; the audit's
    # "abandoned" events (checked later) show it took the watchdog's way out.
    assert code in (DEAD_DRIVER_EXIT, REAPED_BY_ITS_JVM), f"exit code {code}:\n{victim.tail()}"
    assert taken <= SESSION_TIMEOUT + 1, f"owned again only after {taken:.2f} s"
    assert exited <= SESSION_TIMEOUT + 1, f"exited only after {exited:.2f} s"


def _check_exactly_once(
    run: _Run, since: float, *, drained: bool = False, lost_as: str = "abandoned: "
) -> None:
    """Files written after the death land too, every file once, and the audit verifies."""
    _write_new_files(run.landing)
    assert run.finish("job-2") == 0
    assert_every_file_landed_once(run.workdir / "output", run.landing)
    _check_audit(run.workdir, since, drained=drained, lost_as=lost_as)
