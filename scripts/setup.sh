#!/usr/bin/env bash
# Sets up rebalancer-spark on a fresh Debian/Ubuntu machine with Python 3.11+. Safe to run
# again: it skips what is already done.
#
#   scripts/setup.sh --demo   what the demo needs: Java 17, .venv with the package and Spark
#                             (the lowest supported pair), Spark's Delta and S3 jars
#   scripts/setup.sh          the same plus what the tests need: ZooKeeper, redis-server,
#                             RabbitMQ, the test tools in .venv, .venv-spark-newest (the newest
#                             Spark/Delta pair, for the Spark smoke tests) and a .venv-pyX.Y with
#                             the core's test tools for every other Python 3.11+ found
#
# REBALANCER_MATRIX=0 skips .venv-spark-newest and the other Pythons.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[setup] %s\n' "$*"; }
PY=${PYTHON:-python3}
MODE=test
case "${1:-}" in
    --demo) MODE=demo ;;
    --test | "") ;;
    *)
        say "usage: scripts/setup.sh [--demo | --test]   (unknown argument: $1)"
        exit 2
        ;;
esac

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    say "Python 3.11 or newer is needed; '$PY' is $("$PY" --version 2>&1 || echo missing)."
    say "Install it (apt-get install python3.11 python3.11-venv) or set PYTHON=/path/to/python3.11."
    exit 1
fi

apt_install() {
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        say "installing $* from Debian's packages"
        if [ ! -f /tmp/.rebalancer-apt-updated ]; then
            DEBIAN_FRONTEND=noninteractive apt-get update -qq && touch /tmp/.rebalancer-apt-updated
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
        return 0
    fi
    return 1
}

java_major() {
    java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1
}
if ! command -v java >/dev/null || [ "$(java_major)" -lt 17 ] 2>/dev/null; then
    apt_install openjdk-17-jre-headless || {
        say "Java 17 is needed by Spark and was not found (java -version: $(java -version 2>&1 | head -n 1))."
        say "Install it: sudo apt-get install -y openjdk-17-jre-headless   (or set JAVA_HOME to a JDK 17)"
        exit 1
    }
fi
say "java $(java_major) at $(command -v java)"

servers() {
    # Servers the tests start on free ports: ZooKeeper (Debian's package) and redis-server.
    if [ ! -f /usr/share/java/zookeeper.jar ]; then
        apt_install zookeeper || {
            say "ZooKeeper is needed by the ZooKeeper backend's tests: sudo apt-get install -y zookeeper"
            exit 1
        }
    fi
    if ! command -v redis-server >/dev/null; then
        apt_install redis-server || {
            say "redis-server is needed by the Redis backend's tests: sudo apt-get install -y redis-server"
            exit 1
        }
    fi
    # A C compiler builds the library that steps redis-server's clock in the chaos runs
    # (tests/support/clockshift.c); without one those tests and steps are skipped.
    if ! command -v cc >/dev/null; then
        apt_install gcc libc6-dev || say "no C compiler: the Redis clock-step tests will be skipped"
    fi
    # RabbitMQ: the queue tests use the machine's broker on 127.0.0.1:5672 (guest/guest, or
    # $RABBITMQ_URL) and start a node of their own from the same installation for the
    # management API. Install it if missing, and start it if nothing listens on 5672.
    if ! command -v rabbitmq-server >/dev/null && [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
        apt_install rabbitmq-server || {
            say "RabbitMQ is needed by the queue tests: sudo apt-get install -y rabbitmq-server"
            exit 1
        }
    fi
    if [ -z "${RABBITMQ_URL:-}" ] && ! (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; then
        say "starting RabbitMQ (nothing listens on 127.0.0.1:5672)"
        rabbitmq-server -detached >/dev/null 2>&1 || say "could not start RabbitMQ: start it, or set RABBITMQ_URL"
        for _ in $(seq 60); do
            (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null && break
            sleep 1
        done
    fi
}
if [ "$MODE" = test ]; then
    servers
fi

# install VENV PYTHON EXTRAS [CONSTRAINTS]: create VENV with PYTHON if missing and install the
# package (editable) with EXTRAS, unless it holds them already for this pyproject.toml. A venv
# set up for the tests ("test") also serves the demo ("spark").
install() {
    local venv=$1 python=$2 extras=$3 constraints=${4:-}
    if [ ! -x "$venv/bin/python" ]; then
        say "creating $venv ($("$python" --version 2>&1))"
        "$python" -m venv "$venv"
    fi
    local stamp="$venv/.rebalancer-installed" want
    want="$(cat pyproject.toml "${constraints:-/dev/null}" | sha256sum | cut -c1-16)"
    local have
    have=$(cat "$stamp" 2>/dev/null || true)
    if [ "$have" = "$want $extras" ] || { [ "$extras" = spark ] && [ "$have" = "$want test" ]; }; then
        return 0
    fi
    say "installing .[$extras] into $venv (a few minutes the first time with pyspark)"
    "$venv/bin/python" -m pip install -q --upgrade pip setuptools wheel
    if [ -n "$constraints" ]; then
        "$venv/bin/python" -m pip install -q -c "$constraints" -e ".[$extras]"
    else
        "$venv/bin/python" -m pip install -q -e ".[$extras]"
    fi
    echo "$want $extras" > "$stamp"
}

# Spark's Delta and S3 jars for the Spark line of VENV's pyspark (delta-spark, hadoop-aws and
# the AWS SDK bundle, ~570 MB), chosen in src/rebalancer_spark/spark/packages.py and fetched
# once by Spark's Ivy into ${REBALANCER_SPARK_IVY_DIR:-~/.cache/rebalancer-spark/ivy}, outside
# the work tree. Every test session and spark-submit of the project gets them from there.
jars() {
    local venv=$1
    if ! "$venv/bin/python" -c 'import sys; from rebalancer_spark.spark.packages import jars_present; sys.exit(not jars_present())'; then
        say "fetching Spark's Delta and S3 jars for $venv (about 30 s the first time)"
    fi
    "$venv/bin/python" -m rebalancer_spark.spark.packages fetch | sed "s|^|[setup] $venv: |"
}

# The lowest supported Spark/Delta pair is the one the demo and the whole suite run on.
if [ "$MODE" = demo ]; then
    install .venv "$PY" spark scripts/constraints/spark-lowest.txt
else
    install .venv "$PY" test scripts/constraints/spark-lowest.txt
fi
jars .venv

# python_for X.Y: an interpreter of that version, on PATH or in pyenv's versions; empty if none.
python_for() {
    local v=$1 found=""
    if "python$v" -c 'import sys' >/dev/null 2>&1; then
        found=$(command -v "python$v")
    elif command -v pyenv >/dev/null; then
        for p in "$(pyenv root)"/versions/"$v".*/bin/"python$v"; do
            [ -x "$p" ] && found=$p
        done
    fi
    echo "$found"
}

if [ "$MODE" = test ] && [ "${REBALANCER_MATRIX:-1}" != 0 ]; then
    # The newest Spark/Delta pair that Delta supports: the Spark smoke tests run on it.
    install .venv-spark-newest "$PY" test scripts/constraints/spark-newest.txt
    jars .venv-spark-newest
    # The core and the backends on every other Python 3.11+ this machine has.
    main=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    for v in 3.11 3.12 3.13 3.14; do
        [ "$v" = "$main" ] && continue
        p=$(python_for "$v")
        if [ -n "$p" ]; then
            install ".venv-py$v" "$p" test-core
        fi
    done
fi
say "ready ($MODE): $(.venv/bin/python --version), rebalancer-spark installed in .venv"
