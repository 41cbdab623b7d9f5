"""Claims, releases and a member's view: ownership, fenced per resource.

A resource is held by the session its ``epochs/<id>`` record names, until that record says
``released`` or the session ends: the record is persistent and names the session, and the
session's ephemeral ``sessions/<session id>`` exists exactly while the session lives (ZooKeeper
never gives an ended session's id again). A claim is one ``set`` (or ``create``) of the record,
fenced on the version read, in a multi-op that also checks that the claimer's session lives
and that the ``target`` pointer is still at the version whose chunks gave the member the
resource; nobody else can grant the resource in between, and a holder it names is live or
gone for good. Many resources go in one request; a resource refused by its own check is
dropped and the rest tried again. A release sets the record ``released``, fenced the same way.

(Until this layout a claim also created an ephemeral ``claims/<id>`` znode of the claimer's
session and a release deleted it: four writes for a resource that moves, where two do. See
docs/backends/zookeeper.md for members of earlier releases in the same group.)

Each grant also says what it superseded (:mod:`.chain`): the ``epochs/<id>`` record the claim
reads anyway names the last holder and whether it released, and the grant writes its own
record there."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any

from rebalancer_spark.backends.zookeeper.progress import Prefetch, read_progresses
from rebalancer_spark.backends.zookeeper.reads import Changed, read_own_part
from rebalancer_spark.backends.zookeeper.store.chain import (
    EpochRecord,
    grant_data,
    held_grant,
    next_grant,
    notes_data,
    read_notes,
    read_record,
    released_data,
)
from rebalancer_spark.backends.zookeeper.store.client import Settings, wait
from rebalancer_spark.backends.zookeeper.store.connection import Held, SessionState, ZkSession
from rebalancer_spark.backends.zookeeper.store.fence import (
    alive_op,
    require_live,
    session_answer,
    session_gone,
    session_reader,
    session_sync,
)
from rebalancer_spark.backends.zookeeper.store.layout import (
    NOTES_BYTES,
    RECORD_HINT,
    REQUEST_BYTES,
    SESSION_HINT,
)
from rebalancer_spark.backends.zookeeper.store.ops import Op, Refused, send
from rebalancer_spark.backends.zookeeper.store.records import TargetPointer, read_target_pointer
from rebalancer_spark.core.model import Freed, Grant, Phase, Progress
from rebalancer_spark.core.protocols import MemberHead, MemberView

__all__ = ["IN_FLIGHT", "Waiting", "claim", "member_head", "member_view", "release"]

_ATTEMPTS = 10

HINT_TRUST = 1.0
"""Seconds a claim trusts a delta's hint that a resource is still held by the member that had
it (see :func:`claim`, "Hints"): long enough for the holders of a rebalance to release (99
holders at 100,000 x 100 release within 0.3 s of the publication on two cores), short enough
that a wrong hint (a holder that never held the resource) delays its grant by about that much,
plus the reconciler's next step at most a second later."""

IN_FLIGHT = 2
"""Claim and release requests one session has sent and not yet seen answered, at most. The
session's lease renewal is answered behind them on the same connection (and a read of the
session waits for its writes on the server), so sending a claim of 100,000 resources at once
(over a hundred requests of up to REQUEST_BYTES) would hold the renewal back for as long as the
whole claim takes: beyond the lease, in a busy process. Two keep the server busy with one
while the other's answer comes back."""


@dataclasses.dataclass(frozen=True, slots=True)
class Waiting:
    """What keeps the rest of a claim from its member: the znodes to follow (path -> version
    read; see :func:`_read_for_claims`), and whether to try again at once (a grant refused by
    its own record)."""

    znodes: dict[str, int]
    again: bool = False


def _units(units: list[tuple[str, list[Op]]], fixed: int) -> list[list[tuple[str, list[Op]]]]:
    """Per-resource groups of operations packed into requests of at most REQUEST_BYTES."""
    out: list[list[tuple[str, list[Op]]]] = []
    current: list[tuple[str, list[Op]]] = []
    size = fixed
    for tag, ops in units:
        cost = sum(op.cost for op in ops)
        if current and size + cost > REQUEST_BYTES:
            out.append(current)
            current, size = [], fixed
        current.append((tag, ops))
        size += cost
    if current:
        out.append(current)
    return out


