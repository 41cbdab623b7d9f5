"""The refusals a script can return, as the library's errors built from the facts the script
reported (group, member, resource, epoch seen and current, holder); the errors word them."""

from __future__ import annotations

import json

from rebalancer_spark.backends.base import Session, fenced_commit, fenced_coordinator
from rebalancer_spark.backends.base import expired as session_expired
from rebalancer_spark.backends.redis.errors import Refusal
from rebalancer_spark.core.errors import (
    MemberIdInUse,
    RebalancerError,
    SessionExpired,
)

__all__ = ["expired", "fenced_commit_refused", "fenced_coordinator_refused", "in_use"]


def expired(session: Session, doing: str) -> SessionExpired:
    return session_expired(session, "its lease lapsed in Redis or the session ended", doing=doing)


def in_use(group: str, member_id: str, refusal: Refusal) -> RebalancerError:
    if refusal.code != "INUSE":
        return _unexpected(group, refusal)
    try:
        holder = json.loads(refusal.get("info", "{}"))
    except ValueError:
        holder = {}
    if not isinstance(holder, dict):
        holder = {}
    return MemberIdInUse(
        group,
        member_id,
        host=str(holder.get("host", "?")),
        pid=str(holder.get("pid", "?")),
        lease_left=int(refusal.get("pttl", "0") or 0) / 1000,
    )


def fenced_coordinator_refused(session: Session, epoch: int, refusal: Refusal) -> RebalancerError:
    if refusal.code != "FENCED":
        return _unexpected(session.group, refusal)
    holder = refusal.get("member") or None
    current = int(refusal.get("epoch", "0") or 0)
    if refusal.get("alive") == "1":
        return fenced_coordinator(session, epoch, holder=holder, current_epoch=current)
    who = "nobody" if holder is None else repr(holder)
    return fenced_coordinator(
        session,
        epoch,
        holder=holder,
        current_epoch=current,
        why=f"its own lease has lapsed, and the current coordinator is {who} at epoch {current}",
    )


def fenced_commit_refused(
    session: Session, resource: str, epoch: int, refusal: Refusal
) -> RebalancerError:
    if refusal.code != "FENCED":
        return _unexpected(session.group, refusal)
    if refusal.get("lapsed") == "1":
        return fenced_commit(session, resource, epoch, why="its session lease has lapsed in Redis")
    return fenced_commit(
        session,
        resource,
        epoch,
        holder=refusal.get("holder") or None,
        current_epoch=int(refusal.get("epoch", "0") or 0),
    )


def _unexpected(group: str, refusal: Refusal) -> RebalancerError:
    return RebalancerError(
        f"the Redis script for group {group!r} refused with the unexpected code "
        f"{refusal.code!r} {refusal.fields}: this is a bug in rebalancer-spark; please report it"
    )
