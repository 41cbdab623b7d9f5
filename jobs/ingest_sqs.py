"""Reference job: consume the SQS queues of a name prefix, split between the jobs of a group.

    spark-submit jobs/ingest_sqs.py --group orders \\
        --source 'sqs://us-east-1/orders-?visibility_timeout=120' \\
        --output /lake/bronze/orders --audit /lake/audit/ownership [--backend URL] ...

Each queue whose name starts with the prefix is a resource. Every message lands in the Delta
table --output once per dedupe key, and is deleted only after its batch is written and
committed. Credentials come from boto3's usual chain. SIGTERM (or Ctrl-C) drains this job's
queues to the others and stops. See docs/queues.md; `--help` lists the job's options.
"""

from __future__ import annotations

import sys

from rebalancer_spark.shutdown import exit_process
from rebalancer_spark.sources.sqs import SqsSource
from rebalancer_spark.spark.queues import queue_job_main

if __name__ == "__main__":
    exit_process(queue_job_main(sys.argv[1:], "ingest_sqs.py", SqsSource, schemes=("sqs",)))
