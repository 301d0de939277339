"""The report's charts other than the cluster picture (see gantt.py): delivery against what
was owed, usage ratios, queue waits, preemptions and checkpoint storage. Each returns the HTML of
a figure (svg.py: a title, a legend and SVG panels), drawn from series binned beforehand.

Numbers printed on a chart (p90s, attainment, counts) come from the run's metrics dict, the same
one written to metrics.json; the curves come from the event log (runlog.py).
"""

from __future__ import annotations

import numpy as np

from ..durations import format_duration_s
from . import series, svg
from .palette import DAY_S, HOUR_S, REASON_COLORS, policy_color, time_axis
from .runlog import RunLog


def programs_of(teams: list[str]) -> dict[str, list[int]]:
    """Program (first path component) -> indices of its teams."""
    out: dict[str, list[int]] = {}
    for i, t in enumerate(teams):
        out.setdefault(t.split("/")[0], []).append(i)
    return out


def _x_ticks(end: float) -> tuple[list[float], list[str]]:
    ticks = svg.nice_ticks(0.0, end, 5)
    return ticks, [svg.tick_label(t) for t in ticks]


def _y_ticks(top: float, n: int = 4) -> tuple[list[float], list[str]]:
    ticks = svg.nice_ticks(0.0, top, n)
    return ticks, [svg.tick_label(t) for t in ticks]


def delivery_figure(policy: str, th: series.TeamHours, labels: list[str], sub_titles: list[str],
                    hours_per_bin: int, colors: list) -> str:
    """Small multiples: GPU time delivered to funded work and to the rest (stacked) against
    what funded work was owed.

    ``th`` rows are teams or programs; values are shown as mean GPUs over each bin so the
    scale does not depend on the bin width (each panel's series carry these values)."""
    funded = series.rebin(th.funded, hours_per_bin)
    other = series.rebin(th.other, hours_per_bin)
    owed = series.rebin(th.owed, hours_per_bin)
    edges = th.edges_s[::hours_per_bin]
    edges = np.append(edges, th.edges_s[-1]) if edges[-1] != th.edges_s[-1] else edges
    width_s = np.diff(edges)
    width_s[width_s == 0] = 1
    scale_s, unit = time_axis(edges[-1])
    x = edges / scale_s
    xt, xl = _x_ticks(x[-1])
    panels = []
    for i, label in enumerate(labels):
        a, u, o = funded[i] / width_s, other[i] / width_s, owed[i] / width_s
        top = max(1.0, float(np.max(a + u, initial=0)), float(np.max(o, initial=0))) * 1.08
        p = svg.Panel((0.0, x[-1]), (0.0, top))
        yt, yl = _y_ticks(top)
        p.axes(xt, xl, yt, yl, f"time ({unit}), {hours_per_bin} h bins", "GPUs (mean per bin)" if i % 4 == 0 else "")
        p.stairs(x, a, fill=colors[i], opacity=0.9, data=f' data-series="funded" data-values="{svg.values_attr(a)}"')
        p.stairs(x, a + u, baseline=a, fill=colors[i], opacity=0.3,
                 data=f' data-series="other" data-values="{svg.values_attr(u)}"')
        p.stairs(x, a + u, baseline=a, fill=svg.HATCH)
        p.stairs(x, o, stroke="#000", width=1.2, data=f' data-series="owed" data-values="{svg.values_attr(o)}"')
        panels.append((f"{label}\n{sub_titles[i]}", p.svg(label)))
    keys = [svg.key("fill", "#808080", "delivered to funded work"),
            svg.key("hatch", "#808080", "delivered to other work (min runtime 0, or no budget): owed to no one"),
            svg.key("line", "#000", "owed = min(fraction x pool GPUs, GPUs funded work asked for)")]
    return svg.figure_body(f"{policy}: delivered GPU time against what funded work was owed", keys, panels)


def ratio_figure(curves: dict[str, list[np.ndarray]], at_s: np.ndarray, labels: list[str],
                 window_s: float) -> str:
    """Usage ratio over time per team (or program): one line per policy, 1.0 = exactly its share."""
    scale_s, unit = time_axis(at_s[-1] if len(at_s) else 0)
    x = at_s / scale_s
    end = float(x[-1]) if len(x) else 1.0
    xt, xl = _x_ticks(end)
    panels = []
    for i, label in enumerate(labels):
        peak = max((float(np.nanmax(c[i])) for c in curves.values() if len(c[i]) and np.isfinite(c[i]).any()),
                   default=1.0)
        top = max(1.1, peak * 1.05)
        p = svg.Panel((0.0, end), (0.0, top))
        yt, yl = _y_ticks(top)
        p.axes(xt, xl, yt, yl, f"time ({unit})", "usage ratio" if i % 4 == 0 else "")
        p.hline(1.0, "#000", 0.7, "4 3")
        for j, (policy, per_row) in enumerate(curves.items()):
            p.line(x, per_row[i], policy_color(policy, j), 1.1,
                   data=f' data-policy="{policy}" data-values="{svg.values_attr(per_row[i])}"')
        panels.append((label, p.svg(label)))
    keys = [svg.key("line", policy_color(p, j), p) for j, p in enumerate(curves)]
    keys.append(svg.key("dash", "#000", "1.0 = used exactly its share"))
    return svg.figure_body(f"usage ratio = allocated GPU-s in the last {format_duration_s(window_s)} / "
                           "(fraction x pool GPUs x window)", keys, panels)


