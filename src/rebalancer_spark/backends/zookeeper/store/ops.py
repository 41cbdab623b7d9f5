"""Multi-op requests: the unit of every fenced write.

An :class:`Op` is one create, set, delete or check; :func:`transact` applies a list of them
atomically (ZooKeeper ``multi``) or raises :class:`Refused` naming the first operation whose
condition failed, so that a caller can tell a refused fence from a refused resource and try
the rest again. :func:`batches` cuts long lists into requests far below ZooKeeper's 1 MB.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kazoo.exceptions import NoAuthError, NoNodeError, RolledBackError, RuntimeInconsistency
from kazoo.protocol.serialization import CheckVersion, Create, Delete, SetData, Transaction

from rebalancer_spark.backends.zookeeper.store.client import Settings, wait

__all__ = ["Op", "Refused", "answer", "batches", "send", "transact"]


@dataclass(frozen=True, slots=True)
class Op:
    """One operation of a multi-op request; ``tag`` says what it is about (a resource id),
    so that a caller can drop a refused item and try the rest again."""

    kind: str
    path: str
    data: bytes = b""
    version: int = -1
    ephemeral: bool = False
    tag: str = ""

    OVERHEAD: ClassVar[int] = 128
    """Bytes of header, version, flags and one ACL entry per operation, rounded up."""

    @property
    def cost(self) -> int:
        return len(self.path.encode()) + len(self.data) + self.OVERHEAD


class Refused(Exception):
    """A multi-op request was refused by one of its operations; none of it was applied."""

    def __init__(self, op: Op, error: Exception) -> None:
        super().__init__(f"{op.kind} {op.path}: {type(error).__name__}")
        self.op = op
        self.error = error


def transact(
    client: Any,
    ops: Sequence[Op],
    settings: Settings,
    what: str,
    expired: Exception,
    then: Callable[[], None] | None = None,
) -> list[Any]:
    """Apply ``ops`` atomically (ZooKeeper multi) and return kazoo's results (a path per
    create, a stat per set), or raise :class:`Refused` naming the first operation that failed
    its check. ``then`` runs once the request is sent, before its answer is awaited: requests
    it sends on the same client are served right after this one."""
    if not ops:
        return []
    pending = send(client, ops, settings)
    if then is not None:
        then()
    return answer(pending, ops, settings, what, expired)


def send(client: Any, ops: Sequence[Op], settings: Settings) -> Any:
    """Send ``ops`` as one multi-op without waiting; :func:`answer` collects the result.
    Requests sent on one client are served in the order they were sent.

    The request is built from kazoo's protocol records directly rather than through
    ``client.transaction()``, which checks types, normalises the path and logs once per
    operation (a fifth of a 2,000-resource claim's time): every path here is absolute and
    normal already (:class:`.layout.GroupPaths`), so the chroot is simply put in front."""
    root = (client.chroot or "").rstrip("/")
    acl = list(settings.acl)
    records: list[Any] = []
    for op in ops:
        path = root + op.path
        if op.kind == "create":
            records.append(Create(path, op.data, acl, 1 if op.ephemeral else 0))
        elif op.kind == "set":
            records.append(SetData(path, op.data, op.version))
        elif op.kind == "delete":
            records.append(Delete(path, op.version))
        else:
            records.append(CheckVersion(path, op.version))
    pending = client.handler.async_result()
    client._call(Transaction(records), pending)
    return pending


def answer(
    pending: Any, ops: Sequence[Op], settings: Settings, what: str, expired: Exception
) -> list[Any]:
    """The results of the multi-op ``ops`` sent as ``pending`` (see :func:`transact`)."""
    results = wait(pending, settings, what, expired)
    if results is None:  # a NoNode for the whole request: treat as refused by its first op
        raise Refused(ops[0], NoNodeError())
    for op, result in zip(ops, results, strict=False):
        if isinstance(result, NoAuthError):
            raise settings.refused(op.path)
        if isinstance(result, Exception) and not isinstance(
            result, RolledBackError | RuntimeInconsistency
        ):
            raise Refused(op, result)
    return list(results)


def batches(ops: Sequence[Op], limit: int) -> list[list[Op]]:
    """``ops`` cut into consecutive requests of at most ``limit`` bytes each."""
    out: list[list[Op]] = []
    current: list[Op] = []
    size = 0
    for op in ops:
        if current and size + op.cost > limit:
            out.append(current)
            current, size = [], 0
        current.append(op)
        size += op.cost
    if current:
        out.append(current)
    return out
