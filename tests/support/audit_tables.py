"""Audit and output Delta tables written by the tests themselves, in the formats of
docs/audit.md: audit rows with or without the chain columns, and output commits as the fenced
writer makes them (delta-rs transactions with ``rebalancer.*`` commit metadata)."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from rebalancer_spark.audit.delta import audit_schema
from rebalancer_spark.audit.rows import CHAIN_COLUMNS, chain_schema

GROUP = "orders"


def row(
    kind: str,
    at: float,
    resource: str,
    member: str,
    epoch: int,
    *,
    group: str = GROUP,
    reason: str = "",
    **chain: object,
) -> dict[str, object]:
    """One audit row; ``chain`` sets chain columns (generation=, prev_epoch=, freed_at= ...)."""
    unknown = set(chain) - set(CHAIN_COLUMNS)
    assert not unknown, f"not chain columns: {unknown}"
    return {
        "group": group,
        "resource": resource,
        "member_id": member,
        "session_id": f"{member}-s",
        "kind": kind,
        "epoch": epoch,
        "at": round(at * 1_000_000),
        "observed_at": round(at * 1_000_000),
        "reason": reason or f"{kind} by test",
        "host": f"host-{member}",
        "pid": 1,
        "spark_app_id": None,
        **{k: _micros(v) if k == "freed_at" else v for k, v in chain.items()},
    }


def _micros(value: object) -> object:
    return round(float(value) * 1_000_000) if isinstance(value, int | float) else value


def write_audit(
    path: str,
    rows: Sequence[Mapping[str, object]],
    *,
    chain: bool = True,
    storage_options: Mapping[str, str] | None = None,
) -> None:
    """Append ``rows`` to the audit table at ``path``: with the chain columns (``chain``) or
    in the schema of tables written before them."""
    old = pa.schema([f for f in audit_schema() if f.name not in CHAIN_COLUMNS])
    schema = chain_schema() if chain else old
    names = schema.names
    data = pa.Table.from_pylist([{n: r.get(n) for n in names} for r in rows], schema=schema)
    write_deltalake(path, data, mode="append", storage_options=dict(storage_options or {}) or None)


OUTPUT_SCHEMA = pa.schema(
    [("value", pa.int64()), ("_resource", pa.string()), ("_batch", pa.int64())]
)


@dataclass
class OutputTable:
    """An output table and the commits of a fenced writer to it (made with delta-rs)."""

    path: str
    group: str = GROUP
    storage_options: dict[str, str] = field(default_factory=dict)

    def create(self) -> OutputTable:
        DeltaTable.create(
            self.path,
            OUTPUT_SCHEMA,
            partition_by=["_resource"],
            storage_options=self.storage_options or None,
        )
        return self

    def _properties(
        self, kind: str, resource: str, member: str, epoch: int, batch: int, rows: int | None
    ) -> CommitProperties:
        meta = {
            "rebalancer.kind": kind,
            "rebalancer.group": self.group,
            "rebalancer.resource": resource,
            "rebalancer.member_id": member,
            "rebalancer.session_id": f"{member}-s",
            "rebalancer.epoch": str(epoch),
            "rebalancer.batch": str(batch),
        }
        if rows is not None:
            meta["rebalancer.rows"] = str(rows)
        app = f"rebalancer-spark/{self.group}/{resource}"
        return CommitProperties(
            app_transactions=[Transaction(app, epoch * 2**32 + batch)], custom_metadata=meta
        )

    def data(self, resource: str, member: str, epoch: int, batch: int, rows: int = 2) -> int:
        """A data commit of ``rows`` rows; returns its version."""
        table = pa.Table.from_pylist(
            [{"value": i, "_resource": resource, "_batch": batch} for i in range(rows)],
            schema=OUTPUT_SCHEMA,
        )
        write_deltalake(
            self.path,
            table,
            mode="append",
            partition_by=["_resource"],
            storage_options=self.storage_options or None,
            commit_properties=self._properties("data", resource, member, epoch, batch, rows),
        )
        return self.version()

    def fence(self, resource: str, member: str, epoch: int, batch: int) -> int:
        """A fence commit (no files); returns its version."""
        table = DeltaTable(self.path, storage_options=self.storage_options or None)
        table.create_write_transaction(
            [],
            mode="append",
            schema=table.schema(),
            partition_by=["_resource"],
            commit_properties=self._properties("fence", resource, member, epoch, batch, None),
        )
        return self.version()

    def foreign(self) -> int:
        """A commit by another writer (no rebalancer metadata)."""
        table = pa.Table.from_pylist(
            [{"value": -1, "_resource": "other", "_batch": 0}], schema=OUTPUT_SCHEMA
        )
        write_deltalake(
            self.path,
            table,
            mode="append",
            partition_by=["_resource"],
            storage_options=self.storage_options or None,
        )
        return self.version()

    def version(self) -> int:
        return int(DeltaTable(self.path, storage_options=self.storage_options or None).version())


def write_log_commits(path: Path, commits: Sequence[Mapping[str, str]]) -> None:
    """Append commits to the local table at ``path`` by writing their JSON files into
    ``_delta_log`` directly (a commitInfo and a txn action each, no data), then a checkpoint
    as delta-rs writers leave one every 100 commits: thousands of commits in seconds, for
    measuring how fast the log is read."""
    log = path / "_delta_log"
    version = DeltaTable(str(path)).version()
    now = int(time.time() * 1000)
    for meta in commits:
        version += 1
        epoch, batch = int(meta["rebalancer.epoch"]), int(meta["rebalancer.batch"])
        app = f"rebalancer-spark/{meta['rebalancer.group']}/{meta['rebalancer.resource']}"
        actions = [
            {"commitInfo": {"timestamp": now, "operation": "WRITE", **meta}},
            {"txn": {"appId": app, "version": epoch * 2**32 + batch, "lastUpdated": now}},
        ]
        body = "\n".join(json.dumps(a) for a in actions) + "\n"
        name = log / f"{version:020d}.json"
        tmp = log / f".{uuid.uuid4().hex}.tmp"
        tmp.write_text(body)
        os.replace(tmp, name)
    DeltaTable(str(path)).create_checkpoint()


def as_events(rows: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """``rows`` as the loaders return them: times in float epoch seconds, every chain column."""
    out = []
    for r in rows:
        e = {name: r.get(name) for name in chain_schema().names}
        for name in ("at", "observed_at", "freed_at"):
            value = e[name]
            if isinstance(value, int):
                e[name] = value / 1e6
        out.append(e)
    return out
