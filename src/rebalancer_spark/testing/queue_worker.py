"""A member process that consumes queues with the queue loop, for torture tests.

::

    python -m rebalancer_spark.testing.queue_worker --group g --backend sqlite:///tmp/g.db \
        --source 'rabbitmq://guest:guest@127.0.0.1:5672/%2F?queues=a,b' --output /tmp/out \
        --member-id w1 [--audit /tmp/audit] [--option session_timeout=2]

It runs exactly the loop and the output a Spark job runs
(:class:`~rebalancer_spark.spark.queue_loop.QueueLoop` writing through
:class:`~rebalancer_spark.spark.queue_output.QueueOutput` into a Delta table, Spark writing the
files) in a small local Spark application of its own (``local[1]``, no UI, no Delta jars: the
commits are delta-rs's), without ``spark-submit``'s frame and without a transform. The Spark
session starts before the member joins; prints ``ready`` once it joined; SIGTERM drains and
leaves; ``kill -9`` is what the tests do to it (its JVM exits with it).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rebalancer_spark.audit import DeltaAuditLog
from rebalancer_spark.core.config import MemberConfig
from rebalancer_spark.core.errors import ConfigurationError, RebalancerError
from rebalancer_spark.core.events import EventSink
from rebalancer_spark.core.urls import redact_url
from rebalancer_spark.member import Member, default_backend_url
from rebalancer_spark.shutdown import exit_process, stop_on_signals
from rebalancer_spark.sources import open_source
from rebalancer_spark.sources.queues import QueueSource
from rebalancer_spark.spark.outputs import DeltaOutput
from rebalancer_spark.spark.queue_loop import QueueLoop
from rebalancer_spark.spark.queue_output import QueueOutput

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["main", "open_queue_source"]


def open_queue_source(url: str) -> QueueSource:
    """The queue source of ``url`` (a queue plug-in's URL: rabbitmq://, amqp://, sqs:// ...),
    opened through the source registry."""
    source = open_source(url)
    if not isinstance(source, QueueSource):
        raise ConfigurationError(
            f"source {redact_url(url)!r} is a {type(source).__name__}, not a queue source: "
            "give a queue URL such as rabbitmq://USER@HOST/VHOST?queues=a or sqs://REGION/PREFIX"
        )
    return source


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="queue_worker", description=__doc__.split("\n")[0])
    parser.add_argument("--group", required=True)
    parser.add_argument("--backend", default=None)
    parser.add_argument("--member-id", default=None)
    parser.add_argument("--source", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--audit", default=None)
    parser.add_argument("--poll-interval", type=float, default=0.05)
    parser.add_argument("--discovery-interval", type=float, default=30.0)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    options: dict[str, object] = dict(o.split("=", 1) for o in args.option)
    options.update({"group": args.group, "member_id": args.member_id, "backend": args.backend})
    stop = threading.Event()
    stop_on_signals(stop, signal.SIGTERM)
    spark = _spark(args.group)
    audit = DeltaAuditLog(args.audit) if args.audit else None
    sinks: list[EventSink] = [audit] if audit is not None else []
    try:
        config = MemberConfig.from_mapping(options, default_backend=default_backend_url())
        source = open_queue_source(args.source)
        member = Member(
            config,
            discover=source.discover,
            discovery_interval=args.discovery_interval,
            event_sinks=sinks,
        )
        member.start()
    except RebalancerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        spark.stop()
        return 2
    print("ready", flush=True)

    def audit_first() -> None:
        if audit is not None:
            audit.flush(timeout=30)

    output = QueueOutput(spark, DeltaOutput(spark, args.output, config.group))
    loop = QueueLoop(member, source, output, before_first_batch=audit_first)
    stats = loop.run(stop, args.poll_interval)
    member.stop()
    spark.stop()
    if audit is not None:
        audit.close()
    print(
        f"stopped: {stats.batches} batches, {stats.messages} messages, {stats.written} "
        f"written, {stats.duplicates} duplicates, {stats.fenced} fenced",
        flush=True,
    )
    return 0


def _spark(group: str) -> SparkSession:
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[1]")
        .appName(f"queue-worker-{group}")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.driver.memory", "512m")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


if __name__ == "__main__":
    exit_process(main())
