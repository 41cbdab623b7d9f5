"""The epoch chain of the audit trail: every grant names the owner it superseded; check it.

Each ``acquired`` event written since the chain columns exist carries the store's word on what
the grant superseded (``prev_member_id``, ``prev_session_id``, ``prev_epoch``, ``freed``,
``freed_at``; see :class:`~rebalancer_spark.core.model.Grant`). :func:`check_chain` walks every
resource's grants in epoch order and reports, as a :class:`ChainFault` with the rows around it:

* ``duplicate-epoch``: two sessions acquired the same epoch (a forged or replayed row);
* ``stale-epoch``: an epoch acquired after a higher one was (beyond the clock tolerance);
* ``broken-link``: a grant names an epoch other than its own minus one (or ``new`` past 1);
* ``missing-link``: the epoch a grant supersedes has no ``acquired`` row;
* ``wrong-predecessor``: that epoch's owner in the table is not the one the grant names;
* ``early-grant``: granted before the predecessor's lease ran out (``freed_at`` after the
  grant's ``at``, beyond the tolerance);
* ``unreleased``: the store says the predecessor released, but the table has no ``released``
  (nor ``lost``) row of it;
* ``missing-rows`` / ``duplicate-rows``: a session's row numbers skip or repeat (see below).

A process killed with -9 loses the events its audit writer had not committed yet, and only
those: a writer numbers each session's rows (``seq``: 1, 2, …) and commits them in that order,
so a crash loses the *highest* numbers of its session. Hence:

* ``missing-rows``: a session's numbers have a gap (row 7 is there, row 5 is not): rows were
  removed from the table after they were written. Reported once per gap.
* A missing ``acquired`` row of a session whose numbers have no gap, and none of whose rows
  about that epoch is in the table, was among the rows its process had not flushed when it
  ended: listed in :attr:`ChainCheck.unrecorded`, not a fault. (Its ``released`` row is judged
  by time instead: a member writes it *before* the store frees the claim, so any row of the
  session observed after the store's release time proves the writer went on.)
* Rows without numbers (tables written before ``seq``) are judged by time: a missing row is
  put down to a crash only when the session has no row observed after the end of the previous
  epoch, which can also blame a crash on a removal it cannot see, or the reverse.

Epochs below the first one the table holds for a resource predate the table.

Grants without chain columns (a table written before them, or a claim whose answer never
reached its member) are counted in :attr:`ChainCheck.unchained`; the links into them are not
checked, and a resource none of whose grants carries the chain is not checked at all.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = ["ChainCheck", "ChainFault", "check_chain", "is_chained"]

Row = Mapping[str, object]
_Fault = Callable[[int, str, str, Iterable[Row]], None]

_CLOSING = frozenset({"released", "lost"})


@dataclass(frozen=True, slots=True)
class ChainFault:
    """One broken link of a resource's epoch chain."""

    resource: str
    epoch: int
    kind: str
    message: str
    rows: tuple[Row, ...]
    """The rows around it: the grant, its predecessor's rows, what contradicts it."""


@dataclass(frozen=True, slots=True)
class ChainCheck:
    """What the chain check found over a trail."""

    checked: int
    """Grants whose link to their predecessor was checked."""
    unchained: int
    """``acquired`` rows without the chain columns: the links into them were not checked."""
    faults: tuple[ChainFault, ...]
    unrecorded: tuple[ChainFault, ...]
    """Links whose rows are missing for a reason the table itself shows: a process that died
    before its writer flushed (nothing of its session was written afterwards), or epochs that
    predate the table. Listed, not faults."""


def is_chained(row: Row) -> bool:
    """Whether an ``acquired`` row carries its grant's link (``freed`` is set)."""
    return row.get("freed") not in (None, "")