def member_head(zs: ZkSession, settings: Settings) -> MemberHead:
    """The target pointer's generation, phase and epoch, for a live session: one round trip
    behind a ``sync``, like :func:`member_view` without the ids."""
    what = "reading this member's view"
    require_live(zs, settings, what)
    p, s = zs.paths, zs.session
    synced = session_sync(zs, p.changes)
    reader = session_reader(zs, settings, what)
    alive, pointer = reader.stat(p.session(s.session_id), SESSION_HINT), reader.get(p.target)
    reader.send()
    wait(synced, settings, what, zs.expired(), p.changes)
    if alive() is None:
        raise session_gone(zs)
    found = pointer()
    if found is None:
        return MemberHead(0, Phase.RUNNING)
    ptr = read_target_pointer(found[0], p.target, group=p.group)
    return MemberHead(ptr.generation, ptr.phase, ptr.epoch)


def member_view(zs: ZkSession, settings: Settings, *, claims: bool = True) -> MemberView:
    """This member's part of the current target and, if ``claims``, the claims its session
    holds (the records of those whose claim's answer was lost are read).

    Read through the session's own connection, so the view includes every write of the
    session (its claims, its releases), after a ``sync`` of that connection: the server it
    is on catches up with the leader before answering, so the view is at least as recent as
    anything the shared client (whose watches woke the member) has seen. The sync is sent
    just ahead of the reads, in the same pipeline: no extra round trip to wait for."""
    what = "reading this member's view"
    require_live(zs, settings, what)
    p, s = zs.paths, zs.session
    for attempt in range(_ATTEMPTS):
        synced = session_sync(zs, p.changes) if attempt == 0 else None
        reader = session_reader(zs, settings, what)
        alive, pointer = reader.stat(p.session(s.session_id), SESSION_HINT), reader.get(p.target)
        owned, uncertain = zs.held() if claims else ({}, set())
        pending = [(r, reader.get(p.resource_epoch(r), RECORD_HINT)) for r in sorted(uncertain)]
        if synced is not None:
            reader.send()  # the reads go out right behind the sync; then its answer is due
            wait(synced, settings, what, zs.expired(), p.changes)
        if alive() is None:
            raise session_gone(zs)
        found = pointer()
        for resource, answer in pending:
            record = _epoch_record(answer(), p.resource_epoch(resource))
            if record is not None and record.holder == s.session_id:
                owned[resource] = record.epoch
        if claims:
            zs.forget(uncertain - set(owned), only_if_idle=True)
        known = owned if claims else None
        if found is None:
            return MemberView(0, Phase.RUNNING, frozenset(), known)
        ptr = read_target_pointer(found[0], p.target, group=p.group)
        try:
            part = read_own_part(zs, session_reader(zs, settings, "reading"), ptr)()
        except Changed:
            continue  # the target moved on while being read
        return MemberView(ptr.generation, ptr.phase, part, known, ptr.epoch)
    raise settings.unavailable("reading this member's view", "the target kept changing")


