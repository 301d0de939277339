"""The report's charts other than the cluster picture (see gantt.py): delivery against what
was owed, usage ratios, queue waits, preemptions and drains. Each returns a matplotlib Figure.

Numbers printed on a chart (p90s, attainment, counts) come from the run's metrics dict, the same
one written to metrics.json; the curves come from the event log (runlog.py).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ..durations import format_duration_s
from . import series
from .runlog import RunLog
from .style import DAY_S, HOUR_S, REASON_COLORS, finish_grid, grid, panel_title, policy_color, time_axis


def programs_of(teams: list[str]) -> dict[str, list[int]]:
    """Program (first path component) -> indices of its teams."""
    out: dict[str, list[int]] = {}
    for i, t in enumerate(teams):
        out.setdefault(t.split("/")[0], []).append(i)
    return out


def delivery_figure(policy: str, th: series.TeamHours, labels: list[str], sub_titles: list[str],
                    hours_per_bin: int, colors: list) -> Figure:
    """Small multiples: GPU time delivered to funded work and to the rest (stacked) against
    what funded work was owed.

    ``th`` rows are teams or programs; values are shown as mean GPUs over each bin so the
    scale does not depend on the bin width."""
    funded = series.rebin(th.funded, hours_per_bin)
    other = series.rebin(th.other, hours_per_bin)
    owed = series.rebin(th.owed, hours_per_bin)
    edges = th.edges_s[::hours_per_bin]
    edges = np.append(edges, th.edges_s[-1]) if edges[-1] != th.edges_s[-1] else edges
    width_s = np.diff(edges)
    width_s[width_s == 0] = 1
    scale_s, unit = time_axis(edges[-1])
    x = edges / scale_s
    g = grid(len(labels))
    for i, ax in enumerate(g.axes):
        a = funded[i] / width_s
        u = other[i] / width_s
        ax.stairs(a, x, fill=True, color=colors[i], alpha=0.9)
        ax.stairs(a + u, x, baseline=a, fill=True, facecolor="none", edgecolor=colors[i], hatch="////", lw=0)
        ax.stairs(owed[i] / width_s, x, color="black", lw=1.2)
        panel_title(g, ax, f"{labels[i]}\n{sub_titles[i]}")
        _panel_axes(ax, "GPUs (mean per bin)", f"time ({unit}), {hours_per_bin} h bins")
    handles = [Patch(facecolor="grey", label="delivered to funded work"),
               Patch(facecolor="white", edgecolor="grey", hatch="////",
                     label="delivered to other work (min runtime 0, or no budget): owed to no one"),
               Line2D([], [], color="black", label="owed = min(fraction x pool GPUs, GPUs funded work asked for)")]
    return finish_grid(g, f"{policy}: delivered GPU time against what funded work was owed", handles)


def _panel_axes(ax, ylabel: str, xlabel: str) -> None:
    ax.xaxis.set_major_locator(MaxNLocator(5, integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(4))
    ax.xaxis.set_tick_params(labelbottom=True)
    ax.tick_params(labelsize=7)
    ax.set_ylim(bottom=0)
    if ax.get_subplotspec().is_first_col():
        ax.set_ylabel(ylabel, fontsize=8)
    ax.set_xlabel(xlabel, fontsize=7)


def ratio_figure(curves: dict[str, list[np.ndarray]], at_s: np.ndarray, labels: list[str],
                 window_s: float) -> Figure:
    """Usage ratio over time per team (or program): one line per policy, 1.0 = exactly its share."""
    scale_s, unit = time_axis(at_s[-1] if len(at_s) else 0)
    g = grid(len(labels))
    for i, ax in enumerate(g.axes):
        for j, (policy, per_row) in enumerate(curves.items()):
            ax.plot(at_s / scale_s, per_row[i], color=policy_color(policy, j), lw=1.1)
        ax.axhline(1.0, color="black", lw=0.7, ls="--")
        panel_title(g, ax, labels[i])
        _panel_axes(ax, "usage ratio", f"time ({unit})")
    handles = [Line2D([], [], color=policy_color(p, j), label=p) for j, p in enumerate(curves)]
    handles.append(Line2D([], [], color="black", ls="--", label="1.0 = used exactly its share"))
    return finish_grid(g, f"usage ratio = allocated GPU-s in the last {format_duration_s(window_s)} / "
                          "(fraction x pool GPUs x window)", handles)


def _cdf_x(wait_s: np.ndarray) -> np.ndarray:
    return np.maximum(np.sort(wait_s), 1.0)  # a log axis has no 0: show "started at once" at 1 s


def waits_figure(logs: dict[str, RunLog], metrics: dict[str, dict]) -> Figure:
    """CDF of first queue waits, one panel per workload kind (and all), a line per policy.

    The p90 and count in each panel's title are read from metrics.json, not recomputed; the
    policies' colours are in the legend above the panels, so no legend covers a curve."""
    kinds = sorted({k for log in logs.values() for k in log.kinds})
    panels = ["all workloads", *kinds]
    g = grid(len(panels), ncols=3, w=4.6, h=3.3, hspace=0.6)
    for ax, panel in zip(g.axes, panels):
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
            x = _cdf_x(w)
            y = np.arange(1, len(x) + 1) / len(x)
            ax.step(x, y, where="post", color=policy_color(policy, j))
        ax.axhline(0.9, color="grey", lw=0.6, ls=":")
        ax.set_xscale("log")
        ax.set_xlim(1, None)
        ticks = [1, 60, 600, HOUR_S, 6 * HOUR_S, DAY_S, 7 * DAY_S]
        ax.set_xticks(ticks, ["≤1s", "1m", "10m", "1h", "6h", "1d", "7d"])
        ax.set_ylim(0, 1.03)  # (a curve at 1.0 from the start stays visible)
        ax.xaxis.set_tick_params(labelbottom=True)
        n = f" (n={counts.pop():,})" if len(counts) == 1 else ""  # the same workloads under every policy
        panel_title(g, ax, f"{panel}{n}\np90: {' · '.join(p90s) or '–'}", fontsize=9)
        ax.set_xlabel("wait from submission to first start (log scale)", fontsize=8)
        ax.set_ylabel("share of workloads", fontsize=8)
        ax.tick_params(labelsize=7)
    handles = [Line2D([], [], color=policy_color(p, j), label=p) for j, p in enumerate(logs)]
    handles.append(Line2D([], [], color="grey", lw=0.6, ls=":", label="0.9 (the p90)"))
    return finish_grid(g, "queue waits (work still pending at the end counts with its wait so far)", handles)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def preemptions_figure(logs: dict[str, RunLog], metrics: dict[str, dict]) -> Figure:
    """Preemptions per bin by reason (stacked), drains as markers; one panel per policy."""
    end_s = max(log.end_s for log in logs.values())
    hours = 1 if end_s <= 4 * DAY_S else 6
    edges = np.arange(0.0, end_s + hours * HOUR_S, hours * HOUR_S)
    scale_s, unit = time_axis(end_s)
    reasons = sorted({r for log in logs.values() for r in log.preempt_reason})
    height = 2.6 * len(logs) + 0.6
    fig = Figure(figsize=(14, height), dpi=100)
    axes = fig.subplots(len(logs), 1, squeeze=False, sharex=True).ravel()
    fig.subplots_adjust(left=0.06, right=0.83, top=1 - 0.35 / height, bottom=0.55 / height, hspace=0.35)
    for ax, (policy, log) in zip(axes, logs.items()):
        bottom = np.zeros(len(edges) - 1)
        reason_arr = np.array(log.preempt_reason, dtype=object)
        by_reason = metrics[policy]["preemptions_by_reason"]
        for r in reasons:
            counts = series.count_per_bin(log.preempt_t_s[reason_arr == r], edges) if len(reason_arr) else bottom * 0
            ax.bar(edges[:-1] / scale_s, counts, width=np.diff(edges) / scale_s, bottom=bottom, align="edge",
                   color=REASON_COLORS.get(r, "#999999"), label=f"{r} ({by_reason.get(r, 0)})")
            bottom = bottom + counts
        top = max(1.0, bottom.max()) * 1.15
        drains = metrics[policy]["drains"]
        for t, node, kind, human in log.node_events:
            if kind in ("unhealthy", "failed"):
                marker = "v" if kind == "unhealthy" else "X"
                ax.plot([t / scale_s], [top * 0.95], marker=marker, ms=9, ls="none",
                        color="red" if human else "black")
                ax.annotate(node, (t / scale_s, top * 0.95), xytext=(4, -3), textcoords="offset points",
                            fontsize=7)
        ax.set_ylim(0, top * 1.05)
        ax.set_ylabel(f"preemptions per {hours} h", fontsize=8)
        ax.set_title(f"{policy}: {_count(metrics[policy]['preemptions'], 'preemption')}, "
                     f"{_count(drains['total'], 'drain')} ({drains['needing_human']} needing a human), "
                     f"{_count(metrics[policy]['node_failures'], 'node failure')}", fontsize=9, loc="left")
        handles, _ = ax.get_legend_handles_labels()
        handles += [Line2D([], [], marker="v", ls="none", color="black", label="drain (automatic)"),
                    Line2D([], [], marker="v", ls="none", color="red", label="drain needing a human"),
                    Line2D([], [], marker="X", ls="none", color="black", label="node failure")]
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
        ax.tick_params(labelsize=7)
    axes[-1].set_xlabel(f"time since start of run ({unit})")
    axes[-1].set_xlim(0, end_s / scale_s)
    return fig


