"""The request timeline as a picture (matplotlib's Agg renderer; no pyplot, no global state).

Top, given the store's overview (`otel_llm.collector.tracestore.request_heat.heatmap`): every request
of the window as a heatmap of start time by the overview's latency (log scale; darker: more
requests; cells holding failed requests marked red), and under it the mean requests waiting and
running among all of them. Then one row per request drawn, first at the top: the request span as a thin line in its finish
reason's colour with a square at its end, its `queue`, `prefill` and `decode` spans as bars in
three colours (edged red when the request failed or was aborted), the first token as a black
tick and each preemption as a red cross. Under them, one axes per engine lane (`timeline.lanes`,
at most MAX_LANES): each step a bar from its start to its end, as high as its batch's requests, in
the prefill colour when it computed prompt tokens and the decode colour when it only decoded, a red
cross on top when it preempted. Bottom: how many requests were waiting and running
(`timeline.load`). Time runs in seconds from the first request's start.

matplotlib is imported when a picture is drawn: `pip install 'otel-llm[timeline]'`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from otel_llm.collector.timeline.lanes import Lane
from otel_llm.collector.timeline.rows import PHASES, LoadPoint, TimelineRow

PHASE_COLOURS = {"queue": "#e6a532", "prefill": "#3b6fb6", "decode": "#5aa469"}
FINISH_COLOURS = {"stop": "#2e7d32", "length": "#757575", "abort": "#ef6c00", "error": "#c62828"}
OTHER_FINISH_COLOUR = "#8e44ad"  # any other finish reason, or none
PREEMPTION_COLOUR = "#c62828"
WIDTH_IN = 14.0
_ROW_IN, _ROWS_MIN_IN, _ROWS_MAX_IN = 0.22, 3.0, 30.0  # rows' height: per row, within bounds
_LOAD_IN, _MARGINS_IN = 2.4, 1.8  # the load axes; title, legend and time axis
MAX_LANES, _LANE_IN = 4, 1.4  # engine lanes drawn at most, each this high
_OVERVIEW_IN, _OVERVIEW_LOAD_IN = 2.2, 0.9  # the overview's heatmap and its load
_LABELLED_ROWS = 50  # up to this many rows, each is labelled with its span name and trace id


def figure_size_in(num_rows: int, num_lanes: int = 0, overview: bool = True) -> tuple[float, float]:
    """(width, height) in inches of the picture of ``num_rows`` rows and ``num_lanes`` engine lanes
    (MAX_LANES of them drawn at most), with the overview on top or not."""
    rows_in = min(max(num_rows * _ROW_IN, _ROWS_MIN_IN), _ROWS_MAX_IN)
    return WIDTH_IN, (rows_in + min(num_lanes, MAX_LANES) * _LANE_IN + _LOAD_IN + _MARGINS_IN
                      + (_OVERVIEW_IN + _OVERVIEW_LOAD_IN if overview else 0.0))


def check_format(path: str | Path) -> None:
    """Raises ValueError unless matplotlib can write ``path``'s extension; ImportError without matplotlib."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix.lstrip(".").lower()
    if suffix not in formats:
        raise ValueError(f"cannot draw {str(path)!r}: use one of the extensions {', '.join(sorted(formats))}")


def _finish_colour(finish_reason: str | None) -> str:
    return FINISH_COLOURS.get(finish_reason or "", OTHER_FINISH_COLOUR)


def _draw_lane(ax, lane: Lane, t0_ns: int) -> None:
    """One bar per step (a PolyCollection: a lane may hold 100,000 steps), height its batch's requests."""
    from matplotlib.collections import PolyCollection

    s = lane.steps
    x0, x1 = (s["start_ns"] - t0_ns) / 1e9, (s["end_ns"] - t0_ns) / 1e9
    heights = s["num_requests"].astype(float)
    bars = np.stack([np.stack([x0, x0, x1, x1], axis=1),
                     np.stack([np.zeros_like(heights), heights, heights, np.zeros_like(heights)], axis=1)], axis=2)
    colours = np.where(s["prefill_tokens"] > 0, PHASE_COLOURS["prefill"], PHASE_COLOURS["decode"])
    # edged in their own colour: a step far narrower than a pixel still shows
    ax.add_collection(PolyCollection(bars, facecolors=colours, edgecolors=colours, linewidths=0.3))
    preempted = s["preemptions"] > 0
    ax.scatter((x0[preempted] + x1[preempted]) / 2, heights[preempted], marker="x", color=PREEMPTION_COLOUR, s=25,
               linewidths=1.2, zorder=3, clip_on=False)
    ax.set_ylim(0, max(1.0, float(heights.max())) * 1.2)
    ax.autoscale_view(scalex=True, scaley=False)
    ax.yaxis.get_major_locator().set_params(integer=True)
    instance = lane.instance if len(lane.instance) <= 12 else lane.instance[:8] + "…"
    ax.set_ylabel(f"{instance or lane.service} e{lane.engine}\nbatch", fontsize=8)
    ax.grid(alpha=0.3)


