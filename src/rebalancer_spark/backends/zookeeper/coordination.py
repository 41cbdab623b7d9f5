"""The coordinator role: election with a monotonic epoch, fenced publication of targets split
into chunks, and resignation.

**Election** is one multi-op through the candidate's session: set ``epoch`` from version E to
E+1 (naming the winner), create the ephemeral ``coordinator``, touch ``changes``. It fails if
anyone else did either first; the loser reads the winner. The epoch is a persistent znode, so
it only grows, across expiries and restarts of the ensemble.

**Publication** writes the new generation under a fresh directory (each request fenced): a
delta of the moved ids (one chunk per changed member, and for each member that gains ids, once
the target before it has settled, a hints chunk naming the session of the member that had each:
:func:`.ownership.claim`, "Hints") added to the chain behind the last base this session wrote,
or, when that cannot be (:data:`DELTA_SHARE`), a new base of every member's part in chunks;
then it switches the small ``target`` pointer (fenced, and checking that every chunk, the base
and the chain are still there), then removes the directories that neither the new nor the
previous pointer names (fenced). No znode and no request comes near ZooKeeper's 1 MB limit
however large the assignment: chunks are at most :data:`CHUNK_BYTES`, requests at most
:data:`REQUEST_BYTES`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from typing import Any

from rebalancer_spark.backends.base import TargetChange
from rebalancer_spark.backends.zookeeper.store.client import Settings
from rebalancer_spark.backends.zookeeper.store.connection import (
    PublishedBase,
    SessionState,
    ZkSession,
)
from rebalancer_spark.backends.zookeeper.store.fence import (
    alive_op,
    coordinator_fence,
    fenced_transact,
    session_gone,
    session_reader,
    session_transact,
)
from rebalancer_spark.backends.zookeeper.store.layout import (
    CHUNK_BYTES,
    REQUEST_BYTES,
    SESSION_HINT,
    GroupPaths,
    chunk_json,
)
from rebalancer_spark.backends.zookeeper.store.multiread import Reader
from rebalancer_spark.backends.zookeeper.store.ops import Op, Refused, batches
from rebalancer_spark.backends.zookeeper.store.records import (
    TargetPointer,
    change_items,
    coordinator_data,
    encode,
    hints_data,
    read_coordinator,
    read_epoch,
    read_member,
    read_target_pointer,
)
from rebalancer_spark.backends.zookeeper.store.tree import delete_dir
from rebalancer_spark.core.errors import BackendUnavailable, FencedError, SessionExpired
from rebalancer_spark.core.model import CoordinatorRecord, Phase, Target

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
                reader.stat(p.session(s.session_id), SESSION_HINT),
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


DELTA_SHARE = 2
"""A target goes out as a delta while the changes written by the deltas since the last base (a
moved id counts twice: gained and lost) stay within ``1/DELTA_SHARE`` of the base's ids (or
:data:`DELTA_MIN_IDS`), the chain is shorter than :data:`DELTA_CHAIN` and every member's
changes fit one chunk; otherwise a new base is written whole. Whole writes are then a quarter
of the ids moved apart (or a chain apart): the bytes per rebalance follow what moved, and a
fresh reader applies a bounded chain."""

DELTA_MIN_IDS = 1000
"""Changes of this many ids may always go out as deltas, however small the base."""

DELTA_CHAIN = 16
"""The most deltas a pointer names."""

HINT_SETTLE = 2.0
"""Seconds a running target must have been out before the delta after it names who had each
moved id (the hints: :func:`.ownership.claim`): members claim what a target gives them in
about a second, so a member that was given an id by a younger target may not hold it yet (a
rolling start-up publishes a target every stability window), and a hint naming it would keep
the id from its new owner for a second or two. This session's previous publication is the
one timed."""


def publish(
    zs: ZkSession,
    settings: Settings,
    epoch: int,
    assignment: Mapping[str, Collection[str]],
    phase: Phase,
    resources_version: int,
    change: TargetChange | None = None,
) -> Target:
    """Publish a new target generation: as a delta (``change``, from the generation this
    session published last, which the pointer must still name), else whole; see the module
    docstring."""
    p = zs.paths
    what = f"publishing a target of group {p.group!r}"
    fence = coordinator_fence(zs, settings, epoch, what)
    reader = session_reader(zs, settings, what)
    pointer_read = reader.get(p.target)
    losing = _read_losing(zs, reader, change, phase)
    found = pointer_read()
    old = None if found is None else read_target_pointer(found[0], p.target, group=p.group)
    generation = (old.generation if old else 0) + 1
    name = f"g{generation}-e{epoch}-{uuid.uuid4().hex[:8]}"
    parts = {m: frozenset(rs) for m, rs in assignment.items()}
    base = zs.base
    delta = None
    if change is not None and base is not None and old is not None and _extends(base, old, change):
        delta = _delta_chunks(change)
    writes: list[Op] = []
    if base is not None and change is not None and delta is not None:
        deltas = base.deltas
        # No hints behind a stopping phase: every member released everything then (the
        # global barrier), and a hinted holder would look as if it still held them. (None
        # either when the losing members were not read: see _read_losing.)
        hints = (
            _hint_chunks(change, _sessions(losing, p, found[1].mzxid))
            if delta and losing and found and old and old.phase is Phase.RUNNING
            else {}
        )
        if delta:  # no change at all (a new phase, say): the same chain
            deltas += (name,)
            writes.append(Op("create", p.target_dir(name)))
            writes += [Op("create", p.target_chunk(name, m, 0), c) for m, c in delta.items()]
            writes += [Op("create", p.target_hints(name, m), c) for m, c in hints.items()]
        counts = {m: base.counts.get(m, 0) for m in parts}
        pointer = TargetPointer(
            generation,
            epoch,
            phase,
            resources_version,
            base.name,
            counts,
            deltas,
            hinted=tuple(sorted(hints)),
        )
        published = replace(
            base, generation=generation, deltas=deltas, changed=base.changed + change.size
        )
        # The base and the chain must still be there (nobody else removes them while the
        # pointer version checked below still names them; checked all the same).
        checks = [Op("check", p.target_dir(d)) for d in (base.name, *base.deltas)]
    else:
        writes.append(Op("create", p.target_dir(name)))
        counts = {}
        for member, ids in sorted(parts.items()):
            chunks = chunk_json(encode(r) for r in sorted(ids))
            counts[member] = len(chunks)
            writes += [
                Op("create", p.target_chunk(name, member, k), c) for k, c in enumerate(chunks)
            ]
        pointer = TargetPointer(generation, epoch, phase, resources_version, name, counts)
        published = PublishedBase(generation, name, counts, sum(map(len, parts.values())))
        checks = []
    limit = REQUEST_BYTES - sum(op.cost for op in fence)
    for batch in batches(writes, limit):
        fenced_transact(zs, settings, epoch, [*fence, *batch], what)
    checks += [Op("check", op.path) for op in writes]
    switch = (
        Op("create", p.target, pointer.encode())
        if found is None
        else Op("set", p.target, pointer.encode(), version=found[1].version)
    )
    zs.base = None  # unknown until the switch is answered
    fenced_transact(zs, settings, epoch, [*fence, *checks, switch, Op("set", p.changes)], what)
    zs.base = replace(published, published_at=zs.monotonic())
    keep = {pointer.name, *pointer.deltas}
    if old is not None:
        keep |= {old.name, *old.deltas}
    _collect_garbage(zs, settings, fence, keep=keep)
    return Target(
        generation=generation,
        coordinator_epoch=epoch,
        assignment=parts,
        phase=phase,
        resources_version=resources_version,
    )


def _extends(base: PublishedBase, old: TargetPointer, change: TargetChange) -> bool:
    """Whether ``change`` may go out as one more delta: the pointer still names the target this
    session published last, which ``change`` starts from, and the chain has room."""
    return (
        old.generation == base.generation == change.base
        and old.name == base.name
        and old.deltas == base.deltas
        and len(base.deltas) < DELTA_CHAIN
        and base.changed + change.size <= max(DELTA_MIN_IDS, base.size // DELTA_SHARE)
    )


def _delta_chunks(change: TargetChange) -> dict[str, bytes] | None:
    """Each changed member's one delta chunk, or None if a member's changes need more than
    one (a move that large is written whole)."""
    out: dict[str, bytes] = {}
    empty: frozenset[str] = frozenset()
    for member in sorted(change.added.keys() | change.removed.keys()):
        items = change_items(change.added.get(member, empty), change.removed.get(member, empty))
        chunks = chunk_json(items)
        if len(chunks) > 1:
            return None
        if chunks:
            out[member] = chunks[0]
    return out


def _read_losing(
    zs: ZkSession, reader: Reader, change: TargetChange | None, phase: Phase
) -> dict[str, Callable[[], tuple[bytes, Any] | None]]:
    """Issue the reads of the znodes of the members that ``change`` takes ids from, to name
    their sessions in the hints: only for a running target after one that had time to settle
    (:data:`HINT_SETTLE`), and sent with the pointer's read."""
    base = zs.base
    if (
        change is None
        or base is None
        or phase is not Phase.RUNNING
        or zs.monotonic() - base.published_at < HINT_SETTLE
    ):
        return {}
    return {m: reader.get(zs.paths.member(m)) for m in sorted(change.removed)}


