"""The cluster picture as Ai2 drew it: one row per GPU, one bar per workload run.

Bars are coloured by team with a shade per workload, hatched where the workload could be
interrupted (unallocated work, allocated work past its protected minimum runtime) and end in a
red tick where it was preempted. The picture is one SVG panel (svg.py): a rectangle per bar
and GPU row in the time range, the hatching a pattern fill the browser draws, the preemptions
one path.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
from ..durations import format_duration_s
from . import svg
from .palette import DAY_S, HOUR_S, time_axis
from .runlog import GpuRows, RunLog

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


def draw_gantt(log: RunLog, rows: GpuRows, view: GanttView, colors: dict[str, tuple]) -> str:
    """One panel: the GPUs of the cluster over ``view``'s time range under one policy (HTML)."""
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

    # a shade per workload run shown (a month has tens of thousands; two days show a few thousand)
    shown, bar_of = np.unique(seg, return_inverse=True)
    base = np.array([colors[t][:3] for t in log.teams])
    rgb = _workload_shades(base[log.seg_team[shown]], [log.seg_workload[i] for i in shown.tolist()])
    shade = ["#%02x%02x%02x" % tuple(c) for c in np.clip(np.round(rgb * 255), 0, 255).astype(int).tolist()]
    fills = [shade[i] for i in bar_of.tolist()]

    n_rows = view.shown_rows
    row_px = min(8.0, max(2.0, 640 / max(1, n_rows)))  # px per GPU row: 256 rows -> 640 px
    p = svg.Panel((view.start_s / scale_s, view.end_s / scale_s), (-0.5, n_rows - 0.5), w=1100,
                  h=int(n_rows * row_px) + 46, left=70, top=6, bottom=40, y_down=True)
    ticks = _row_ticks(rows, view)
    xt = svg.nice_ticks(view.start_s / scale_s, view.end_s / scale_s, 8)
    p.axes(xt, [svg.tick_label(t) for t in xt], [t for t, _ in ticks], [n for _, n in ticks],
           f"time since start of run ({unit})", "node / GPU", grid=False)
    p.rects(x0 / scale_s, x1 / scale_s, y - 0.45, y + 0.45, fills, min_w=0.3)
    hatched = xi < x1
    if hatched.any():
        p.rects(xi[hatched] / scale_s, x1[hatched] / scale_s, y[hatched] - 0.45, y[hatched] + 0.45, svg.HATCH)
    # out-of-service nodes (unhealthy -> repaired) as a grey band over their rows
    _draw_node_outages(p, log, rows, view, scale_s)
    preempted = (log.seg_end[seg] == 2) & (t1[keep] <= view.end_s)
    if preempted.any():
        p.vticks(x1[preempted] / scale_s, y[preempted] - 0.5, y[preempted] + 0.5, "#e00000", 1.6)
    teams_shown = sorted({log.teams[i] for i in np.unique(log.seg_team[shown])})
    keys = [svg.key("fill", colors[t], t) for t in teams_shown]
    keys += [svg.key("hatch", "#000", "interruptible"), svg.key("line", "#e00000", "preempted"),
             svg.key("band", "#808080", "node out of service")]
    title = f"{log.policy}: GPUs over {(view.end_s - view.start_s) / HOUR_S:.0f} h ({view.shown_rows} rows)"
    return svg.figure_body(title, keys, [("", p.svg(title))], cols=1)


def _draw_node_outages(p: svg.Panel, log: RunLog, rows: GpuRows, view: GanttView, scale_s: float) -> None:
    since: dict[str, float] = {}
    spans = []
    for t, node, kind, _ in log.node_events:
        if kind in ("unhealthy", "failed"):
            since.setdefault(node, t)
        elif kind == "repaired" and node in since:
            spans.append((node, since.pop(node), t))
    spans += [(node, t, view.end_s) for node, t in since.items()]
    boxes = []
    for node, a, b in spans:
        a, b = max(a, view.start_s), min(b, view.end_s)
        if b <= a:
            continue
        first = rows.node_base[node]
        last = first + rows.node_gpus[node] - 1
        lo, hi = math.ceil(first / view.row_stride), last // view.row_stride
        if hi < lo:
            continue
        boxes.append((a / scale_s, b / scale_s, lo - 0.5, hi + 0.5))
    if boxes:
        a, b, lo, hi = (np.array(c) for c in zip(*boxes))
        p.rects(a, b, lo, hi, "#808080", ' fill-opacity="0.35" stroke="#000" stroke-width="0.8"')


def _row_ticks(rows: GpuRows, view: GanttView) -> list[tuple[int, str]]:
    """About 16 nodes named on the y axis, at the row of their first shown GPU."""
    names = list(rows.node_base)
    step = max(1, math.ceil(len(names) / 16))
    return [(math.ceil(rows.node_base[name] / view.row_stride), name) for name in names[::step]]
