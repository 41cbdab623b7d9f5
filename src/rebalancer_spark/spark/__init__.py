"""Spark glue: the node on the driver, batches of owned resources, fenced outputs, job frames.

The façade of the Spark side; everything a pipeline needs is importable from here::

    from rebalancer_spark.spark import batches, job_main, start

    def loop(ctx):                                  # a job's loop, run by job_main
        while not ctx.stop.is_set():
            for batch in batches(ctx.spark):        # what this job owns now
                with batch:                         # fenced anywhere: dropped, logged
                    batch.write(batch.read())       # one fenced Delta commit, then progress
            ctx.stop.wait(ctx.job.poll_interval)
        return "done"

Names load lazily, so ``import rebalancer_spark.spark`` imports neither pyspark nor deltalake.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rebalancer_spark.spark.batch import Batch, batches
    from rebalancer_spark.spark.jobs import JobContext, job_main
    from rebalancer_spark.spark.options import JobConfig
    from rebalancer_spark.spark.outputs import DeltaOutput, Output, ParquetOutput, open_output
    from rebalancer_spark.spark.session import (
        RebalancerNode,
        assigned_sources,
        current_node,
        start,
    )
    from rebalancer_spark.spark.source import AssignedSource

__all__ = [
    "AssignedSource",
    "Batch",
    "DeltaOutput",
    "JobConfig",
    "JobContext",
    "Output",
    "ParquetOutput",
    "RebalancerNode",
    "assigned_sources",
    "batches",
    "current_node",
    "job_main",
    "open_output",
    "start",
]

_HOMES = {
    "AssignedSource": "source",
    "Batch": "batch",
    "DeltaOutput": "outputs",
    "JobConfig": "options",
    "JobContext": "jobs",
    "Output": "outputs",
    "ParquetOutput": "outputs",
    "RebalancerNode": "session",
    "assigned_sources": "session",
    "batches": "batch",
    "current_node": "session",
    "job_main": "jobs",
    "open_output": "outputs",
    "start": "session",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rebalancer_spark.spark' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rebalancer_spark.spark.{home}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
