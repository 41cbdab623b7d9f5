"""Reading back the text fields every backend stores the same way, refusing what we never wrote.

A group's phase is stored as :class:`Phase` ``.value``; a member's info as a JSON object;
epochs and versions as integers; resources as a valid id and weight. Each backend reads them
through :func:`parse_phase`, :func:`parse_member_info`, :func:`parse_count` and
:func:`parse_resource`, passing the name of
its store (``"SQLite"``, ``"Redis"``, ``"znode /chroot/groups/g/target"``), so data this library
did not write is a :class:`CorruptStateError` naming the group, the value seen, the values
expected and where it was found.
"""

from __future__ import annotations

import json
from typing import Any

from rebalancer_spark.core.errors import ConfigurationError, CorruptStateError
from rebalancer_spark.core.model import Phase, Resource

__all__ = ["parse_count", "parse_member_info", "parse_phase", "parse_resource"]


def parse_count(group: str, what: str, value: object, *, store: str) -> int:
    """An epoch, generation, version or acknowledged generation read back as ``value``: a
    non-negative integer (stores without column types, such as SQLite, may hand back text)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise CorruptStateError(
        f"group {group!r} has {what} = {value!r} in {store}, expected an integer of 0 or more: "
        "it was not written by rebalancer-spark; inspect the store and remove that data"
    )


def parse_resource(group: str, resource: object, weight: object, *, store: str) -> Resource:
    """A resource read back from the group's resource set; ids and weights this library would
    refuse to write are corrupt data, not a configuration mistake."""
    try:
        if not isinstance(resource, str) or isinstance(weight, bool):
            raise ConfigurationError(f"resource {resource!r} with weight {weight!r}")
        return Resource(resource, weight)  # type: ignore[arg-type]
    except (ConfigurationError, TypeError) as exc:
        raise CorruptStateError(
            f"group {group!r} has the resource {resource!r} with weight {weight!r} in {store}, "
            f"which rebalancer-spark never writes ({exc}): inspect the store and remove it"
        ) from None


def parse_phase(group: str, text: str, *, store: str, next_step: str = "") -> Phase:
    """The phase stored as ``text`` for ``group`` in ``store``; ``next_step``, if given, is
    appended to the error."""
    try:
        return Phase(text)
    except ValueError:
        raise CorruptStateError(
            f"group {group!r} has phase {text!r} in {store}, expected one of "
            f"{[p.value for p in Phase]}: it was not written by rebalancer-spark"
            + (f"; {next_step}" if next_step else "")
        ) from None


def parse_member_info(group: str, member: str, text: str, *, store: str) -> dict[str, str]:
    """The info map stored as JSON ``text`` for ``member`` of ``group`` in ``store``."""
    try:
        info: Any = json.loads(text)
    except ValueError:
        info = None
    if not isinstance(info, dict):
        raise CorruptStateError(
            f"member {member!r} of group {group!r} has unreadable info {text[:80]!r} in "
            f"{store}: it was not written by rebalancer-spark"
        )
    return {str(k): str(v) for k, v in info.items()}
