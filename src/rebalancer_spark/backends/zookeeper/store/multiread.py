"""Reading many znodes in one round trip: ZooKeeper's ``multiRead`` (3.6 and later).

A :class:`Reader` collects reads (``get``, ``stat``, ``children``) and hands back thunks; the
first thunk called sends everything collected so far as ``multiRead`` requests, each answer
holding many results. Against a 200-resource group this is one request instead of 200, and
most of the cost of a read in kazoo is per request (a future, a thread hand-off, a log call).
ZooKeeper runs a multiRead's reads one after the other in its single final request processor,
so the answers of one request are also a consistent cut. A server without multiRead (before
3.6) answers "unimplemented": the reader then falls back to pipelined single reads.

kazoo has no multiRead; :class:`MultiRead` is the request in kazoo's own request protocol
(``type``, ``serialize``, ``deserialize``), written after its ``Transaction``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from kazoo.exceptions import EXCEPTIONS, NoAuthError, NoNodeError, UnimplementedError
from kazoo.protocol.serialization import (
    GetChildren,
    GetData,
    int_struct,
    multiheader_struct,
    read_buffer,
    read_string,
    stat_struct,
)
from kazoo.protocol.states import ZnodeStat

from rebalancer_spark.backends.zookeeper.store.client import Settings, wait
from rebalancer_spark.core.errors import RebalancerError

__all__ = ["MultiRead", "Reader"]

SMALL = 2048
"""Expected answer size of a znode read without a hint (records, pointers, claims)."""
LIMIT = 512 * 1024
"""Expected answer size of one multiRead request at most."""
MAX_OPS = 2000
_UNSUPPORTED = "_rebalancer_spark_no_multiread"


class MultiRead:
    """A ``multiRead`` request (opcode 22) of GetData and GetChildren operations."""

    type = 22

    def __init__(self, operations: Sequence[Any]) -> None:
        self.operations = list(operations)

    def __repr__(self) -> str:
        return f"MultiRead({len(self.operations)} reads)"

    def serialize(self) -> bytearray:
        out = bytearray()
        for op in self.operations:
            out.extend(multiheader_struct.pack(op.type, False, -1))
            out.extend(op.serialize())
        out.extend(multiheader_struct.pack(-1, True, -1))
        return out

    @classmethod
    def deserialize(cls, data: bytes, offset: int) -> list[Any]:
        results: list[Any] = []
        while True:
            kind, done, _ = multiheader_struct.unpack_from(data, offset)
            offset += multiheader_struct.size
            if done:
                return results
            if kind == GetData.type:
                value, offset = read_buffer(data, offset)
                stat = ZnodeStat._make(stat_struct.unpack_from(data, offset))
                offset += stat_struct.size
                results.append((value if value is not None else b"", stat))
            elif kind == GetChildren.type:
                (count,) = int_struct.unpack_from(data, offset)
                offset += int_struct.size
                children = []
                for _ in range(max(count, 0)):
                    child, offset = read_string(data, offset)
                    children.append(child)
                results.append(children)
            elif kind == -1:
                (code,) = int_struct.unpack_from(data, offset)
                offset += int_struct.size
                results.append(EXCEPTIONS[code]())
            else:
                raise ValueError(f"unexpected multiRead result type {kind}")


class Reader:
    """Batched reads on one client; a missing znode reads as None."""

    def __init__(self, client: Any, settings: Settings, what: str, expired: Exception) -> None:
        self._client = client
        self._settings = settings
        self._what = what
        self._expired = expired
        self._deadline = time.monotonic() + settings.request_timeout
        self._ops: list[tuple[str, str, int]] = []
        self._results: list[Any] = []
        self._sent: list[tuple[list[tuple[str, str, int]], Any]] = []

    def get(self, path: str, hint: int = SMALL) -> Callable[[], tuple[bytes, Any] | None]:
        """Data and stat of ``path``; ``hint`` is the size its data may reach."""
        return self._add("data", path, hint)

    def stat(self, path: str, hint: int = SMALL) -> Callable[[], Any | None]:
        """The stat of ``path`` (read with its data: use it for small znodes only)."""
        read = self._add("data", path, hint)

        def collect() -> Any | None:
            found = read()
            return None if found is None else found[1]

        return collect

    def children(self, path: str, hint: int = 64 * 1024) -> Callable[[], list[str] | None]:
        return self._add("children", path, hint)

    def _add(self, kind: str, path: str, hint: int) -> Callable[[], Any]:
        index = len(self._ops)
        self._ops.append((kind, path, hint))
        return lambda: self._result(index)

    def _result(self, index: int) -> Any:
        if index >= len(self._results):
            self._run()
        result = self._results[index]
        _, path, _ = self._ops[index]
        if isinstance(result, NoNodeError):
            return None
        if isinstance(result, NoAuthError):
            raise self._settings.refused(path)
        if isinstance(result, RebalancerError):
            raise result
        if isinstance(result, Exception):
            raise self._settings.unavailable(
                f"{self._what} ({path})", f"{type(result).__name__}: {result}"
            )
        return result

    def send(self) -> None:
        """Send every read collected and not sent yet, as few multiReads as the limits
        allow, without waiting for the answers."""
        pending = self._ops[len(self._results) + sum(len(b) for b, _ in self._sent) :]
        if not pending:
            return
        if getattr(self._client, _UNSUPPORTED, False):
            self._sent.append((pending, None))
            return
        batches: list[list[tuple[str, str, int]]] = [[]]
        size = 0
        for op in pending:
            if batches[-1] and (size + op[2] > LIMIT or len(batches[-1]) >= MAX_OPS):
                batches.append([])
                size = 0
            batches[-1].append(op)
            size += op[2]
        self._sent += [(batch, self._send(batch)) for batch in batches]

    def _run(self) -> None:
        """Send what is left, then collect every answer in order."""
        self.send()
        sent, self._sent = self._sent, []
        for batch, answer in sent:
            if answer is None:
                self._results += self._one_by_one(batch)
            else:
                self._results += self._collect(batch, answer)

    def _send(self, batch: list[tuple[str, str, int]]) -> Any:
        request = MultiRead(
            [GetData(p, None) if k == "data" else GetChildren(p, None) for k, p, _ in batch]
        )
        answer = self._client.handler.async_result()
        self._client._call(request, answer)
        return answer

    def _collect(self, batch: list[tuple[str, str, int]], answer: Any) -> list[Any]:
        try:
            results: list[Any] | None = answer.get(
                timeout=max(self._deadline - time.monotonic(), 0.001)
            )
        except UnimplementedError:
            setattr(self._client, _UNSUPPORTED, True)
            return self._one_by_one(batch)
        except Exception:
            # Translate the failure (timeout, connection loss, expiry) the usual way.
            results = wait(answer, self._settings, self._what, self._expired, deadline=0.0)
        if results is None:  # the request as a whole found no node: so did each read
            return [NoNodeError() for _ in batch]
        return results

    def _one_by_one(self, batch: list[tuple[str, str, int]]) -> list[Any]:
        sent = [
            self._client.get_async(p) if k == "data" else self._client.get_children_async(p)
            for k, p, _ in batch
        ]
        out: list[Any] = []
        for pending, (_, path, _) in zip(sent, batch, strict=True):
            try:
                found = wait(
                    pending, self._settings, self._what, self._expired, path, self._deadline
                )
            except Exception as exc:
                out.append(exc)
                continue
            out.append(NoNodeError() if found is None else found)
        return out