#: the CDF is drawn at this many waits, spaced evenly on the log axis (about a pixel column each)
CDF_POINTS = 300
_WAIT_TICKS = ((1, "≤1s"), (60, "1m"), (600, "10m"), (HOUR_S, "1h"), (6 * HOUR_S, "6h"), (DAY_S, "1d"),
               (7 * DAY_S, "7d"), (30 * DAY_S, "30d"))


def cdf_at(wait_s: np.ndarray, at_s: np.ndarray) -> np.ndarray:
    """Share of ``wait_s`` at most each of ``at_s`` (a wait under 1 s counts as 1 s: the axis is
    logarithmic and starts there)."""
    w = np.sort(np.maximum(wait_s, 1.0))
    return np.searchsorted(w, at_s, side="right") / max(1, len(w))


def waits_figure(logs: dict[str, RunLog], metrics: dict[str, dict]) -> str:
    """CDF of first queue waits, one panel per workload kind (and all), a line per policy.

    The p90 and count in each panel's title are read from metrics.json, not recomputed. The
    curves are the CDF at ``CDF_POINTS`` waits from 1 s to the longest (``data-x``)."""
    kinds = sorted({k for log in logs.values() for k in log.kinds})
    longest = max((float(log.wait_s.max()) for log in logs.values() if len(log.wait_s)), default=1.0)
    x_end = max(10.0, longest * 1.2)
    at = np.geomspace(1.0, x_end, CDF_POINTS)
    ticks = [(t, s) for t, s in _WAIT_TICKS if t <= x_end]
    panels = []
    for panel in ["all workloads", *kinds]:
        p = svg.Panel((1.0, x_end), (0.0, 1.03), w=420, h=230, xlog=True)
        p.axes([t for t, _ in ticks], [s for _, s in ticks], [0, 0.25, 0.5, 0.75, 1.0],
               ["0", "0.25", "0.5", "0.75", "1"], "wait from submission to first start (log scale)",
               "share of workloads")
        p.hline(0.9, "#808080", 0.6, "1 2")
        p90s, counts = [], set()
        for j, (policy, log) in enumerate(logs.items()):
            if panel == "all workloads":
                w = log.wait_s
                stats = metrics[policy]["queue_wait_s"]["overall"]
            elif panel in log.kinds:
                w = log.wait_s[log.wait_kind == log.kinds.index(panel)]
                stats = metrics[policy]["queue_wait_s"]["by_kind"].get(panel)
            else:
                continue
            if not len(w) or stats is None:
                continue
            p90s.append(f"{policy} {format_duration_s(stats['p90'])}")
            counts.add(stats["count"])
            y = cdf_at(w, at)
            p.steps(at, y, policy_color(policy, j), 1.2,
                    data=f' data-policy="{policy}" data-x="{svg.values_attr(at)}" data-values="{svg.values_attr(y)}"')
        n = f" (n={counts.pop():,})" if len(counts) == 1 else ""  # the same workloads under every policy
        panels.append((f"{panel}{n}\np90: {' · '.join(p90s) or '–'}", p.svg(panel)))
    keys = [svg.key("line", policy_color(p, j), p) for j, p in enumerate(logs)]
    keys.append(svg.key("dot", "#808080", "0.9 (the p90)"))
    return svg.figure_body("queue waits (work still pending at the end counts with its wait so far)", keys, panels,
                           cols=3)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def preemption_counts(log: RunLog, reasons: list[str], edges_s: np.ndarray) -> dict[str, np.ndarray]:
    """Preemptions per bin between ``edges_s``, per reason."""
    reason_arr = np.array(log.preempt_reason, dtype=object)
    return {r: series.count_per_bin(log.preempt_t_s[reason_arr == r], edges_s) if len(reason_arr)
            else np.zeros(len(edges_s) - 1, np.int64) for r in reasons}


