"""The ownership timeline: who owned what and when, with the rebalances and control events.

Use case: ``save_timeline(load_rows(path).rows, "ownership.png")`` draws who owned what and
when, for an incident report or a notebook. With one lane per resource (up to ``max_lanes``
resources, see :mod:`rebalancer_spark.audit.lanes`), each bar is one ownership (one member
session at one epoch) in its member's colour (the legend names them); a tick and the epoch
(``e3``) mark each acquisition; white space between bars is time without an owner; a black
cross ends an ownership that was lost (lease lapsed) rather than released. An ownership still
open at the end of the trail runs to ``until`` (default: the last event) with an arrow.

With more resources the lanes are aggregated (by prefix, by member or by range of ids): a lane
shows, stacked in member colours, the share of its resources each member owned over time, so
the image stays the same readable size for 40 or 40,000 resources.

Above the lanes, a strip marks each rebalance (``g12 join``, from the coordinator's
``rebalance`` rows) and each control event (pause, resume, drain, pin …, from ``control``
rows), with a faint line across the lanes at the same instant.

Matplotlib is used through its object API with the Agg canvas only: no pyplot, no global
state, no display needed (``pip install 'rebalancer-spark[plot]'``).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

try:
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.axes import Axes
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import PolyCollection
    from matplotlib.colors import to_hex
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"the ownership timeline needs matplotlib ({exc}): pip install 'rebalancer-spark[plot]'"
    ) from exc

from rebalancer_spark.audit.lanes import Lane, choose_lanes
from rebalancer_spark.core.audit import Interval, intervals
from rebalancer_spark.core.errors import ConfigurationError

__all__ = ["TimelineImage", "member_colours", "save_timeline", "timeline_figure"]

_WIDTH_INCHES = 12.0
_LANE_INCHES = 0.32
_STRIP_INCHES = 0.9
_MAX_LABELLED_EPOCHS = 400
_MAX_LABELLED_MARKS = 40
_MARK_CHARS = 28
_SIDE_LEGEND = 20
_LEGEND_ROW_INCHES = 0.2
_OWNERSHIP = frozenset({"acquired", "released", "lost"})


@dataclass(frozen=True)
class TimelineImage:
    """What :func:`save_timeline` drew."""

    width: int
    height: int
    lanes: str
    """How the lanes were chosen: ``resource``, ``prefix`` or ``member``."""
    lane_count: int
    marks: int
    """Rebalance and control marks drawn."""


def member_colours(members: Iterable[str]) -> dict[str, str]:
    """A distinct colour (``#rrggbb``) per member, in sorted member order: tab10 for up to ten
    members, tab20 up to twenty, then evenly spaced hues."""
    names = sorted(set(members))
    if len(names) <= 10:
        cmap, n = colormaps["tab10"], 10
    elif len(names) <= 20:
        cmap, n = colormaps["tab20"], 20
    else:
        cmap, n = colormaps["hsv"], len(names) + 1
    return {name: to_hex(cmap(i / n if n > 20 else i)) for i, name in enumerate(names)}


def timeline_figure(
    events: Iterable[Mapping[str, object]],
    *,
    title: str | None = None,
    until: float | None = None,
    dpi: int = 100,
    lanes: str = "auto",
    max_lanes: int = 60,
) -> Figure:
    """The timeline of ``events`` (dicts as :func:`load_rows` returns) as a Matplotlib figure
    on an Agg canvas; the x axis is seconds since the first ownership or rebalance event
    (its UTC time is in the axis label); ``lanes`` is ``auto``, ``resource``, ``prefix`` or
    ``member`` (see :mod:`rebalancer_spark.audit.lanes`). The figure's first axes hold the
    lanes. Raises
    :class:`ConfigurationError` for a trail without ownerships."""
    return _draw(list(events), title, until, dpi, lanes, max_lanes)[0]


def save_timeline(
    events: Iterable[Mapping[str, object]],
    out: str | os.PathLike[str],
    *,
    title: str | None = None,
    until: float | None = None,
    dpi: int = 100,
    lanes: str = "auto",
    max_lanes: int = 60,
) -> TimelineImage:
    """Draw the timeline of ``events`` into the PNG file ``out``."""
    figure, mode, count, marks = _draw(list(events), title, until, dpi, lanes, max_lanes)
    try:
        figure.savefig(os.fspath(out), format="png")
    except OSError as exc:
        raise ConfigurationError(
            f"cannot write the timeline to {os.fspath(out)!r}: {exc.strerror or exc}; give a "
            "path in a directory that exists and that you can write"
        ) from exc
    width, height = figure.canvas.get_width_height()
    return TimelineImage(int(width), int(height), mode, count, marks)


def _draw(
    events: list[Mapping[str, object]],
    title: str | None,
    until: float | None,
    dpi: int,
    lanes: str,
    max_lanes: int,
) -> tuple[Figure, str, int, int]:
    trail = [e for e in events if str(e["kind"]) in _OWNERSHIP]
    by_resource = intervals(trail)
    if not by_resource:
        raise ConfigurationError(
            f"nothing to draw: the {len(events)} events hold no acquisition; check the audit "
            "path and the --group filter"
        )
    # The axis spans the ownerships and the rebalances that caused them (a publication comes
    # just before its first acquisition); control events outside that span are left out.
    times = [_float(e["at"]) for e in events if str(e["kind"]) in (*_OWNERSHIP, "rebalance")]
    t0 = min(times)
    end = max(times) if until is None else until
    end = max(end, t0 + 1e-3)
    every = [i for items in by_resource.values() for i in items]
    colours = member_colours(i.member_id for i in every)
    mode, chosen = choose_lanes(by_resource, colours, lanes=lanes, max_lanes=max_lanes)
    marks = _marks(events, t0, end)
    legend_rows = 0 if len(colours) <= _SIDE_LEGEND else math.ceil(len(colours) / 10)
    figure, axes = _canvas(len(chosen), marks, legend_rows, dpi, t0)
    title = _draw_lanes(axes, mode, chosen, by_resource, t0, end, colours) or title
    labels = [spec.label for spec in chosen]
    axes.set_yticks(range(len(chosen)), labels=labels, fontsize=8 if len(chosen) > 30 else 9)
    axes.set_ylim(len(chosen) - 0.5, -0.5)
    axes.set_xlim(0, (end - t0) * 1.04)
    axes.set_xlabel(f"seconds since {_utc(t0)}")
    axes.set_ylabel({"resource": "resource", "prefix": "resources", "member": "member"}[mode])
    axes.grid(axis="x", alpha=0.3)
    axes.set_title(title or _title(mode, len(by_resource), len(colours), len(chosen)))
    handles = [Patch(facecolor=colour, label=member) for member, colour in colours.items()]
    if legend_rows:
        figure.legend(
            handles=handles, title="member", loc="outside lower center", ncols=10, fontsize=7
        )
    else:
        axes.legend(handles=handles, title="member", loc="upper left", bbox_to_anchor=(1.01, 1))
    if not (marks or legend_rows):
        figure.tight_layout()
    return figure, mode, len(chosen), len(marks)


def _canvas(
    lanes: int, marks: Sequence[_Mark], legend_rows: int, dpi: int, t0: float
) -> tuple[Figure, Axes]:
    """The figure sized for ``lanes`` lanes, the rebalance strip above them if there are
    ``marks``, and the legend rows below (up to 20 members: a legend beside the lanes)."""
    strip = _STRIP_INCHES if marks else 0.0
    height = 1.6 + strip + _LANE_INCHES * lanes + legend_rows * _LEGEND_ROW_INCHES
    constrained = bool(marks) or legend_rows > 0
    figure = Figure(
        figsize=(_WIDTH_INCHES, height), dpi=dpi, layout="constrained" if constrained else None
    )
    FigureCanvasAgg(figure)
    if not marks:
        return figure, figure.add_subplot()
    lanes_inches = height - strip - 1.2 - legend_rows * _LEGEND_ROW_INCHES
    grid = figure.add_gridspec(2, 1, height_ratios=[strip, lanes_inches])
    axes = figure.add_subplot(grid[1])
    _draw_marks(figure.add_subplot(grid[0], sharex=axes), axes, marks, t0)
    return figure, axes


def _draw_lanes(
    axes: Axes,
    mode: str,
    chosen: Sequence[Lane],
    by_resource: Mapping[str, list[Interval]],
    t0: float,
    end: float,
    colours: Mapping[str, str],
) -> str | None:
    """Draw each chosen lane; return the title member lanes call for (else None)."""
    if mode == "resource":
        label_epochs = sum(len(items) for items in by_resource.values()) <= _MAX_LABELLED_EPOCHS
        for lane, spec in enumerate(chosen):
            (resource,) = spec.resources
            _draw_lane(axes, lane, by_resource[resource], t0, end, colours, label_epochs)
        return None
    shares = [_share(spec, by_resource, t0, end) for spec in chosen]
    # Member lanes share one scale (the most any member owned); a resource lane group is
    # full when all its resources are owned.
    peak = max(share.peak for share in shares)
    for lane, (spec, share) in enumerate(zip(chosen, shares, strict=True)):
        _draw_share(axes, lane, share, peak if spec.member else len(spec.resources), colours)
    if mode == "member":
        return _title(mode, len(by_resource), len(colours), peak)
    return None


def _title(mode: str, resources: int, members: int, lanes: int) -> str:
    text = f"ownership of {resources} resources by {members} members"
    if mode == "prefix":
        return f"{text}: {lanes} lanes of resources, bar height = share owned by each member"
    if mode == "member":
        return f"{text}: resources owned per member (a full lane = {lanes})"
    return text


def _draw_lane(
    axes: Axes,
    lane: int,
    items: Sequence[Interval],
    t0: float,
    end: float,
    colours: Mapping[str, str],
    label_epochs: bool,
) -> None:
    for item in items:
        start = item.start - t0
        stop = (min(item.end, end) if math.isfinite(item.end) else end) - t0
        colour = colours[item.member_id]
        axes.barh(lane, max(stop - start, 0.0), left=start, height=0.6, color=colour)
        axes.plot([start, start], [lane - 0.4, lane + 0.4], color="black", linewidth=0.8)
        if label_epochs:
            axes.text(start, lane - 0.34, f" e{item.epoch}", fontsize=7, va="bottom", ha="left")
        if item.closed_by == "lost":
            axes.plot([stop], [lane], marker="x", color="black", markersize=7, mew=2)
        elif item.closed_by == "open":
            axes.plot([stop], [lane], marker=">", color=colour, markersize=6)


@dataclass
class _Share:
    """A lane's step functions: per member, how many of its resources it owned from each x."""

    xs: Any
    counts: dict[str, Any]
    losses: set[float]

    @property
    def peak(self) -> int:
        return int(max((max(c) for c in self.counts.values()), default=0))


def _share(spec: Lane, by_resource: Mapping[str, list[Interval]], t0: float, end: float) -> _Share:
    deltas: dict[str, list[tuple[float, int]]] = defaultdict(list)
    losses: set[float] = set()
    for resource in spec.resources:
        for item in by_resource.get(resource, ()):
            if spec.member is not None and item.member_id != spec.member:
                continue
            stop = min(item.end, end) if math.isfinite(item.end) else end
            deltas[item.member_id] += [(item.start - t0, 1), (stop - t0, -1)]
            if item.closed_by == "lost":
                losses.add(round(stop - t0, 1))
    xs = np.unique(np.array([0.0, end - t0] + [x for d in deltas.values() for x, _ in d]))
    counts = {}
    for member, changes in deltas.items():
        steps = np.zeros(len(xs))
        np.add.at(steps, np.searchsorted(xs, [x for x, _ in changes]), [n for _, n in changes])
        counts[member] = np.cumsum(steps)
    return _Share(xs, counts, losses)


def _draw_share(
    axes: Axes, lane: int, share: _Share, full: int, colours: Mapping[str, str]
) -> None:
    """Stacked step areas in member colours; ``full`` resources fill the lane's height."""
    scale = 0.8 / max(full, 1)
    base = np.zeros(len(share.xs))
    shapes, faces = [], []
    for member in sorted(share.counts):
        top = base + share.counts[member]
        shapes.append(_step_band(share.xs, lane + 0.4 - base * scale, lane + 0.4 - top * scale))
        faces.append(colours[member])
        base = top
    axes.add_collection(PolyCollection(shapes, facecolors=faces, linewidths=0))
    for x in sorted(share.losses):
        axes.plot([x], [lane], marker="x", color="black", markersize=6, mew=1.5)


def _step_band(xs: Any, low: Any, high: Any) -> Any:
    """The outline of the area between two step functions (held until the next x)."""
    x_steps = np.repeat(xs, 2)[1:]
    forward = np.column_stack([x_steps, np.repeat(high, 2)[:-1]])
    backward = np.column_stack([x_steps, np.repeat(low, 2)[:-1]])[::-1]
    return np.vstack([forward, backward])


@dataclass(frozen=True)
class _Mark:
    at: float
    row: int
    """0: rebalance, 1: control."""
    text: str


def _marks(events: Sequence[Mapping[str, object]], t0: float, end: float) -> list[_Mark]:
    marks = []
    for e in events:
        kind, at = str(e["kind"]), _float(e["at"])
        if not t0 <= at <= end:
            continue
        if kind == "rebalance":
            trigger = e.get("trigger") or "?"
            marks.append(_Mark(at - t0, 0, f"g{e.get('generation')} {trigger}"))
        elif kind == "control":
            text = " ".join(str(e.get("reason") or "control").split())
            where = f" {e['resource']}" if e.get("resource") else ""
            marks.append(_Mark(at - t0, 1, f"{text}{where}"[:_MARK_CHARS]))
    return sorted(marks, key=lambda m: (m.at, m.row))


def _draw_marks(strip: Axes, axes: Axes, marks: Sequence[_Mark], t0: float) -> None:
    styles = {0: ("v", "tab:blue", ":"), 1: ("D", "dimgray", "--")}
    labelled = len(marks) <= _MAX_LABELLED_MARKS
    for mark in marks:
        shape, colour, line = styles[mark.row]
        strip.plot([mark.at], [mark.row], marker=shape, color=colour, markersize=6)
        axes.axvline(mark.at, color=colour, linestyle=line, linewidth=0.7, alpha=0.6)
        if labelled:
            strip.text(
                mark.at,
                mark.row - 0.25,
                f" {mark.text}",
                fontsize=7,
                rotation=20,
                va="bottom",
                ha="left",
                color=colour,
            )
    strip.set_ylim(1.6, -0.9)
    strip.set_yticks([0, 1], labels=["rebalance", "control"], fontsize=8)
    strip.tick_params(axis="x", labelbottom=False)
    strip.grid(axis="x", alpha=0.3)
    if not labelled:
        strip.set_title(f"{len(marks)} rebalance and control marks (too many to label)", fontsize=8)


def _utc(seconds: float) -> str:
    stamp = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"time {value!r} is not a number of epoch seconds")
    return float(value)