def claim(
    zs: ZkSession,
    settings: Settings,
    resources: Collection[str],
    generation: int,
    moved: Collection[str] = (),
) -> tuple[dict[str, Grant], Waiting]:
    """Claim what is free among ``resources`` that the target at ``generation`` gives us;
    each grant with the progress it hands over (:func:`_hand_over`). Also what to wait for
    about the rest.

    The first read (one multiRead) holds this session's znode, the target pointer, the
    znodes of the holders the last claim found, and then the records of the holders among
    ``moved``, the followed znodes that moved since the last claim read them (their watch
    fired, or its registration found them at another version:
    :meth:`.ZookeeperWatch.take_moved`): after the holders' znodes, the order the cut needs
    (:func:`_read_for_claims`). When it has as many resources whose holder it does not know
    (nor has a hint of, below) as the group has members
    (:attr:`.ZkSession.group_size`), it also lists the group's
    sessions: the second read, which reads this member's part of the target, reads those
    sessions' znodes before the records of those resources, so that a record naming a live
    session is decided there. Only the records of holders that moved unannounced, or that
    started after the list, are left for a third read (as all are for a claim of fewer: the
    10 resources each of 99 members takes over from one that leaves cost 11 reads more
    each that way, not 100).

    (Without the list, the first claim of a newcomer in a join read its 990 records twice at
    100,000 x 100: once, then with the 99 holders' znodes, since none was known before
    them; the second read took 230 of the round's 510 ms in a trace of one join, and every
    release that landed meanwhile waited for the next round.)

    **Hints.** A delta names, for each id a member gains, the session of the member that had
    it in the target before (:func:`.coordination.publish`: not behind a stopping phase,
    where every member released everything); the member's view reads the hints of the last
    delta with its part (:attr:`.ZkSession.hints`). The first read also reads the znodes of
    the hinted holders of resources whose holder the session does not know. A hinted holder
    whose znode was last written before the hints were (its ``mzxid`` is lower than the
    hints chunk's ``czxid``, which precedes the pointer's switch to that delta) has released
    nothing since: every release writes the releasing session's znode. Its resources are
    taken as held by it, at the version read, and followed like those a record named,
    without reading their records; the records of the others are read behind their znodes,
    as for known holders that moved. That it held them when the hints were written is the
    guess: the coordinator names only members of a target out for
    :data:`.coordination.HINT_SETTLE` seconds, whose znode predates it. A newcomer's first
    claim in a join thus reads the 99 holders' znodes and the records of those that released
    already, not the 990 records of which, at the peak of the releases, about 40 were free
    (a trace at 100,000 x 100: that read took 120 ms, and every release after it waited for
    the round behind it).

    **Release notes.** Every release writes what it released into the releaser's own
    session znode, in the same multi-op (:func:`release`, :func:`.chain.notes_data`): the
    holders' znodes this first read reads carry them. A resource its holder's notes name is
    taken as released at the version the notes give, as a read of its record would say, and
    its record is not read (:func:`_noted`); a newcomer that finds a holder's znode moved
    grants what it released without a second read. A grant from a note is fenced on that
    version like any other. One refused (the record moved on since: the holder, or another
    member, claimed it again) leaves the resource with no known holder and no hint (a
    resource decided here drops both), so the claim that follows reads its record.

    A hint is a guess, never a grant: a grant is made only from a record read (or the notes
    of the release that wrote it), fenced on its version. A wrong hint (the member that had
    the resource never claimed it, it is held by another, or its holder's new session has not
    claimed it yet) can only delay: a hint is
    trusted for :data:`HINT_TRUST` seconds from the view that read it; then the resources
    taken from it count as unknown again and the next claim reads their records (the
    reconciler claims again within :data:`~rebalancer_spark.member.reconciler.MAX_WAIT`, a
    second, while anything is missing): about two seconds at most. A record read replaces
    the hint."""
    what = "claiming resources"
    require_live(zs, settings, what)
    p, s = zs.paths, zs.session
    # A member claims again on a holder's release without reading its view first (the
    # reconciler's rest): the sync that member_view sends ahead of its reads goes here too,
    # so that the claim sees what the watch that woke the member saw (see member_view).
    synced = session_sync(zs, p.changes)
    reader = session_reader(zs, settings, what)
    alive, pointer = reader.stat(p.session(s.session_id), SESSION_HINT), reader.get(p.target)
    asked = list(dict.fromkeys(resources))
    hints = zs.trusted_hints(asked, HINT_TRUST)  # first: forgets what it no longer trusts
    hinted_at = zs.hinted_at  # (the part read below may note newer hints)
    known = {r: zs.held_by_others[r] for r in asked if r in zs.held_by_others}
    hinted = {r: hint for r, hint in hints.items() if r not in known and hint[0] != s.session_id}
    holders = {
        h: reader.get(p.session(h), SESSION_HINT)
        for h in sorted({h for h, _ in known.values()} | {h for h, _ in hinted.values()})
    }
    # As many resources whose holder this session does not know as the group has members?
    unknown = len(asked) - len(known) - len(hinted)
    listed = reader.children(p.sessions) if unknown >= max(zs.group_size, 1) else None
    early = {
        r: reader.get(p.resource_epoch(r), RECORD_HINT)
        for r in asked
        if r in known and p.session(known[r][0]) in moved
    }
    reader.send()
    wait(synced, settings, what, zs.expired(), p.changes)
    if alive() is None:
        raise session_gone(zs)
    found = pointer()
    if found is None:
        return {}, Waiting({})
    ptr = read_target_pointer(found[0], p.target, group=p.group)
    if ptr.generation != generation or ptr.phase is not Phase.RUNNING:
        return {}, Waiting({})
    znodes = {h: read() for h, read in holders.items()}
    stats = {h: None if z is None else z[1] for h, z in znodes.items()}
    versions = {h: None if st is None else st.version for h, st in stats.items()}
    # A hinted holder that has not written its znode since its hints were written released
    # nothing since: what the hint names is taken as held by it, at the version read, unread.
    assumed = {
        r: (h, st.version)
        for r, (h, written) in hinted.items()
        if (st := stats[h]) is not None and st.mzxid < written
    }
    # The others' holders wrote since: what their last release noted is released.
    moved_from = {r: h for r, (h, v) in known.items() if versions.get(h) != v}
    moved_from.update((r, h) for r, (h, _) in hinted.items() if r not in assumed)
    noted = _noted(moved_from, znodes)
    sessions = () if listed is None else listed() or ()
    read = _read_for_claims(
        zs, settings, ptr, asked, {**known, **assumed}, versions, early, noted, sessions
    )
    if read is None:
        return {}, Waiting({})
    zs.assumed = {
        r: zs.assumed.get(r, hinted_at) for r in read.unread if r in zs.assumed or r in assumed
    }
    for r in asked:
        if r not in read.unread:
            zs.hints.pop(r, None)  # its record was read: what it says counts now
    granted, grants, units = _plan_claims(zs, read.wanted, read.epochs)
    if not units:
        zs.confirm(_held(granted, read.epochs, written=False))
        return _hand_over(zs, settings, granted, {}), Waiting(read.waiting, again=read.again)
    refused, stopped, handed = _write_grants(
        zs, settings, units, grants, granted, read.epochs, found[1].version
    )
    # A grant refused by its own record (another claim, a lift, a release since the read),
    # or a record that named a holder not read with it: the member tries again at once. (A
    # refused frame means a new target, which wakes it anyway, or the end of its session.)
    waiting = Waiting(read.waiting, again=read.again or (bool(refused) and stopped is None))
    return _hand_over(zs, settings, granted, handed), waiting


