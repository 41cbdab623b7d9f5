"""The epoch chain in ``epochs/<id>``: who holds or last held a resource, and how it ended.

The persistent znode ``epochs/<id>`` holds ``{"epoch": e, "member": m, "session": s,
"prev": {...} | null}`` from the grant of epoch ``e`` to ``m``/``s`` (``prev`` is what that
grant superseded), and ``{"epoch": e, "member": m, "session": s, "released": true}`` once
``m`` released it: that ``set`` is part of the release's multi-op (in place of a plain version
check), so the znode's ``mtime`` is the release time in store time (the leader's wall clock).
A claim reads the znode anyway (its version fences the grant), so the chain costs no extra
round trip:

* claim znode gone and ``released``: freed ``released`` at the znode's ``mtime``;
* claim znode gone otherwise: the holder's session ended (expiry, a crash, a leave without a
  release). ZooKeeper keeps no record of when it ended a session, so ``freed_at`` is the store
  time of the grant that found it gone (the ``mtime`` the grant's multi-op returns), an upper
  bound of the real end;
* no znode: a first grant (``new``); a znode of an older version (``{"epoch": e}`` only): the
  predecessor is unknown (``freed`` None).
"""

from __future__ import annotations

from typing import Any

from rebalancer_spark.backends.zookeeper.store.records import decode, encode
from rebalancer_spark.core.errors import CorruptStateError
from rebalancer_spark.core.model import Freed, Grant

__all__ = ["grant_data", "held_grant", "next_grant", "released", "released_data"]


def grant_data(member_id: str, session_id: str, grant: Grant) -> bytes:
    """The ``epochs/<id>`` record of ``grant`` to ``member_id``/``session_id``. The
    predecessor's end time is kept for a release (``at``); for an expiry it is the grant's own
    ``mtime`` (None here)."""
    prev = None
    if grant.freed is not None and grant.freed is not Freed.NEW:
        prev = {
            "member": grant.prev_member_id,
            "session": grant.prev_session_id,
            "freed": grant.freed.value,
            "at": grant.freed_at if grant.freed is Freed.RELEASED else None,
        }
    return encode({"epoch": grant.epoch, "member": member_id, "session": session_id, "prev": prev})


def released_data(member_id: str, session_id: str, epoch: int) -> bytes:
    """The ``epochs/<id>`` record once ``session_id`` released the resource at ``epoch``."""
    return encode({"epoch": epoch, "member": member_id, "session": session_id, "released": True})


def _record(data: bytes, path: str) -> dict[str, Any]:
    value = decode(data, path)
    if not isinstance(value, dict) or not isinstance(value.get("epoch"), int):
        raise CorruptStateError(
            f"znode {path} holds {value!r}, not a resource epoch record; it was not written by "
            "this version of rebalancer-spark: inspect it with zkCli, then remove the group"
        )
    return value


def released(data: bytes, path: str) -> bool:
    """Whether the record ``data`` says its holder released the resource (so no claim znode
    exists: the release deleted it in the same multi-op)."""
    return _record(data, path).get("released") is True


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def next_grant(data: bytes | None, mtime_ms: int, path: str) -> Grant:
    """The grant that follows the record ``data`` (None: no znode) last written at
    ``mtime_ms``, the claim znode being gone. An expiry's ``freed_at`` is left None: the
    caller fills in the grant's own store time."""
    if data is None:
        return Grant(1)
    record = _record(data, path)
    epoch: int = record["epoch"]
    member, session = _text(record.get("member")), _text(record.get("session"))
    if member is None or session is None:
        return Grant(epoch + 1, None, None, None, epoch, None)
    if record.get("released") is True:
        return Grant(epoch + 1, Freed.RELEASED, member, session, epoch, mtime_ms / 1000)
    return Grant(epoch + 1, Freed.EXPIRED, member, session, epoch, None)


def held_grant(data: bytes, mtime_ms: int, path: str) -> Grant:
    """The grant recorded in ``data`` for its current holder (written at ``mtime_ms``)."""
    record = _record(data, path)
    epoch: int = record["epoch"]
    prev = record.get("prev")
    if "prev" not in record:
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
        float(at) if isinstance(at, int | float) else mtime_ms / 1000,
    )
