"""Tools for testing code built on rebalancer-spark: run a member as its own process with a
trail of everything it did (:mod:`rebalancer_spark.testing.member_process`)."""