def _write_grants(
    zs: ZkSession,
    settings: Settings,
    units: list[tuple[str, list[Op]]],
    grants: Mapping[str, Grant],
    granted: dict[str, Grant],
    epochs: Mapping[str, EpochRecord | None],
    pointer_version: int,
) -> tuple[set[str], Op | None, dict[str, Progress | None]]:
    """Write the grants ``units`` make, fenced on this session and the target pointer at
    ``pointer_version``, into ``granted``; the resources refused, the frame operation that
    stopped the writes (or None) and the progress read behind each request."""
    what = "claiming resources"
    p, s = zs.paths, zs.session
    fixed = [alive_op(zs), Op("check", p.target, version=pointer_version)]
    marker = Op("set", p.changes)
    zs.begin_claim({r for r, _ in units})
    refused: set[str] = set()
    confirmed: dict[str, Held] = {}
    handed: dict[str, Progress | None] = {}
    stopped: Op | None = None
    try:

        def follow(tags: list[str]) -> Prefetch:
            return Prefetch(zs, settings, tags)

        applied, refused, stopped = _apply(
            zs, settings, units, fixed, lambda _: [marker], what, follow, handed
        )
        for r, at in applied.items():
            grant = grants[r]
            if grant.freed is Freed.EXPIRED:
                # ZooKeeper keeps no time of a session's end: the grant's own time bounds it.
                grant = dataclasses.replace(grant, freed_at=at)
            granted[r] = grant
        confirmed = {
            **_held({r: g for r, g in granted.items() if r not in grants}, epochs, False),
            **_held({r: granted[r] for r in applied}, epochs, written=True),
        }
        if stopped is not None:  # the session or the target moved on: nothing more to grant
            refused = {r for r, _ in units} - set(applied)
            if stopped.path == p.session(s.session_id):
                raise session_gone(zs)
    finally:
        zs.end_claim(refused, confirmed)  # none confirmed if a request got no answer
    return refused, stopped, handed


