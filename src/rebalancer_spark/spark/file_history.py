"""The history of the files a group processed: a Delta table of file entries, one row per file.

The store's progress record of a file resource stays small (:mod:`.file_progress`: a
watermark and the open batch); the names of the files processed, which grow without end, are
rows of this table instead, written by the owner once a batch has landed in the output and
*before* the store marks the batch done::

    _resource  string  (partition)     batch  long     name  string
    fingerprint string                 epoch  long     at    double

Why this is exactly-once without a second fence: a row is appended only for a batch that is
the open batch of the resource's progress record (planned under the owner's epoch, fenced by the
store) and whose rows landed in the output; a batch's files never change once planned. So a late
append by a stale owner, or the same append twice (a kill between the append and the progress
commit, then the next owner completing the batch), only writes rows that are true. Readers
deduplicate by name (the row of the highest ``(batch, at)`` wins: a file read again after a
rewrite, or an ``on_change=ignore`` row recording its new fingerprint). Appends carry the Delta
application transaction ``rebalancer-spark-files/<group>/<resource>`` at the batch id, and
an append whose batch the table already holds is skipped, so a retried batch adds no rows.

Appends are blind appends (delta-rs, several jobs at once, locally and on S3 with put-if-absent);
a table holding many small commits is compacted per resource by :meth:`FileHistory.compact`.
The table lives next to the output, under ``<output>/_rebalancer_files`` (a name Spark, Delta
and Parquet readers skip), with the output's storage options.

**Plans.** The file list of an open batch too long for the progress record
(:data:`.file_progress.INLINE_BYTES`) is appended to a second table beside this one,
``<history>_plans`` (``_resource``, ``batch``, ``plan``, ``seq``, ``name``, ``fingerprint``,
``epoch``, ``at``), *before* the record names it by its digest. Appends are blind and carry no
transaction: a plan is found by (resource, batch, digest), and one written twice (a retry) or
written by an owner that then lost the resource (never named by a record) is harmless. Plans of
batches a resource committed are deleted when a plan of every 20th batch id is saved
(:meth:`FileHistory.prune_plans`); the files they leave are removed by a ``VACUUM`` of that
table, as for any Delta table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rebalancer_spark.core.errors import RebalancerError, SourceError

__all__ = ["HISTORY_DIR", "PLANS_SUFFIX", "FileHistory", "HistoryEntry"]

log = logging.getLogger("rebalancer_spark.ingest")

HISTORY_DIR = "_rebalancer_files"
"""The history table's directory under the output."""
_PARTITION = "_resource"
_COMPACT_EVERY = 200
"""Compact a resource's partition after this many appends by one owner."""
PLANS_SUFFIX = "_plans"
"""The plans table is the history's location with this suffix."""
_PRUNE_EVERY = 20
"""Delete a resource's committed plans when a plan of a batch id divisible by this is saved
(whoever owns it then: owners change, batch ids go on)."""


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One processed file: the batch that processed it and its fingerprint then."""

    batch: int
    fingerprint: str
    at: float = 0.0


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            (_PARTITION, pa.string()),
            ("batch", pa.int64()),
            ("name", pa.string()),
            ("fingerprint", pa.string()),
            ("epoch", pa.int64()),
            ("at", pa.float64()),
        ]
    )


def _plan_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            (_PARTITION, pa.string()),
            ("batch", pa.int64()),
            ("plan", pa.string()),
            ("seq", pa.int64()),
            ("name", pa.string()),
            ("fingerprint", pa.string()),
            ("epoch", pa.int64()),
            ("at", pa.float64()),
        ]
    )


class FileHistory:
    """The history table of one group at ``uri`` (a local path or ``s3://`` URL for delta-rs,
    with ``storage_options``); see the module docstring."""

    def __init__(
        self, uri: str, group: str, *, storage_options: Mapping[str, str] | None = None
    ) -> None:
        self.uri = uri.rstrip("/")
        self.group = group
        self.storage_options = dict(storage_options or {})
        self._table: Any = None
        self._appends = 0

    def __repr__(self) -> str:
        return f"FileHistory({self.uri!r}, group={self.group!r})"

    def app_id(self, resource: str) -> str:
        return f"rebalancer-spark-files/{self.group}/{resource}"

    def _open(self) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        if self._table is not None:
            self._table.update_incremental()
            return self._table
        try:
            self._table = DeltaTable(self.uri, storage_options=self.storage_options or None)
        except TableNotFoundError:
            return None
        return self._table

    def recorded_batch(self, resource: str) -> int:
        """The highest batch id whose rows the table holds for ``resource`` (0: none)."""
        table = self._open()
        if table is None:
            return 0
        return int(table.transaction_version(self.app_id(resource)) or 0)

    def load(self, resource: str, after: str | None = None) -> dict[str, HistoryEntry]:
        """Every file of ``resource`` the table holds (only names above ``after`` when given),
        deduplicated as the module docstring says."""
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        try:
            table = self._open()
            if table is None:
                return {}
            where = ds.field(_PARTITION) == resource
            if after is not None:
                where = where & (ds.field("name") > after)
            rows = table.to_pyarrow_dataset().to_table(
                filter=where, columns=["name", "batch", "fingerprint", "at"]
            )
        except OSError as exc:
            raise SourceError(f"cannot read the file history {self.uri}: {exc}") from None
        if rows.num_rows == 0:
            return {}
        rows = rows.sort_by([("batch", "ascending"), ("at", "ascending")])
        out: dict[str, HistoryEntry] = {}
        names = rows.column("name").to_pylist()
        batches = rows.column("batch").to_pylist()
        prints = rows.column("fingerprint").to_pylist()
        ats = pc.fill_null(rows.column("at"), 0.0).to_pylist()
        for name, batch, fp, at in zip(names, batches, prints, ats, strict=True):
            out[name] = HistoryEntry(int(batch), str(fp or ""), float(at))
        return out

    def append(
        self,
        resource: str,
        batch: int,
        epoch: int,
        entries: Iterable[tuple[str, str]],
        *,
        transaction: bool = True,
    ) -> bool:
        """Append the files ``entries`` ((name, fingerprint) pairs) as processed by ``batch``;
        with ``transaction``, skipped (False) when the table already holds that batch. Raises
        :class:`RebalancerError` when the table cannot be written (the batch stays open)."""
        import pyarrow as pa
        from deltalake import CommitProperties, Transaction, write_deltalake
        from deltalake.exceptions import DeltaError

        rows = list(entries)
        if transaction and self.recorded_batch(resource) >= batch:
            return False
        now = time.time()
        data = pa.Table.from_pydict(
            {
                _PARTITION: [resource] * len(rows),
                "batch": [batch] * len(rows),
                "name": [n for n, _ in rows],
                "fingerprint": [f for _, f in rows],
                "epoch": [epoch] * len(rows),
                "at": [now] * len(rows),
            },
            schema=_schema(),
        )
        txns = [Transaction(self.app_id(resource), batch)] if transaction else []
        try:
            write_deltalake(
                self.uri,
                data,
                mode="append",
                partition_by=[_PARTITION],
                storage_options=self.storage_options or None,
                commit_properties=CommitProperties(
                    app_transactions=txns,
                    custom_metadata={
                        "rebalancer.kind": "files",
                        "rebalancer.group": self.group,
                        "rebalancer.resource": resource,
                        "rebalancer.batch": str(batch),
                        "rebalancer.epoch": str(epoch),
                    },
                    max_commit_retries=100,
                ),
            )
        except (DeltaError, OSError) as exc:
            raise RebalancerError(
                f"cannot append batch {batch} of {resource!r} to the file history {self.uri} "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}): the batch stays "
                "open and is retried; check that the output's location is writable"
            ) from None
        self._appends += 1
        if self._appends % _COMPACT_EVERY == 0:
            self.compact(resource)
        return True

    @property
    def plans_uri(self) -> str:
        """Where the plans of long batches live (module docstring)."""
        return self.uri + PLANS_SUFFIX

    def save_plan(
        self,
        resource: str,
        batch: int,
        plan: str,
        epoch: int,
        files: Sequence[str],
        versions: Mapping[str, str],
    ) -> None:
        """Append the file list ``files`` of ``batch`` under its digest ``plan``. Raises
        :class:`RebalancerError` when the table cannot be written (nothing is planned then)."""
        import pyarrow as pa
        from deltalake import CommitProperties, write_deltalake
        from deltalake.exceptions import DeltaError

        n = len(files)
        data = pa.Table.from_pydict(
            {
                _PARTITION: [resource] * n,
                "batch": [batch] * n,
                "plan": [plan] * n,
                "seq": list(range(n)),
                "name": list(files),
                "fingerprint": [versions.get(f, "") for f in files],
                "epoch": [epoch] * n,
                "at": [time.time()] * n,
            },
            schema=_plan_schema(),
        )
        try:
            write_deltalake(
                self.plans_uri,
                data,
                mode="append",
                partition_by=[_PARTITION],
                storage_options=self.storage_options or None,
                commit_properties=CommitProperties(max_commit_retries=100),
            )
        except (DeltaError, OSError) as exc:
            raise SourceError(
                f"cannot save the plan of batch {batch} of {resource!r} ({n} files) to "
                f"{self.plans_uri} ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}): "
                "nothing was planned, the planning is retried; check that the output's "
                "location is writable"
            ) from None
        if batch % _PRUNE_EVERY == 0:
            self.prune_plans(resource, below=batch)

    def load_plan(
        self, resource: str, batch: int, plan: str
    ) -> tuple[tuple[str, ...], dict[str, str]]:
        """The files (in planned order) and fingerprints the plan ``plan`` of ``batch`` holds
        (empty when the table holds no such plan)."""
        import pyarrow.dataset as ds
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            table = DeltaTable(self.plans_uri, storage_options=self.storage_options or None)
            rows = table.to_pyarrow_dataset().to_table(
                filter=(ds.field(_PARTITION) == resource)
                & (ds.field("batch") == batch)
                & (ds.field("plan") == plan),
                columns=["seq", "name", "fingerprint"],
            )
        except TableNotFoundError:
            return (), {}
        except OSError as exc:
            raise SourceError(f"cannot read the plans table {self.plans_uri}: {exc}") from None
        by_seq: dict[int, tuple[str, str]] = {}
        for seq, name, fp in zip(
            rows.column("seq").to_pylist(),
            rows.column("name").to_pylist(),
            rows.column("fingerprint").to_pylist(),
            strict=True,
        ):
            by_seq[int(seq)] = (str(name), str(fp or ""))
        ordered = [by_seq[k] for k in sorted(by_seq)]
        return tuple(n for n, _ in ordered), {n: fp for n, fp in ordered if fp}

    def prune_plans(self, resource: str, below: int) -> None:
        """Delete ``resource``'s plans of batches before ``below`` (committed ones: a
        resource has one open batch at a time); a failure is only logged."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        quoted = resource.replace("'", "''")
        try:
            table = DeltaTable(self.plans_uri, storage_options=self.storage_options or None)
            table.delete(f"{_PARTITION} = '{quoted}' AND batch < {int(below)}")
        except (DeltaError, OSError, TableNotFoundError) as exc:
            log.info("plans %s: pruning %r skipped: %s", self.plans_uri, resource, exc)

    def compact(self, resource: str) -> None:
        """Merge the small files of ``resource``'s partition (Delta OPTIMIZE); a failure is
        only logged: the table stays correct, only slower to read."""
        from deltalake.exceptions import DeltaError

        table = self._open()
        if table is None:
            return
        try:
            table.optimize.compact(partition_filters=[(_PARTITION, "=", resource)])
            table.create_checkpoint()
        except (DeltaError, OSError) as exc:
            log.info("file history %s: compaction of %r skipped: %s", self.uri, resource, exc)
