"""Reading a group: consistent snapshots from many znodes without a multi-read.

ZooKeeper has no read transaction, so :func:`read_state` reads optimistically: it notes three
counters that together change with every change of the group (the ``changes`` marker's
version, bumped by every write of this library; the ``cversion`` of ``members/`` and of
``sessions/``, which also move when ZooKeeper deletes the ephemeral znodes of an expired session),
reads everything in pipelined rounds, then reads the counters again. Equal counters mean no
change happened in between: the snapshot is consistent. Otherwise it reads again. The
snapshot of unchanged counters is cached, so polling an idle group costs one round trip.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from rebalancer_spark.backends.zookeeper.control import decode_control
from rebalancer_spark.backends.zookeeper.store.chain import read_record
from rebalancer_spark.backends.zookeeper.store.client import Settings
from rebalancer_spark.backends.zookeeper.store.connection import ZkSession
from rebalancer_spark.backends.zookeeper.store.layout import (
    CHUNK_BYTES,
    LOG_PREFIX,
    RECORD_HINT,
    GroupPaths,
    unescape,
)
from rebalancer_spark.backends.zookeeper.store.multiread import Reader
from rebalancer_spark.backends.zookeeper.store.records import (
    ResourcesPointer,
    TargetPointer,
    apply_changes,
    read_coordinator,
    read_hints,
    read_member,
    read_resource_chunk,
    read_resource_log_chunk,
    read_resources_pointer,
    read_target_chunk,
    read_target_pointer,
)
from rebalancer_spark.core.control import Control
from rebalancer_spark.core.errors import BackendUnavailable, CorruptStateError
from rebalancer_spark.core.model import (
    Claim,
    CoordinatorRecord,
    GroupHead,
    GroupState,
    MemberRecord,
    Resource,
    ResourceChange,
    Target,
    fold_changes,
)

__all__ = ["Changed", "SnapshotReader", "read_own_part", "read_resources", "read_target_part"]

_ATTEMPTS = 50
_T = TypeVar("_T")


class Changed(Exception):
    """The group changed while it was being read (a znode listed a moment ago is gone)."""


def _need(value: Any) -> Any:
    if value is None:
        raise Changed
    return value


def read_resources(
    reader: Reader, paths: GroupPaths, pointer: ResourcesPointer | None
) -> Callable[[], dict[str, Resource]]:
    """Issue the reads of a resource set's chunks; the thunk collects them."""
    chunks = read_resource_chunks(reader, paths, pointer)
    return lambda: build_resources(chunks())


def read_resource_chunks(
    reader: Reader, paths: GroupPaths, pointer: ResourcesPointer | None
) -> Callable[[], list[tuple[str, bytes]]]:
    """Issue the reads of a resource set's chunks, and of the chunks of the changes logged
    after its directory's version (``pointer.chain``), all in one round; the thunk collects
    them as read (each with its path), unparsed, in the order :func:`build_resources` applies
    them."""
    if pointer is None:
        return list
    names = [(pointer.name, pointer.chunks)] + [(c.name, c.chunks) for c in pointer.chain]
    chunks = [
        (path, reader.get(path, CHUNK_BYTES))
        for name, count in names
        for k in range(count)
        if (path := paths.resource_chunk(name, k))
    ]
    return lambda: [(path, _need(pending())[0]) for path, pending in chunks]


def build_resources(chunks: list[tuple[str, bytes]]) -> dict[str, Resource]:
    """The resource set of the chunks :func:`read_resource_chunks` collected: the set's,
    then each logged change's (a directory named ``log-...``) applied in turn."""
    out: dict[str, Resource] = {}
    for path, data in chunks:
        if path.rsplit("/", 2)[-2].startswith(LOG_PREFIX):
            for rid, weight in read_resource_log_chunk(data, path):
                if weight is None:
                    out.pop(rid, None)
                else:
                    out[rid] = _resource(rid, weight, path)
        else:
            out.update((r.id, r) for r in read_resource_chunk(data, path))
    return out


def _resource(rid: str, weight: float, path: str) -> Resource:
    try:
        return Resource(rid, weight)
    except ValueError as exc:
        raise CorruptStateError(
            f"znode {path} holds an invalid resource ({exc}); it was not written by "
            "rebalancer-spark: recreate the group"
        ) from None