def _held(
    granted: Mapping[str, Grant], epochs: Mapping[str, EpochRecord | None], written: bool
) -> dict[str, Held]:
    """What the session now holds for sure, with each epoch record's version: as read, or,
    once this session's claim rewrote it (``written``), the next one (0: created)."""
    out: dict[str, Held] = {}
    for r, g in granted.items():
        seen = epochs.get(r)
        if seen is None:
            out[r] = Held(g.epoch, 0 if written else None)
        else:
            out[r] = Held(g.epoch, seen.version + 1 if written else seen.version)
    return out


Record = tuple[bytes, Any] | None
"""A znode's data and stat as read, or None: no such znode."""


def _noted(holders: Mapping[str, str], znodes: Mapping[str, Record]) -> dict[str, EpochRecord]:
    """The epoch records that the release notes in the ``znodes`` of the resources' holders
    (resource -> session whose znode moved since the claim last knew it) give: only those
    holders' notes are parsed."""
    notes = {
        h: read_notes(z[0], h, z[1])
        for h in set(holders.values())
        if (z := znodes.get(h)) is not None and z[0]
    }
    out: dict[str, EpochRecord] = {}
    for r, h in holders.items():
        record = notes.get(h, {}).get(r)
        if record is not None:
            out[r] = record
    return out


def _epoch_record(found: Record, path: str) -> EpochRecord | None:
    return None if found is None else read_record(found[0], found[1], path)


@dataclasses.dataclass(frozen=True, slots=True)
class _ForClaims:
    """What a claim read: the resources to plan (given to this member by the target, not
    held by another live session), with their epoch records, the znodes to follow for the
    rest (path -> version at the read), and whether some were left undecided (``again``: a
    record re-read in the cut named a holder whose znode was not read before it)."""

    wanted: list[str]
    epochs: dict[str, EpochRecord | None]
    waiting: dict[str, int]
    unread: frozenset[str]
    again: bool = False


