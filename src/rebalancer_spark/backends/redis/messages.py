"""The messages of the refusals a script can return: each names the group, the member, the
resource, the epoch seen and the epoch expected, and what to do next."""

from __future__ import annotations

import json

from rebalancer_spark.backends.base import Session
from rebalancer_spark.backends.redis.errors import Refusal
from rebalancer_spark.core.errors import (
    FencedError,
    MemberIdInUse,
    RebalancerError,
    SessionExpired,
)

__all__ = ["expired", "fenced_commit", "fenced_coordinator", "in_use"]


def expired(session: Session, doing: str) -> SessionExpired:
    return SessionExpired(
        f"{doing} refused: the lease of member {session.member_id!r} in group "
        f"{session.group!r} (session {session.session_id[:8]}) has lapsed in Redis or the "
        "session ended: the member has stopped all work and rejoins with a new session"
    )


def in_use(group: str, member_id: str, refusal: Refusal) -> RebalancerError:
    if refusal.code != "INUSE":
        return _unexpected(group, refusal)
    try:
        holder = json.loads(refusal.get("info", "{}"))
    except ValueError:
        holder = {}
    if not isinstance(holder, dict):
        holder = {}
    left = int(refusal.get("pttl", "0") or 0) / 1000
    return MemberIdInUse(
        f"member id {member_id!r} is in use in group {group!r} by a live session "
        f"(host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, lease ends in "
        f"{max(left, 0):.1f} s): give each job its own --member-id, or stop the other one first"
    )


def fenced_coordinator(session: Session, epoch: int, refusal: Refusal) -> RebalancerError:
    if refusal.code != "FENCED":
        return _unexpected(session.group, refusal)
    holder = refusal.get("member") or "nobody"
    why = "" if refusal.get("alive") == "1" else " (and its own lease has lapsed)"
    return FencedError(
        f"coordinator write for group {session.group!r} refused: it carried epoch {epoch} "
        f"from member {session.member_id!r}{why}, but the current coordinator is "
        f"{holder!r} at epoch {refusal.get('epoch', '0')}; this member stepped down and "
        "changed nothing"
    )


def fenced_commit(session: Session, resource: str, epoch: int, refusal: Refusal) -> RebalancerError:
    if refusal.code != "FENCED":
        return _unexpected(session.group, refusal)
    what = (
        f"commit for resource {resource!r} by member {session.member_id!r} of group "
        f"{session.group!r} at epoch {epoch} refused"
    )
    if refusal.get("lapsed") == "1":
        return FencedError(
            f"{what}: its session lease has lapsed in Redis; stop working on it, the next "
            "owner resumes from the last accepted commit"
        )
    holder = refusal.get("holder")
    return FencedError(
        f"{what}: the resource is held by {repr(holder) if holder else 'nobody'} at epoch "
        f"{refusal.get('epoch', '0')}; stop working on it, the new owner resumes from the "
        "last accepted commit"
    )


def _unexpected(group: str, refusal: Refusal) -> RebalancerError:
    return RebalancerError(
        f"the Redis script for group {group!r} refused with the unexpected code "
        f"{refusal.code!r} {refusal.fields}: this is a bug in rebalancer-spark; please report it"
    )