def _sessions(
    reads: Mapping[str, Callable[[], tuple[bytes, Any] | None]], paths: GroupPaths, before: int
) -> dict[str, str]:
    """Member id -> its session, for the members whose znode the reads found created before
    the zxid ``before`` (the target before this one): a member that joined again since then
    holds nothing of that target under its new session."""
    out: dict[str, str] = {}
    for member, read in reads.items():
        found = read()
        if found is not None and found[1].czxid < before:
            out[member] = read_member(member, found[0], paths.member(member)).session_id
    return out


def _hint_chunks(change: TargetChange, sessions: Mapping[str, str]) -> dict[str, bytes]:
    """Each gaining member's hints chunk: for the ids it gains, the session of the member that
    had each in the target before (if that member is still there), when they fit one chunk.
    A hint is only a guess of the holder (see ``ownership``, "Hints"): a member whose hints do
    not fit claims as without them."""
    before = {r: m for m, ids in change.removed.items() for r in ids}
    out: dict[str, bytes] = {}
    for member, gained in sorted(change.added.items()):
        held: dict[str, list[str]] = {}
        for r in gained:
            session = sessions.get(before.get(r, ""))
            if session is not None:
                held.setdefault(session, []).append(r)
        if held and len(data := hints_data(held)) <= CHUNK_BYTES:
            out[member] = data
    return out


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
