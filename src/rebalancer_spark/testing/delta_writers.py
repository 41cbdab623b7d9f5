"""Several processes committing batches into one Delta table at once, as several jobs of a group
do: the check behind the "many writers, one table" bar (tests/test_delta_writers.py,
benchmarks/bench_delta_writers.py).

Each writer is a separate process (``spawn``: deltalake cannot be used in a forked child) that
commits ``batches`` batches of its own resource through :class:`DeltaCommitter` — one small
Parquet file each, written with pyarrow, then one fenced Delta commit — and returns how many
commits were acknowledged. :func:`count` then reads what the table really holds.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

__all__ = ["WriterResult", "count", "run_writers"]

_SCHEMA = (
    '{"type":"struct","fields":['
    '{"name":"id","type":"string","nullable":true,"metadata":{}},'
    '{"name":"_batch","type":"long","nullable":true,"metadata":{}},'
    '{"name":"_resource","type":"string","nullable":true,"metadata":{}}]}'
)


class _OwnsItsResource:
    """The write guard of a writer here: each owns its resource by construction (no group)."""

    def check(self) -> None:
        pass

    def holding(self) -> AbstractContextManager[object]:
        return nullcontext()


_OWNS = _OwnsItsResource()


@dataclass(frozen=True, slots=True)
class WriterResult:
    resource: str
    acknowledged: int
    seconds: float


def _writer(
    uri: str, options: Mapping[str, str], group: str, resource: str, batches: int
) -> WriterResult:
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    from deltalake.transaction import AddAction

    from rebalancer_spark.spark.delta_commit import DeltaCommitter, Landing

    committer = DeltaCommitter(uri, group, storage_options=options)
    committer.table(_SCHEMA)
    if uri.startswith("s3://"):
        fs: pafs.FileSystem = pafs.S3FileSystem(
            access_key=options["AWS_ACCESS_KEY_ID"],
            secret_key=options["AWS_SECRET_ACCESS_KEY"],
            endpoint_override=options["AWS_ENDPOINT_URL"],
            scheme="http",
            region=options.get("AWS_REGION", "us-east-1"),
        )
        root = uri.removeprefix("s3://")
    else:
        fs, root = pafs.LocalFileSystem(), uri
    began, acknowledged = time.monotonic(), 0
    for batch in range(1, batches + 1):
        relative = f"_resource={resource}/batch={batch:010d}-{uuid.uuid4().hex[:8]}/part-0.parquet"
        table = pa.table({"id": [f"{resource}-{batch}-{i}" for i in range(10)],
                          "_batch": pa.array([batch] * 10, pa.int64())})  # fmt: skip
        fs.create_dir(f"{root}/{relative.rsplit('/', 1)[0]}", recursive=True)
        with fs.open_output_stream(f"{root}/{relative}") as out:
            pq.write_table(table, out)
        size = fs.get_file_info(f"{root}/{relative}").size or 0
        add = AddAction(relative, size, {"_resource": resource}, int(time.time() * 1000), True,
                        '{"numRecords": 10}')  # fmt: skip
        landing = committer.commit(resource, 1, batch, [add], {"member_id": resource},
                                   schema_json=_SCHEMA, rows=10, guard=_OWNS)  # fmt: skip
        acknowledged += landing is Landing.COMMITTED
    return WriterResult(resource, acknowledged, time.monotonic() - began)


def run_writers(
    uri: str, options: Mapping[str, str], writers: int, batches: int, group: str = "writers"
) -> list[WriterResult]:
    """``writers`` processes, each committing ``batches`` batches of its own resource."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(writers) as pool:
        jobs = [
            pool.apply_async(_writer, (uri, dict(options), group, f"w{i}", batches))
            for i in range(writers)
        ]
        return [job.get(timeout=900) for job in jobs]


def count(uri: str, options: Mapping[str, str]) -> tuple[int, int]:
    """(data commits in the table's log, rows the table holds)."""
    from deltalake import DeltaTable

    table = DeltaTable(uri, storage_options=dict(options) or None)
    commits = sum(1 for c in table.history() if c.get("rebalancer.kind") == "data")
    return commits, table.to_pyarrow_table(columns=["id"]).num_rows