def _read_for_claims(
    zs: ZkSession,
    settings: Settings,
    ptr: TargetPointer,
    asked: list[str],
    known: Mapping[str, tuple[str, int]],
    versions: Mapping[str, int | None],
    early: Mapping[str, Callable[[], Record]],
    noted: Mapping[str, EpochRecord],
    sessions: Collection[str],
) -> _ForClaims | None:
    """What :class:`_ForClaims` says, for the resources ``asked`` for (None: the target moved
    on while being read).

    A resource's epoch record says who holds it (see :attr:`.EpochRecord.holder`); a
    released one, or one that names no session, is free with no more reads, and one that
    names this session is held by it. A resource held by another session is held while that
    session's znode exists, and that znode is to be followed: every release sets it and the
    session's end deletes it; once it is gone (read before or after the record: an ended
    session never comes back), the resource is free.
    What the member knows of a holder's znode must come from before the record that names it
    (read in that order through this session's connection, which the server answers in order,
    or in one multiRead, a consistent cut): then a release or an end after that read either
    shows in the record or moves the znode off the version followed, which the watch's
    registration sees (another version) or which fires it.

    ``known``: the resources the last claim found held (:attr:`.ZkSession.held_by_others`),
    each with its holder and the version of the holder's znode then; ``versions``: those
    holders' znodes, as the claim's first read found them (None: gone), which came before
    this function's reads; ``early``: records that read already read after those znodes
    (those of holders whose znode fired), used instead of reading them again; ``noted``:
    records that the release notes of holders that moved give (:func:`_noted`), used instead
    of reading them unless read early. A known
    resource whose holder's znode did not move is held still and not read at all: that
    holder released nothing since. The records of the rest are read together with this
    member's part of the target (unless read early); one that names a holder read in
    ``versions`` is decided there, and so is one naming a session among ``sessions`` (the
    group's sessions as the claim's first read listed them), whose znodes this read reads
    before the records. Only a record naming another holder (a session started after the
    list) costs one more multiRead (:func:`_cut`). A refused grant costs nothing but the
    attempt: every claim is fenced on the record's version."""
    what = "claiming resources"
    p, own = zs.paths, zs.session.session_id
    reader = session_reader(zs, settings, what)
    part = read_own_part(zs, reader, ptr)
    still = {r: hv for r, hv in known.items() if versions.get(hv[0]) == hv[1]}
    listed = {
        h: reader.stat(p.session(h), SESSION_HINT)
        for h in sessions
        if h != own and h not in versions
    }
    reads = {
        r: early[r] if r in early else reader.get(p.resource_epoch(r), RECORD_HINT)
        for r in asked
        if r not in still and (r in early or r not in noted)
    }
    try:
        mine = part()
    except Changed:
        return None
    # Every read answered, wanted or not.
    found = {r: read() for r, read in reads.items()}
    if listed:
        versions = {
            **versions,
            **{h: None if (st := read()) is None else st.version for h, read in listed.items()},
        }
    wanted = [r for r in asked if r in mine]
    still = {r: hv for r, hv in still.items() if r in mine}
    epochs = {r: _epoch_record(found[r], p.resource_epoch(r)) for r in wanted if r in found}
    epochs.update((r, noted[r]) for r in wanted if r not in found and r in noted)
    unsure = {r: e for r, e in epochs.items() if e is not None and not e.released}
    follow: dict[str, tuple[str, int]] = {}  # held by a live session: follow that session
    others: dict[str, str] = {}
    for r, e in list(unsure.items()):
        holder = e.holder
        if holder is None or holder == own:
            continue  # free, or this session's
        if holder not in versions:
            others[r] = holder  # a holder not read before this record: the cut below
        elif (version := versions[holder]) is not None:
            follow[r] = (holder, version)
        # else: its holder's session has ended: free
    undecided: set[str] = set()
    if others:
        held, undecided = _cut(zs, settings, others, epochs)
        follow.update(held)
    held_by_others = {**still, **follow}
    waiting = {p.session(h): v for h, v in held_by_others.values()}
    taken = set(held_by_others) | undecided
    zs.held_by_others = held_by_others
    wanted = [r for r in wanted if r not in taken]
    return _ForClaims(wanted, epochs, waiting, frozenset(still), again=bool(undecided))


def _cut(
    zs: ZkSession,
    settings: Settings,
    others: Mapping[str, str],
    epochs: dict[str, EpochRecord | None],
) -> tuple[dict[str, tuple[str, int]], set[str]]:
    """Read the znodes of the holders ``others`` names (resource -> a holder not read before
    its record), then those records again, into ``epochs``. Returns the resources still held
    by a live session, each with that session and its znode's version, and those whose
    record now names yet another holder, not read before it (a claim and a release in
    between: left for the next claim, at once). The rest are free: released, or their
    holder is gone."""
    p, own = zs.paths, zs.session.session_id
    cut = session_reader(zs, settings, "claiming resources")
    alive = {h: cut.stat(p.session(h), SESSION_HINT) for h in sorted(set(others.values()))}
    again = {r: cut.get(p.resource_epoch(r), RECORD_HINT) for r in others}
    stats = {h: read() for h, read in alive.items()}
    held: dict[str, tuple[str, int]] = {}
    undecided: set[str] = set()
    for r, read in again.items():
        now = epochs[r] = _epoch_record(read(), p.resource_epoch(r))
        holder = None if now is None else now.holder
        if holder is None or holder == own:
            continue  # released since it was read: free (or, oddly, this session's)
        if holder not in stats:
            undecided.add(r)
        elif (stat := stats[holder]) is not None:
            held[r] = (holder, stat.version)  # still held by a live session
        # else: its holder's session has ended: free
    return held, undecided


