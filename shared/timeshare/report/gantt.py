"""The cluster picture as Ai2 drew it: one row per GPU, one bar per workload run.

Bars are coloured by team with a shade per workload, hatched where the workload could be
interrupted (unallocated work, allocated work past its protected minimum runtime) and end in a
red tick where it was preempted. All bars go into two PolyCollections (solid bodies, hatched
overlays) and one LineCollection (preemptions): one draw call each instead of one patch per
bar, which is what keeps 1024 GPUs x 30 days to about a second.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.lines import Line2D

from .runlog import GpuRows, RunLog
from ..durations import format_duration_s
from .style import DAY_S, HOUR_S, time_axis

#: default time range when none is chosen: two days in the middle of the run
DEFAULT_WINDOW_S = 2 * DAY_S


@dataclass(frozen=True)
class GanttView:
    """What part of the run the picture shows and how the GPU rows were thinned out."""

    start_s: float
    end_s: float
    row_stride: int  # keep GPU rows whose index is a multiple of this
    total_rows: int

    @property
    def shown_rows(self) -> int:
        return math.ceil(self.total_rows / self.row_stride)

    def describe(self, gpus_per_node: int | None) -> str:
        if self.row_stride == 1:
            return f"all {self.total_rows} GPUs, one row each"
        which = ""
        if gpus_per_node and self.row_stride < gpus_per_node and gpus_per_node % self.row_stride == 0:
            ids = ", ".join(str(g) for g in range(0, gpus_per_node, self.row_stride))
            which = f" (GPU {ids} of every node)"
        elif gpus_per_node and self.row_stride % gpus_per_node == 0:
            which = f" (GPU 0 of every {self.row_stride // gpus_per_node}th node)"
        return (f"every {self.row_stride}th GPU: {self.shown_rows} of {self.total_rows} rows{which}; "
                "whole-node gangs appear on every shown row of their nodes")


def choose_view(end_s: float, total_rows: int, window: tuple[float, float] | None = None,
                max_rows: int = 256) -> GanttView:
    if window is None:
        if end_s <= DEFAULT_WINDOW_S:
            window = (0.0, end_s)
        else:
            mid = end_s / 2
            window = (mid - DEFAULT_WINDOW_S / 2, mid + DEFAULT_WINDOW_S / 2)
    start, end = max(0.0, float(window[0])), min(float(end_s), float(window[1]))
    if end <= start:
        raise ValueError(f"empty time range {format_duration_s(window[0])}..{format_duration_s(window[1])} "
                         f"for a run of {format_duration_s(end_s)}")
    stride = max(1, math.ceil(total_rows / max_rows))
    return GanttView(start, end, stride, total_rows)


def _workload_shades(base_rgb: np.ndarray, workload_ids: list[str]) -> np.ndarray:
    """Lighten or darken each workload's team colour by a stable hash of its id."""
    h = np.array([zlib.crc32(w.split("~")[0].encode()) for w in workload_ids], dtype=np.float64)
    # -0.12 (darker) .. +0.12 (lighter): the hue stays the team's; narrow, since the teams of a
    # program are shades of one hue (style.team_colors)
    f = (h % 1000) / 1000 * 0.24 - 0.12
    f = f[:, None]
    return np.where(f > 0, base_rgb + (1 - base_rgb) * f, base_rgb * (1 + f))


def _rects(x0: np.ndarray, x1: np.ndarray, y: np.ndarray, half: float) -> np.ndarray:
    verts = np.empty((len(x0), 4, 2))
    verts[:, 0, 0] = x0
    verts[:, 1, 0] = x0
    verts[:, 2, 0] = x1
    verts[:, 3, 0] = x1
    verts[:, 0, 1] = y - half
    verts[:, 1, 1] = y + half
    verts[:, 2, 1] = y + half
    verts[:, 3, 1] = y - half
    return verts


