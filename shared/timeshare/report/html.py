"""``report.html``: one self-contained page comparing the policies of a simulation.

Figures are inline SVG (svg.py) drawn from binned series, so the file opens offline, can be
mailed, and costs about two seconds of CPU for a month of three policies (most of it reading
the event logs).
Curves come from each policy's ``events.jsonl``; every number printed comes from the metrics
dicts that ``timeshare simulate`` also writes to ``metrics.json``.
"""

from __future__ import annotations

import gc
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from html import escape
from pathlib import Path

import numpy as np

from ..durations import format_duration_s
from . import figures, gantt, series, svg, tables
from .palette import HOUR_S, bin_hours, program_colors, team_colors
from .runlog import GpuRows, RunLog, fold_events, read_events

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1450px; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
figure { margin: 1.2em 0; }
figcaption { font-size: .9em; color: #444; max-width: 1100px; }
table.metrics { border-collapse: collapse; font-size: .85em; margin: .5em 0; }
table.metrics td, table.metrics th { border: 1px solid #ddd; padding: 2px 8px; }
table.metrics th.metric { text-align: left; font-weight: normal; font-family: monospace; }
td.num { text-align: right; font-variant-numeric: tabular-nums; } td.ratio { color: #666; }
.aside { color: #777; } td.miss { color: #b00; font-weight: bold; } td.target { color: #444; }
table.headline { font-size: 1em; } table.headline td, table.headline th { padding: 4px 12px; }
details { margin: 1em 0; } summary { cursor: pointer; font-weight: bold; }
.settings { font-family: monospace; font-size: .85em; color: #444; }
"""


def _metrics_of(result) -> dict:
    return result if isinstance(result, dict) else result.metrics


def _end_s(result) -> float:
    if isinstance(result, dict):
        return float(result["sim"]["simulated_s"])
    return float(result.end_s)


def _figure(body: str, caption: str, fig_id: str) -> str:
    return f'<figure id="{fig_id}">{body}<figcaption>{caption}</figcaption></figure>\n'


@dataclass
class _Context:
    """What every part of the report needs."""

    rows: GpuRows
    teams: list[str]
    fractions: dict[str, float]
    colors: dict[str, tuple]
    lookback_window_s: int
    view: gantt.GanttView
    gpus_per_node: int | None
    at_s: np.ndarray  # hourly instants of the usage-ratio curves

    @property
    def programs(self) -> dict[str, list[int]]:
        return figures.programs_of(self.teams)


@dataclass
class _PolicyPart:
    log: RunLog
    cluster_html: str
    delivery_html: list[str]
    ratio_teams: list[np.ndarray]
    ratio_programs: list[np.ndarray]


def report_context(out_dir: Path, scenario, end_s: float, window: tuple[float, float] | None = None,
                   max_gpu_rows: int = 256, with_events: bool = True) -> _Context:
    """What every part of the report of ``scenario`` needs, for runs that ended at ``end_s``."""
    tree = scenario.tree()
    teams = tree.leaves
    rows = GpuRows.from_scenario(scenario)
    return _Context(rows, teams, {t: tree.nodes[t].fraction for t in teams}, team_colors(teams),
                    scenario.policy.lookback_window_s,
                    gantt.choose_view(end_s, rows.total, window, max_gpu_rows) if with_events and end_s > 0 else None,
                    scenario.pools[0].gpus_per_node if len(scenario.pools) == 1 else None,
                    np.arange(0.0, end_s + 1, HOUR_S))


def write_report(out_dir: Path, scenario, results: dict, window: tuple[float, float] | None = None,
                 max_gpu_rows: int = 256, logs: dict[str, RunLog] | None = None) -> Path:
    """Write ``out_dir/report.html`` for ``results`` ({policy: RunResult or metrics dict}).

    ``window`` = (start_s, end_s) of the cluster picture (default: 2 days in the middle of the
    run); more than ``max_gpu_rows`` GPUs are thinned to every k-th GPU. Each policy's curves
    come from its ``events.jsonl``, read and folded once (runlog.py), then binned (series.py)
    and drawn as SVG (figures.py, gantt.py): about two seconds of CPU for a month of three
    policies, so it is all done in this process. ``logs``: policies whose run folded its own
    events already (``timeshare simulate``'s runs do), with the same teams and GPU rows."""
    t_start = time.perf_counter()
    out_dir = Path(out_dir)
    metrics = {p: _metrics_of(r) for p, r in results.items()}
    with_events = {p: out_dir / p / "events.jsonl" for p in results if (out_dir / p / "events.jsonl").exists()}
    missing = [p for p in results if p not in with_events]
    end_s = max((_end_s(results[p]) for p in with_events), default=0.0)
    ctx = report_context(out_dir, scenario, end_s, window, max_gpu_rows, bool(with_events))
    teams = ctx.teams

    parts = [f"<h1>timeshare simulation: {escape(scenario.name)}</h1>", _settings(scenario, metrics)]
    if missing:
        parts.append(f"<p><b>No events.jsonl for {escape(', '.join(missing))}</b>: only its metrics are shown.</p>")
    parts += ["<h2>Headline</h2>", tables.headline_table(metrics), _HEADLINE_NOTE,
              '<details id="all-metrics"><summary>Every metric of <code>metrics.json</code>, policy beside '
              "policy</summary><p>The last columns divide the first policy's value by each other's (beyond "
              f"{tables.RATIO_MAX}× or below {tables.RATIO_MIN}× they show the bound).</p>",
              tables.metrics_table(metrics), "</details>"]
    if with_events and end_s <= 0:
        parts.append("<p><b>Nothing ran</b>: the run is empty (no workload was submitted), so there is "
                     "nothing to draw.</p>")
    elif with_events:
        policy_parts = {}
        for p, path in with_events.items():
            log = logs.get(p) if logs else None
            if log is None:
                with _no_gc():
                    log = fold_events(read_events(path), p, _end_s(results[p]), ctx.teams, ctx.rows)
            policy_parts[p] = _policy_part(ctx, p, log, metrics[p]["teams"])
        run_logs = {p: part.log for p, part in policy_parts.items()}
        ratio_teams = {p: part.ratio_teams for p, part in policy_parts.items()}
        ratio_programs = {p: part.ratio_programs for p, part in policy_parts.items()}
        shared = [figures.ratio_figure(ratio_teams, ctx.at_s, teams, ctx.lookback_window_s),
                  figures.ratio_figure(ratio_programs, ctx.at_s, list(ctx.programs), ctx.lookback_window_s),
                  figures.waits_figure(run_logs, metrics), figures.preemptions_figure(run_logs, metrics)]
        if _any_checkpoints(metrics):
            shared.append(figures.storage_figure(metrics))
        parts.append("<h2>The cluster</h2>")
        parts += [part.cluster_html for part in policy_parts.values()]
        parts += ["<h2>Allocation and delivery</h2>", _DELIVERY_INTRO]
        for part in policy_parts.values():
            parts += part.delivery_html
        parts.append(_figure(shared[0], (
            "Usage ratio per team over time, the number the budget policy orders its queue by (lower goes "
            "first): allocated GPU-seconds in the lookback window over the team's share of the window. Early "
            "in the run the window is not yet full, so ratios start low. Under the baseline policy "
            "'allocated' means opted out of preemption, so its curve is not a budget."), "fig-ratio-teams"))
        parts.append(_figure(shared[1], "Usage ratio per program (the level above the teams in the fair-share "
                                        "tree).", "fig-ratio-programs"))
        parts += ["<h2>Queue waits</h2>", _figure(shared[2], (
            "Share of workloads (y) that waited at most x from submission to first start, per workload kind. "
            "Resubmissions are not counted; work never started counts with its wait until the end of the run. "
            "The p90s and count in each panel's title are <code>queue_wait_s</code> of metrics.json."), "fig-waits")]
        parts += ["<h2>Preemptions and drains</h2>", _figure(shared[3], (
            "Preemptions per bin, stacked by reason (legend: totals from metrics.json). Triangles mark nodes "
            "reported unhealthy (drained as their work reaches its minimum runtime); red triangles are drains "
            "that needed a human because protected work blocked them beyond the cap; crosses are node "
            "failures."), "fig-preemptions")]
        if len(shared) > 4:
            parts += ["<h2>Checkpoint storage</h2>", _figure(shared[4], (
                "Checkpoints written on notice share the cluster's checkpoint bandwidth: the demand on the "
                "storage, the highest of each hour (GB/s), per policy; the dashed line is the bandwidth the "
                "cluster sets (rule \"storage\": no more notices at once than it can write within their "
                "notices)."), "fig-storage")]
    parts += ["<h2>Teams</h2>", tables.teams_table(metrics)]
    parts.append(f'<p class="settings">rendered in {time.perf_counter() - t_start:.1f} s</p>')
    page = (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>timeshare: "
            f"{escape(scenario.name)}</title><style>{_CSS}{svg.CSS}</style></head><body>{svg.DEFS}{''.join(parts)}"
            "</body></html>\n")
    out = out_dir / "report.html"
    out.write_text(page)
    return out


_HEADLINE_NOTE = (
    '<p class="settings">Attainment counts funded work only (a workload with a minimum runtime on a team with '
    "a budget): unallocated time is free capacity promised to no one. Targets are the issue's bounds; a "
    "value in red misses its target. The all-work attainment (every workload counted as owed) is in the "
    "full table and the Teams table, for comparison only.</p>")

_DELIVERY_INTRO = (
    "<p>Per team, GPU time delivered against what its funded work was owed: owed(team, hour) = min(fraction "
    "x pool GPUs x 1 h, GPU-hours its funded workloads asked for, pending or running); funded = a minimum "
    "runtime > 0 on a team with a budget. A program's owed is the sum of its teams'. Attainment (in each "
    "title, from metrics.json) = sum of min(delivered to funded work, owed) / sum of owed, hour by hour.</p>")


@contextmanager
def _no_gc():
    """The garbage collector off while a log is decoded and folded: 200k new objects without a
    cycle among them set off collections that walk every object the process holds (after a
    simulation, its whole state): 0.15 to 0.5 s of the month's report, for nothing."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _any_checkpoints(metrics: dict[str, dict]) -> bool:
    return any(m.get("checkpoint_storage", {}).get("peak_gbps", 0) > 0 for m in metrics.values())


def _settings(scenario, metrics: dict) -> str:
    pools = ", ".join(f"{p.nodes} x {p.gpus_per_node} {p.gpu_type}" for p in scenario.pools)
    pol = scenario.policy
    return (f'<p class="settings">{escape(pools)} · duration {format_duration_s(scenario.duration_s)} · '
            f"seed {scenario.seed} · lookback window {format_duration_s(pol.lookback_window_s)} · "
            f"max min runtime {format_duration_s(pol.max_min_runtime_s)} · hysteresis "
            f"{pol.preemption_hysteresis} · {len(scenario.workloads)} workloads ({escape(scenario.source)}) · "
            f"policies: {escape(', '.join(metrics))}</p>")


def _policy_part(ctx: _Context, policy: str, log: RunLog, team_metrics: dict) -> _PolicyPart:
    """Everything drawn from one policy's log alone."""
    view = ctx.view
    cluster = _figure(gantt.draw_gantt(log, ctx.rows, view, ctx.colors), (
        f"<b>{escape(policy)}</b>: one row per GPU, {escape(view.describe(ctx.gpus_per_node))}; time "
        f"{view.start_s / HOUR_S:.1f} h to {view.end_s / HOUR_S:.1f} h of the run (choose another range with "
        "<code>timeshare report --window</code>). One bar per run of a workload, coloured by team with a "
        "shade per workload; hatched where it could be interrupted (unallocated, or allocated past its "
        "protected minimum runtime); a red tick where it was preempted; grey boxes are nodes out of "
        "service (unhealthy or failed, until repaired)."), f"fig-cluster-{policy}")

    teams, fractions, programs = ctx.teams, ctx.fractions, ctx.programs
    th = series.team_hours(log, fractions, ctx.rows.pool_gpus)
    hours = bin_hours(log.end_s)
    titles = [_attainment_title(fractions[t], team_metrics.get(t, {}).get("attainment"),
                                team_metrics.get(t, {}).get("owed_gpu_hours")) for t in teams]
    delivery = [_figure(figures.delivery_figure(policy, th, teams, titles, hours, [ctx.colors[t] for t in teams]),
                        f"<b>{escape(policy)}</b>, per team: solid = GPU time delivered to funded work, hatched "
                        "= delivered to other work (minimum runtime 0, owed to no one), black line = owed to "
                        f"funded work; mean GPUs over each {hours} h bin.",
                        f"fig-delivery-{policy}")]
    prog = _program_hours(th, programs)
    ptitles = []
    for i, idx in enumerate(programs.values()):
        got = series.attainment(prog.funded[i], prog.owed[i])
        ptitles.append(_attainment_title(sum(fractions[teams[j]] for j in idx), got, prog.owed[i].sum() / HOUR_S))
    delivery.append(_figure(figures.delivery_figure(
        policy, prog, list(programs), ptitles, hours, [program_colors(teams)[p] for p in programs]),
        f"<b>{escape(policy)}</b>, per program (first path component; attainment here is computed from the "
        "summed team series, not a metrics.json field).", f"fig-delivery-programs-{policy}"))

    total_gpus = sum(ctx.rows.pool_gpus.values())
    window_s = ctx.lookback_window_s
    ratio_teams = [series.usage_ratio(log, lambda s, i=i: s == i, fractions[t], total_gpus, window_s, ctx.at_s)
                   for i, t in enumerate(teams)]
    ratio_programs = [series.usage_ratio(log, lambda s, idx=idx: np.isin(s, idx),
                                         sum(fractions[teams[j]] for j in idx), total_gpus, window_s, ctx.at_s)
                      for idx in programs.values()]
    return _PolicyPart(log, cluster, delivery, ratio_teams, ratio_programs)


def _attainment_title(fraction, got, owed_h) -> str:
    got_s = "–" if got is None else f"{100 * got:.1f}%"
    return f"fraction {100 * fraction:.1f}% · owed {owed_h or 0:,.0f} GPU-h\nattainment (funded) {got_s}"


def _program_hours(th: series.TeamHours, programs: dict[str, list[int]]) -> series.TeamHours:
    idx = list(programs.values())
    return series.TeamHours(th.edges_s, np.array([th.funded[i].sum(0) for i in idx]),
                            np.array([th.other[i].sum(0) for i in idx]),
                            np.array([th.owed[i].sum(0) for i in idx]),
                            np.array([th.owed_all_work[i].sum(0) for i in idx]),
                            np.array([th.fraction[i].sum() for i in idx]))


def load_results(out_dir: Path) -> dict[str, dict]:
    """{policy: metrics} from a simulate output directory's metrics.json (one written before
    attainment counted funded work only is read with its keys renamed: upgrade_metrics)."""
    results = json.loads((Path(out_dir) / "metrics.json").read_text())
    return {policy: upgrade_metrics(m) for policy, m in results.items()}


def upgrade_metrics(m: dict) -> dict:
    """A metrics dict written before 2026-12-01, when ``attainment`` was the all-work figure and
    ``attainment_funded`` the funded one, with today's keys: the funded figure as ``attainment``,
    the all-work one as ``attainment_all_work`` (per team likewise; the funded GPU-hours delivered
    were not recorded then: None). A current dict is returned as it is."""
    if "attainment_funded" not in m:
        return m
    m = dict(m)
    m["attainment_all_work"] = m.pop("attainment")
    m["attainment"] = m.pop("attainment_funded")
    teams = {}
    for name, t in m["teams"].items():
        teams[name] = {"fraction": t["fraction"], "owed_gpu_hours": t.get("funded_owed_gpu_hours"),
                       "delivered_gpu_hours": None, "attainment": t.get("funded_attainment"),
                       "owed_all_work_gpu_hours": t["owed_gpu_hours"],
                       "delivered_all_work_gpu_hours": t["delivered_gpu_hours"],
                       "attainment_all_work": t["attainment"]}
    m["teams"] = teams
    return m