def check_chain(events: Iterable[Row], *, tolerance: float = 0.0) -> ChainCheck:
    """Check every resource's epoch chain in ``events`` (dicts with the audit columns; pass
    every row, ``control`` and ``rebalance`` rows too, for the row numbers to be complete)."""
    every = list(events)
    rows = [e for e in every if str(e.get("kind")) in _CLOSING | {"acquired"}]
    by_resource: dict[str, list[Row]] = defaultdict(list)
    last_seen: dict[str, float] = {}
    for e in rows:
        by_resource[str(e["resource"])].append(e)
        sid = str(e["session_id"])
        last_seen[sid] = max(last_seen.get(sid, -math.inf), _observed(e))
    faults: list[ChainFault] = []
    unrecorded: list[ChainFault] = []
    seen = _Sessions(last_seen, _check_numbers(every, faults))
    checked = unchained = 0
    for resource, trail in sorted(by_resource.items()):
        c, u = _check_resource(resource, trail, seen, tolerance, faults, unrecorded)
        checked += c
        unchained += u
    return ChainCheck(checked, unchained, tuple(faults), tuple(unrecorded))


@dataclass(frozen=True, slots=True)
class _Sessions:
    """What the check knows of each session's writing."""

    last_seen: Mapping[str, float]
    """The latest ``observed_at`` of the session's ownership rows."""
    gapless: Mapping[str, bool]
    """For sessions whose rows are numbered: whether the numbers run from 1 without a gap."""


def _check_numbers(rows: Sequence[Row], faults: list[ChainFault]) -> dict[str, bool]:
    """Report gaps and repeats in each session's row numbers; return, per numbered session,
    whether its numbers are complete (1 … its highest, each once)."""
    numbered: dict[str, list[Row]] = defaultdict(list)
    for e in rows:
        # Rows of no session (tables of earlier versions numbered them under "", one count
        # per process) are in no session's trail.
        if e.get("seq") is not None and e.get("session_id"):
            numbered[str(e["session_id"])].append(e)
    gapless: dict[str, bool] = {}
    for sid, found in sorted(numbered.items()):
        found.sort(key=lambda r: _int(r["seq"]))
        gapless[sid] = True
        for previous, row in zip([None, *found], found, strict=False):
            last = 0 if previous is None else _int(previous["seq"])
            seq = _int(row["seq"])
            if seq == last:
                kind = "duplicate-rows"
                message = f"{_who(row)} has row {seq} of its trail twice ({_what(previous)}, "
                message += f"{_what(row)}): a row written twice, or forged"
            elif seq > last + 1:
                kind = "missing-rows"
                span = f"row {last + 1} is" if seq == last + 2 else f"rows {last + 1}-{seq - 1} are"
                message = f"{_who(row)}: {span} missing from its trail, yet row {seq} "
                message += f"({_what(row)}) is there: rows removed from the table"
            else:
                continue
            gapless[sid] = False
            around = tuple(r for r in (previous, row) if r is not None)
            faults.append(
                ChainFault(str(row["resource"]), _int(row["epoch"]), kind, message, around)
            )
    return gapless


def _what(row: Row | None) -> str:
    if row is None:
        return "nothing"
    about = f" of {row['resource']} epoch {row['epoch']}" if row["resource"] else ""
    return f"{row['kind']}{about} at {_when(_at(row))}"


def _check_resource(
    resource: str,
    trail: Sequence[Row],
    sessions: _Sessions,
    tol: float,
    faults: list[ChainFault],
    unrecorded: list[ChainFault],
) -> tuple[int, int]:
    check = _ResourceCheck(resource, trail, sessions, tol, faults, unrecorded)
    if not check.acquired:
        return 0, 0
    if not any(is_chained(r) for found in check.acquired.values() for r in found):
        # A resource whose rows all predate the chain columns: nothing here to check.
        found = check.acquired.values()
        return 0, sum(len({str(r["session_id"]) for r in rows}) for rows in found)
    grants = check.grants()
    check.stale_grants()
    checked = unchained = 0
    for epoch, g in sorted(grants.items()):
        if is_chained(g):
            checked += 1
            check.link(epoch, g)
        else:
            unchained += 1
    return checked, unchained


