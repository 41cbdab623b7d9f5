"""What each znode of a group holds, as JSON, and the checks that read it back.

Every reader goes through :func:`decode` and the typed readers below, so data this library did
not write (not JSON, a field missing or of the wrong type) is a :class:`CorruptStateError` that
names the znode, never a ``KeyError`` deep inside a member's loop.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rebalancer_spark.backends.records import parse_phase
from rebalancer_spark.core.errors import CorruptStateError
from rebalancer_spark.core.model import (
    CoordinatorRecord,
    MemberRecord,
    Phase,
    Progress,
    Resource,
    UnreadableProgress,
)

__all__ = [
    "CHAINS",
    "LAYOUT",
    "LoggedChange",
    "ResourcesPointer",
    "TargetPointer",
    "apply_changes",
    "change_items",
    "decode",
    "encode",
    "hints_data",
    "json_scalar",
    "read_coordinator",
    "read_epoch",
    "read_hints",
    "read_layout",
    "read_member",
    "read_progress",
    "read_resource_chunk",
    "read_resource_log_chunk",
    "read_resources_pointer",
    "read_target_chunk",
    "read_target_pointer",
    "reads_chains",
]

LAYOUT = 1
"""The version of the znode layout this library writes and reads."""


_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def encode(value: Any) -> bytes:
    """Compact, sorted JSON in UTF-8."""
    return _ENCODER.encode(value).encode()


@functools.lru_cache(maxsize=4096)
def _json_text(text: str) -> str:
    return _ENCODER.encode(text)


def json_scalar(value: str | int | float | None) -> str:
    """``value`` as :func:`encode` writes it, for the records written once per resource in a
    claim or a release (``chain.grant_data``, ``chain.released_data``):
    those fill a fixed template with it, at a tenth of the cost of encoding a dict. Texts
    (member and session ids, repeated across a batch) are encoded once and kept."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, str):
        return _json_text(value)
    if math.isfinite(value):
        return float.__repr__(value)
    return _ENCODER.encode(value)


_NEXT_STEP = "inspect it with zkCli, then remove the group (or use another chroot)"


def _corrupt(path: str, what: str) -> CorruptStateError:
    return CorruptStateError(
        f"znode {path} holds {what}; it was not written by this version of rebalancer-spark: "
        f"{_NEXT_STEP}"
    )


def decode(data: bytes, path: str) -> Any:
    """The JSON value stored in the znode at ``path``."""
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        shown = data[:60].decode("utf-8", "replace")
        raise _corrupt(path, f"data that is not JSON ({shown!r})") from None


def _object(data: bytes, path: str) -> dict[str, Any]:
    value = decode(data, path)
    if not isinstance(value, dict):
        raise _corrupt(path, f"a JSON {type(value).__name__} where an object was expected")
    return value


def _get(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], path: str) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise _corrupt(path, f"{key} = {value!r}, not of the expected type")
    return value


def read_layout(data: bytes, path: str) -> None:
    """Check the ``{"layout": 1}`` marker of the tree or of a group."""
    if _get(_object(data, path), "layout", int, path) != LAYOUT:
        raise CorruptStateError(
            f"znode {path} was written with layout {decode(data, path).get('layout')!r}, this "
            f"library reads layout {LAYOUT}: use the matching rebalancer-spark version"
        )


def member_data(
    session_id: str,
    info: Mapping[str, str],
    *,
    static: bool,
    leaving: bool = False,
    acked: int = 0,
) -> bytes:
    return encode(
        {
            "session": session_id,
            "info": dict(info),
            "static": static,
            "leaving": leaving,
            "acked": acked,
            # This member reads a resource set written as a chain of changes (a record of an
            # earlier release has no such field: no writer chains while such a member lives).
            CHAINS: True,
        }
    )


CHAINS = "chains"
"""The field of a member record that says its member reads chained resource pointers."""


def reads_chains(data: bytes, path: str) -> bool:
    """Whether the member record ``data`` was written by a release that reads chained
    resource pointers (:class:`ResourcesPointer`)."""
    return _object(data, path).get(CHAINS) is True


def read_member(member_id: str, data: bytes, path: str) -> MemberRecord:
    obj = _object(data, path)
    info = _get(obj, "info", dict, path)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in info.items()):
        raise _corrupt(path, "member info that is not a map of strings")
    return MemberRecord(
        member_id=member_id,
        session_id=_get(obj, "session", str, path),
        info=info,
        acked_generation=_get(obj, "acked", int, path),
        leaving=_get(obj, "leaving", bool, path),
        static=_get(obj, "static", bool, path),
    )


def coordinator_data(member_id: str, session_id: str, epoch: int) -> bytes:
    return encode({"member": member_id, "session": session_id, "epoch": epoch})


def read_coordinator(data: bytes, path: str) -> CoordinatorRecord:
    obj = _object(data, path)
    return CoordinatorRecord(
        member_id=_get(obj, "member", str, path),
        session_id=_get(obj, "session", str, path),
        epoch=_get(obj, "epoch", int, path),
    )


