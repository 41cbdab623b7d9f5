"""The progress a claim hands over, kept for the new owner's next :meth:`progress` read.

A member reads the progress of what it was just granted right after the claim. The CLAIM
script already returns it (it is in the same hash slot), so that read costs no second round
trip: between the claim and the member knowing what it owns, no other request runs.

An entry is exact at the moment of the grant, and nobody but the new owner can commit to the
resource at its new epoch; so it stays exact until this handle commits or releases the
resource (both drop it), unless the ownership ends and the next owner commits, which is why an
entry is used at most once and only within :data:`FRESH_FOR` seconds of the grant; anything
else is read from Redis.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

__all__ = ["FRESH_FOR", "Handoff"]

FRESH_FOR = 1.0
"""Seconds after a grant during which its handed-over progress may be used instead of a read."""


class Handoff:
    """Thread-safe ``(group, resource) -> progress record`` of recent grants."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], tuple[float, str]] = {}

    def granted(self, group: str, records: dict[str, str]) -> None:
        """Keep the progress records ('' for none) of resources just granted."""
        now = time.monotonic()
        with self._lock:
            for key in [k for k, (at, _) in self._entries.items() if now - at > FRESH_FOR]:
                del self._entries[key]
            for rid, record in records.items():
                self._entries[(group, rid)] = (now, record)

    def take(self, group: str, resources: Iterable[str]) -> tuple[dict[str, str], list[str]]:
        """The fresh records among ``resources`` ('' for none), removed; and the rest."""
        now = time.monotonic()
        found: dict[str, str] = {}
        rest: list[str] = []
        with self._lock:
            for rid in resources:
                entry = self._entries.pop((group, rid), None)
                if entry is not None and now - entry[0] <= FRESH_FOR:
                    found[rid] = entry[1]
                else:
                    rest.append(rid)
        return found, rest

    def forget(self, group: str, resources: Iterable[str]) -> None:
        with self._lock:
            for rid in resources:
                self._entries.pop((group, rid), None)
