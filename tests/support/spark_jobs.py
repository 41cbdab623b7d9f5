"""spark-submit jobs of one group for the slow tests: start, kill, stop them, and read what
they committed (the torture test, the user-pipeline test)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rebalancer_spark.backends import Backend, open_backend
from rebalancer_spark.sources.files import FileShareSource
from rebalancer_spark.spark.packages import spark_submit_command
from tests.support.helpers import JOB_CONF

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Job:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    driver_pid: int | None = None

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class SparkJobs:
    """``script`` run as spark-submit applications of ``group`` over the file share at
    ``workdir/landing``, writing ``workdir/output`` and ``workdir/audit``, on SQLite."""

    workdir: Path
    group: str
    script: Path
    args: Sequence[str] = ()
    session_timeout: float = 4.0
    backend: str = ""
    """The group's store (default: an SQLite file in ``workdir``)."""
    source: str = ""
    """The jobs' --source (default: the file share at ``workdir/landing``)."""
    output: str = ""
    """The jobs' --output (default: ``workdir/output``)."""
    jobs: dict[str, Job] = field(default_factory=dict)
    started: int = 0

    def __post_init__(self) -> None:
        self.backend = self.backend or f"sqlite://{self.workdir.resolve()}/groups.db"
        self.store: Backend = open_backend(self.backend)
        self.landing_url = (self.workdir / "landing").resolve().as_uri() + "/"
        self.share = FileShareSource(self.landing_url)
        self.source = self.source or self.landing_url
        self.output = self.output or str(self.workdir / "output")
        self.env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src"),
                                           os.environ.get("PYTHONPATH", "")]),
        }  # fmt: skip

    def start_job(self) -> Job:
        self.started += 1
        name = f"job-{self.started}"
        cmd = spark_submit_command(
            self.script,
            "--group", self.group, "--backend", self.backend, "--member-id", name,
            "--source", self.source, "--output", self.output,
            "--audit", str(self.workdir / "audit"), *self.args,
            conf={
                **JOB_CONF,
                "spark.rebalancer.session-timeout": f"{self.session_timeout}s",
                # Spark's scratch space (with a copy of every --jars jar, 0.5 GB with
                # hadoop-aws) inside the test's directory: a killed application never removes
                # its own, and /tmp filled up with them.
                "spark.local.dir": str(self.workdir.resolve() / "spark-local"),
            },
        )  # fmt: skip
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            # A session of its own: the JVM and the Python driver it starts share a process
            # group that the test can end as one.
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        self.jobs[name] = job = Job(name, proc, log)
        return job

    def check_alive(self) -> None:
        for job in self.jobs.values():
            if job.proc.poll() is not None:
                raise AssertionError(f"{job.name} exited with {job.proc.returncode}:\n{job.tail()}")

    def driver_pid(self, job: Job) -> int | None:
        if job.driver_pid is None:
            record = self.store.state(self.group).members.get(job.name)
            if record is not None:
                job.driver_pid = int(record.info["pid"])
        return job.driver_pid

    def kill(self, job: Job) -> None:
        """kill -9 the Python driver (the member lives there), then its spark-submit JVM."""
        pid = self.driver_pid(job)
        assert pid is not None, f"{job.name} never joined the group"
        os.kill(pid, signal.SIGKILL)
        os.killpg(job.proc.pid, signal.SIGKILL)
        job.proc.wait(60)
        del self.jobs[job.name]

    def pause(self, job: Job) -> None:
        """SIGSTOP the whole application: its JVM, its Python driver and Spark's workers."""
        os.killpg(job.proc.pid, signal.SIGSTOP)

    def resume(self, job: Job) -> None:
        os.killpg(job.proc.pid, signal.SIGCONT)

    def stop(self, job: Job, timeout: float = 120) -> int:
        """SIGTERM to the Python driver: it drains its resources and leaves; its exit code."""
        pid = self.driver_pid(job)
        assert pid is not None, f"{job.name} never joined:\n{job.tail()}"
        os.kill(pid, signal.SIGTERM)
        code = job.proc.wait(timeout)
        del self.jobs[job.name]
        return code

    def committed(self, resources: Sequence[str] = ()) -> tuple[int, bool]:
        """How many input files are committed, and whether no batch is left planned (of
        ``resources``, by default those of the file share)."""
        resources = list(resources) or [r.id for r in self.share.discover()]
        progress = self.store.progress(self.group, resources)
        done, idle = 0, True
        for resource in resources:
            value = progress[resource].value if resource in progress else None
            if not value:
                idle = False
                continue
            done += int(value["files"])
            idle = idle and value.get("batch") is None
        return done, idle

    def cleanup(self) -> None:
        for job in self.jobs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.proc.pid, signal.SIGCONT)
                os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait(60)
        self.jobs.clear()
        self.store.close()
