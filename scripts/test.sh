#!/usr/bin/env bash
# The test command: sets everything up, then runs the linter, the formatter check, the strict
# type checker, the import-layer check and the whole test suite (slow tests included).
# Extra arguments go to pytest, e.g. scripts/test.sh -m 'not slow' -x
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
echo "[test] ruff";          .venv/bin/ruff check src tests benchmarks jobs scripts
echo "[test] ruff format";   .venv/bin/ruff format --check src tests benchmarks jobs scripts
echo "[test] mypy --strict"; .venv/bin/mypy
echo "[test] import layers"; .venv/bin/lint-imports
echo "[test] pytest"
set +e
.venv/bin/python -m pytest "$@"
code=$?
set -e
if [ "$code" = 5 ]; then
    echo "[test] pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$code"