_METRIC_NAMES = {"ttft": "TTFT", "e2e": "e2e latency", "queue": "queue time", "itl": "inter-token latency"}


def _draw_overview(ax, load_ax, overview: dict, t0_ns: int) -> None:
    """The heatmap of every request of the window (columns of whole steps, log-spaced latency buckets)
    and the mean requests waiting and running among them."""
    from matplotlib.colors import LogNorm

    o = overview
    cells = np.array([c for c in o["cells"] if c[1] != o["no_value_bucket"]], np.int64).reshape(-1, 6)
    x_edges = (o["start_us"] + np.arange(o["columns"] + 1) * o["step_us"] - t0_ns / 1e3) / 1e6
    name = _METRIC_NAMES.get(o["metric"], o["metric"])
    without = f"; {o['no_value']} without it" if o["no_value"] else ""
    ax.set_title(f"every one of the window's {o['requests']} requests by start and {name}{without}: darker, more "
                 f"requests; red squares, failed or aborted among them", fontsize=9)
    if len(cells):
        lo, hi = int(cells[:, 1].min()), int(cells[:, 1].max())
        grid = np.zeros((hi - lo + 1, o["columns"]))
        grid[cells[:, 1] - lo, cells[:, 0]] = cells[:, 2]
        y_edges = 10.0 ** (np.arange(lo, hi + 2) / o["per_decade"])
        ax.pcolormesh(x_edges, y_edges, np.ma.masked_equal(grid, 0), cmap="Blues",
                      norm=LogNorm(vmin=1, vmax=max(2.0, grid.max())))
        bad = cells[cells[:, 3] > 0]
        ax.scatter((x_edges[bad[:, 0]] + x_edges[bad[:, 0] + 1]) / 2,
                   np.sqrt(y_edges[bad[:, 1] - lo] * y_edges[bad[:, 1] - lo + 1]), marker="s", s=6,
                   facecolors="none", edgecolors=PREEMPTION_COLOUR, linewidths=0.6, zorder=3)
        ax.set_yscale("log")
    ax.set_ylabel(f"{name} (s)", fontsize=8)
    ax.grid(alpha=0.3)
    load = np.array(o["load"], np.float64).reshape(-1, 3)
    centres = (x_edges[load[:, 0].astype(np.int64)] + x_edges[load[:, 0].astype(np.int64) + 1]) / 2
    for column, field, colour in ((2, "running", PHASE_COLOURS["decode"]), (1, "waiting", PHASE_COLOURS["queue"])):
        load_ax.plot(centres, load[:, column], color=colour, linewidth=1.0, label=f"{field}, every request")
    load_ax.set_ylim(bottom=0)
    load_ax.set_ylabel("mean", fontsize=8)
    load_ax.legend(loc="upper right", fontsize=7)
    load_ax.grid(alpha=0.3)