def _plan_claims(
    zs: ZkSession,
    wanted: list[str],
    epochs: Mapping[str, EpochRecord | None],
) -> tuple[dict[str, Grant], dict[str, Grant], list[tuple[str, list[Op]]]]:
    """For each wanted resource (given to this member, held by no other live session), from
    its epoch record as read: the grant this session holds already, or the grant a claim
    would make with its operation (raise the epoch, naming this session)."""
    p, s = zs.paths, zs.session
    granted: dict[str, Grant] = {}
    grants: dict[str, Grant] = {}
    units: list[tuple[str, list[Op]]] = []
    for r in wanted:
        seen = epochs.get(r)
        if seen is not None and seen.holder == s.session_id:
            granted[r] = held_grant(seen)
            continue
        grant = next_grant(seen)
        grants[r] = grant
        record = grant_data(s.member_id, s.session_id, grant)
        path = p.resource_epoch(r)
        raise_epoch = (
            Op("create", path, record, tag=r)
            if seen is None
            else Op("set", path, record, seen.version, tag=r)
        )
        units.append((r, [raise_epoch]))
    return granted, grants, units


def _hand_over(
    zs: ZkSession,
    settings: Settings,
    granted: dict[str, Grant],
    handed: dict[str, Progress | None],
) -> dict[str, Grant]:
    """``granted``, each with its progress: from ``handed`` (read right behind the claim's
    request), else read now through the session's connection (resources this session held
    already, or whose read behind the claim failed). Only this session can commit to them
    while it holds them, so either read is the value the grant hands over."""
    missing = [r for r in granted if r not in handed]
    if missing:
        read = read_progresses(zs.client, settings, zs.paths, missing)
        handed = {**handed, **{r: read.get(r) for r in missing}}
    return {r: g.with_progress(handed.get(r)) for r, g in granted.items()}


def _apply(
    zs: ZkSession,
    settings: Settings,
    units: list[tuple[str, list[Op]]],
    fixed: list[Op],
    tail: Callable[[list[str]], list[Op]],
    what: str,
    follow: Callable[[list[str]], Prefetch] | None = None,
    followed: dict[str, Progress | None] | None = None,
    *,
    room: int = 0,
) -> tuple[dict[str, float | None], set[str], Op | None]:
    """Apply per-resource units of operations, each request framed by ``fixed`` and
    ``tail(tags)``, the operations that end a request of the units tagged ``tags`` (at most
    ``room`` bytes more than ``tail([])``).

    Requests go out :data:`IN_FLIGHT` at a time, the next as soon as the oldest is answered
    (the server serves them in order and writes them to its log together): each is atomic on
    its own, so one refused leaves the others as they were answered. A unit refused by one of
    its own operations is dropped and the rest of its request sent again; a refused frame
    operation stops everything (the requests already sent are still collected). Returns the
    tags applied (each with the store time of its request, in seconds, from the ``mtime`` the
    last ``set`` of the request returned, or None), the tags refused, and the frame operation
    that stopped it (or None). ``follow`` makes reads to send right behind each request,
    collected into ``followed`` once it succeeded."""
    applied: dict[str, float | None] = {}
    refused: set[str] = set()
    stopped: Op | None = None
    frame = sum(op.cost for op in [*fixed, *tail([])]) + room
    todo = collections.deque(_units(units, frame))
    sent: collections.deque[tuple[list[tuple[str, list[Op]]], list[Op], Prefetch | None, Any]]
    sent = collections.deque()
    while sent or (todo and stopped is None):
        while todo and stopped is None and len(sent) < IN_FLIGHT:
            batch = todo.popleft()
            tags = [r for r, _ in batch]
            ops = [*fixed, *(op for _, unit in batch for op in unit), *tail(tags)]
            reads = None if follow is None else follow(tags)
            sent.append((batch, ops, reads, send(zs.client, ops, settings)))
            if reads is not None:
                reads.send()  # served right behind its request, before the next one
        batch, ops, reads, pending = sent.popleft()
        try:
            results = session_answer(zs, settings, pending, ops, what)
        except Refused as exc:
            if not exc.op.tag:
                stopped = stopped or exc.op
                continue
            refused.add(exc.op.tag)
            rest = [(r, unit) for r, unit in batch if r != exc.op.tag]
            if rest:
                todo.append(rest)
            continue
        applied.update(dict.fromkeys((r for r, _ in batch), _store_time(results)))
        if reads is not None and followed is not None:
            followed.update(reads.collect())
    return applied, refused, stopped


