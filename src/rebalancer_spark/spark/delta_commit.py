"""Fenced commits into a Delta table: the resource epoch checked inside Delta's own commit.

Every batch a job writes for a resource becomes **one** Delta commit that carries application
transactions (Delta's idempotent-writer records, ``txn``) that together make its :class:`Mark`
(who wrote last, what landed last)::

    app id rebalancer-spark-epoch/<group>/<resource>   version: the epoch
    app id rebalancer-spark-batch/<group>/<resource>   version: the batch id
    app id rebalancer-spark/<group>/<resource>         version: epoch * 2**32 + batch, written
                                                       only while it fits (epoch < 2**31)

Two versions rather than one packed number, because epochs need not stay small: a store that
lost its data lifts every epoch above the wall clock in microseconds (about 2**51, see
docs/operations.md), which the packed form cannot hold. The packed one is still written while
it fits, and read, so that tables written before, and jobs of earlier versions reading tables
written now, agree on the mark.

A commit of batch ``b`` at epoch ``e`` is made only while the table's recorded mark for the
resource is below ``(e, b)`` with an epoch not above ``e``; the check and the commit are one
compare-and-swap, because delta-rs refuses a commit whose app transaction was also written by a
concurrent winner (``CommitFailedError``: the loop then re-reads the mark). So:

* a **stale owner** (epoch ``e``) is refused as soon as the table holds anything of epoch
  ``e + 1``: the new owner's first data commit, or its *fence*, an empty commit that raises the
  recorded epoch and keeps the batch part, made when it inherits a batch its predecessor had
  planned and may still be writing;
* a batch that already **landed** (the mark's batch is ``>= b``) is not written again, whoever
  wrote it: after a kill between the Delta commit and the progress commit, the next owner reads
  the mark, sees the batch in, and only commits the progress.

Commits are made by ``deltalake`` (delta-rs) from the driver: its S3 commits use put-if-absent,
so several jobs (several JVMs) appending to one table on S3 lose nothing, which Spark's own Delta
writer on ``s3a://`` does not guarantee (docs/spark.md). The files come from Spark
(:mod:`.outputs`); this module only commits them. Each commit also carries the metadata the
audit's output check reads (``rebalancer.kind``, ``.group``, ``.resource``, ``.epoch``,
``.batch``, ``.member_id``, ``.session_id``, ``.rows``) at the top of its ``commitInfo``.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rebalancer_spark.core.errors import ConfigurationError, FencedError, RebalancerError
from rebalancer_spark.spark.guard import WriteGuard

__all__ = [
    "DeltaCommitter",
    "Landing",
    "Mark",
    "app_id",
]

log = logging.getLogger("rebalancer_spark.output")

_BATCH_BITS = 32
_BATCH_MAX = (1 << _BATCH_BITS) - 1
_PACKED_EPOCH_MAX = (1 << 31) - 1
_VERSION_MAX = (1 << 63) - 1
"""Delta transaction versions are signed 64-bit numbers."""
_ATTEMPTS = 100
PARTITION_COLUMN = "_resource"


def app_id(group: str, resource: str) -> str:
    """The Delta application id of the packed mark of a group's ``resource`` (module
    docstring)."""
    return f"rebalancer-spark/{group}/{resource}"


def _epoch_id(group: str, resource: str) -> str:
    return f"rebalancer-spark-epoch/{group}/{resource}"


def _batch_id(group: str, resource: str) -> str:
    return f"rebalancer-spark-batch/{group}/{resource}"


@dataclass(frozen=True, slots=True, order=True)
class Mark:
    """What a table recorded for one resource: the epoch of its last writer (or fencer) and
    the highest batch id that landed. ``Mark(0, 0)``: nothing yet."""

    epoch: int
    batch: int

    def __post_init__(self) -> None:
        if not 0 <= self.epoch <= _VERSION_MAX or not 0 <= self.batch <= _VERSION_MAX:
            raise RebalancerError(
                f"epoch {self.epoch} / batch {self.batch} cannot be recorded in a Delta "
                f"transaction version (0 to {_VERSION_MAX})"
            )

    @property
    def version(self) -> int | None:
        """The packed form, epoch * 2**32 + batch, while it fits (None otherwise)."""
        if self.epoch > _PACKED_EPOCH_MAX or self.batch > _BATCH_MAX:
            return None
        return (self.epoch << _BATCH_BITS) | self.batch

    @classmethod
    def of(cls, version: int | None) -> Mark:
        """The mark of a packed version (None: nothing recorded)."""
        if version is None:
            return cls(0, 0)
        return cls(version >> _BATCH_BITS, version & _BATCH_MAX)

    def transactions(self, group: str, resource: str) -> list[tuple[str, int]]:
        """The (app id, version) pairs a commit that leaves this mark carries."""
        out = [(_epoch_id(group, resource), self.epoch), (_batch_id(group, resource), self.batch)]
        packed = self.version
        return out if packed is None else [*out, (app_id(group, resource), packed)]


class Landing(enum.Enum):
    """How a fenced commit of one batch ended."""

    COMMITTED = "committed"
    """This call made the commit."""
    ALREADY = "already"
    """The table already holds this batch (an earlier attempt, or a previous owner)."""
    EMPTY = "empty"
    """Nothing to commit: every row of the batch was in the table already
    (:meth:`DeltaCommitter.commit_fresh` only)."""


class DeltaCommitter:
    """Commits files into the Delta table at ``uri`` (a local path or ``s3://`` URL for
    delta-rs, with ``storage_options``), fenced per resource as the module docstring says."""

    def __init__(
        self,
        uri: str,
        group: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        shown_as: str | None = None,
    ) -> None:
        self.uri = uri
        self.group = group
        self.storage_options = dict(storage_options or {})
        self.shown_as = shown_as or uri
        self._table: Any = None

    def __repr__(self) -> str:
        return f"DeltaCommitter({self.shown_as!r}, group={self.group!r})"

    # -- the table -------------------------------------------------------------------------

    def table(self, schema_json: str | None = None) -> Any:
        """The table at its latest version; created (partitioned by ``_resource``) from
        ``schema_json`` (Spark's schema JSON, ``_resource`` included) when it does not exist
        and a schema is given. Several jobs creating it at once: one wins, the others load it."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        if self._table is not None:
            self._table.update_incremental()
            return self._table
        try:
            self._table = DeltaTable(self.uri, storage_options=self.storage_options or None)
        except TableNotFoundError:
            if schema_json is None:
                return None
            self._create(schema_json)
        self._check_layout(self._table)
        return self._table

    def _create(self, schema_json: str) -> None:
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError
        from deltalake.schema import Schema

        try:
            self._table = DeltaTable.create(
                self.uri,
                Schema.from_json(schema_json),
                mode="error",
                partition_by=[PARTITION_COLUMN],
                storage_options=self.storage_options or None,
            )
            log.info("created the output Delta table %s", self.shown_as)
        except DeltaError as exc:  # another job created it first
            try:
                self._table = DeltaTable(self.uri, storage_options=self.storage_options or None)
            except TableNotFoundError:
                raise RebalancerError(
                    f"cannot create the output Delta table {self.shown_as}: {exc}; check that "
                    "the path is writable (or create the table yourself, partitioned by "
                    f"{PARTITION_COLUMN})"
                ) from exc

    def _check_layout(self, table: Any) -> None:
        parts = list(table.metadata().partition_columns)
        if parts != [PARTITION_COLUMN]:
            raise ConfigurationError(
                f"the output Delta table {self.shown_as} is partitioned by {parts or 'nothing'}, "
                f"not by [{PARTITION_COLUMN!r}] as a rebalancer job's output is: give --output a "
                "new path, or a table created with PARTITIONED BY (_resource)"
            )

    def schema_json(self) -> str | None:
        """The table's schema as Spark's schema JSON, or None when there is no table yet."""
        table = self.table()
        return None if table is None else str(table.schema().to_json())

    # -- marks, fences and commits ----------------------------------------------------------

    def mark(self, resource: str) -> Mark:
        """The table's mark for ``resource`` now (``Mark(0, 0)`` without a table)."""
        return self._mark_on(self.table(), resource)

    def _mark_on(self, table: Any, resource: str) -> Mark:
        """The mark for ``resource`` in ``table`` as loaded (no refresh)."""
        if table is None:
            return Mark(0, 0)
        packed = Mark.of(table.transaction_version(app_id(self.group, resource)))
        epoch = table.transaction_version(_epoch_id(self.group, resource))
        batch = table.transaction_version(_batch_id(self.group, resource))
        return max(packed, Mark(epoch or 0, batch or 0))

    def landed(self, resource: str, epoch: int, batch: int) -> bool:
        """Whether batch ``batch`` of ``resource`` is in the table already; raises
        :class:`FencedError` when the table holds an epoch newer than ``epoch``."""
        current = self.mark(resource)
        if current.epoch > epoch:
            raise self._fenced(resource, epoch, current)
        return current.batch >= batch

    def fence(self, resource: str, epoch: int, who: Mapping[str, str]) -> Mark:
        """Raise the table's epoch for ``resource`` to ``epoch`` (an empty commit) unless it is
        there already, so that no writer of an older epoch can commit afterwards. Returns the
        mark after the fence (its batch part says what landed before it). Raises
        :class:`FencedError` if the table already holds a newer epoch."""
        for _ in range(_ATTEMPTS):
            current = self.mark(resource)
            if current.epoch > epoch:
                raise self._fenced(resource, epoch, current)
            if current.epoch == epoch or self.table() is None:
                return current
            target = Mark(epoch, current.batch)
            meta = _meta(self.group, resource, "fence", target, who)
            if self._try_commit(resource, [], target, meta, expected=current):
                log.info("output %s: %s fenced at epoch %d", self.shown_as, resource, epoch)
                return target
        raise self._contended(resource, "fence")

    def commit(
        self,
        resource: str,
        epoch: int,
        batch: int,
        adds: Sequence[Any],
        who: Mapping[str, str],
        *,
        schema_json: str,
        rows: int | None,
        guard: WriteGuard,
    ) -> Landing:
        """Commit ``adds`` (delta-rs ``AddAction`` s) as batch ``batch`` of ``resource`` at
        ``epoch``, fenced (module docstring). Each attempt runs inside ``guard.holding()``,
        which raises :class:`FencedError` when this job no longer owns the resource locally (it
        moved, or the lease lapsed) and keeps a revocation waiting until the attempt is over.
        Raises :class:`FencedError` when the table holds a newer epoch."""
        target = Mark(epoch, batch)
        extra = {} if rows is None else {"rebalancer.rows": str(rows)}
        meta = {**_meta(self.group, resource, "data", target, who), **extra}
        self.table(schema_json)
        for _ in range(_ATTEMPTS):
            current = self.mark(resource)
            if current.epoch > epoch:
                raise self._fenced(resource, epoch, current)
            if current.batch >= batch:
                return Landing.ALREADY
            with guard.holding():
                committed = self._try_commit(resource, adds, target, meta, expected=current)
            if committed:
                return Landing.COMMITTED
        raise self._contended(resource, f"batch {batch}")

    def _contended(self, resource: str, what: str) -> RebalancerError:
        return RebalancerError(
            f"the output Delta table {self.shown_as}: the {what} commit of resource "
            f"{resource!r} lost {_ATTEMPTS} races in a row to other commits of the same "
            "resource; it is retried with the batch (is another group or job writing this "
            "resource under the same group name?)"
        )

    def commit_fresh(
        self,
        resource: str,
        epoch: int,
        batch: int,
        who: Mapping[str, str],
        *,
        prepare: Callable[[Any], tuple[Sequence[Any], int]],
        guard: WriteGuard,
    ) -> tuple[Landing, int]:
        """Commit batch ``batch`` of ``resource`` at ``epoch``, fenced as :meth:`commit`, for
        a batch whose rows depend on what the table already holds (a queue batch, from which
        the keys the table has are dropped: :mod:`.queue_output`). Each attempt calls
        ``prepare(dataset)`` with a pyarrow dataset of the table at the version the attempt
        checked (None while there is no table); it writes the batch's files (creating the table
        if needed) and returns their ``AddAction`` s and row count. The commit is made only if
        no commit of ``resource`` landed since that version; otherwise (a concurrent commit of
        the resource won) those files are never committed and ``prepare`` runs again against
        the new version. Returns how the batch ended and the rows committed; an attempt with no
        rows commits nothing (:attr:`Landing.EMPTY`)."""
        target = Mark(epoch, batch)
        for _ in range(_ATTEMPTS):
            table = self.table()
            current = self._mark_on(table, resource)
            if current.epoch > epoch:
                raise self._fenced(resource, epoch, current)
            if current.batch >= batch:
                return Landing.ALREADY, 0
            dataset = None if table is None else table.to_pyarrow_dataset()
            adds, rows = prepare(dataset)
            if rows == 0:
                return Landing.EMPTY, 0
            meta = {
                **_meta(self.group, resource, "data", target, who),
                "rebalancer.rows": str(rows),
            }
            with guard.holding():
                committed = self._try_commit(resource, adds, target, meta, expected=current)
            if committed:
                return Landing.COMMITTED, rows
        raise self._contended(resource, f"batch {batch}")

    def _try_commit(
        self,
        resource: str,
        adds: Sequence[Any],
        target: Mark,
        meta: Mapping[str, str],
        *,
        expected: Mark,
    ) -> bool:
        """One attempt, made only while the table's mark for ``resource`` is still
        ``expected`` on the very version the commit is made from (so the check and the commit
        see one snapshot, and delta-rs refuses the commit if another commit of the resource
        lands after it); False when a concurrent commit of the same resource won (re-check)."""
        from deltalake import CommitProperties, Transaction
        from deltalake.exceptions import CommitFailedError

        table = self.table()
        if self._mark_on(table, resource) != expected:
            log.info("output %s: %s changed since it was checked; re-checking", self.shown_as,
                     resource)  # fmt: skip
            return False
        props = CommitProperties(
            app_transactions=[
                Transaction(app, version)
                for app, version in target.transactions(self.group, resource)
            ],
            custom_metadata=dict(meta),
            max_commit_retries=_ATTEMPTS,
        )
        try:
            table.create_write_transaction(
                list(adds),
                mode="append",
                schema=table.schema(),
                partition_by=[PARTITION_COLUMN],
                commit_properties=props,
            )
        except CommitFailedError as exc:
            log.info("output %s: %s commit lost a race (%s); re-checking", self.shown_as,
                     resource, str(exc).splitlines()[0])  # fmt: skip
            time.sleep(0.01)
            return False
        return True

    def _fenced(self, resource: str, epoch: int, current: Mark) -> FencedError:
        return FencedError(
            f"the output Delta table {self.shown_as} already holds epoch {current.epoch} of "
            f"resource {resource!r} (batch {current.batch} landed), newer than this job's "
            f"epoch {epoch}: ownership moved on, so this job's write was refused by the table; "
            "stop working on the resource"
        )


def _meta(
    group: str, resource: str, kind: str, mark: Mark, who: Mapping[str, str]
) -> dict[str, str]:
    return {
        "rebalancer.kind": kind,
        "rebalancer.group": group,
        "rebalancer.resource": resource,
        "rebalancer.epoch": str(mark.epoch),
        "rebalancer.batch": str(mark.batch),
        "rebalancer.member_id": who.get("member_id", ""),
        "rebalancer.session_id": who.get("session_id", ""),
    }
