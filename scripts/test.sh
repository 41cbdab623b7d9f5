#!/usr/bin/env bash
# The test command: sets everything up, then runs the linter, the formatter check, the strict
# type checker, the import-layer check, the Spark smoke tests on the newest Spark/Delta pair
# (.venv-spark-newest), the core and backends' tests on every other Python 3.11+ found
# (.venv-pyX.Y), and last the whole test suite (slow tests included) on the lowest pair (.venv).
# Extra arguments go to the whole suite's pytest only, and skip the other two, e.g.
# scripts/test.sh -m 'not slow' -x
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
echo "[test] ruff";          .venv/bin/ruff check src tests benchmarks jobs scripts
echo "[test] ruff format";   .venv/bin/ruff format --check src tests benchmarks jobs scripts
echo "[test] mypy --strict"; .venv/bin/mypy
echo "[test] import layers"; .venv/bin/lint-imports

# The core and the backends: what runs without Spark, S3 or queues (the member runtime's own
# tests, test_member.py and test_control_member.py, half of the time, run on the main Python
# only).
CORE_TESTS=(
    tests/contract tests/test_assignors.py tests/test_model.py tests/test_protocols.py
    tests/test_config.py tests/test_coordinator_rules.py tests/test_status.py
    tests/test_sqlite.py tests/test_zookeeper.py tests/test_redis.py
)

failed=0
# finish NAME CODE: exit status 5 (no tests collected) counts as a failure too.
finish() {
    if [ "$2" = 5 ]; then
        echo "[test] $1: pytest collected no tests: that is a failure here" >&2
        failed=1
    elif [ "$2" != 0 ]; then
        failed=$2
    fi
}

if [ "$#" = 0 ]; then
    # The Spark smoke tests on the newest Spark/Delta pair (Spark keeps both cores busy) ...
    if [ -x .venv-spark-newest/bin/python ]; then
        echo "[test] Spark smoke tests on $(.venv-spark-newest/bin/python -c 'import pyspark; print("pyspark", pyspark.__version__)') (.venv-spark-newest)"
        set +e
        PYSPARK_PYTHON="$PWD/.venv-spark-newest/bin/python" .venv-spark-newest/bin/python -m pytest \
            -m spark_smoke -p no:cacheprovider -q
        code=$?
        set -e
        finish "the Spark smoke tests" "$code"
    fi
    # ... then the core on each other Python, one after the other: side by side they load the
    # two cores enough to break the contract suite's bounds on watch wake-ups.
    for venv in .venv-py3.*; do
        [ -x "$venv/bin/python" ] || continue
        echo "[test] core and backends on $("$venv/bin/python" --version) ($venv)"
        set +e
        REBALANCER_HYPOTHESIS_PROFILE=other-python "$venv/bin/python" -m pytest \
            "${CORE_TESTS[@]}" -m 'not slow' -p no:cacheprovider -q
        code=$?
        set -e
        finish "the core on $venv" "$code"
    done
fi

echo "[test] pytest"
set +e
.venv/bin/python -m pytest --durations=30 "$@"
code=$?
set -e
finish "the whole suite" "$code"
exit "$failed"