def _read_part(
    reader: Reader,
    paths: GroupPaths,
    pointer: TargetPointer,
    member: str,
    start: tuple[int, frozenset[str]] | None = None,
    hints: dict[str, tuple[str, int]] | None = None,
) -> Callable[[], frozenset[str]]:
    """Issue the reads of ``member``'s part of ``pointer``'s target: its chunks in the base,
    then, for each delta, the member's chunk there (one chunk or none: no change) and the
    delta's directory, all in one round. ``start`` = (k, part) resumes from the member's part
    after the first k deltas, read before: only the later deltas are read. With ``hints``, the
    member's hints in the last delta (if the pointer says it has some and that delta is read
    here) go into it: resource -> the session of the member that had it, and the ``czxid`` of
    the hints chunk (written before the pointer switched to that delta)."""
    if start is None:
        count = pointer.members.get(member, 0)
        base = [
            (path, reader.get(path, CHUNK_BYTES))
            for k in range(count)
            if (path := paths.target_chunk(pointer.name, member, k))
        ]
        skip, known = 0, None
    else:
        base, (skip, known) = [], start
    # The chunk first, then its directory: found untouched (version 0) after the chunk's read,
    # the directory was not being removed then (tree.delete_dir marks it first), so a chunk
    # missing there was never written: the member had no change.
    deltas = [
        (path, reader.get(path, CHUNK_BYTES), reader.stat(paths.target_dir(d)))
        for d in pointer.deltas[skip:]
        if (path := paths.target_chunk(d, member, 0))
    ]
    hinted = None
    if hints is not None and member in pointer.hinted and len(pointer.deltas) > skip:
        hinted_path = paths.target_hints(pointer.deltas[-1], member)
        hinted = (hinted_path, reader.get(hinted_path, CHUNK_BYTES))

    def collect() -> frozenset[str]:
        part = set(known or ())
        for path, pending in base:
            data, _ = _need(pending())
            part.update(read_target_chunk(data, path))
        for path, chunk, directory in deltas:
            if _need(directory()).version != 0:  # being removed: the target moved on
                raise Changed
            found = chunk()
            if found is not None:
                apply_changes(part, found[0], path)
        if hints is not None and hinted is not None and (found := hinted[1]()) is not None:
            created = found[1].czxid
            hints.update({r: (s, created) for r, s in read_hints(found[0], hinted[0]).items()})
        return frozenset(part)

    return collect


def read_target_part(
    reader: Reader, paths: GroupPaths, pointer: TargetPointer, members: Iterable[str]
) -> Callable[[], dict[str, frozenset[str]]]:
    """Issue the reads of ``members``' parts of a target (those it names), in one round."""
    pending = {m: _read_part(reader, paths, pointer, m) for m in members if m in pointer.members}
    return lambda: {m: collect() for m, collect in pending.items()}


def read_own_part(
    zs: ZkSession, reader: Reader, pointer: TargetPointer
) -> Callable[[], frozenset[str]]:
    """Issue the reads of this session's member's part of ``pointer``'s target, as far as the
    session did not read it already (:attr:`ZkSession.parts`): directories are written once
    under fresh names and never changed, so a member reads its part of a base once, and then
    only its chunk of each delta added to the chain since. Notes the target's number of
    members too (:attr:`ZkSession.group_size`)."""
    member = zs.session.member_id
    zs.group_size = len(pointer.members)
    if member not in pointer.members:
        return frozenset  # given nothing: called, an empty part
    cached = zs.parts
    start = None
    if cached is not None and cached[0] == pointer.name:
        done = cached[1]
        if pointer.deltas[: len(done)] == done:
            if len(done) == len(pointer.deltas):
                part = cached[2]
                return lambda: part
            start = (len(done), cached[2])
    hints: dict[str, tuple[str, int]] = {}
    pending = _read_part(reader, zs.paths, pointer, member, start, hints)

    def collect() -> frozenset[str]:
        part = pending()
        zs.parts = (pointer.name, pointer.deltas, part)
        zs.note_hints({r: hint for r, hint in hints.items() if r in part})
        return part

    return collect


def target_of(pointer: TargetPointer, assignment: dict[str, frozenset[str]]) -> Target:
    return Target(
        generation=pointer.generation,
        coordinator_epoch=pointer.epoch,
        assignment=assignment,
        phase=pointer.phase,
        resources_version=pointer.resources_version,
    )


