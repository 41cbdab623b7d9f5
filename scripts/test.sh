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

# The core and the backends: what runs without Spark, S3 or queues.
CORE_TESTS=(
    tests/contract tests/test_assignors.py tests/test_model.py tests/test_protocols.py
    tests/test_config.py tests/test_coordinator_rules.py tests/test_status.py
    tests/test_sqlite.py tests/test_zookeeper.py tests/test_redis.py tests/test_member.py
    tests/test_control_member.py
)

failed=0
# pytest VENV ARGS...: one pytest run in VENV (its own Python for Spark's workers too); exit
# status 5 (no tests collected) counts as a failure.
run_pytest() {
    local venv=$1 code
    shift
    set +e
    PYSPARK_PYTHON="$PWD/$venv/bin/python" "$venv/bin/python" -m pytest "$@"
    code=$?
    set -e
    if [ "$code" = 5 ]; then
        echo "[test] pytest collected no tests in $venv: that is a failure here" >&2
        code=1
    fi
    [ "$code" = 0 ] || failed=$code
    return 0
}

if [ "$#" = 0 ]; then
    if [ -x .venv-spark-newest/bin/python ]; then
        echo "[test] Spark smoke tests on $(.venv-spark-newest/bin/python -c 'import pyspark; print("pyspark", pyspark.__version__)') (.venv-spark-newest)"
        run_pytest .venv-spark-newest -m spark_smoke -p no:cacheprovider -q
    fi
    for venv in .venv-py3.*; do
        [ -x "$venv/bin/python" ] || continue
        echo "[test] core and backends on $("$venv/bin/python" --version) ($venv)"
        run_pytest "$venv" "${CORE_TESTS[@]}" -m 'not slow' -p no:cacheprovider -q
    done
fi

echo "[test] pytest"
run_pytest .venv "$@"
exit "$failed"
