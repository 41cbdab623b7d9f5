"""The Delta audit trail (Spark-glue floor): write it, read it, verify it.

Importing this package imports ``deltalake`` and ``pyarrow`` (``pip install
'rebalancer-spark[spark]'``); ``pyspark`` only for :func:`read_audit`'s argument; ``matplotlib``
only when :mod:`.timeline` is imported.
"""

from rebalancer_spark.audit.delta import AUDIT_COLUMNS, DeltaAuditLog, audit_schema
from rebalancer_spark.audit.reader import load_events, read_audit
from rebalancer_spark.audit.stats import Rebalance, basis_notes, current_owners, rebalances
from rebalancer_spark.audit.verify import AuditVerdict, history, verify_events, verify_table

__all__ = [
    "AUDIT_COLUMNS",
    "AuditVerdict",
    "DeltaAuditLog",
    "Rebalance",
    "audit_schema",
    "basis_notes",
    "current_owners",
    "history",
    "load_events",
    "read_audit",
    "rebalances",
    "verify_events",
    "verify_table",
]
