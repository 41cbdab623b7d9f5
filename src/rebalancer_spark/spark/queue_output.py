"""An append-only Delta table in which each queue message's key appears at most once.

Every row carries ``_resource`` (the queue) and ``_key`` (the message's dedupe key). Writing a
batch of one queue:

1. load the table's latest snapshot and the queue's *app transaction* version ``v``
   (``DeltaTable.transaction_version("rebalancer-queue/<queue>")``);
2. drop the batch's rows whose key is already in that snapshot (only the queue's partition and
   the ``_key`` column are read), and repeated keys within the batch;
3. append the rest with the app transaction ``v + 1``.

Two writers of the same queue at once (a stale owner and the new one) both commit an app
transaction with the same id: delta-rs refuses the second (``CommitFailedError … Concurrent
transaction failed``), which then starts again from 1 and finds the winner's keys. So the table
never holds a key twice for one queue, even with a zombie writer, without any lock. Writers of
different queues append side by side (blind appends, retried by delta-rs). The table is
partitioned by ``_resource``; written with ``deltalake`` from the driver, so no Delta jars are
needed, and any Delta reader reads it.

Cost: step 2 reads the ``_key`` column of the queue's partition, which grows with the table;
compact it (``optimize``) now and then, and start a new table (or a new partition scheme) when
one queue's keys run into the hundreds of millions.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from rebalancer_spark.core.errors import RebalancerError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["KEY", "RESOURCE", "KeyedDeltaOutput"]

log = logging.getLogger("rebalancer_spark.queues")

KEY = "_key"
RESOURCE = "_resource"
_ATTEMPTS = 50


class KeyedDeltaOutput:
    """The Delta table at ``path``; see the module docstring."""

    def __init__(self, path: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.path = path
        self.storage_options = dict(storage_options or {})

    def __repr__(self) -> str:
        return f"KeyedDeltaOutput({self.path!r})"

    @staticmethod
    def app_id(resource: str) -> str:
        """The app transaction id that serialises the writes of one queue."""
        return f"rebalancer-queue/{resource}"

    def write(self, resource: str, table: pa.Table) -> int:
        """Append ``table``'s rows whose ``_key`` the queue has not written yet; return how
        many were written. ``_resource`` is set to ``resource``."""
        import pyarrow as pa
        import pyarrow.compute as pc
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
        from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

        if KEY not in table.column_names:
            raise RebalancerError(
                f"the batch of queue {resource!r} has no {KEY!r} column (columns: "
                f"{table.column_names}): keep the dedupe key column through the transformation"
            )
        if RESOURCE in table.column_names:
            table = table.drop_columns([RESOURCE])
        table = table.append_column(RESOURCE, pa.array([resource] * table.num_rows, pa.string()))
        table = _first_of_each_key(table)
        last: Exception | None = None
        for _ in range(_ATTEMPTS):
            try:
                dt: DeltaTable | None = DeltaTable(
                    self.path, storage_options=self.storage_options or None
                )
            except TableNotFoundError:
                dt = None
            version = 0
            fresh = table
            if dt is not None:
                version = dt.transaction_version(self.app_id(resource)) or 0
                keys = table.column(KEY)
                present = (
                    dt.to_pyarrow_dataset()
                    .to_table(
                        columns=[KEY],
                        filter=(pc.field(RESOURCE) == resource) & pc.field(KEY).isin(keys),
                    )
                    .column(KEY)
                )
                if len(present):
                    fresh = table.filter(pc.invert(pc.is_in(table.column(KEY), present)))
            if fresh.num_rows == 0:
                return 0
            try:
                write_deltalake(
                    dt if dt is not None else self.path,
                    fresh,
                    mode="append",
                    partition_by=[RESOURCE],
                    storage_options=self.storage_options or None,
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(self.app_id(resource), version + 1)]
                    ),
                )
                return int(fresh.num_rows)
            except (CommitFailedError, DeltaError) as exc:
                # another writer of this queue (or the table's creator) went first: look again
                last = exc
                log.info("%r: write of queue %r lost a race, retrying: %s", self, resource, exc)
        raise RebalancerError(
            f"writing a batch of queue {resource!r} to {self.path!r} failed {_ATTEMPTS} times "
            f"in a row ({last}): another writer keeps winning or the table cannot be written; "
            "the batch stays unacknowledged and is delivered again"
        )

    def keys(self, resource: str | None = None) -> list[str]:
        """Every key in the table (of ``resource`` only, if given), with repeats, sorted."""
        import pyarrow.compute as pc
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            dt = DeltaTable(self.path, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return []
        flt = None if resource is None else pc.field(RESOURCE) == resource
        column = dt.to_pyarrow_dataset().to_table(columns=[KEY], filter=flt).column(KEY)
        return sorted(str(k) for k in column.to_pylist())


def _first_of_each_key(table: pa.Table) -> pa.Table:
    """``table`` without later rows repeating an earlier row's key."""
    import pyarrow as pa

    seen: set[object] = set()
    keep: list[bool] = []
    for key in table.column(KEY).to_pylist():
        keep.append(key not in seen)
        seen.add(key)
    return table if all(keep) else table.filter(pa.array(keep))
