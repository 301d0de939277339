"""Shared look of the figures: team and policy colours, time units, PNG encoding."""

from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")  # no display: the report is written to a file

from matplotlib import colormaps  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

HOUR_S = 3600
DAY_S = 86400

POLICY_COLORS = {"budget": "#1f77b4", "baseline": "#d62728", "fifo": "#7f7f7f"}
REASON_COLORS = {"unallocated": "#9ecae1", "fair_share": "#3182bd", "drain": "#ff7f0e",
                 "node_failed": "#d62728", "priority": "#756bb1"}


def policy_color(policy: str, i: int = 0) -> str:
    return POLICY_COLORS.get(policy, colormaps["tab10"](i % 10))


def team_colors(teams: list[str]) -> dict[str, tuple]:
    """A colour per team, as far apart as the palette allows: tab10 for up to 10 teams, else
    the dark then the light halves of tab20 (so consecutive teams never share a hue), then
    tab20b. Workload shades (gantt.py) vary lightness only, so hue stays the team's."""
    ordered = sorted(teams)
    if len(ordered) <= 10:
        palette = [colormaps["tab10"](i) for i in range(10)]
    else:
        tab20 = colormaps["tab20"]
        palette = [tab20(i) for i in range(0, 20, 2)] + [tab20(i) for i in range(1, 20, 2)]
        palette += [colormaps["tab20b"](i) for i in range(20)]
    return {t: palette[i % len(palette)] for i, t in enumerate(ordered)}


def time_axis(span_s: float) -> tuple[float, str]:
    """Seconds per axis unit: hours for up to three days, days beyond."""
    return (HOUR_S, "h") if span_s <= 3 * DAY_S else (DAY_S, "days")


def bin_hours(end_s: float) -> int:
    """Hourly bins up to four days, six-hourly beyond (30 days -> 120 bins)."""
    return 1 if end_s <= 4 * DAY_S else 6


def png_data_uri(fig: Figure, dpi: int = 100) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
