"""Turning the read scripts' replies into the model's values, refusing what we never wrote."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rebalancer_spark.backends.records import parse_member_info, parse_phase
from rebalancer_spark.core.control import Control
from rebalancer_spark.core.errors import CorruptStateError
from rebalancer_spark.core.model import (
    Claim,
    CoordinatorRecord,
    Freed,
    Grant,
    GroupHead,
    GroupState,
    MemberRecord,
    Progress,
    Resource,
    Target,
    UnreadableProgress,
    decode_progress,
)
from rebalancer_spark.core.protocols import MemberView

__all__ = [
    "CLAIM_ROW",
    "DecodedHead",
    "DecodedState",
    "DecodedView",
    "decode_control",
    "decode_grant",
    "decode_head",
    "decode_member_view",
    "decode_members",
    "decode_progress_record",
    "decode_resources",
    "decode_state",
    "decode_target",
    "encode_progress_record",
    "pairs",
]

_MEMBER_ROW = 7


def pairs(flat: Sequence[Any]) -> dict[str, str]:
    """A flat ``[k1, v1, k2, v2 ...]`` reply (HGETALL) as a dict."""
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


def number(group: str, what: str, text: object) -> int:
    try:
        return int(str(text))
    except ValueError:
        raise CorruptStateError(
            f"group {group!r} has {what} = {str(text)[:40]!r} in Redis, expected an integer: "
            "the key was not written by rebalancer-spark; inspect the rb:{GROUP}: keys"
        ) from None


CLAIM_ROW = 9
"""Values per resource in the CLAIM script's answer."""


def decode_grant(group: str, row: list[object], now: float) -> Grant:
    """One resource of the CLAIM script's answer (see :mod:`.ownership`) as a :class:`Grant`
    with the progress it hands over. The predecessor's end comes as an age in ms (Redis' clock
    may be stepped, or set apart from the members'): it is put on this member's clock, ``now``
    being when the answer came (wall-clock seconds), and never after it."""
    rid, epoch, _, record, member, session, prev_epoch, freed, freed_ago = (str(v) for v in row)
    what = f"epoch of {rid!r}"
    try:
        how = Freed(freed) if freed else None
    except ValueError:
        how = None
    granted = number(group, what, epoch)
    if prev_epoch:
        before: int | None = number(group, f"previous {what}", prev_epoch)
    else:  # lifted to the base after a loss (freed 'expired'), or a record without the chain
        before = None if how is not None else granted - 1
    return Grant(
        epoch=granted,
        freed=how,
        prev_member_id=member or None,
        prev_session_id=session or None,
        prev_epoch=before,
        freed_at=now - max(number(group, f"age of the end before {rid!r}", freed_ago), 0) / 1000
        if freed_ago
        else None,
        progress=decode_progress_record(group, rid, record) if record else None,
    )


@dataclass(frozen=True, slots=True)
class DecodedState:
    """A :class:`GroupState` plus what the backend remembers from it."""

    state: GroupState
    ttls_ms: list[int]
    resources: dict[str, str]
    incarnation: str


def decode_members(group: str, flat: Sequence[Any]) -> tuple[dict[str, MemberRecord], list[int]]:
    """The live member rows of STATE and HEAD, and their lease TTLs in ms."""
    rows = list(flat)
    members: dict[str, MemberRecord] = {}
    ttls: list[int] = []
    for i in range(0, len(rows) - _MEMBER_ROW + 1, _MEMBER_ROW):
        mid, sid, info, acked, leaving, static, ttl = (str(v) for v in rows[i : i + _MEMBER_ROW])
        members[mid] = MemberRecord(
            member_id=mid,
            session_id=sid,
            info=parse_member_info(group, mid, info, store="Redis"),
            acked_generation=number(group, f"acked generation of {mid!r}", acked),
            leaving=leaving == "1",
            static=static == "1",
        )
        ttls.append(number(group, f"lease ttl of {mid!r}", ttl))
    return members, ttls


def decode_resources(group: str, weights: Mapping[str, str]) -> dict[str, Resource]:
    resources: dict[str, Resource] = {}
    for rid, weight in weights.items():
        try:
            resources[rid] = Resource(rid, float(weight))
        except ValueError:
            raise CorruptStateError(
                f"resource {rid[:60]!r} of group {group!r} has weight {weight[:40]!r} in Redis: "
                "it was not written by rebalancer-spark"
            ) from None
    return resources


def decode_target(group: str, meta: Mapping[str, str], flat: Sequence[Any]) -> Target | None:
    """The target from the group's meta fields and ``{member, {ids}, ...}``."""
    if meta.get("has_target") != "1":
        return None
    parts = list(flat)
    assignment = {
        str(parts[i]): frozenset(str(r) for r in parts[i + 1]) for i in range(0, len(parts), 2)
    }
    return Target(
        generation=number(group, "generation", meta.get("generation", "0")),
        coordinator_epoch=number(group, "target_epoch", meta.get("target_epoch", "0")),
        assignment=assignment,
        phase=parse_phase(group, meta.get("phase", "running"), store="Redis"),
        resources_version=number(group, "target_rv", meta.get("target_rv", "0")),
    )


def _coordinator(
    group: str, meta: Mapping[str, str], members: Mapping[str, MemberRecord]
) -> CoordinatorRecord | None:
    live = {m.session_id: m.member_id for m in members.values()}
    coord_sid = meta.get("coord_sid")
    coord_epoch = number(group, "coord_epoch", meta.get("coord_epoch", "0"))
    if coord_sid in live:
        return CoordinatorRecord(live[coord_sid], coord_sid, coord_epoch)
    return None


@dataclass(frozen=True, slots=True)
class DecodedHead:
    head: GroupHead
    ttls_ms: list[int]