def storage_figure(metrics: dict[str, dict]) -> Figure:
    """The checkpoint storage's demand over time (the highest of each hour, GB/s) per policy,
    with its peak and the bandwidth when the cluster sets one."""
    fig = Figure(figsize=(14, 2.8), dpi=100)
    ax = fig.subplots()
    fig.subplots_adjust(left=0.06, right=0.83, top=0.88, bottom=0.2)
    hours = max((len(m["checkpoint_storage"]["hourly_peak_gbps"]) for m in metrics.values()
                 if "checkpoint_storage" in m), default=1)
    scale_s, unit = time_axis(hours * HOUR_S)
    bandwidth = None
    for policy, m in metrics.items():
        storage = m.get("checkpoint_storage")
        if not storage:
            continue
        y = np.array(storage["hourly_peak_gbps"], dtype=float)
        ax.step(np.arange(len(y)) * HOUR_S / scale_s, y, where="post", lw=1,
                label=f"{policy} (peak {storage['peak_gbps']:.1f} GB/s, {storage['written_gb']:,.0f} GB written)")
        bandwidth = storage["bandwidth_gbps"] or bandwidth
    if bandwidth:
        ax.axhline(bandwidth, color="red", ls="--", lw=1, label=f"bandwidth {bandwidth:g} GB/s")
    ax.set_ylabel("checkpoint writes (GB/s)", fontsize=8)
    ax.set_xlabel(f"time since start of run ({unit})", fontsize=8)
    ax.set_xlim(0, hours * HOUR_S / scale_s)
    ax.set_ylim(0, None)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.tick_params(labelsize=7)
    return fig
