"""``sweep.html``: the table of every sweep point and each headline metric against each parameter."""

from __future__ import annotations

import itertools
import json
from html import escape
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ..durations import format_duration_s
from .palette import policy_color
from .style import finish_grid, panel_title, png_data_uri
from .style import grid as layout_grid
from .sweep import METRIC_COLUMNS, SweepResult

_LABELS = {
    "occupancy": "occupancy", "unallocated_share": "unallocated share of delivered",
    "attainment_fleet": "attainment (funded), fleet", "attainment_min_team": "attainment (funded), worst team",
    "debug_p90_wait_s": "debug p90 wait", "p90_wait_s": "p90 wait (all)", "preemptions": "preemptions",
    "wasted_gpu_hours": "wasted GPU-hours", "drains_needing_human": "drains needing a human",
    "attainment_all_work_fleet": "all-work attainment, fleet (no target)", "wall_s": "simulation wall time (s)",
}
_PCT = {"occupancy", "unallocated_share", "attainment_fleet", "attainment_min_team", "attainment_all_work_fleet"}
_DURATION = {"debug_p90_wait_s", "p90_wait_s"}

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1450px; color: #222; }
table { border-collapse: collapse; font-size: .85em; } td, th { border: 1px solid #ddd; padding: 2px 8px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; } tr.error td { color: #b00; }
figure img { max-width: 100%; } figcaption { font-size: .9em; color: #444; }
"""


def _fmt(column: str, value) -> str:
    if value is None:
        return "–"
    if column in _PCT:
        return f"{100 * value:.1f}%"
    if column in _DURATION:
        return format_duration_s(value)
    if isinstance(value, float):
        return f"{value:,.2f}"
    return f"{value:,}"


def _columns(results: list[SweepResult]) -> list[str]:
    """Headline columns, leaving out one no point has (no 'debug' kind -> no debug p90)."""
    return [c for c in METRIC_COLUMNS if any(r.metrics.get(c) is not None for r in results)] or list(METRIC_COLUMNS)


def sweep_table(grid: dict[str, list[str]], results: list[SweepResult]) -> str:
    cols = _columns(results)
    head = "".join(f"<th>{escape(k)}</th>" for k in ["policy", *grid]) + "".join(
        f"<th>{escape(_LABELS[c])}</th>" for c in cols) + "<th>error</th>"
    rows = []
    for r in results:
        cells = f"<td>{escape(r.point.policy)}</td>" + "".join(
            f'<td data-param="{escape(k)}">{escape(r.point.settings[k])}</td>' for k in grid)
        cells += "".join(f"<td class=\"num\" data-metric=\"{c}\" data-value='{escape(json.dumps(r.metrics.get(c)))}'>"
                         f"{_fmt(c, r.metrics.get(c))}</td>" for c in cols)
        cells += f"<td>{escape(r.error)}</td>"
        rows.append(f'<tr class="{"error" if r.error else "ok"}" data-point="{r.point.index}">{cells}</tr>')
    return f'<table id="sweep-table"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def param_figure(param: str, grid: dict[str, list[str]], results: list[SweepResult]) -> Figure:
    """Every headline metric against ``param`` (x = its values in the order given), one line per
    combination of the other parameters and policy; many combinations collapse into the median
    with a min-max band so the plot stays readable."""
    cols = _columns(results)
    others = [k for k in grid if k != param]
    policies = list(dict.fromkeys(r.point.policy for r in results))
    groups = [(pol, combo) for pol in policies for combo in itertools.product(*(grid[k] for k in others))]
    xs = np.arange(len(grid[param]))
    g = layout_grid(len(cols), ncols=4, w=4.0, h=2.9, hspace=0.55)
    by_key = {(r.point.policy, tuple(r.point.settings[k] for k in others), r.point.settings[param]): r
              for r in results}
    collapse = len(groups) > 8
    for ax, col in zip(g.axes, cols):
        scale = 100 if col in _PCT else (1 / 3600 if col in _DURATION else 1)
        for gi, (pol, combo) in enumerate(groups):
            ys = []
            for v in grid[param]:
                r = by_key.get((pol, combo, v))
                val = r.metrics.get(col) if r is not None and not r.error else None
                ys.append(np.nan if val is None else val * scale)
            if collapse:
                continue
            label = ", ".join([pol] * (len(policies) > 1) + [f"{k}={c}" for k, c in zip(others, combo)
                                                              if len(grid[k]) > 1]) or pol
            ax.plot(xs, ys, marker="o", lw=1.2, label=label,
                    color=policy_color(pol, gi) if not others else None)
        if collapse:
            for pi, pol in enumerate(policies):
                mat = np.array([[np.nan if (r := by_key.get((pol, combo, v))) is None or r.error
                                 or r.metrics.get(col) is None else r.metrics[col] * scale
                                 for v in grid[param]] for (p2, combo) in groups if p2 == pol])
                if np.all(np.isnan(mat)):
                    continue
                ax.plot(xs, np.nanmedian(mat, 0), marker="o", color=policy_color(pol, pi), label=f"{pol} median")
                ax.fill_between(xs, np.nanmin(mat, 0), np.nanmax(mat, 0), color=policy_color(pol, pi), alpha=0.2)
        ax.set_xticks(xs, grid[param], fontsize=8)
        ax.xaxis.set_tick_params(labelbottom=True)
        ax.set_xlabel(param, fontsize=8)
        unit = " (%)" if col in _PCT else (" (h)" if col in _DURATION else "")
        panel_title(g, ax, _LABELS[col] + unit, fontsize=9)
        ax.tick_params(labelsize=7)
    handles, _ = g.axes[0].get_legend_handles_labels()
    return finish_grid(g, f"headline metrics against {param}", handles)


def write_sweep_html(path: Path, scenario_path: str, grid: dict[str, list[str]], results: list[SweepResult],
                     fixed: dict[str, str] | None = None) -> Path:
    errors = sum(1 for r in results if r.error)
    parts = [f"<h1>timeshare sweep: {escape(str(scenario_path))}</h1>",
             "<p>" + escape(" × ".join(f"{k} ∈ {{{', '.join(v)}}}" for k, v in grid.items())) +
             (f"; fixed: {escape(', '.join(f'{k}={v}' for k, v in (fixed or {}).items()))}" if fixed else "") +
             f" — {len(results)} points, {errors} invalid.</p>", sweep_table(grid, results)]
    if len(results) > errors:
        for param in (k for k, values in grid.items() if len(values) > 1):  # a fixed setting has no curve
            uri = png_data_uri(param_figure(param, grid, results))
            parts.append(f'<figure id="fig-{escape(param)}"><img src="{uri}" alt="metrics against {escape(param)}">'
                         f"<figcaption>Each headline metric against {escape(param)}; invalid points are gaps."
                         "</figcaption></figure>")
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>timeshare sweep</title>"
            f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>\n")
    Path(path).write_text(page)
    return Path(path)
