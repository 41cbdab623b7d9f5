"""The epoch chain in ``epochs/<id>``: who holds or last held a resource, and how it ended.

The persistent znode ``epochs/<id>`` holds ``{"epoch": e, "member": m, "session": s,
"prev": {...} | null}`` from the grant of epoch ``e`` to ``m``/``s`` (``prev`` is what that
grant superseded), and ``{"epoch": e, "member": m, "session": s, "released": true}`` once
``m`` released it: that ``set`` is part of the release's multi-op (in place of a plain version
check), so the znode's ``mtime`` is the release time in store time (the leader's wall clock).
A claim reads the znode anyway (its version fences the grant), so the chain costs no extra
round trip:

* ``released``: freed ``released`` at the znode's ``mtime``;
* otherwise, its session znode gone: the holder's session ended (expiry, a crash, a leave
  without a release). ZooKeeper keeps no record of when it ended a session, so ``freed_at``
  is the store time of the grant that found it gone (the ``mtime`` the grant's multi-op
  returns), an upper bound of the real end;
* no znode: a first grant (``new``); a znode of an older version (``{"epoch": e}`` only): the
  predecessor is unknown (``freed`` None).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from rebalancer_spark.backends.zookeeper.store.layout import NOTES_BYTES
from rebalancer_spark.backends.zookeeper.store.records import decode, json_scalar
from rebalancer_spark.core.errors import CorruptStateError
from rebalancer_spark.core.model import Freed, Grant

__all__ = [
    "EpochRecord",
    "grant_data",
    "held_grant",
    "next_grant",
    "notes_data",
    "read_notes",
    "read_record",
    "released_data",
]


@dataclasses.dataclass(frozen=True, slots=True)
class EpochRecord:
    """An ``epochs/<id>`` record as read, parsed once: its fields, the znode's ``version``
    (what a claim's ``set`` is fenced on) and ``mtime`` in milliseconds."""

    epoch: int
    member: str | None
    session: str | None
    released: bool
    prev: Any
    """The ``prev`` field as stored; :data:`NO_PREV` when the record has none (an older
    version's record)."""
    version: int
    mtime_ms: int

    @property
    def holder(self) -> str | None:
        """The session the record says holds the resource now (None: released, or unknown).
        It holds it while its ``sessions/<id>`` znode exists: only a release (which rewrites
        this record) or the session's end (which deletes that ephemeral znode) ends the
        claim."""
        return None if self.released else self.session


NO_PREV = object()


def read_record(data: bytes, stat: Any, path: str) -> EpochRecord:
    """The record in ``data`` of the znode at ``path`` whose ``stat`` was read with it."""
    value = decode(data, path)
    if not isinstance(value, dict) or not isinstance(value.get("epoch"), int):
        raise CorruptStateError(
            f"znode {path} holds {value!r}, not a resource epoch record; it was not written by "
            "this version of rebalancer-spark: inspect it with zkCli, then remove the group"
        )
    return EpochRecord(
        value["epoch"],
        _text(value.get("member")),
        _text(value.get("session")),
        value.get("released") is True,
        value.get("prev", NO_PREV),
        stat.version,
        stat.mtime,
    )


def grant_data(member_id: str, session_id: str, grant: Grant) -> bytes:
    """The ``epochs/<id>`` record of ``grant`` to ``member_id``/``session_id``. The
    predecessor's end time is kept for a release (``at``); for an expiry it is the grant's own
    ``mtime`` (None here).

    What ``encode`` writes of ``{"epoch": ..., "member": ..., "session": ..., "prev": {"member":
    ..., "session": ..., "freed": ..., "at": ...} or None}``, byte for byte, from a template
    (:func:`.records.json_scalar`): a claim writes one per resource."""
    prev = "null"
    if grant.freed is not None and grant.freed is not Freed.NEW:
        at = grant.freed_at if grant.freed is Freed.RELEASED else None
        prev = (
            f'{{"at":{json_scalar(at)},"freed":{json_scalar(grant.freed.value)},'
            f'"member":{json_scalar(grant.prev_member_id)},'
            f'"session":{json_scalar(grant.prev_session_id)}}}'
        )
    return (
        f'{{"epoch":{json_scalar(grant.epoch)},"member":{json_scalar(member_id)},'
        f'"prev":{prev},"session":{json_scalar(session_id)}}}'
    ).encode()


def released_data(member_id: str, session_id: str, epoch: int) -> bytes:
    """The ``epochs/<id>`` record once ``session_id`` released the resource at ``epoch``:
    ``{"epoch": ..., "member": ..., "session": ..., "released": true}`` as ``encode`` writes
    it, from a template."""
    return (
        f'{{"epoch":{json_scalar(epoch)},"member":{json_scalar(member_id)},'
        f'"released":true,"session":{json_scalar(session_id)}}}'
    ).encode()


def notes_data(member_id: str, released: Mapping[str, tuple[int, int]]) -> bytes:
    """The data of a releasing session's own ``sessions/<id>`` znode, set in the release's
    multi-op: ``{"member": m, "released": {id: [epoch, version], ...}}``, each id with the
    epoch it released and the version its epoch record has once released (that request's
    ``set`` of it); empty when they would take more than :data:`NOTES_BYTES` (given up on as
    soon as they do: a request of a release of 100,000 holds some 1,300 ids)."""
    head = f'{{"member":{json_scalar(member_id)},"released":{{'
    size = len(head) + 2
    entries: list[str] = []
    for r, (epoch, version) in released.items():
        entry = f"{json.dumps(r)}:[{json_scalar(epoch)},{json_scalar(version)}]"
        size += len(entry) + 1
        if size > NOTES_BYTES:
            return b""
        entries.append(entry)
    data = (head + ",".join(entries) + "}}").encode()
    return data if len(data) <= NOTES_BYTES else b""


def read_notes(data: bytes, session_id: str, stat: Any) -> dict[str, EpochRecord]:
    """The epoch records a session's last release wrote, from the notes in its znode's
    ``data`` (read with its ``stat``): each as :func:`read_record` would read it, released
    at the znode's ``mtime`` (the same multi-op's). They are trusted as the records are:
    this library writes them in the multi-op that writes the records they name, and a grant
    from them is fenced on the version they give, so a record that moved on since refuses
    it. What is not notes as written here (an empty znode, a release of too many ids,
    anything else) reads as none; a later format would use another key than ``released``."""
    if not data:
        return {}
    try:
        value = decode(data, "")
    except CorruptStateError:
        return {}
    member = value.get("member") if isinstance(value, dict) else None
    released = value.get("released") if isinstance(value, dict) else None
    if not isinstance(member, str) or not isinstance(released, dict):
        return {}
    out: dict[str, EpochRecord] = {}
    for r, pair in released.items():
        if (
            isinstance(pair, list)
            and len(pair) == 2
            and all(type(n) is int and n >= 0 for n in pair)
        ):
            out[r] = EpochRecord(pair[0], member, session_id, True, NO_PREV, pair[1], stat.mtime)
    return out


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def next_grant(record: EpochRecord | None) -> Grant:
    """The grant that follows ``record`` (None: no znode), its holder released or gone. An
    expiry's ``freed_at`` is left None: the caller fills in the grant's own store time."""
    if record is None:
        return Grant(1)
    epoch, member, session = record.epoch, record.member, record.session
    if member is None or session is None:
        return Grant(epoch + 1, None, None, None, epoch, None)
    if record.released:
        return Grant(epoch + 1, Freed.RELEASED, member, session, epoch, record.mtime_ms / 1000)
    return Grant(epoch + 1, Freed.EXPIRED, member, session, epoch, None)


def held_grant(record: EpochRecord) -> Grant:
    """The grant ``record`` names for its current holder."""
    epoch, prev = record.epoch, record.prev
    if prev is NO_PREV:
        return Grant(epoch, None, None, None, epoch - 1, None)
    if not isinstance(prev, dict):
        return Grant(epoch)
    try:
        freed = Freed(str(prev.get("freed")))
    except ValueError:
        freed = None
    at = prev.get("at")
    return Grant(
        epoch,
        freed,
        _text(prev.get("member")),
        _text(prev.get("session")),
        epoch - 1,
        float(at) if isinstance(at, int | float) else record.mtime_ms / 1000,
    )
