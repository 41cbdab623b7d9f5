#!/usr/bin/env bash
# The main job: sets up what the demo needs (Java, .venv with Spark, Delta's jars: no
# ZooKeeper, Redis, RabbitMQ or test tools), then runs three concurrent spark-submit jobs in
# one group on the embedded SQLite backend, kills one, shows the take-over, and proves from the
# Delta audit table and the output that every file was processed exactly once.
# Extra arguments go to scripts/demo.py (--jobs N, --dirs N, --files N, --backend URL).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --demo
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
exec .venv/bin/python scripts/demo.py "$@"