class _ResourceCheck:
    """The chain check of one resource's rows."""

    def __init__(
        self,
        resource: str,
        trail: Sequence[Row],
        sessions: _Sessions,
        tol: float,
        faults: list[ChainFault],
        unrecorded: list[ChainFault],
    ) -> None:
        self.resource = resource
        self.sessions = sessions
        self.tol = tol
        self.faults = faults
        self.unrecorded = unrecorded
        self.acquired: dict[int, list[Row]] = defaultdict(list)
        self.closing: dict[tuple[str, int], list[Row]] = defaultdict(list)
        self.of_epoch: dict[int, list[Row]] = defaultdict(list)
        for e in trail:
            epoch = _int(e["epoch"])
            self.of_epoch[epoch].append(e)
            if str(e["kind"]) == "acquired":
                self.acquired[epoch].append(e)
            else:
                self.closing[(str(e["session_id"]), epoch)].append(e)

    def fault(self, epoch: int, kind: str, message: str, around: Iterable[Row]) -> None:
        text = f"{self.resource}: {message}"
        self.faults.append(ChainFault(self.resource, epoch, kind, text, tuple(around)))

    def excuse(self, epoch: int, kind: str, message: str, around: Iterable[Row]) -> None:
        """A link missing for a reason the table shows: listed, not a fault."""
        self.unrecorded.append(ChainFault(self.resource, epoch, kind, message, tuple(around)))

    def grants(self) -> dict[int, Row]:
        """One grant per epoch (the earliest); an epoch acquired by two sessions is a fault."""
        grants: dict[int, Row] = {}
        for epoch, found in sorted(self.acquired.items()):
            ordered = sorted(found, key=_at)
            grants[epoch] = ordered[0]
            if len({str(r["session_id"]) for r in found}) > 1:
                who = "; ".join(f"{_who(r)} at {_when(_at(r))}" for r in ordered)
                message = f"epoch {epoch} was acquired twice: {who}"
                self.fault(epoch, "duplicate-epoch", message, ordered)
        return grants

    def stale_grants(self) -> None:
        """Epochs must be acquired in time order (beyond the tolerance)."""
        latest: Row | None = None
        for e in sorted((r for found in self.acquired.values() for r in found), key=_at):
            older = latest is not None and _int(e["epoch"]) < _int(latest["epoch"])
            if older and latest is not None and _at(e) - _at(latest) > self.tol:
                self.fault(
                    _int(e["epoch"]),
                    "stale-epoch",
                    f"{_who(e)} acquired epoch {e['epoch']} at {_when(_at(e))}, after epoch "
                    f"{latest['epoch']} had been acquired by {_who(latest)} at "
                    f"{_when(_at(latest))}: a grant at a stale epoch",
                    [latest, e],
                )
            if latest is None or _int(e["epoch"]) > _int(latest["epoch"]):
                latest = e

    def link(self, epoch: int, g: Row) -> None:
        """Check grant ``g`` of ``epoch`` against the epoch it names as superseded."""
        freed, prev = str(g["freed"]), g.get("prev_epoch")
        if prev is None:
            if freed != "expired":
                message = f"{_who(g)} acquired epoch {epoch} naming no previous epoch but "
                self.fault(epoch, "broken-link", message + f"freed={freed!r}", [g])
            _check_time(g, self.tol, self.fault)
            return  # the store lost its records: a new start of the chain
        p = _int(prev)
        if freed == "new":
            if epoch != 1 or p != 0:
                message = f"{_who(g)} acquired epoch {epoch} as never owned (freed='new'), "
                message += "but only epoch 1 can be a first grant"
                self.fault(epoch, "broken-link", message, [g])
            return
        if p != epoch - 1:
            message = f"{_who(g)} acquired epoch {epoch} superseding epoch {p}: epochs must "
            message += f"grow by exactly one (expected {epoch - 1})"
            self.fault(epoch, "broken-link", message, [g, *self.of_epoch.get(p, [])])
            return
        _check_time(g, self.tol, self.fault)
        pred = self.acquired.get(p)
        if not pred:
            self.missing(epoch, g)
            return
        owner, sid = pred[0], str(g.get("prev_session_id") or "")
        if str(owner["session_id"]) != sid or str(owner["member_id"]) != str(
            g.get("prev_member_id")
        ):
            self.fault(
                epoch,
                "wrong-predecessor",
                f"{_who(g)} acquired epoch {epoch} superseding {g.get('prev_member_id')} "
                f"(session {sid}), but epoch {p} was acquired by {_who(owner)}",
                self.around(p, g),
            )
        elif freed == "released" and not self.closing.get((sid, p)):
            self.unreleased(epoch, g, owner)

    def around(self, p: int, g: Row) -> list[Row]:
        return [*self.of_epoch.get(p - 1, []), *self.of_epoch.get(p, []), g]

    def missing(self, epoch: int, g: Row) -> None:
        """Epoch ``epoch - 1``, which ``g`` supersedes, has no acquired row."""
        p, sid = epoch - 1, str(g.get("prev_session_id") or "")
        message = (
            f"epoch {p} ({g.get('prev_member_id')} session {sid}), superseded by "
            f"{_who(g)} at epoch {epoch}, has no acquired row"
        )
        around = self.around(p, g)
        since = max((_at(r) for r in self.of_epoch.get(p - 1, [])), default=-math.inf)
        last_seen = self.sessions.last_seen.get(sid, -math.inf)
        if p < min(self.acquired):
            self.excuse(p, "before-table", message + " (it predates the table's rows)", (g,))
        elif self.of_epoch.get(p):
            self.fault(p, "missing-link", message + ": a missing link of the chain", around)
        elif self.sessions.gapless.get(sid):
            message += " (that session's rows are all there up to its last one: it was among "
            self.excuse(p, "crash", message + "the rows its process had not flushed when it "
                        "ended)", around)  # fmt: skip
        elif sid not in self.sessions.gapless and last_seen <= since + self.tol:
            message += " (nothing of that session was written after it: its process ended "
            self.excuse(p, "crash", message + "before its audit writer flushed)", around)
        else:
            self.fault(p, "missing-link", message + ": a missing link of the chain", around)

    def unreleased(self, epoch: int, g: Row, owner: Row) -> None:
        """The store says the predecessor released epoch ``epoch - 1``; no row says so."""
        p, sid = epoch - 1, str(owner["session_id"])
        freed_at = _opt(g.get("freed_at"))
        message = (
            f"{_who(g)} acquired epoch {epoch} after {_who(owner)} released epoch {p} (the "
            f"store says at {_when(freed_at)}), but the table has no released row of it"
        )
        after = freed_at if freed_at is not None else _at(g)
        if self.sessions.last_seen.get(sid, -math.inf) <= after + self.tol:
            message += " (nothing of that session was written after the release: its process "
            self.excuse(p, "crash", message + "ended before its audit writer flushed)",
                        self.around(p, g))  # fmt: skip
        else:
            message += " although that session wrote later rows"
            self.fault(epoch, "unreleased", message, self.around(p, g))


def _check_time(g: Row, tol: float, fault: _Fault) -> None:
    freed_at = _opt(g.get("freed_at"))
    if freed_at is not None and freed_at - _at(g) > tol:
        fault(
            _int(g["epoch"]),
            "early-grant",
            f"{_who(g)} acquired epoch {g['epoch']} at {_when(_at(g))}, while the previous "
            f"owner's ownership ({g.get('freed')}) lasted until {_when(freed_at)}: "
            f"{freed_at - _at(g):.3f} s of two owners",
            [g],
        )


def _who(row: Row) -> str:
    return f"member {row['member_id']} (session {row['session_id']})"


def _when(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "an unknown time"
    stamp = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _at(row: Row) -> float:
    return _float(row["at"])


def _observed(row: Row) -> float:
    value = row.get("observed_at")
    return _float(value) if value is not None else _at(row)


def _opt(value: object) -> float | None:
    return None if value is None else _float(value)


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str | float):
        raise ValueError(f"epoch {value!r} is not an integer")
    return int(value)


def _float(value: object) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, int | str | float):
        raise ValueError(f"time {value!r} is not a number")
    return float(value)