def draw(rows: list[TimelineRow], points: list[LoadPoint], path: str | Path, dpi: int = 100,
         lanes: Sequence[Lane] = (), overview: dict | None = None) -> None:
    """Draws ``overview`` (the store's heatmap of the window, if given), ``rows`` (ordered by start, not
    empty), their ``points`` and the first MAX_LANES of ``lanes`` into ``path`` (the format by its
    extension), figure_size_in(len(rows), len(lanes), overview is not None) inches at ``dpi``."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    t0_ns = rows[0].start_ns
    n = len(rows)
    drawn_lanes = list(lanes[:MAX_LANES])
    width_in, height_in = figure_size_in(n, len(drawn_lanes), overview is not None)
    top = [_OVERVIEW_IN, _OVERVIEW_LOAD_IN] if overview is not None else []
    rows_in = height_in - len(drawn_lanes) * _LANE_IN - _LOAD_IN - _MARGINS_IN - sum(top)
    fig = Figure(figsize=(width_in, height_in), dpi=dpi, layout="constrained")
    axes = fig.subplots(len(top) + 2 + len(drawn_lanes), 1, sharex=True,
                        height_ratios=[*top, rows_in, *[_LANE_IN] * len(drawn_lanes), _LOAD_IN])
    if overview is not None:
        _draw_overview(axes[0], axes[1], overview, t0_ns)
    ax, *lane_axes, load_ax = axes[len(top):]

    def seconds(t_ns: int) -> float:
        return (t_ns - t0_ns) / 1e9

    ys = range(n)
    failed = [r.finish_reason in ("abort", "error") for r in rows]
    colours = [_finish_colour(r.finish_reason) for r in rows]
    row_pt = rows_in * 72 / max(n, 1)  # a row's height in points, for marker sizes
    ax.hlines(ys, [seconds(r.start_ns) for r in rows], [seconds(r.end_ns) for r in rows], colors=colours,
              linewidth=min(1.5, row_pt / 6))
    ax.scatter([seconds(r.end_ns) for r in rows], ys, marker="s", c=colours, s=min(36, (row_pt * 0.45) ** 2),
               zorder=3, linewidths=0)
    for phase in PHASES:
        drawn = [(y, getattr(r, phase), bad) for y, r, bad in zip(ys, rows, failed) if getattr(r, phase) is not None]
        if drawn:
            ax.barh([y for y, _, _ in drawn], [(b - a) / 1e9 for _, (a, b), _ in drawn],
                    left=[seconds(a) for _, (a, _), _ in drawn], height=0.7, color=PHASE_COLOURS[phase],
                    edgecolor=[PREEMPTION_COLOUR if bad else PHASE_COLOURS[phase] for _, _, bad in drawn],
                    linewidth=min(1.0, row_pt / 10), zorder=2)
    firsts = [(seconds(r.first_token_ns), y) for y, r in zip(ys, rows) if r.first_token_ns is not None]
    ax.scatter([x for x, _ in firsts], [y for _, y in firsts], marker="|", color="black",
               s=min(144, (row_pt * 0.9) ** 2), linewidths=min(1.5, row_pt / 5), zorder=4)
    preempted = [(seconds(t), y) for y, r in zip(ys, rows) for t in r.preemptions_ns]
    ax.scatter([x for x, _ in preempted], [y for _, y in preempted], marker="x", color=PREEMPTION_COLOUR,
               s=min(64, (row_pt * 0.7) ** 2), linewidths=min(1.5, row_pt / 5), zorder=5)
    ax.set_ylim(n - 0.5, -0.5)
    if n <= _LABELLED_ROWS:
        ax.set_yticks(list(ys), [f"{r.name} {r.trace_id[:8]}" for r in rows], fontsize=7)
    else:
        ax.set_ylabel("requests, by start")
    ax.grid(axis="x", alpha=0.3)
    services = ", ".join(sorted({r.service for r in rows}))
    start = datetime.fromtimestamp(t0_ns / 1e9, timezone.utc).isoformat(timespec="milliseconds")
    cut = f"; {len(drawn_lanes)} of {len(lanes)} engine lanes drawn" if len(lanes) > len(drawn_lanes) else ""
    ax.set_title(f"{n} request{'s' * (n != 1)} of {services}, from {start}{cut}", fontsize=10)
    for lane_ax, lane in zip(lane_axes, drawn_lanes):
        _draw_lane(lane_ax, lane, t0_ns)

    xs = [seconds(p.t_ns) for p in points]
    for field, colour in (("running", PHASE_COLOURS["decode"]), ("waiting", PHASE_COLOURS["queue"])):
        values = [getattr(p, field) for p in points]
        load_ax.fill_between(xs, values, step="post", color=colour, alpha=0.35, linewidth=0)
        load_ax.step(xs, values, where="post", color=colour, linewidth=1.2, label=field)
    load_ax.set_ylabel("requests")
    load_ax.set_ylim(bottom=0)
    load_ax.yaxis.get_major_locator().set_params(integer=True)
    load_ax.legend(loc="upper right", fontsize=8)
    load_ax.grid(alpha=0.3)
    load_ax.set_xlabel(f"seconds since the first request's start ({start})")

    reasons = sorted({r.finish_reason or "none" for r in rows})
    handles = [Patch(color=PHASE_COLOURS[p], label=p) for p in PHASES]
    handles += [Line2D([], [], color="black", marker="|", linestyle="", markersize=9, label="first token"),
                Line2D([], [], color=PREEMPTION_COLOUR, marker="x", linestyle="", label="preempted"),
                Patch(facecolor="white", edgecolor=PREEMPTION_COLOUR, label="failed / aborted")]
    handles += [Line2D([], [], color=_finish_colour(None if r == "none" else r), marker="s", label=f"finish: {r}")
                for r in reasons]
    fig.legend(handles=handles, loc="outside upper center", ncols=min(len(handles), 8), fontsize=8, frameon=False)
    fig.savefig(path, dpi=dpi)
