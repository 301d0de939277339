"""Colours and time units of the figures, without matplotlib (report.html draws SVG; only the
sweep page still draws with matplotlib, style.py).

The program hues are matplotlib's single-hue sequential colormaps (ColorBrewer's nine-class
Blues, Oranges, ...), sampled the way matplotlib samples them (a 256-entry table), so the
colours are the ones the report had when it drew with matplotlib."""

from __future__ import annotations

HOUR_S = 3600
DAY_S = 86400

POLICY_COLORS = {"budget": "#1f77b4", "baseline": "#d62728", "fifo": "#7f7f7f"}
REASON_COLORS = {"unallocated": "#9ecae1", "fair_share": "#3182bd", "drain": "#ff7f0e",
                 "node_failed": "#d62728", "priority": "#756bb1"}
#: matplotlib's tab10, for policies without a colour of their own
TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
         "#bcbd22", "#17becf")

# ColorBrewer nine-class sequential schemes (as in matplotlib._cm), 0-255
_SCHEMES = {
    "Blues": ("f7fbff", "deebf7", "c6dbef", "9ecae1", "6baed6", "4292c6", "2171b5", "08519c", "08306b"),
    "Oranges": ("fff5eb", "fee6ce", "fdd0a2", "fdae6b", "fd8d3c", "f16913", "d94801", "a63603", "7f2704"),
    "Greens": ("f7fcf5", "e5f5e0", "c7e9c0", "a1d99b", "74c476", "41ab5d", "238b45", "006d2c", "00441b"),
    "Purples": ("fcfbfd", "efedf5", "dadaeb", "bcbddc", "9e9ac8", "807dba", "6a51a3", "54278f", "3f007d"),
    "Reds": ("fff5f0", "fee0d2", "fcbba1", "fc9272", "fb6a4a", "ef3b2c", "cb181d", "a50f15", "67000d"),
    "Greys": ("ffffff", "f0f0f0", "d9d9d9", "bdbdbd", "969696", "737373", "525252", "252525", "000000"),
}

#: one single-hue sequential colormap per program (first path component), in this order; a
#: program's teams take shades of it from light to dark. Past six programs the hues repeat.
PROGRAM_COLORMAPS = ("Blues", "Oranges", "Greens", "Purples", "Reds", "Greys")
#: the part of each colormap the shades come from (its lightest end is too close to white)
_SHADES = (0.3, 1.0)


def _rgb(hex6: str) -> tuple[float, float, float]:
    return tuple(int(hex6[i:i + 2], 16) / 255 for i in (0, 2, 4))  # type: ignore[return-value]


def colormap(name: str, x: float) -> tuple[float, float, float, float]:
    """``name`` at ``x`` in [0, 1], as matplotlib's 256-entry colormap gives it (RGBA)."""
    anchors = [_rgb(h) for h in _SCHEMES[name]]
    i = min(255, max(0, int(x * 256)))
    pos = i / 255 * (len(anchors) - 1)
    k = min(int(pos), len(anchors) - 2)
    f = pos - k
    a, b = anchors[k], anchors[k + 1]
    return (a[0] + (b[0] - a[0]) * f, a[1] + (b[1] - a[1]) * f, a[2] + (b[2] - a[2]) * f, 1.0)


def to_hex(color) -> str:
    """"#rrggbb" of an RGB(A) tuple of floats in [0, 1] (a hex string is returned as it is)."""
    if isinstance(color, str):
        return color
    return "#" + "".join(f"{min(255, max(0, round(float(c) * 255))):02x}" for c in color[:3])


def policy_color(policy: str, i: int = 0) -> str:
    return POLICY_COLORS.get(policy, TAB10[i % 10])


def team_colors(teams: list[str]) -> dict[str, tuple]:
    """A colour per team: a hue per program, a shade of it per team within the program.

    Teams are taken in path order, so neighbours in the tree (and in every legend) are
    neighbouring shades of one hue. Workload shades (gantt.py) vary lightness only a little
    around the team's colour."""
    lo, hi = _SHADES
    out = {}
    for program, cmap in _program_colormaps(teams).items():
        members = sorted(t for t in teams if t.split("/")[0] == program)
        k = len(members)
        for j, t in enumerate(members):
            out[t] = colormap(cmap, 0.7 if k == 1 else lo + (hi - lo) * j / (k - 1))
    return out


def program_colors(teams: list[str]) -> dict[str, tuple]:
    """A colour per program (first path component): the middle shade of its teams' hue."""
    return {program: colormap(cmap, 0.7) for program, cmap in _program_colormaps(teams).items()}


def _program_colormaps(teams: list[str]) -> dict[str, str]:
    programs = sorted({t.split("/")[0] for t in teams})
    return {p: PROGRAM_COLORMAPS[i % len(PROGRAM_COLORMAPS)] for i, p in enumerate(programs)}


def time_axis(span_s: float) -> tuple[float, str]:
    """Seconds per axis unit: hours for up to three days, days beyond."""
    return (HOUR_S, "h") if span_s <= 3 * DAY_S else (DAY_S, "days")


def bin_hours(end_s: float) -> int:
    """Hourly bins up to four days, six-hourly beyond (30 days -> 120 bins)."""
    return 1 if end_s <= 4 * DAY_S else 6
