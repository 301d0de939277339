"""HTML tables rendered straight from the metrics dicts (the ones written to metrics.json).

Every value cell carries ``data-policy``, ``data-metric`` (the dotted path in metrics.json) and
``data-value`` (the raw JSON value), so a test or a script can check the page against the file
without parsing the human formatting.
"""

from __future__ import annotations

import json
from html import escape

from ..durations import format_duration_s

_PCT = {"occupancy", "unallocated_share", "fleet", "min_team", "attainment"}
_WAIT_STATS = {"mean", "p50", "p90", "p99", "max"}
#: not metrics of the policy's outcome (names, or machine-dependent speeds)
_SKIP = {"policy", "scenario", "teams", "sim.simulated_s_per_wall_s", "sim.events_per_wall_s"}


def flatten(metrics: dict, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}, in the dict's own order, leaving out _SKIP."""
    out: dict[str, object] = {}
    for key, value in metrics.items():
        path = f"{prefix}{key}"
        if path in _SKIP:
            continue
        if isinstance(value, dict):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def format_value(path: str, value) -> str:
    if value is None:
        return "–"
    last = path.rsplit(".", 1)[-1]
    if path.startswith("queue_wait_s.") and last in _WAIT_STATS:
        return format_duration_s(value)
    if last in _PCT:
        return f"{100 * value:.1f}%"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _ratio(a, b) -> str:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return "–"
    if b == 0:
        return "–" if a == 0 else "∞"
    return f"×{a / b:.2f}"


def _cell(policy: str, path: str, value) -> str:
    return (f'<td class="num" data-policy="{escape(policy)}" data-metric="{escape(path)}" '
            f"data-value='{escape(json.dumps(value), quote=True)}'>{escape(format_value(path, value))}</td>")


def metrics_table(metrics_by_policy: dict[str, dict]) -> str:
    """Policy beside policy, then the first policy's value over each other's."""
    policies = list(metrics_by_policy)
    flat = {p: flatten(m) for p, m in metrics_by_policy.items()}
    paths: list[str] = []
    for p in policies:
        paths += [k for k in flat[p] if k not in paths]
    first = policies[0]
    head = "".join(f"<th>{escape(p)}</th>" for p in policies)
    head += "".join(f"<th>{escape(first)} / {escape(p)}</th>" for p in policies[1:])
    rows = []
    for path in paths:
        cells = "".join(_cell(p, path, flat[p].get(path)) for p in policies)
        cells += "".join(f'<td class="num ratio">{_ratio(flat[first].get(path), flat[p].get(path))}</td>'
                         for p in policies[1:])
        rows.append(f'<tr id="m-{escape(path)}"><th class="metric">{escape(path)}</th>{cells}</tr>')
    return (f'<table class="metrics" id="metrics-table"><thead><tr><th>metric (metrics.json)</th>{head}</tr>'
            f"</thead><tbody>{''.join(rows)}</tbody></table>")


def teams_table(metrics_by_policy: dict[str, dict]) -> str:
    """Per team: fraction, then owed / delivered GPU-hours and attainment for each policy."""
    policies = list(metrics_by_policy)
    teams = list(next(iter(metrics_by_policy.values()))["teams"])
    fields = ("owed_gpu_hours", "delivered_gpu_hours", "attainment")
    head = "".join(f'<th colspan="3">{escape(p)}</th>' for p in policies)
    sub = "".join("<th>owed GPU-h</th><th>delivered GPU-h</th><th>attainment</th>" for _ in policies)
    rows = []
    for team in teams:
        fraction = metrics_by_policy[policies[0]]["teams"][team]["fraction"]
        cells = "".join(_cell(p, f"teams.{team}.{f}", metrics_by_policy[p]["teams"].get(team, {}).get(f))
                        for p in policies for f in fields)
        rows.append(f'<tr><th class="metric">{escape(team)}</th><td class="num">{100 * fraction:.1f}%</td>'
                    f"{cells}</tr>")
    return (f'<table class="metrics" id="teams-table"><thead><tr><th rowspan="2">team</th>'
            f'<th rowspan="2">fraction</th>{head}</tr><tr>{sub}</tr></thead><tbody>{"".join(rows)}</tbody></table>')
