"""The ownership timeline: one lane per resource, one coloured bar per ownership.

Use case: ``save_timeline(load_events(path), "ownership.png")`` draws who owned what and when,
for an incident report or a notebook. Each bar is one ownership (one member session at one
epoch) in its member's colour (the legend names them); a tick and the epoch (``e3``) mark each
acquisition; white space between bars is time without an owner; a black cross ends an
ownership that was lost (lease lapsed) rather than released. An ownership still open at the
end of the trail runs to ``until`` (default: the last event) with an arrow.

Matplotlib is used through its object API with the Agg canvas only: no pyplot, no global
state, no display needed (``pip install 'rebalancer-spark[plot]'``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

try:
    from matplotlib import colormaps
    from matplotlib.axes import Axes
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import to_hex
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"the ownership timeline needs matplotlib ({exc}): pip install 'rebalancer-spark[plot]'"
    ) from exc

from rebalancer_spark.core.audit import Interval, intervals
from rebalancer_spark.core.errors import ConfigurationError

__all__ = ["member_colours", "save_timeline", "timeline_figure"]

_WIDTH_INCHES = 12.0
_LANE_INCHES = 0.32
_MAX_HEIGHT_INCHES = 60.0
_MAX_LABELLED_EPOCHS = 400


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
) -> Figure:
    """The timeline of ``events`` (dicts as :func:`load_events` returns) as a Matplotlib
    figure on an Agg canvas; the x axis is seconds since the first event (its UTC time is in
    the axis label); control rows (``kind`` ``control``) are left out. Raises
    :class:`ConfigurationError` for a trail without ownerships."""
    trail = [e for e in events if str(e["kind"]) != "control"]
    by_resource = intervals(trail)
    if not by_resource:
        raise ConfigurationError(
            f"nothing to draw: the {len(trail)} events hold no acquisition; check the audit "
            "path and the --group filter"
        )
    times = [_float(e["at"]) for e in trail]
    t0 = min(times)
    end = max(times) if until is None else until
    end = max(end, t0 + 1e-3)
    lanes = sorted(by_resource)
    colours = member_colours(i.member_id for items in by_resource.values() for i in items)
    height = min(_MAX_HEIGHT_INCHES, 1.6 + _LANE_INCHES * len(lanes))
    figure = Figure(figsize=(_WIDTH_INCHES, height), dpi=dpi)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    every = [i for items in by_resource.values() for i in items]
    label_epochs = len(every) <= _MAX_LABELLED_EPOCHS
    for lane, resource in enumerate(lanes):
        _draw_lane(axes, lane, by_resource[resource], t0, end, colours, label_epochs)
    axes.set_yticks(range(len(lanes)), labels=lanes, fontsize=8 if len(lanes) > 30 else 9)
    axes.set_ylim(len(lanes) - 0.5, -0.5)
    axes.set_xlim(0, (end - t0) * 1.04)
    axes.set_xlabel(f"seconds since {_utc(t0)}")
    axes.set_ylabel("resource")
    axes.grid(axis="x", alpha=0.3)
    axes.set_title(title or f"ownership of {len(lanes)} resources by {len(colours)} members")
    handles = [Patch(facecolor=colour, label=member) for member, colour in colours.items()]
    axes.legend(handles=handles, title="member", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    return figure


def save_timeline(
    events: Iterable[Mapping[str, object]],
    out: str | os.PathLike[str],
    *,
    title: str | None = None,
    until: float | None = None,
    dpi: int = 100,
) -> tuple[int, int]:
    """Draw the timeline of ``events`` into the PNG file ``out``; return its (width, height)
    in pixels."""
    figure = timeline_figure(events, title=title, until=until, dpi=dpi)
    try:
        figure.savefig(os.fspath(out), format="png")
    except OSError as exc:
        raise ConfigurationError(
            f"cannot write the timeline to {os.fspath(out)!r}: {exc.strerror or exc}; give a "
            "path in a directory that exists and that you can write"
        ) from exc
    width, height = figure.canvas.get_width_height()
    return int(width), int(height)


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


def _utc(seconds: float) -> str:
    stamp = datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _float(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"time {value!r} is not a number of epoch seconds")
    return float(value)
