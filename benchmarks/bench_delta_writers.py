"""Many writers, one table: processes committing batches into one Delta table on S3 (moto's
server, started here) through the fenced committer of the output, and whether every
acknowledged commit is in the table's log.

    python benchmarks/bench_delta_writers.py                      # 2 and 4 writers x 100 batches
    python benchmarks/bench_delta_writers.py --writers 2 --batches 200

Each writer is a process of its own (as each job of a group is), committing one small Parquet
file per batch with its resource's app transaction. The printed line per run: writers x batches,
acknowledged commits, data commits found in ``_delta_log``, rows, seconds, commits per second.
(Spark's plain Delta writer on ``s3a://`` lost 2 of 80 and 3 of 120 acknowledged commits with
two drivers in the same set-up: docs/spark.md.)
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rebalancer_spark.testing.delta_writers import count, run_writers

KEY, SECRET, REGION = "bench-key", "bench-secret", "us-east-1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--batches", type=int, default=100)
    args = parser.parse_args()
    import boto3

    # moto in a process of its own: delta-rs holds the GIL while it reads a table's history,
    # which would starve a server thread in this process.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(endpoint + "/moto-api/", timeout=1)  # noqa: S310 - loopback
            break
        except OSError:
            time.sleep(0.1)
    options = {"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": REGION,
               "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}  # fmt: skip
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY,
                      aws_secret_access_key=SECRET, region_name=REGION)  # fmt: skip
    try:
        for writers in args.writers:
            bucket = f"writers-{uuid.uuid4().hex[:8]}"
            s3.create_bucket(Bucket=bucket)
            uri = f"s3://{bucket}/output"
            began = time.monotonic()
            results = run_writers(uri, options, writers, args.batches)
            seconds = time.monotonic() - began
            acknowledged = sum(r.acknowledged for r in results)
            commits, rows = count(uri, options)
            print(
                f"{writers} writers x {args.batches} batches on S3: acknowledged {acknowledged}, "
                f"in the log {commits}, rows {rows}, {seconds:.1f} s, "
                f"{commits / seconds:.1f} commits/s, lost {acknowledged - commits}",
                flush=True,
            )
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