def read_epoch(data: bytes, version: int, path: str) -> CoordinatorRecord:
    """The coordinator epoch znode: its epoch must equal its version (every election is one
    versioned write)."""
    obj = _object(data, path)
    epoch = _get(obj, "epoch", int, path)
    if epoch != version:
        raise _corrupt(path, f"epoch {epoch} at znode version {version} (they always match)")
    if epoch == 0:
        return CoordinatorRecord("", "", 0)
    return CoordinatorRecord(_get(obj, "member", str, path), _get(obj, "session", str, path), epoch)


def progress_data(value: Any, epoch: int, member_id: str, at: float) -> bytes:
    return encode({"value": value, "epoch": epoch, "member": member_id, "at": at})


def read_progress(resource: str, data: bytes, path: str) -> Progress:
    """The progress record at ``path``; one that cannot be decoded is an
    :class:`UnreadableProgress` (that resource's owner is stuck, the read goes on)."""
    try:
        obj = _object(data, path)
        if "value" not in obj:
            raise _corrupt(path, "a progress record without a value")
        epoch, member = _get(obj, "epoch", int, path), _get(obj, "member", str, path)
    except CorruptStateError as exc:
        shown = data[:120].decode("utf-8", "replace")
        return Progress(resource, UnreadableProgress(resource, shown, str(exc)), 0, "")
    return Progress(
        resource=resource,
        value=obj["value"],
        epoch=epoch,
        member_id=member,
    )


@dataclass(frozen=True, slots=True)
class LoggedChange:
    """One change of the resource set in its log: the version it made and the directory of
    its chunks (``resource-sets/<name>``: [id, weight] put, [id, null] removed)."""

    version: int
    name: str
    chunks: int
    ids: int


@dataclass(frozen=True, slots=True)
class ResourcesPointer:
    """The current resource set: its version, the directory of the chunks of the set whole at
    :attr:`whole_at` (its version, unless a chain of logged changes follows it), and the log of
    its last changes (every change after ``log_from`` is in ``log``, oldest first; every
    change after :attr:`whole_at` always is). A pointer written before the log was kept reads
    as one whose log starts at its version. A chained pointer names its directory ``base``,
    not ``set``: a reader of an earlier release takes it for corrupt instead of reading the
    set without its chain."""

    version: int
    name: str
    chunks: int
    log_from: int = -1
    log: tuple[LoggedChange, ...] = ()
    set_version: int = -1

    @property
    def logged_from(self) -> int:
        return self.version if self.log_from < 0 else self.log_from

    @property
    def whole_at(self) -> int:
        return self.version if self.set_version < 0 else self.set_version

    @property
    def chain(self) -> tuple[LoggedChange, ...]:
        """The logged changes after :attr:`whole_at`: applied to its directory's set, they
        make the set at :attr:`version`."""
        return tuple(c for c in self.log if c.version > self.whole_at)

    def encode(self) -> bytes:
        return encode(
            {
                "version": self.version,
                "set" if self.whole_at == self.version else "base": self.name,
                "set_version": self.whole_at,
                "chunks": self.chunks,
                "log_from": self.logged_from,
                "log": [[c.version, c.name, c.chunks, c.ids] for c in self.log],
            }
        )


def read_resources_pointer(data: bytes, path: str) -> ResourcesPointer:
    obj = _object(data, path)
    version = _get(obj, "version", int, path)
    log: list[LoggedChange] = []
    for item in obj.get("log", []):
        if not (
            isinstance(item, list)
            and len(item) == 4
            and isinstance(item[1], str)
            and all(isinstance(x, int) and not isinstance(x, bool) for x in (item[0], *item[2:]))
        ):
            raise _corrupt(path, f"the logged change {item!r}, not [version, set, chunks, ids]")
        log.append(LoggedChange(item[0], item[1], item[2], item[3]))
    whole = _get(obj, "set_version", int, path) if "set_version" in obj else version
    if whole > version or ("set" in obj) != (whole == version):
        raise _corrupt(path, f"a set at version {whole} named as for version {version}")
    pointer = ResourcesPointer(
        version,
        _get(obj, "set" if "set" in obj else "base", str, path),
        _get(obj, "chunks", int, path),
        _get(obj, "log_from", int, path) if "log_from" in obj else version,
        tuple(log),
        whole,
    )
    if [c.version for c in pointer.chain] != list(range(whole + 1, version + 1)):
        raise _corrupt(path, f"a set at version {whole} whose log lacks a change up to {version}")
    return pointer


def read_resource_log_chunk(data: bytes, path: str) -> list[tuple[str, float | None]]:
    """A chunk of a logged change: (id, weight) put, (id, None) removed."""
    value = decode(data, path)
    if not isinstance(value, list):
        raise _corrupt(path, "a chunk of a resource-set change that is not a list")
    out: list[tuple[str, float | None]] = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not (item[1] is None or isinstance(item[1], int | float))
            or isinstance(item[1], bool)
        ):
            raise _corrupt(path, f"the logged entry {item!r}, not [id, weight or null]")
        out.append((item[0], None if item[1] is None else float(item[1])))
    return out


