"""``python -m rebalancer_spark.cli``: the same as the ``rebalancer-spark`` command."""

from rebalancer_spark.cli.main import run

run()
