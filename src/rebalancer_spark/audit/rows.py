"""The audit table's rows with whatever chain columns the table has, old tables included.

Use case: the output check, the rebalance statistics and the timeline read every row of an
audit table, written before or after the chain columns were added (``generation``,
``coordinator_epoch``, ``prev_*``, ``freed``, ``freed_at``, ``trigger``, ``moves``, ``seq``,
``pending_files``, ``pending_bytes``, ``pending_messages``; see
``docs/audit.md``), and need to know which kind of table they read, to say what they could
not check. :func:`load_rows` reads the base columns (:data:`AUDIT_COLUMNS`, which must all be
there) plus those of :data:`CHAIN_COLUMNS` that the table has; a row of an old table has
``None`` for each chain column.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from rebalancer_spark.audit.delta import AUDIT_COLUMNS, CHAIN_COLUMNS, audit_schema
from rebalancer_spark.core.errors import ConfigurationError, CorruptStateError
from rebalancer_spark.core.urls import redact_url

__all__ = ["CHAIN_COLUMNS", "AuditRows", "chain_schema", "load_rows"]

# The nullable columns added after the base ones (epoch chain, rebalances, row numbers, lag
# samples), with their types: delta.CHAIN_COLUMNS, re-exported here.
_CHAIN = tuple((f.name, f.type) for f in audit_schema() if f.name in CHAIN_COLUMNS)
_LATER = frozenset({"seq", "pending_files", "pending_bytes", "pending_messages"})

_TIMES = ("at", "observed_at", "freed_at")
# The base columns: every one a table must have.
_BASE = tuple(name for name in AUDIT_COLUMNS if name not in CHAIN_COLUMNS)


@dataclass(frozen=True)
class AuditRows:
    """The rows read, and which chain columns the table had."""

    rows: list[dict[str, object]]
    """One dict per row: the base and chain columns, times as float epoch seconds, sorted by
    (``at``, ``resource``)."""
    chain_columns: tuple[str, ...]
    """The :data:`CHAIN_COLUMNS` present in the table (empty for a table that predates them)."""

    @property
    def has_chain(self) -> bool:
        """Whether the table has every chain column (``seq`` and the lag samples' columns,
        added later, aside)."""
        return all(name in self.chain_columns for name in CHAIN_COLUMNS if name not in _LATER)


def chain_schema() -> pa.Schema:
    """The audit table's schema with the chain columns appended (all nullable)."""
    base = [field for field in audit_schema() if field.name not in CHAIN_COLUMNS]
    extra = [pa.field(name, kind, nullable=True) for name, kind in _CHAIN]
    return pa.schema([*base, *extra])


def load_rows(
    path: str, *, group: str | None = None, storage_options: Mapping[str, str] | None = None
) -> AuditRows:
    """Every row of the audit table at ``path`` (of ``group`` only, if given).

    Raises :class:`ConfigurationError` when there is no readable Delta table at ``path`` and
    :class:`CorruptStateError` when the table lacks a base audit column."""
    options = dict(storage_options or {})
    try:
        table = DeltaTable(path, storage_options=options or None)
    except TableNotFoundError as exc:
        raise ConfigurationError(
            f"no Delta audit table at {redact_url(path)}: pass the path the members' "
            "DeltaAuditLog writes to (--audit of the jobs)"
        ) from exc
    except Exception as exc:
        raise ConfigurationError(
            f"cannot read the Delta audit table at {redact_url(path)} "
            f"({type(exc).__name__}); check the path and the storage options (credentials, "
            "endpoint)"
        ) from exc
    present = {field.name for field in table.schema().fields}
    missing = [name for name in _BASE if name not in present]
    if missing:
        raise CorruptStateError(
            f"the Delta table at {redact_url(path)} is not a rebalancer-spark audit table: "
            f"missing columns {', '.join(missing)}; pass the path of the audit table (the "
            "jobs' --audit), not of an output table"
        )
    chain = tuple(name for name in CHAIN_COLUMNS if name in present)
    filters = [("group", "=", group)] if group is not None else None
    data = table.to_pyarrow_table(columns=[*_BASE, *chain], filters=filters)
    for name in _TIMES:
        if name in data.column_names:
            seconds = pc.divide(data.column(name).cast(pa.int64()).cast(pa.float64()), 1e6)
            data = data.set_column(data.schema.get_field_index(name), name, seconds)
    rows: list[dict[str, object]] = data.to_pylist()
    for row in rows:
        for name in CHAIN_COLUMNS:
            row.setdefault(name, None)
    rows.sort(key=lambda row: (_seconds(row["at"]), str(row["resource"])))
    return AuditRows(rows, chain)


def _seconds(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0
