"""The frame every ``spark-submit`` job in ``jobs/`` shares.

:func:`job_main` parses the command line, starts Spark, resolves the options (command line >
``spark.rebalancer.*`` conf > TOML), configures logging (``--log-format``), checks that the job
got the source and output it needs, opens the source, starts the driver's node, runs the job's
loop until SIGTERM or Ctrl-C, then stops Spark, which drains this member's resources to the
others and leaves the group. A job is then its loop and a few lines::

    def loop(ctx: JobContext) -> str:
        stats = run_ingest(ctx.spark, ctx.node, ctx.stop)
        return f"{stats.batches} batches"

    exit_process(job_main(argv, "ingest_files.py", loop, schemes=("file",)))

A pipeline adds flags of its own next to ours with ``add_arguments`` (an argparse argument
group); their values are ``ctx.args``. ``--log-format json`` and every other option work the
same in it.

Before the source is opened or the group joined, the paths are checked
(:mod:`.path_check`): output and audit apart, neither inside a file source nor it inside them,
no audit table among other files.

Exit codes: 0 after a clean stop, what the loop says for a loop that ends by itself
(``ingest_files.py --once``: 1 when a resource was stuck), 2 for bad options, overlapping
paths or a source that cannot be opened (one line on stderr saying what to fix), 3 when the
Spark JVM died or the SparkContext was stopped under the running node (its resources given up
at once; see :mod:`.watchdog`), 4 when the node's member thread failed (:class:`MemberFailed`:
the member left its group for good; the job stops so that its supervisor starts it again
rather than run on owning nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rebalancer_spark.core.errors import MemberFailed, RebalancerError
from rebalancer_spark.member import default_backend_url
from rebalancer_spark.member.logfields import configure_logging
from rebalancer_spark.shutdown import MEMBER_FAILED_EXIT, stop_on_signals
from rebalancer_spark.sources import ResourceSource, open_source
from rebalancer_spark.spark.job_config import JobConfig
from rebalancer_spark.spark.layers import AddArguments, parse_job_command_line
from rebalancer_spark.spark.options import resolve, spark_conf_options
from rebalancer_spark.spark.path_check import check_job_paths
from rebalancer_spark.spark.session import RebalancerNode, start
from rebalancer_spark.spark.watchdog import DEAD_DRIVER_EXIT, Probe, jvm_probes

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["MEMBER_FAILED_EXIT", "JobContext", "job_main", "stop_spark"]

_NOISY = ("py4j", "botocore", "urllib3", "pika")
_JVM_EXIT_WAIT = 5.0
"""Seconds a job whose ``spark.stop()`` failed waits for its JVM process to end (a JVM that
is shutting down) before it takes the failure for an error of its own."""

log = logging.getLogger("rebalancer_spark.spark")


@dataclass(frozen=True, slots=True)
class JobContext:
    """What a job's loop works with."""

    spark: SparkSession
    job: JobConfig
    node: RebalancerNode
    source: ResourceSource
    output: str
    stop: threading.Event
    args: argparse.Namespace
    """The pipeline's own flags (``add_arguments`` of :func:`job_main`)."""