class SnapshotReader:
    """Consistent snapshots of one group through one client; see the module docstring."""

    def __init__(self, client: Any, settings: Settings, paths: GroupPaths) -> None:
        self._client = client
        self._settings = settings
        self._paths = paths
        self._lock = threading.Lock()
        self._cached: tuple[tuple[int, int, int], GroupState] | None = None

    def _reader(self) -> Reader:
        what = f"reading group {self._paths.group!r}"
        return Reader(
            self._client, self._settings, what, self._settings.unavailable(what, "session expired")
        )

    def _counters(self, reader: Reader) -> Callable[[], tuple[int, int, int]]:
        p = self._paths
        marker, members, sessions = (
            reader.stat(p.changes),
            reader.stat(p.members),
            reader.stat(p.sessions),
        )

        def collect() -> tuple[int, int, int]:
            return (
                _need(marker()).version,
                _need(members()).cversion,
                _need(sessions()).cversion,
            )

        return collect

    def state(self) -> GroupState:
        return self._retry(self._attempt)

    def _retry(self, attempt: Callable[[], _T]) -> _T:
        for _ in range(_ATTEMPTS):
            try:
                return attempt()
            except Changed:
                continue
        raise BackendUnavailable(
            f"ZooKeeper {self._settings.shown}: group {self._paths.group!r} changed during "
            f"each of {_ATTEMPTS} attempts to read it consistently; try again"
        )

    def head(self) -> GroupHead:
        """:meth:`Backend.head` in two round trips: the member list, coordinator, pointers and
        control, then the member records; consistent when the member list did not change
        in between (``members/`` cversion). Claims may change meanwhile: the head has none."""
        return self._retry(self._head_attempt)

    def _head_attempt(self) -> GroupHead:
        p = self._paths
        r1 = self._reader()
        before, members_list = r1.stat(p.members), r1.children(p.members)
        coordinator, rptr_raw, tptr_raw = (
            r1.get(p.coordinator),
            r1.get(p.resources),
            r1.get(p.target),
        )
        control = r1.get(p.control, 4 * CHUNK_BYTES)
        names: list[str] = _need(members_list())
        r2 = self._reader()
        gets = [(m, r2.get(p.member(m))) for m in names]
        after = r2.stat(p.members)
        members: dict[str, MemberRecord] = {}
        for m, pending in gets:
            data, _ = _need(pending())
            members[m] = read_member(m, data, p.member(m))
        if _need(after()).cversion != _need(before()).cversion:
            raise Changed
        rptr, tptr = self._pointers(rptr_raw(), tptr_raw())
        return GroupHead(
            p.group,
            members,
            self._coordinator(coordinator(), members),
            0 if rptr is None else rptr.version,
            0 if tptr is None else tptr.generation,
            decode_control(p.group, control()),
        )

    def control(self) -> Control:
        """:meth:`Backend.control`: one read of the ``control`` znode."""
        found = self._reader().get(self._paths.control, 4 * CHUNK_BYTES)
        return decode_control(self._paths.group, found())

    def _pointers(
        self, rptr_raw: tuple[bytes, Any] | None, tptr_raw: tuple[bytes, Any] | None
    ) -> tuple[ResourcesPointer | None, TargetPointer | None]:
        p = self._paths
        rptr = None if rptr_raw is None else read_resources_pointer(rptr_raw[0], p.resources)
        tptr = (
            None if tptr_raw is None else read_target_pointer(tptr_raw[0], p.target, group=p.group)
        )
        return rptr, tptr

    def _coordinator(
        self, found: tuple[bytes, Any] | None, members: dict[str, MemberRecord]
    ) -> CoordinatorRecord | None:
        if found is None:
            return None
        record = read_coordinator(found[0], self._paths.coordinator)
        live = {rec.session_id for rec in members.values()}
        return record if record.session_id in live else None

    def resources(self) -> tuple[int, dict[str, Resource]]:
        """:meth:`Backend.resources`: :meth:`resource_chunks`, built."""
        version, chunks = self.resource_chunks()
        return version, build_resources(chunks)

    def resource_chunks(self) -> tuple[int, list[tuple[str, bytes]]]:
        """The resource set's version and its chunks as read, unparsed (what
        :meth:`Backend.remember_resources` keeps): the pointer, then its chunks (a set replaced
        meanwhile loses its chunks: read again)."""

        def attempt() -> tuple[int, list[tuple[str, bytes]]]:
            found = self._reader().get(self._paths.resources)()
            rptr, _ = self._pointers(found, None)
            if rptr is None:
                return 0, []
            return rptr.version, read_resource_chunks(self._reader(), self._paths, rptr)()

        return self._retry(attempt)

    def resource_changes(self, since: int) -> ResourceChange | None:
        """:meth:`Backend.resource_changes`: the pointer, then the chunks of every logged
        change after ``since`` in one round (module :mod:`.resources`); None if the log does
        not reach back to ``since``, or a change it names was dropped meanwhile."""
        found = self._reader().get(self._paths.resources)()
        rptr, _ = self._pointers(found, None)
        if rptr is None:
            return ResourceChange(0, 0, {}, frozenset()) if since == 0 else None
        if not rptr.logged_from <= since <= rptr.version:
            return None
        reader = self._reader()
        pending = [
            (path, reader.get(path, CHUNK_BYTES))
            for change in rptr.log
            if change.version > since
            for k in range(change.chunks)
            if (path := self._paths.resource_chunk(change.name, k))
        ]
        entries: list[tuple[str, Resource | None]] = []
        for path, answer in pending:
            got = answer()
            if got is None:
                return None  # dropped from the log by a later change
            entries += (
                (rid, None if weight is None else _resource(rid, weight, path))
                for rid, weight in read_resource_log_chunk(got[0], path)
            )
        put, removed = fold_changes(entries)
        return ResourceChange(since, rptr.version, put, frozenset(removed))

    def target(self) -> Target | None:
        """:meth:`Backend.target`: the pointer, then every member's part of it."""

        def attempt() -> Target | None:
            found = self._reader().get(self._paths.target)()
            _, tptr = self._pointers(None, found)
            if tptr is None:
                return None
            parts = read_target_part(self._reader(), self._paths, tptr, list(tptr.members))
            return target_of(tptr, parts())

        return self._retry(attempt)

    def holders(self, sessions: dict[str, str]) -> frozenset[str]:
        """:meth:`Backend.holders`: ZooKeeper keeps claims per resource only, so this reads
        every epoch record (the coordinator asks only while a drain is unfinished)."""
        by_session = {sid: m for m, sid in sessions.items()}
        names = self._reader().children(self._paths.epochs)() or []
        claims = _claims(self._reader(), self._paths, names)()
        return frozenset(by_session[c.session_id] for c in claims if c.session_id in by_session)

    def _attempt(self) -> GroupState:
        p = self._paths
        r1 = self._reader()
        counters = self._counters(r1)
        members_list = r1.children(p.members)
        epoch_list = r1.children(p.epochs)
        coordinator = r1.get(p.coordinator)
        resources_ptr = r1.get(p.resources)
        target_ptr = r1.get(p.target)
        control = r1.get(p.control, 4 * CHUNK_BYTES)
        before = counters()
        with self._lock:
            if self._cached is not None and self._cached[0] == before:
                return self._cached[1]
        member_names: list[str] = _need(members_list())
        epoch_names: list[str] = _need(epoch_list())
        coord = coordinator()
        rptr, tptr = self._pointers(resources_ptr(), target_ptr())

        r2 = self._reader()
        member_gets = [(m, r2.get(p.member(m))) for m in member_names]
        claims = _claims(r2, p, epoch_names)
        resources = read_resources(r2, p, rptr)
        parts = None if tptr is None else read_target_part(r2, p, tptr, list(tptr.members))
        after = self._counters(r2)
        members: dict[str, MemberRecord] = {}
        for m, pending in member_gets:
            data, _ = _need(pending())
            members[m] = read_member(m, data, p.member(m))
        snapshot_resources = resources()
        target = None if tptr is None or parts is None else target_of(tptr, parts())
        if after() != before:
            raise Changed
        live = {rec.session_id for rec in members.values()}
        state = GroupState(
            group=p.group,
            members=members,
            coordinator=self._coordinator(coord, members),
            resources=snapshot_resources,
            resources_version=0 if rptr is None else rptr.version,
            target=target,
            claims={c.resource: c for c in claims() if c.session_id in live},
            control=decode_control(p.group, control()),
        )
        with self._lock:
            self._cached = (before, state)
        return state


def _claims(reader: Reader, p: GroupPaths, names: Iterable[str]) -> Callable[[], list[Claim]]:
    """Read the ``epochs/`` records ``names`` with ``reader``; collect the claims they name: a
    record that names a session and was not released (whether that session lives is the
    caller's to judge)."""
    gets = [
        (unescape(n, p.epochs), f"{p.epochs}/{n}", reader.get(f"{p.epochs}/{n}", RECORD_HINT))
        for n in names
    ]

    def collect() -> list[Claim]:
        out: list[Claim] = []
        for resource, path, pending in gets:
            found = pending()
            if found is None:
                continue  # removed meanwhile
            record = read_record(*found, path)
            if record.holder is not None and record.member is not None:
                out.append(Claim(resource, record.member, record.holder, record.epoch))
        return out

    return collect