def preemptions_figure(logs: dict[str, RunLog], metrics: dict[str, dict]) -> str:
    """Preemptions per bin by reason (stacked), drains and node failures as markers; one panel
    per policy."""
    end_s = max(log.end_s for log in logs.values())
    hours = 1 if end_s <= 4 * DAY_S else 6
    edges = np.arange(0.0, end_s + hours * HOUR_S, hours * HOUR_S)
    scale_s, unit = time_axis(end_s)
    reasons = sorted({r for log in logs.values() for r in log.preempt_reason})
    xt, xl = _x_ticks(end_s / scale_s)
    parts = []
    for policy, log in logs.items():
        counts = preemption_counts(log, reasons, edges)
        total = sum(counts.values(), np.zeros(len(edges) - 1))
        top = max(1.0, float(total.max(initial=0))) * 1.25
        p = svg.Panel((0.0, end_s / scale_s), (0.0, top), w=1100, h=200, left=50)
        yt, yl = _y_ticks(top)
        p.axes(xt, xl, yt, yl, f"time since start of run ({unit})", f"preemptions per {hours} h")
        bottom = np.zeros(len(edges) - 1)
        for r in reasons:
            c = counts[r].astype(np.float64)
            nz = c > 0
            p.rects(edges[:-1][nz] / scale_s, edges[1:][nz] / scale_s, bottom[nz], (bottom + c)[nz],
                    REASON_COLORS.get(r, "#999999"), f' data-reason="{r}"')
            p.parts.append(f'<g data-reason="{r}" data-values="{svg.values_attr(c)}"/>')
            bottom = bottom + c
        for t, node, kind, human in log.node_events:
            if kind in ("unhealthy", "failed"):
                p.marker(t / scale_s, top * 0.93, "v" if kind == "unhealthy" else "x",
                         "#d00000" if human else "#000", node)
        by_reason = metrics[policy]["preemptions_by_reason"]
        drains = metrics[policy]["drains"]
        title = (f"{policy}: {_count(metrics[policy]['preemptions'], 'preemption')}, "
                 f"{_count(drains['total'], 'drain')} ({drains['needing_human']} needing a human), "
                 f"{_count(metrics[policy]['node_failures'], 'node failure')}")
        keys = [svg.key("fill", REASON_COLORS.get(r, "#999999"), f"{r} ({by_reason.get(r, 0)})") for r in reasons]
        keys += [svg.key("v", "#000", "drain (automatic)"), svg.key("v", "#d00000", "drain needing a human"),
                 svg.key("x", "#000", "node failure")]
        parts.append(svg.figure_body(title, keys, [("", p.svg(policy))], cols=1))
    return "".join(parts)


def storage_figure(metrics: dict[str, dict]) -> str:
    """The checkpoint storage's demand over time (the highest of each hour, GB/s) per policy,
    with its peak and the bandwidth when the cluster sets one."""
    hours = max((len(m["checkpoint_storage"]["hourly_peak_gbps"]) for m in metrics.values()
                 if "checkpoint_storage" in m), default=1)
    scale_s, unit = time_axis(hours * HOUR_S)
    curves, bandwidth, keys = [], None, []
    for j, (policy, m) in enumerate(metrics.items()):
        storage = m.get("checkpoint_storage")
        if not storage:
            continue
        curves.append((policy, j, np.array(storage["hourly_peak_gbps"], dtype=float)))
        keys.append(svg.key("line", policy_color(policy, j), f"{policy} (peak {storage['peak_gbps']:.1f} GB/s, "
                                                            f"{storage['written_gb']:,.0f} GB written)"))
        bandwidth = storage["bandwidth_gbps"] or bandwidth
    top = max([float(y.max(initial=0)) for _, _, y in curves] + [bandwidth or 0, 0.1]) * 1.1
    end = hours * HOUR_S / scale_s
    p = svg.Panel((0.0, end), (0.0, top), w=1100, h=200, left=50)
    xt, xl = _x_ticks(end)
    yt, yl = _y_ticks(top)
    p.axes(xt, xl, yt, yl, f"time since start of run ({unit})", "checkpoint writes (GB/s)")
    for policy, j, y in curves:
        p.steps(np.arange(len(y)) * HOUR_S / scale_s, y, policy_color(policy, j), 1.0,
                data=f' data-policy="{policy}" data-values="{svg.values_attr(y)}"')
    if bandwidth:
        p.hline(bandwidth, "#d00000", 1.0, "5 3")
        keys.append(svg.key("dash", "#d00000", f"bandwidth {bandwidth:g} GB/s"))
    return svg.figure_body("checkpoint storage", keys, [("", p.svg("checkpoint storage"))], cols=1)