def read_resource_chunk(data: bytes, path: str) -> list[Resource]:
    value = decode(data, path)
    if not isinstance(value, list):
        raise _corrupt(path, "a resource chunk that is not a list")
    out: list[Resource] = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not isinstance(item[1], int | float)
            or isinstance(item[1], bool)
        ):
            raise _corrupt(path, f"the resource entry {item!r}, not [id, weight]")
        try:
            out.append(Resource(item[0], float(item[1])))
        except ValueError as exc:
            raise _corrupt(path, f"an invalid resource ({exc})") from None
    return out


@dataclass(frozen=True, slots=True)
class TargetPointer:
    """The current target generation: everything but the per-member chunks.

    A target is a *base* directory of per-member chunks, written whole, followed by a chain of
    *delta* directories, oldest first: each holds, for every member whose part changed from the
    generation before, one chunk of its changes (``+id`` gained, ``-id`` lost); a member
    without a chunk there had no change. A pointer with deltas names its base under ``base``
    instead of ``dir``, so a reader that knows no deltas refuses it instead of reading the base
    alone."""

    generation: int
    epoch: int
    phase: Phase
    resources_version: int
    name: str
    """The base directory."""
    members: Mapping[str, int]
    """Member id -> number of chunks of its part in the base (0 for a member that had nothing
    there); exactly the members of this generation."""
    deltas: tuple[str, ...] = ()
    """The delta directories to apply to the base, oldest first."""
    hinted: tuple[str, ...] = ()
    """The members whose hints (``<member>#h`` in the last delta: who had each id they gain;
    see :func:`read_hints`) are to be read with this pointer. Readers of earlier releases
    ignore it."""

    def encode(self) -> bytes:
        obj: dict[str, object] = {
            "generation": self.generation,
            "epoch": self.epoch,
            "phase": self.phase.value,
            "resources_version": self.resources_version,
            "members": dict(self.members),
        }
        if self.deltas:
            obj |= {"base": self.name, "deltas": list(self.deltas)}
            if self.hinted:
                obj["hinted"] = list(self.hinted)
        else:
            obj["dir"] = self.name
        return encode(obj)


def read_target_pointer(data: bytes, path: str, *, group: str) -> TargetPointer:
    obj = _object(data, path)
    members = _get(obj, "members", dict, path)
    if not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in members.items()):
        raise _corrupt(path, "a member table that is not a map of chunk counts")
    phase = parse_phase(
        group, _get(obj, "phase", str, path), store=f"znode {path}", next_step=_NEXT_STEP
    )
    deltas = obj.get("deltas")
    if deltas is not None and not (
        isinstance(deltas, list) and deltas and all(isinstance(d, str) for d in deltas)
    ):
        raise _corrupt(path, "a delta chain that is not a list of directory names")
    hinted = obj.get("hinted", [])
    if not isinstance(hinted, list) or not all(isinstance(m, str) for m in hinted):
        raise _corrupt(path, "hinted members that are not a list of member ids")
    return TargetPointer(
        generation=_get(obj, "generation", int, path),
        epoch=_get(obj, "epoch", int, path),
        phase=phase,
        resources_version=_get(obj, "resources_version", int, path),
        name=_get(obj, "dir" if deltas is None else "base", str, path),
        members=members,
        deltas=() if deltas is None else tuple(deltas),
        hinted=tuple(hinted),
    )


def read_target_chunk(data: bytes, path: str) -> list[str]:
    value = decode(data, path)
    if not isinstance(value, list) or not all(isinstance(r, str) for r in value):
        raise _corrupt(path, "a target chunk that is not a list of resource ids")
    return value


def hints_data(held: Mapping[str, Iterable[str]]) -> bytes:
    """A delta's hints chunk for one member: session id -> the ids it gains that the member
    of that session had in the target before."""
    return encode({session: sorted(ids) for session, ids in sorted(held.items())})


def read_hints(data: bytes, path: str) -> dict[str, str]:
    """A hints chunk (:func:`hints_data`) as resource id -> session id."""
    value = decode(data, path)
    if not isinstance(value, dict) or not all(
        isinstance(ids, list) and all(isinstance(r, str) for r in ids) for ids in value.values()
    ):
        raise _corrupt(path, "delta hints that are not a map of session ids to resource ids")
    return {r: session for session, ids in value.items() for r in ids}


def change_items(gained: Iterable[str], lost: Iterable[str]) -> Iterator[bytes]:
    """The encoded items of a delta chunk: ``+id`` for each id gained, ``-id`` for each lost."""
    for r in sorted(gained):
        yield encode("+" + r)
    for r in sorted(lost):
        yield encode("-" + r)


def apply_changes(part: set[str], data: bytes, path: str) -> None:
    """Apply the delta chunk ``data`` to a member's ``part`` of the base, in place."""
    for item in read_target_chunk(data, path):
        sign, r = item[:1], item[1:]
        if sign == "+" and r:
            part.add(r)
        elif sign == "-" and r:
            part.discard(r)
        else:
            raise _corrupt(path, f"the change {item!r}, not '+id' or '-id'")