def draw_gantt(log: RunLog, rows: GpuRows, view: GanttView, colors: dict[str, tuple]) -> Figure:
    """One panel: the GPUs of the cluster over ``view``'s time range under one policy."""
    scale_s, unit = time_axis(view.end_s - view.start_s)
    # which GPU-rows are in the time range and shown
    t0 = log.seg_t0_s[log.row_seg]
    t1 = log.seg_t1_s[log.row_seg]
    keep = (t1 > view.start_s) & (t0 < view.end_s) & (log.gpu_row % view.row_stride == 0) & (t1 > t0)
    seg = log.row_seg[keep]
    y = (log.gpu_row[keep] // view.row_stride).astype(np.float64)
    x0 = np.maximum(t0[keep], view.start_s)
    x1 = np.minimum(t1[keep], view.end_s)
    xi = np.clip(log.seg_interruptible_from_s[seg], x0, x1)

    base = np.array([colors[t][:3] for t in log.teams])
    seg_rgb = _workload_shades(base[log.seg_team], log.seg_workload) if len(log.seg_team) else np.zeros((0, 3))
    rgb = seg_rgb[seg]

    n_rows = view.shown_rows
    height_in = min(16.0, max(3.0, 0.028 * n_rows + 1.6))
    fig = Figure(figsize=(14, height_in), dpi=100)
    ax = fig.add_subplot()
    ax.add_collection(PolyCollection(_rects(x0 / scale_s, x1 / scale_s, y, 0.45), facecolors=rgb,
                                     edgecolors="none", linewidths=0, antialiased=False))
    # layout first: the hatch raster is computed at the axes' exact pixel size
    top_in, bottom_in = 0.45, 0.6
    fig.subplots_adjust(left=0.08, right=0.84, top=1 - top_in / height_in, bottom=bottom_in / height_in)
    hatched = xi < x1
    if hatched.any():
        _draw_hatch(ax, fig, view, scale_s, y[hatched].astype(np.int64), xi[hatched], x1[hatched], n_rows)
    # out-of-service nodes (unhealthy -> repaired) as a grey band over their rows
    _draw_node_outages(ax, log, rows, view, scale_s)
    preempted = (log.seg_end[seg] == 2) & (t1[keep] <= view.end_s)
    if preempted.any():
        xp = x1[preempted] / scale_s
        yp = y[preempted]
        lines = np.stack([np.stack([xp, yp - 0.5], 1), np.stack([xp, yp + 0.5], 1)], 1)
        ax.add_collection(LineCollection(lines, colors="red", linewidths=1.6, zorder=3))
    ax.set_xlim(view.start_s / scale_s, view.end_s / scale_s)
    ax.set_ylim(n_rows - 0.5, -0.5)  # GPU 0 of the first node at the top
    _label_rows(ax, rows, view)
    ax.set_xlabel(f"time since start of run ({unit})")
    ax.set_title(f"{log.policy}: GPUs over {(view.end_s - view.start_s) / HOUR_S:.0f} h "
                 f"({view.shown_rows} rows)", loc="left")
    teams_shown = sorted({log.teams[i] for i in np.unique(log.seg_team[seg])}) if len(seg) else []
    handles = [Patch(facecolor=colors[t], label=t) for t in teams_shown]
    handles += [Patch(facecolor="white", edgecolor="black", hatch="////", label="interruptible"),
                Line2D([], [], color="red", lw=2, label="preempted"),
                Patch(facecolor=(0.5, 0.5, 0.5, 0.35), label="node out of service")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    return fig


def _draw_hatch(ax, fig, view: GanttView, scale_s: float, row: np.ndarray, x0_s: np.ndarray,
                x1_s: np.ndarray, n_rows: int) -> None:
    """Hatch the interruptible spans as one transparent RGBA image over the bars.

    Matplotlib hatches each polygon as its own clipped path: ~1 s per 10k bars. Marking the
    spans in a (rows x pixel columns) grid with +1/-1 at their ends and a cumulative sum is a
    few milliseconds for any number of bars (a GPU holds one workload at a time, so spans on a
    row never overlap)."""
    pos = ax.get_position()
    w_px = max(1, int(round(pos.width * fig.get_figwidth() * fig.dpi)))
    h_px = max(1, int(round(pos.height * fig.get_figheight() * fig.dpi)))
    span_s = view.end_s - view.start_s
    c0 = np.clip(np.floor((x0_s - view.start_s) / span_s * w_px), 0, w_px).astype(np.int64)
    c1 = np.clip(np.floor((x1_s - view.start_s) / span_s * w_px), 0, w_px).astype(np.int64)
    diff = np.zeros((n_rows, w_px + 1), dtype=np.int32)
    np.add.at(diff, (row, c0), 1)
    np.add.at(diff, (row, c1), -1)
    spans = np.cumsum(diff, axis=1)[:, :w_px] > 0
    row_pos = (np.arange(h_px) + 0.5) / h_px * n_rows  # pixel row -> position in GPU rows
    inside_bar = np.abs(row_pos % 1 - 0.5) < 0.45  # bars are 0.9 rows tall
    on_stripe = ((np.arange(w_px)[None, :] + np.arange(h_px)[:, None]) % 5) < 1  # 45-degree lines
    mask = spans[row_pos.astype(np.int64)] & on_stripe & inside_bar[:, None]
    rgba = np.zeros((h_px, w_px, 4), dtype=np.float32)
    rgba[mask, 3] = 0.55  # black lines, partly transparent so the team colour shows through
    ax.imshow(rgba, extent=(view.start_s / scale_s, view.end_s / scale_s, n_rows - 0.5, -0.5),
              aspect="auto", interpolation="nearest", zorder=2.5)


def _draw_node_outages(ax, log: RunLog, rows: GpuRows, view: GanttView, scale_s: float) -> None:
    since: dict[str, float] = {}
    spans = []
    for t, node, kind, _ in log.node_events:
        if kind in ("unhealthy", "failed"):
            since.setdefault(node, t)
        elif kind == "repaired" and node in since:
            spans.append((node, since.pop(node), t))
    spans += [(node, t, view.end_s) for node, t in since.items()]
    verts = []
    for node, a, b in spans:
        a, b = max(a, view.start_s), min(b, view.end_s)
        if b <= a:
            continue
        first = rows.node_base[node]
        last = first + rows.node_gpus[node] - 1
        lo, hi = math.ceil(first / view.row_stride), last // view.row_stride
        if hi < lo:
            continue
        verts.append([(a / scale_s, lo - 0.5), (a / scale_s, hi + 0.5), (b / scale_s, hi + 0.5),
                      (b / scale_s, lo - 0.5)])
    if verts:
        ax.add_collection(PolyCollection(verts, facecolors=(0.5, 0.5, 0.5, 0.35), edgecolors="black",
                                         linewidths=0.8, zorder=3))


def _label_rows(ax, rows: GpuRows, view: GanttView) -> None:
    """Name about 16 nodes on the y axis, at the row of their first shown GPU."""
    names = list(rows.node_base)
    step = max(1, math.ceil(len(names) / 16))
    ticks, labels = [], []
    for name in names[::step]:
        ticks.append(math.ceil(rows.node_base[name] / view.row_stride))
        labels.append(name)
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_ylabel("node / GPU")
