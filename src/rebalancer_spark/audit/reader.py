"""Reading the audit table back: as Python dicts (no Spark) or as a Spark DataFrame.

Use case: :func:`load_events` feeds the verifier and the CLI's history on any machine with
``deltalake``; :func:`read_audit` gives analysts a DataFrame for Spark SQL, on a cluster with the
Delta jars and on a laptop or build machine without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from rebalancer_spark.audit.delta import (
    AUDIT_COLUMNS,
    audit_schema,
    missing_chain_columns,
    open_audit_table,
)
from rebalancer_spark.core.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["delta_reader_available", "epoch_floors", "load_events", "read_audit"]

_TIME_COLUMNS = ("at", "observed_at", "freed_at")
_DELTA_SOURCE_CLASS = "org.apache.spark.sql.delta.sources.DeltaDataSource"


def load_events(
    path: str, *, group: str | None = None, storage_options: Mapping[str, str] | None = None
) -> list[dict[str, object]]:
    """Every event in the audit table at ``path`` (of ``group`` only, if given), through
    deltalake and pyarrow, no Spark: one dict per row with the :data:`AUDIT_COLUMNS`, ``at``
    and ``observed_at`` as float epoch seconds, sorted by (``at``, ``resource``).

    Raises :class:`ConfigurationError` when there is no table at ``path`` and
    :class:`CorruptStateError` when the table there is not an audit table. A table written
    before the epoch chain's columns reads them as None."""
    table = _arrow_table(path, group, storage_options)
    for name in _TIME_COLUMNS:
        seconds = pc.divide(table.column(name).cast(pa.int64()).cast(pa.float64()), 1e6)
        table = table.set_column(table.schema.get_field_index(name), name, seconds)
    rows: list[dict[str, object]] = table.to_pylist()
    rows.sort(key=lambda row: (row["at"], row["resource"]))
    return rows


_COORDINATOR_KINDS = ("control", "rebalance")


def epoch_floors(
    path: str, group: str, *, storage_options: Mapping[str, str] | None = None
) -> dict[str, int]:
    """The highest resource epoch the audit table at ``path`` records for each resource of
    ``group``: what a member tells its store (``Backend.remember_epochs``) so that no grant
    goes back below it, even if the store lost its state. Empty when there is no table there
    yet. The coordinator's rows (``control``, ``rebalance``) carry its own epoch, not a
    resource's, and group-wide rows no resource: both are left out."""
    try:
        table = open_audit_table(path, storage_options)
    except ConfigurationError:
        return {}
    filters = [
        ("group", "=", group),
        ("kind", "not in", list(_COORDINATOR_KINDS)),
        ("resource", "!=", ""),
    ]
    arrow = table.to_pyarrow_table(columns=["resource", "epoch"], filters=filters)
    grouped = arrow.group_by("resource").aggregate([("epoch", "max")])
    return {
        str(r): int(e)
        for r, e in zip(
            grouped.column("resource").to_pylist(),
            grouped.column("epoch_max").to_pylist(),
            strict=True,
        )
        if e is not None
    }


def read_audit(spark: SparkSession, path: str, *, group: str | None = None) -> DataFrame:
    """The audit table at ``path`` (of ``group`` only, if given) as a DataFrame with the
    :data:`AUDIT_COLUMNS`, ``at`` and ``observed_at`` as timestamps.

    Where the Delta jars are on the classpath (a cluster with delta-spark), this is Spark's own
    reader, ``spark.read.format("delta").load(path)``, distributed and lazy. Without them (the
    build machines, a plain ``pip install pyspark``), the table is read on the driver by
    deltalake into Arrow and handed to ``spark.createDataFrame``: fine for audit-sized tables,
    and the same rows and columns either way.
    """
    if delta_reader_available(spark):
        frame = spark.read.format("delta").load(path)
        frame = frame.select(*[c for c in AUDIT_COLUMNS if c in frame.columns])
        return frame if group is None else frame.where(frame["group"] == group)
    return spark.createDataFrame(_arrow_table(path, group, None))


def delta_reader_available(spark: SparkSession) -> bool:
    """Whether ``spark`` can read ``format("delta")``: a class lookup in the driver's JVM,
    quiet and cheap; for a Spark Connect session, which has no JVM here, one probe of the
    format that is expected to fail with DATA_SOURCE_NOT_FOUND when the jars are absent."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is not None:
        return bool(jvm.org.apache.spark.util.Utils.classIsLoadable(_DELTA_SOURCE_CLASS))
    try:
        _ = spark.read.format("delta").load("/rebalancer-spark/delta-probe").schema
    except Exception as exc:
        text = str(exc)
        return not ("DATA_SOURCE_NOT_FOUND" in text or "Failed to find the data source" in text)
    return True


def _arrow_table(
    path: str, group: str | None, storage_options: Mapping[str, str] | None
) -> pa.Table:
    table = open_audit_table(path, storage_options)
    filters = [("group", "=", group)] if group is not None else None
    missing = missing_chain_columns(table)
    present = [c for c in AUDIT_COLUMNS if c not in missing]
    arrow = table.to_pyarrow_table(columns=present, filters=filters)
    schema = audit_schema()
    for name in missing:  # a table written before the chain: its columns read as nulls
        kind = schema.field(name).type
        arrow = arrow.append_column(pa.field(name, kind), pa.nulls(arrow.num_rows, kind))
    return arrow
