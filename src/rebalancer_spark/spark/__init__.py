"""Spark glue: options, the node on the driver, sources as DataFrames."""
