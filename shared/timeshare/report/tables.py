"""HTML tables rendered straight from the metrics dicts (the ones written to metrics.json).

Every value cell carries ``data-policy``, ``data-metric`` (the dotted path in metrics.json) and
``data-value`` (the raw JSON value), so a test or a script can check the page against the file
without parsing the human formatting.
"""

from __future__ import annotations

import json
from html import escape

from ..durations import format_duration_s

_PCT = {"occupancy", "unallocated_share", "fleet", "min_team", "attainment", "attainment_all_work"}
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


#: ratios beyond these bounds are shown as the bound (a ratio of 9005.5 says no more than "> 100×")
RATIO_MAX = 100
RATIO_MIN = 0.01


def format_ratio(a, b) -> str:
    """``a / b`` for the table's last columns: "2.50×", "12×", "> 100×" (b is 0, or the ratio is
    larger), "< 0.01×" (a is 0, or smaller), "–" when there is nothing to divide (a value
    missing or not a number, or both 0)."""
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return "–"
    if a == 0 and b == 0:
        return "–"
    if a < 0 or b < 0:  # (no metric is negative; a ratio of signed values would mislead)
        return "–"
    if b == 0 or a / b > RATIO_MAX:
        return f"> {RATIO_MAX}×"
    ratio = a / b
    if ratio < RATIO_MIN:
        return f"< {RATIO_MIN}×"
    return f"{ratio:.2f}×" if ratio < 9.995 else f"{ratio:.0f}×"  # (9.996 shows as "10×", not "10.00×")


def _cell(policy: str, path: str, value, css: str = "") -> str:
    return (f'<td class="num{" " + css if css else ""}" data-policy="{escape(policy)}" data-metric="{escape(path)}" '
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
        cells += "".join(f'<td class="num ratio">{escape(format_ratio(flat[first].get(path), flat[p].get(path)))}</td>'
                         for p in policies[1:])
        rows.append(f'<tr id="m-{escape(path)}"><th class="metric">{escape(path)}</th>{cells}</tr>')
    return (f'<table class="metrics" id="metrics-table"><thead><tr><th>metric (metrics.json)</th>{head}</tr>'
            f"</thead><tbody>{''.join(rows)}</tbody></table>")


def teams_table(metrics_by_policy: dict[str, dict]) -> str:
    """Per team: fraction, then for each policy what funded work was owed and delivered and its
    attainment (the target), and beside it the all-work attainment (every workload counted as
    owed; shown, never a target)."""
    policies = list(metrics_by_policy)
    teams = list(next(iter(metrics_by_policy.values()))["teams"])
    fields = ("owed_gpu_hours", "delivered_gpu_hours", "attainment", "attainment_all_work")
    head = "".join(f'<th colspan="{len(fields)}">{escape(p)}</th>' for p in policies)
    sub = "".join("<th>owed GPU-h (funded)</th><th>delivered GPU-h (funded)</th><th>attainment (funded)</th>"
                  '<th class="aside">all-work attainment (not a target)</th>' for _ in policies)
    rows = []
    for team in teams:
        fraction = metrics_by_policy[policies[0]]["teams"][team]["fraction"]
        cells = "".join(_cell(p, f"teams.{team}.{f}", metrics_by_policy[p]["teams"].get(team, {}).get(f),
                              "aside" if f == "attainment_all_work" else "")
                        for p in policies for f in fields)
        rows.append(f'<tr><th class="metric">{escape(team)}</th><td class="num">{100 * fraction:.1f}%</td>'
                    f"{cells}</tr>")
    return (f'<table class="metrics" id="teams-table"><thead><tr><th rowspan="2">team</th>'
            f'<th rowspan="2">fraction</th>{head}</tr><tr>{sub}</tr></thead><tbody>{"".join(rows)}</tbody></table>')


#: The headline: the few numbers Ai2 showed, policy beside policy, with the issue's bounds
#: (tests/sim/test_builtin.py). (label, dotted path in metrics.json, target, met(value, metrics)).
HEADLINE = (
    ("debug p90 wait", "queue_wait_s.by_kind.debug.p90", "≤ 5 min", lambda v, m: v <= 300),
    ("occupancy", "occupancy", "≥ 97%", lambda v, m: v >= 0.97),
    ("attainment (funded), fleet", "attainment.fleet", "≥ 98%", lambda v, m: v >= 0.98),
    ("attainment (funded), worst team", "attainment.min_team", "≥ 95%", lambda v, m: v >= 0.95),
    ("teams at or above 95% (funded)", "attainment.teams_at_or_above_95", "all",
     lambda v, m: v == m["attainment"]["teams"]),
    ("preemptions", "preemptions", "", None),
    ("wasted GPU-hours", "wasted_gpu_hours", "", None),
)


def lookup(metrics: dict, path: str):
    """The value at a dotted path of a metrics dict, None where the path is missing."""
    node = metrics
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def worst_teams(metrics: dict) -> list[str]:
    """The teams whose (funded) attainment is the lowest (more than one on a tie)."""
    rated = {name: t["attainment"] for name, t in metrics["teams"].items() if t["attainment"] is not None}
    low = min(rated.values(), default=None)
    return [name for name, a in rated.items() if a == low]


def headline_text(path: str, metrics: dict) -> str:
    """A headline cell as shown: the formatted value, with the worst team's name and the number
    of teams where they say more than the number alone."""
    value = lookup(metrics, path)
    if value is None:
        return "–"
    if path == "attainment.teams_at_or_above_95":
        return f"{value} of {metrics['attainment']['teams']}"
    if path == "attainment.min_team":
        worst = worst_teams(metrics)
        return f"{format_value(path, value)} ({worst[0] if len(worst) == 1 else f'{len(worst)} teams'})"
    if path == "wasted_gpu_hours":
        return f"{value:,.0f}"
    return format_value(path, value)


def headline_table(metrics_by_policy: dict[str, dict]) -> str:
    policies = list(metrics_by_policy)
    head = "".join(f"<th>{escape(p)}</th>" for p in policies)
    rows = []
    for label, path, target, met in HEADLINE:
        cells = []
        for p in policies:
            m = metrics_by_policy[p]
            value = lookup(m, path)
            miss = met is not None and value is not None and not met(value, m)
            cells.append(f'<td class="num{" miss" if miss else ""}" data-policy="{escape(p)}" '
                         f"data-metric=\"{escape(path)}\" data-value='{escape(json.dumps(value), quote=True)}'>"
                         f"{escape(headline_text(path, m))}</td>")
        rows.append(f'<tr><th class="metric">{escape(label)}</th>{"".join(cells)}'
                    f'<td class="target">{escape(target)}</td></tr>')
    return (f'<table class="metrics headline" id="headline"><thead><tr><th></th>{head}<th>target</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")