def _store_time(results: list[Any]) -> float | None:
    """The ``mtime`` of the last znode stat among a multi-op's results, in seconds."""
    for result in reversed(results):
        mtime = getattr(result, "mtime", None)
        if isinstance(mtime, int):
            return mtime / 1000
    return None


def release(zs: ZkSession, settings: Settings, claims: Mapping[str, int]) -> None:
    """Release the given claims if this session holds them at those epochs.

    A claim this session's own request made (or a read confirmed) is trusted: nobody else
    rewrites its record while the session lives. If the session also knows the record's
    version (what its claim wrote), the release is written without any read first, fenced on
    that version; a release refused there is read and tried again (someone rewrote the
    record: a lift of the epochs after the store lost its state, or a release whose answer
    was lost).

    The multi-op also sets this session's own znode, which wakes the members following it,
    to the notes of what that request released (:func:`.chain.notes_data`; none beyond
    :data:`.layout.NOTES_BYTES`): their claims take those resources as released from the
    znode they read anyway (see :func:`claim`, "Release notes")."""
    if not claims or zs.state is SessionState.ENDED:
        return
    what = "releasing resources"
    require_live(zs, settings, what)
    p, s = zs.paths, zs.session
    known = zs.record_versions(claims)
    units = [(r, _release_ops(zs, r, claims[r], version)) for r, version in known.items()]
    notes = {r: (claims[r], version + 1) for r, version in known.items()}
    reader = session_reader(zs, settings, what)
    reads = {r: reader.get(p.resource_epoch(r), RECORD_HINT) for r in claims if r not in known}
    gone: set[str] = set()
    for r, read in reads.items():
        record = _epoch_record(read(), p.resource_epoch(r))
        if record is None or record.holder != s.session_id:
            gone.add(r)  # released already (a release whose answer was lost), or not ours
        elif record.epoch == claims[r]:
            units.append((r, _release_ops(zs, r, record.epoch, record.version)))
            notes[r] = (record.epoch, record.version + 1)

    def tail(tags: list[str]) -> list[Op]:
        # Setting this session's own znode wakes the members whose claims found these
        # resources held by it (they follow it: see the watch's module); its data, the
        # release notes, tells them what this request released (see claim, "Release notes").
        data = notes_data(s.member_id, {r: notes[r] for r in tags})
        return [Op("set", p.changes), Op("set", p.session(s.session_id), data)]

    try:
        released, refused, _ = _apply(zs, settings, units, [], tail, what, room=NOTES_BYTES)
    except BaseException:
        for r in known:  # a request without an answer may have applied: read them next time
            zs.doubt(r)
        raise
    zs.forget(gone | set(released))
    for r in refused:
        zs.doubt(r)  # a claim trusted without a read was not as this session holds it
    again = {r: claims[r] for r in refused if r in known}
    if again:
        release(zs, settings, again)  # doubted now: read this time


def _release_ops(zs: ZkSession, resource: str, epoch: int, version: int) -> list[Op]:
    """Mark ``resource``'s epoch record released, fenced on its ``version``."""
    p, s = zs.paths, zs.session
    record = released_data(s.member_id, s.session_id, epoch)
    return [Op("set", p.resource_epoch(resource), record, version, tag=resource)]
