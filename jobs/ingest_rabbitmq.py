"""Reference job: consume RabbitMQ queues, split between the jobs of a group, at least once.

    spark-submit jobs/ingest_rabbitmq.py --group orders \\
        --source 'rabbitmq://USER:PASSWORD@HOST:5672/VHOST?queues=orders,payments' \\
        --output /lake/bronze/orders --audit /lake/audit/ownership [--backend URL] ...

Each queue is a resource. Every message lands in the Delta table --output once per dedupe key
(columns _resource, _key, _body, _headers, _redelivered), and is acknowledged only after its
batch is written and committed. SIGTERM (or Ctrl-C) drains this job's queues to the others and
stops. See docs/queues.md for the URL options; `--help` lists the job's options.
"""

from __future__ import annotations

import sys

from rebalancer_spark.shutdown import exit_process
from rebalancer_spark.sources.rabbitmq import RabbitMqSource
from rebalancer_spark.sources.registry import plugin_named
from rebalancer_spark.spark.queues import queue_job_main

if __name__ == "__main__":
    exit_process(
        queue_job_main(
            sys.argv[1:],
            "ingest_rabbitmq.py",
            RabbitMqSource,
            schemes=plugin_named("rabbitmq").schemes,
        )
    )