def job_main(
    argv: Sequence[str],
    prog: str,
    loop: Callable[[JobContext], str | tuple[str, int]],
    *,
    schemes: Collection[str],
    make_source: Callable[[str], ResourceSource] = open_source,
    check: Callable[[JobConfig], None] | None = None,
    add_arguments: AddArguments | None = None,
) -> int:
    """Run a job; ``loop`` runs until ``ctx.stop`` is set and returns a one-line summary (or
    the summary and the exit status, for a loop that ends by itself: ``--once``).
    ``schemes`` are the ``--source`` URL schemes the job reads (the first one is named in the
    error when another is given); ``check`` refuses, with a :class:`RebalancerError`, options
    the job needs beyond a source and an output."""
    from pyspark.sql import SparkSession

    command_line, args = parse_job_command_line(list(argv), prog=prog, add_arguments=add_arguments)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    _quiet()
    spark = SparkSession.builder.appName(f"rebalancer-{prog.removesuffix('.py')}").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        job = resolve(
            command_line,
            spark_conf_options(spark.sparkContext.getConf().getAll()),
            default_backend=default_backend_url(),
        )
        configure_logging(job.log_format)
        _quiet()
        source_url, output = _required(job, prog, schemes)
        if check is not None:
            check(job)
        check_job_paths(job)
        source = make_source(source_url)
        print(job.describe(), flush=True)
        node = start(spark, job, source)
    except RebalancerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        spark.stop()
        return 2
    stop = threading.Event()
    stop_on_signals(stop, signal.SIGTERM, signal.SIGINT)
    name = node.member.member_id
    jvm = jvm_probes(spark.sparkContext)
    print(f"member {name} of group {job.member.group} running", flush=True)
    failed: Exception | None = None
    try:
        ended = loop(JobContext(spark, job, node, source, output, stop, args))
    except Exception as exc:  # re-raised below unless the JVM died under it
        failed = exc
    gone = stop_spark(spark, jvm)  # drains and leaves the group first
    if gone is not None:
        # A JVM killed during a batch's write also fails that write (Py4J, Spark's own
        # shutdown): the death is the cause, and the exit code says so.
        why = "" if failed is None else f" (the job's loop failed with it: {failed!r:.200})"
        log.warning("member %s stopped: %s%s; exit code %d", name, gone, why, DEAD_DRIVER_EXIT)
        return DEAD_DRIVER_EXIT
    if isinstance(failed, MemberFailed):
        log.error("member %s stopped: %s; exit code %d", name, failed, MEMBER_FAILED_EXIT)
        with contextlib.suppress(OSError):
            print(f"error: {failed}", file=sys.stderr, flush=True)
        return MEMBER_FAILED_EXIT
    if failed is not None:
        raise failed
    summary, code = ended if isinstance(ended, tuple) else (ended, 0)
    with contextlib.suppress(OSError):  # spark-submit relays this output: a pipe that can break
        print(f"member {name} stopped: {summary}", flush=True)
    return code


def stop_spark(spark: Any, jvm: Sequence[Probe], wait: float = _JVM_EXIT_WAIT) -> str | None:
    """Stop Spark (the node drains and leaves the group first); why Spark's JVM is gone when
    it is, else None.

    Use case: ``kill -TERM`` of ``spark-submit``. The JVM's shutdown stops the SparkContext
    and ends the Python driver it started with SIGTERM, so the job stops as if asked to while
    its JVM is dying: ``spark.stop()`` may then fail (Py4J has no JVM to call), and the pipe
    through which spark-submit relays the driver's output may be gone. That is a dead driver
    (:data:`DEAD_DRIVER_EXIT`), not a failed job (exit 1 with a traceback nobody sees). A
    failure of ``spark.stop()`` while the JVM process lives on for ``wait`` seconds is a real
    error and is raised."""
    try:
        spark.stop()
    except Exception:
        deadline = time.monotonic() + wait
        while (why := _jvm_gone(jvm)) is None and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the kernel for another process's end: no event to wait on
        if why is None:
            raise
        return why
    return _jvm_gone(jvm)


def _jvm_gone(jvm: Sequence[Probe]) -> str | None:
    return next((why for probe in jvm if (why := probe()) is not None), None)


def _quiet() -> None:
    for noisy in _NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _required(job: JobConfig, prog: str, schemes: Collection[str]) -> tuple[str, str]:
    example = f"{next(iter(schemes))}://…"
    if job.source is None or job.output is None:
        raise RebalancerError(f"{prog} needs --source {example} and --output PATH")
    scheme = urlsplit(job.source).scheme
    if scheme not in schemes:
        raise RebalancerError(
            f"{prog} reads {', '.join(f'{s}://' for s in schemes)} sources, not {scheme!r} "
            f"({job.source.split('?')[0].split('@')[-1]}); give --source {example} or use the "
            "job in jobs/ made for that kind of source"
        )
    return job.source, job.output
