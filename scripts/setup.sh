#!/usr/bin/env bash
# Sets up everything rebalancer-spark needs on a fresh Debian/Ubuntu machine with Python 3.11+:
# checks (and, as root, installs) Java 17 for Spark, creates .venv and installs the package with
# its test extras, and fetches Spark's Delta and S3 jars into a cache. Safe to run again: it
# skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[setup] %s\n' "$*"; }
PY=${PYTHON:-python3}

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

# RabbitMQ: the queue tests use the machine's broker on 127.0.0.1:5672 (guest/guest, or
# $RABBITMQ_URL) and start a node of their own from the same installation for the management
# API. Install it if missing, and start it if nothing listens on 5672.
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

if [ ! -x .venv/bin/python ]; then
    say "creating .venv"
    "$PY" -m venv .venv
fi
stamp=.venv/.rebalancer-installed
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing Python packages into .venv (pyspark is large: a few minutes the first time)"
    .venv/bin/python -m pip install -q --upgrade pip setuptools wheel
    .venv/bin/python -m pip install -q -e ".[test]"
    echo "$want" > "$stamp"
fi

# Spark's Delta and S3 jars (delta-spark, hadoop-aws and the AWS SDK bundle, ~570 MB), pinned
# in src/rebalancer_spark/spark/packages.py and fetched once by Spark's Ivy into
# ${REBALANCER_SPARK_IVY_DIR:-~/.cache/rebalancer-spark/ivy}, outside the work tree. Every test
# session and spark-submit of the project gets them from there by path.
if ! .venv/bin/python -c 'import sys; from rebalancer_spark.spark.packages import jars_present; sys.exit(not jars_present())'; then
    say "fetching Spark's Delta and S3 jars (about 30 s the first time)"
fi
.venv/bin/python -m rebalancer_spark.spark.packages fetch | sed 's/^/[setup] /'
say "ready: $(.venv/bin/python --version), rebalancer-spark installed in .venv"
