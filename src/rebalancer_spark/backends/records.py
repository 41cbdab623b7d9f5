"""Reading back the text fields every backend stores the same way, refusing what we never wrote.

A group's phase is stored as :class:`Phase` ``.value``; a member's info as a JSON object. Each
backend reads them through :func:`parse_phase` and :func:`parse_member_info`, passing the name of
its store (``"SQLite"``, ``"Redis"``, ``"znode /chroot/groups/g/target"``), so data this library
did not write is a :class:`CorruptStateError` naming the group, the value seen, the values
expected and where it was found.
"""

from __future__ import annotations

import json
from typing import Any

from rebalancer_spark.core.errors import CorruptStateError
from rebalancer_spark.core.model import Phase

__all__ = ["parse_member_info", "parse_phase"]


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