def decode_head(group: str, reply: Sequence[Any]) -> DecodedHead:
    """The HEAD script's reply (see :mod:`.reads`)."""
    control = decode_control(group, reply[-1] if reply else [])
    if not reply or not reply[0]:
        return DecodedHead(GroupHead(group, {}, None, 0, 0, control), [])
    meta = pairs(reply[0])
    members, ttls = decode_members(group, reply[1])
    coordinator = _coordinator(group, meta, members)
    version = number(group, "resources_version", meta.get("resources_version", "0"))
    generation = number(group, "generation", meta.get("generation", "0"))
    shown = generation if meta.get("has_target") == "1" else 0
    head = GroupHead(group, members, coordinator, version, shown, control)
    return DecodedHead(head, ttls)


def decode_state(group: str, reply: Sequence[Any]) -> DecodedState:
    """The STATE script's reply (see :mod:`.reads`) as a snapshot of live members only."""
    control = decode_control(group, reply[-1] if len(reply) in (2, 7) else [])
    if not reply or not reply[0]:
        empty = GroupState(group, {}, None, {}, 0, None, {}, control)
        return DecodedState(empty, [], {}, "")
    meta = pairs(reply[0])
    members, ttls = decode_members(group, reply[1])
    live = {m.session_id: m.member_id for m in members.values()}
    coordinator = _coordinator(group, meta, members)
    weights = pairs(reply[2])
    resources = decode_resources(group, weights)
    target = decode_target(group, meta, reply[3])
    epochs = pairs(reply[5])
    claims = {
        rid: Claim(rid, live[sid], sid, number(group, f"epoch of {rid[:60]!r}", epochs.get(rid)))
        for rid, sid in pairs(reply[4]).items()
        if sid in live
    }
    version = number(group, "resources_version", meta.get("resources_version", "0"))
    state = GroupState(group, members, coordinator, resources, version, target, claims, control)
    return DecodedState(state, ttls, weights, meta.get("inc", ""))


def decode_control(group: str, flat: Sequence[Any]) -> Control:
    """The control record from HGETALL of the group's ``control`` hash (empty: default)."""
    fields = pairs(flat)
    if not fields:
        return Control()
    version = number(group, "control version", fields.get("version", ""))
    return Control.decode(group, fields.get("body", ""), version)


@dataclass(frozen=True, slots=True)
class DecodedView:
    """The MEMBER_VIEW script's reply: the view, and what names the part it holds (the
    group's incarnation id and the target's token) for the next view to ask from."""

    view: MemberView
    incarnation: str
    token: str


def decode_member_view(
    group: str, reply: Sequence[Any], kept: frozenset[str] = frozenset(), *, claims: bool = True
) -> DecodedView:
    """The MEMBER_VIEW script's reply. ``kept`` is the part the caller named to the script: a
    reply that brings it up to date with the change log's entries is applied to it. Without
    ``claims`` (not asked for) the view's ``owned`` is None."""
    generation, phase_text, target, owned, incarnation, epoch, how, token = reply
    flat = list(owned)
    view = MemberView(
        generation=number(group, "generation", generation),
        phase=parse_phase(group, str(phase_text), store="Redis"),
        target=(
            _brought_up_to_date(group, kept, target)
            if str(how) == "1"
            else frozenset(str(r) for r in target)
        ),
        owned={
            str(flat[i]): number(group, f"epoch of {str(flat[i])[:60]!r}", flat[i + 1])
            for i in range(0, len(flat) - 1, 2)
        }
        if claims
        else None,
        coordinator_epoch=number(group, "target epoch", epoch),
    )
    return DecodedView(view, str(incarnation), str(token))


def _brought_up_to_date(group: str, part: frozenset[str], entries: Sequence[Any]) -> frozenset[str]:
    """``part`` after the change log's ``entries`` for its member, oldest first: each the JSON
    ``[emptied, added ids, removed ids]`` that PUBLISH_CHANGE wrote (Lua's cjson writes an
    empty list as ``{}``)."""
    if not entries:
        return part
    now = set(part)
    for entry in entries:
        try:
            emptied, added, removed = json.loads(entry)
            if emptied not in (0, 1):
                raise ValueError(f"the first value is {emptied!r}, not 0 or 1")
            if emptied == 1:
                now.clear()
            now.difference_update(_ids(removed))
            now.update(_ids(added))
        except (ValueError, TypeError) as exc:
            raise CorruptStateError(
                f"Redis group {group!r}: an entry of the target's change log is not what this "
                f"library writes ([emptied, added ids, removed ids]): {str(entry)[:120]!r} "
                f"({exc}). The member reads its part whole instead; if this repeats, look "
                f"for another program writing under rb:{{{group}}}:."
            ) from None
    return frozenset(now)


def encode_progress_record(epoch: int, member_id: str, progress_json: str) -> str:
    """What COMMIT stores per resource: ``<epoch>\\n<member>\\n<progress JSON>``."""
    return f"{epoch}\n{member_id}\n{progress_json}"


def decode_progress_record(group: str, resource: str, text: str) -> Progress:
    epoch, sep, rest = text.partition("\n")
    member, sep2, value = rest.partition("\n")
    if not (sep and sep2) or not epoch.isdigit():
        why = "not in the form this library writes (epoch, member, JSON)"
        return Progress(resource, UnreadableProgress(resource, text[:120], why), 0, "")
    return Progress(
        resource,
        decode_progress(resource, value),
        number(group, "progress epoch", epoch),
        member,
    )


def _ids(value: object) -> list[str]:
    """A list of ids in a change log entry (an empty one is ``{}``: Lua's cjson cannot tell an
    empty list from an empty table)."""
    if value == {}:
        return []
    if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
        raise TypeError(f"{str(value)[:60]!r} is not a list of ids")
    return value
