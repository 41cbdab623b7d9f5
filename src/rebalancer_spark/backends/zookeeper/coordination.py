"""The coordinator role: election with a monotonic epoch, fenced publication of targets split
into chunks, and resignation.

**Election** is one multi-op through the candidate's session: set ``epoch`` from version E to
E+1 (naming the winner), create the ephemeral ``coordinator``, touch ``changes``. It fails if
anyone else did either first; the loser reads the winner. The epoch is a persistent znode, so
it only grows, across expiries and restarts of the ensemble.

**Publication** writes the new generation's chunks under a fresh ``targets/<dir>`` (each
request fenced), then switches the small ``target`` pointer (fenced, and checking that every
chunk is still there), then removes older directories (fenced). No znode and no request comes
near ZooKeeper's 1 MB limit however large the assignment: chunks are at most
:data:`CHUNK_BYTES`, requests at most :data:`REQUEST_BYTES`.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping

from rebalancer_spark.backends.zookeeper.store.client import Settings
from rebalancer_spark.backends.zookeeper.store.connection import SessionState, ZkSession
from rebalancer_spark.backends.zookeeper.store.fence import (
    alive_op,
    coordinator_fence,
    fenced_transact,
    session_gone,
    session_reader,
    session_transact,
)
from rebalancer_spark.backends.zookeeper.store.layout import REQUEST_BYTES, chunk_json
from rebalancer_spark.backends.zookeeper.store.ops import Op, Refused, batches
from rebalancer_spark.backends.zookeeper.store.records import (
    TargetPointer,
    coordinator_data,
    encode,
    read_coordinator,
    read_epoch,
    read_target_pointer,
)
from rebalancer_spark.backends.zookeeper.store.tree import delete_dir
from rebalancer_spark.core.errors import BackendUnavailable, FencedError, SessionExpired
from rebalancer_spark.core.model import CoordinatorRecord, Phase, Target, validate_resource_id

__all__ = ["elect", "publish", "resign"]

_ATTEMPTS = 20


def elect(zs: ZkSession, settings: Settings) -> CoordinatorRecord | None:
    """Become coordinator if the role is vacant; the coordinator after the attempt."""
    if zs.state is SessionState.ENDED:
        return None
    p, s = zs.paths, zs.session
    what = f"electing a coordinator of group {s.group!r}"
    try:
        for _ in range(_ATTEMPTS):
            reader = session_reader(zs, settings, what)
            alive, holder, epoch = (
                reader.stat(p.session(s.session_id)),
                reader.get(p.coordinator),
                reader.get(p.epoch),
            )
            if alive() is None:
                session_gone(zs)
                return None
            found = holder()
            if found is not None:
                return read_coordinator(found[0], p.coordinator)
            current = epoch()
            if current is None:
                raise BackendUnavailable(f"group znode {p.epoch} is missing: the group is damaged")
            record = read_epoch(current[0], current[1].version, p.epoch)
            won = CoordinatorRecord(s.member_id, s.session_id, record.epoch + 1)
            data = coordinator_data(won.member_id, won.session_id, won.epoch)
            ops = [
                alive_op(zs),
                Op("set", p.epoch, data, version=record.epoch),
                Op("create", p.coordinator, data, ephemeral=True),
                Op("set", p.changes),
            ]
            try:
                session_transact(zs, settings, ops, what)
            except Refused as exc:
                if exc.op.kind == "check":
                    session_gone(zs)
                    return None
                continue  # someone else won or bumped the epoch first: look again
            return won
    except SessionExpired:
        return None
    raise BackendUnavailable(
        f"ZooKeeper {settings.shown}: the election in group {s.group!r} kept conflicting "
        f"({_ATTEMPTS} attempts); retry"
    )


def publish(
    zs: ZkSession,
    settings: Settings,
    epoch: int,
    assignment: Mapping[str, Collection[str]],
    phase: Phase,
    resources_version: int,
) -> Target:
    """Publish a new target generation; see the module docstring."""
    p = zs.paths
    what = f"publishing a target of group {p.group!r}"
    fence = coordinator_fence(zs, settings, epoch, what)
    found = session_reader(zs, settings, what).get(p.target)()
    old = None if found is None else read_target_pointer(found[0], p.target, group=p.group)
    generation = (old.generation if old else 0) + 1
    name = f"g{generation}-e{epoch}-{uuid.uuid4().hex[:8]}"
    parts = {m: sorted({validate_resource_id(r) for r in rs}) for m, rs in assignment.items()}
    writes: list[Op] = [Op("create", p.target_dir(name))]
    counts: dict[str, int] = {}
    for member, resources in sorted(parts.items()):
        chunks = chunk_json(encode(r) for r in resources)
        counts[member] = len(chunks)
        writes += [
            Op("create", p.target_chunk(name, member, k), chunk) for k, chunk in enumerate(chunks)
        ]
    limit = REQUEST_BYTES - sum(op.cost for op in fence)
    for batch in batches(writes, limit):
        fenced_transact(zs, settings, epoch, [*fence, *batch], what)
    pointer = TargetPointer(generation, epoch, phase, resources_version, name, counts)
    checks = [Op("check", op.path) for op in writes]
    switch = (
        Op("create", p.target, pointer.encode())
        if found is None
        else Op("set", p.target, pointer.encode(), version=found[1].version)
    )
    fenced_transact(zs, settings, epoch, [*fence, *checks, switch, Op("set", p.changes)], what)
    _collect_garbage(zs, settings, fence, keep={name, old.name if old else name})
    return Target(
        generation=generation,
        coordinator_epoch=epoch,
        assignment={m: frozenset(rs) for m, rs in parts.items()},
        phase=phase,
        resources_version=resources_version,
    )


def _collect_garbage(zs: ZkSession, settings: Settings, fence: list[Op], keep: set[str]) -> None:
    """Remove target directories other than the current and the previous one (the previous
    is kept for readers that read the old pointer a moment ago)."""
    p = zs.paths
    found = session_reader(zs, settings, "listing old targets").children(p.targets)()
    for name in sorted(set(found or ()) - keep):
        delete_dir(zs.client, settings, p.target_dir(name), fence, zs.expired())


def resign(zs: ZkSession, settings: Settings, epoch: int) -> None:
    """Give up the role if held at ``epoch`` (the epoch is kept); otherwise do nothing."""
    if zs.state is SessionState.ENDED:
        return
    what = f"resigning as coordinator of group {zs.paths.group!r}"
    try:
        fence = coordinator_fence(zs, settings, epoch, what)
        session_transact(
            zs,
            settings,
            [*fence, Op("delete", zs.paths.coordinator), Op("set", zs.paths.changes)],
            what,
        )
    except (Refused, FencedError, SessionExpired):
        return
