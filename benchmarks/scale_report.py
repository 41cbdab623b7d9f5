"""The scale benchmark's figures: one cell (backend x resources x members) and its measurements,
its rows in the printed table, and its JSON form (``bench_scale.py``)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import bench_rebalance as br
from store_counters import Figures

SCENARIOS = ("join", "graceful leave", "crash")


@dataclass
class Point:
    scenario: str
    seconds: float
    moved: int
    minimum: int
    window: tuple[float, float]
    store: Figures
    cpu: float
    unowned: br.GapStats | None = None


@dataclass
class Cell:
    backend: str
    resources: int
    members: int
    threads: int
    points: list[Point] = field(default_factory=list)
    first_assignment: float | None = None
    first_store: Figures = field(default_factory=dict)
    first_probe: dict[str, float | int | None] = field(default_factory=dict)
    """``store_probe.py``'s figures over the first assignment (empty if it did not run)."""
    size: Figures = field(default_factory=dict)
    double: int | None = None
    failure: str | None = None

    @property
    def anomalous(self) -> str | None:
        """Why this cell's trails are worth keeping (it failed, moved more than the minimum,
        or saw two owners at once), or None."""
        if self.failure is not None:
            return "it did not finish"
        if self.double:
            return f"{self.double} double ownerships"
        extra = [p.scenario for p in self.points if p.moved > p.minimum]
        if extra:
            return f"more moves than the minimum in: {', '.join(sorted(set(extra)))}"
        return None


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}{suffix}{unit}"
    return f"{value:.0f}{unit}"


def _med(values: Sequence[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def _probe_note(cell: Cell) -> str:
    probe = cell.first_probe
    if probe.get("longest_s") is None:
        return ""
    figures = ", ".join(
        f"{name} {_secs(probe[key])}"
        for name, key in (("longest", "longest_s"), ("p99", "p99_s"), ("median", "median_s"))
    )
    return (
        f"; a small read during the first assignment: {figures} "
        f"({probe['reads']} reads, {probe['failures']} failed)"
    )


def _secs(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 0.1 else f"{value:.3f} s"


def rows(cell: Cell, ttl: float) -> list[tuple[str, ...]]:
    kind = f"{cell.threads}t+{cell.members - cell.threads}p" if cell.threads else "p"
    who = f"{cell.members} ({kind})"
    res = f"{cell.resources:,}"
    if cell.first_assignment is None and cell.failure:
        return [(res, who, f"  ({cell.failure}{_probe_note(cell)})", *("",) * 10)]
    size = cell.size
    first = (
        res, who, "first assignment", "1", f"{cell.first_assignment:.3f}", "-", "-", "-", "-",
        _num(cell.first_store.get("ops")), _num(cell.first_store.get("bytes_in"), "B"),
        _num(cell.first_store.get("bytes_out"), "B"), _num(cell.first_store.get("pages")),
    )  # fmt: skip
    out: list[tuple[str, ...]] = [first]
    for scenario in SCENARIOS:
        points = [p for p in cell.points if p.scenario == scenario]
        if not points:
            continue
        secs = [p.seconds for p in points]
        unowned = [p.unowned for p in points if p.unowned is not None]
        med_unowned = _med([u.resources for u in unowned])
        longest = max((u.longest for u in unowned), default=0.0)
        gaps = f"{med_unowned:g} / {longest:.3f}" if med_unowned is not None else "-"
        out.append((
            res, who, scenario, str(len(points)), f"{statistics.median(secs):.3f}",
            f"{br.p95(secs):.3f}",
            f"{_med([p.moved for p in points]):g} / {_med([p.minimum for p in points]):g}",
            gaps,
            f"{_med([p.cpu for p in points]):.2f}",
            _num(_med([p.store.get("ops") for p in points])),
            _num(_med([p.store.get("bytes_in") for p in points]), "B"),
            _num(_med([p.store.get("bytes_out") for p in points]), "B"),
            _num(_med([p.store.get("pages") for p in points])),
        ))  # fmt: skip
        if scenario == "crash":
            over = [s - ttl for s in secs]
            out.append((res, who, "crash - session timeout", str(len(points)),
                        f"{statistics.median(over):.3f}", f"{br.p95(over):.3f}",
                        *("",) * 7))  # fmt: skip
    note = f"store size {_num(size.get('bytes'), 'B')}" + "".join(
        f", {k} {_num(v)}" for k, v in size.items() if k != "bytes"
    )
    note += f"; double ownerships {cell.double if cell.double is not None else '-'}"
    note += _probe_note(cell)
    if cell.failure:
        note = f"{cell.failure}; {note}"
    out.append((res, who, f"  ({note})", *("",) * 10))
    return out


HEADER = ("resources", "members", "scenario", "n", "median s", "p95 s", "moved / min",
          "unowned (med / longest s)", "member CPU s", "store ops", "bytes in", "bytes out",
          "pages")  # fmt: skip


def table(cells: Sequence[Cell], ttl: float) -> str:
    lines = [HEADER, *(r for c in cells for r in rows(c, ttl))]
    widths = [
        max(len(line[i]) for line in lines if not line[2].startswith("  ("))
        for i in range(len(HEADER))
    ]
    out = []
    for k, line in enumerate(lines):
        if line[2].startswith("  ("):
            out.append(f"{line[0].rjust(widths[0])}  {line[1].ljust(widths[1])}  {line[2].strip()}")
            continue
        cells_ = [line[0].rjust(widths[0]), line[1].ljust(widths[1]), line[2].ljust(widths[2])]
        cells_ += [c.rjust(w) for c, w in zip(line[3:], widths[3:], strict=True)]
        out.append("  ".join(cells_).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def cell_json(cell: Cell) -> dict[str, Any]:
    return {
        "backend": cell.backend, "resources": cell.resources, "members": cell.members,
        "member_threads": cell.threads, "first_assignment_s": cell.first_assignment,
        "first_assignment_store": cell.first_store,
        "first_assignment_probe": cell.first_probe, "store_size": cell.size,
        "double_ownerships": cell.double, "failure": cell.failure,
        "points": [
            {"scenario": p.scenario, "seconds": p.seconds, "moved": p.moved,
             "minimum": p.minimum, "store": p.store, "member_cpu_s": p.cpu,
             "unowned_resources": p.unowned.resources if p.unowned else None,
             "unowned_resource_seconds": p.unowned.resource_seconds if p.unowned else None,
             "longest_gap_s": p.unowned.longest if p.unowned else None}
            for p in cell.points
        ],
    }  # fmt: skip
