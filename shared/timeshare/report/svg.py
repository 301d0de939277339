"""Charts as inline SVG, drawn by the browser from series already binned (no raster, no plotting
library): a few thousand shapes per figure are milliseconds of string formatting.

A figure is HTML: its title and legend are HTML text above a grid of small ``<svg>`` panels, each
with its own HTML title, so the browser wraps and places every label (nothing to measure here,
nothing to overlap). A panel's series carry their values in ``data-values`` (and the x they are
drawn at in ``data-x`` where that is not the panel's bins), so a test or a script can read the
numbers behind a curve without parsing its path.
"""

from __future__ import annotations

import math
from html import escape

import numpy as np

from .palette import to_hex

#: hatching used for "could be interrupted" and "owed to no one": defined once per page (DEFS)
HATCH = "url(#ts-hatch)"
DEFS = ('<svg width="0" height="0" style="position:absolute" aria-hidden="true"><defs>'
        '<pattern id="ts-hatch" patternUnits="userSpaceOnUse" width="5" height="5" '
        'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="5" stroke="#000" '
        'stroke-opacity="0.55" stroke-width="1.1"/></pattern></defs></svg>')

CSS = """
.fig-title { font-weight: bold; margin: .3em 0; }
.legend { font-size: .8em; margin: .2em 0 .4em; } .key { margin-right: 1.2em; white-space: nowrap; }
.key svg { vertical-align: middle; margin-right: .3em; }
.panels { display: grid; grid-template-columns: repeat(var(--cols, 4), minmax(0, 1fr)); gap: 8px 14px; }
.panel svg { width: 100%; height: auto; display: block; }
.ptitle { font-size: .78em; white-space: pre-line; overflow-wrap: anywhere; }
svg.chart text { font: 10px system-ui, sans-serif; fill: #333; }
svg.chart .grid { stroke: #eee; } svg.chart .frame { fill: none; stroke: #888; }
"""


def num(v: float) -> str:
    """A value in a data attribute: four significant digits, no exponent for everyday sizes."""
    return f"{v:.4g}" if math.isfinite(v) else "nan"


def values_attr(values) -> str:
    return " ".join(num(v) for v in np.asarray(values, dtype=np.float64).tolist())


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round ticks (1, 2, 2.5, 5 x 10^k apart) from ``lo`` to ``hi``."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 10) for i in range(int((hi - first) / step + 1e-9) + 1)]


def tick_label(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:g}"


class Panel:
    """One chart: data ranges mapped onto a ``w`` x ``h`` viewBox with margins for the axes."""

    def __init__(self, x_range: tuple[float, float], y_range: tuple[float, float], w: int = 340, h: int = 190,
                 xlog: bool = False, left: int = 44, right: int = 10, top: int = 8, bottom: int = 32,
                 y_down: bool = False):
        self.w, self.h = w, h
        self.left, self.right, self.top, self.bottom = left, right, top, bottom
        self.xlog, self.y_down = xlog, y_down
        x0, x1 = x_range
        if xlog:
            x0, x1 = math.log10(x0), math.log10(x1)
        self.x0, self.x1 = x0, x1 if x1 > x0 else x0 + 1
        y0, y1 = y_range
        self.y0, self.y1 = y0, y1 if y1 > y0 else y0 + 1
        self.parts: list[str] = []  # the data
        self.under: list[str] = []  # grid lines and labels, below the data
        self.frame = ""

    # -- coordinates -----------------------------------------------------------------------
    def px(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if self.xlog:
            x = np.log10(np.maximum(x, 1e-300))
        return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.w - self.left - self.right)

    def py(self, y) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64)
        f = (y - self.y0) / (self.y1 - self.y0)
        if self.y_down:
            f = 1 - f
        return self.h - self.bottom - f * (self.h - self.top - self.bottom)

    @staticmethod
    def _points(xs: np.ndarray, ys: np.ndarray) -> str:
        return " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(np.round(xs, 1).tolist(), np.round(ys, 1).tolist()))

    # -- shapes ----------------------------------------------------------------------------
    def line(self, xs, ys, color: str, width: float = 1.2, dash: str | None = None, data: str = "") -> None:
        """A polyline through (xs, ys); NaNs break it into pieces."""
        xs, ys = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
        ok = np.isfinite(ys)
        pieces = np.split(np.arange(len(ys)), np.flatnonzero(np.diff(ok.astype(np.int8))) + 1)
        d = " ".join("M" + self._points(self.px(xs[p]), self.py(ys[p])) for p in pieces if len(p) and ok[p[0]])
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<path d="{d or "M0,0"}" fill="none" stroke="{to_hex(color)}" stroke-width="{width}"'
                          f'{dash_attr} stroke-linejoin="round"{data}/>')

    def steps(self, xs, ys, color: str, width: float = 1.2, dash: str | None = None, data: str = "") -> None:
        """A step line: ``ys[i]`` from ``xs[i]`` to ``xs[i + 1]`` (the last value to the last x)."""
        xs, ys = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
        if len(ys) == len(xs):
            xs = np.append(xs, xs[-1]) if len(xs) else xs
        sx = np.repeat(xs, 2)[1:-1]
        sy = np.repeat(ys, 2)
        self.line(sx, sy, color, width, dash, data)

    def stairs(self, edges, values, baseline=None, fill: str = "none", opacity: float = 1.0,
               stroke: str | None = None, width: float = 1.2, data: str = "") -> None:
        """The area between ``baseline`` (0 by default) and ``values``, constant over each bin
        between consecutive ``edges``; with ``fill="none"`` only the top edge as a line."""
        edges, values = np.asarray(edges, dtype=np.float64), np.asarray(values, dtype=np.float64)
        if not len(values):
            return
        base = np.zeros(len(values)) if baseline is None else np.asarray(baseline, dtype=np.float64)
        tx, ty = np.repeat(edges, 2)[1:-1], np.repeat(values, 2)
        if fill == "none":
            self.line(tx, ty, stroke or "#000", width, data=data)
            return
        bx, by = tx[::-1], np.repeat(base, 2)[::-1]
        pts = self._points(self.px(np.concatenate((tx, bx))), self.py(np.concatenate((ty, by))))
        op = f' fill-opacity="{opacity}"' if opacity != 1 else ""
        self.parts.append(f'<polygon points="{pts}" fill="{fill if isinstance(fill, str) and fill.startswith("url") else to_hex(fill)}"'
                          f'{op} stroke="none"{data}/>')

    def rects(self, x0, x1, y0, y1, fills, extra: str = "", min_w: float = 0.0) -> None:
        """Rectangles from data corners; ``fills`` one colour or one per rectangle."""
        px0, px1 = self.px(x0), self.px(x1)
        py0, py1 = self.py(y0), self.py(y1)
        top, bottom = np.minimum(py0, py1), np.maximum(py0, py1)
        x = np.round(px0, 1).tolist()
        wd = np.round(np.maximum(px1 - px0, min_w), 2).tolist()
        y = np.round(top, 2).tolist()
        ht = np.round(bottom - top, 2).tolist()
        if isinstance(fills, str):
            fills = [fills] * len(x)
        self.parts.append("".join(f'<rect x="{a}" y="{b}" width="{c}" height="{d}" fill="{f}"{extra}/>'
                                  for a, b, c, d, f in zip(x, y, wd, ht, fills)))

    def vticks(self, xs, y0, y1, color: str, width: float = 1.6) -> None:
        """Short vertical marks (one path) at ``xs`` from ``y0`` to ``y1`` (data units)."""
        px = np.round(self.px(xs), 1).tolist()
        a, b = np.round(self.py(y0), 1).tolist(), np.round(self.py(y1), 1).tolist()
        d = "".join(f"M{x},{p}V{q}" for x, p, q in zip(px, a, b))
        if d:
            self.parts.append(f'<path d="{d}" stroke="{color}" stroke-width="{width}" fill="none"/>')

    def hline(self, y: float, color: str = "#000", width: float = 0.8, dash: str | None = None) -> None:
        yy = float(self.py(y))
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<line x1="{self.left}" x2="{self.w - self.right}" y1="{yy:.1f}" y2="{yy:.1f}" '
                          f'stroke="{color}" stroke-width="{width}"{dash_attr}/>')

    def marker(self, x: float, y: float, kind: str, color: str, label: str = "") -> None:
        """A triangle pointing down ("v") or a cross ("x") at a data point, a label to its right."""
        cx, cy = float(self.px(x)), float(self.py(y))
        if kind == "v":
            shape = f'<path d="M{cx - 5:.1f},{cy - 4:.1f}h10l-5,8z" fill="{color}"/>'
        else:
            shape = (f'<path d="M{cx - 4:.1f},{cy - 4:.1f}l8,8m0,-8l-8,8" stroke="{color}" stroke-width="2.2" '
                     'fill="none"/>')
        text = f'<text x="{cx + 6:.1f}" y="{cy + 3:.1f}">{escape(label)}</text>' if label else ""
        self.parts.append(shape + text)

    # -- axes ------------------------------------------------------------------------------
    def axes(self, xticks, xlabels, yticks, ylabels, xlabel: str = "", ylabel: str = "", grid: bool = True) -> None:
        """The frame, ticks with their labels, and the axis titles."""
        out = []
        l, r, t, b = self.left, self.w - self.right, self.top, self.h - self.bottom
        for v, s in zip(xticks, xlabels):
            x = float(self.px(v))
            if l - 0.5 <= x <= r + 0.5:
                if grid:
                    out.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{t}" y2="{b}"/>')
                out.append(f'<text x="{x:.1f}" y="{b + 12}" text-anchor="middle">{escape(s)}</text>')
        for v, s in zip(yticks, ylabels):
            y = float(self.py(v))
            if t - 0.5 <= y <= b + 0.5:
                if grid:
                    out.append(f'<line class="grid" x1="{l}" x2="{r}" y1="{y:.1f}" y2="{y:.1f}"/>')
                out.append(f'<text x="{l - 3}" y="{y + 3:.1f}" text-anchor="end">{escape(s)}</text>')
        if xlabel:
            out.append(f'<text x="{(l + r) / 2:.0f}" y="{self.h - 4}" text-anchor="middle">{escape(xlabel)}</text>')
        if ylabel:
            out.append(f'<text transform="translate(10,{(t + b) / 2:.0f}) rotate(-90)" text-anchor="middle">'
                       f"{escape(ylabel)}</text>")
        self.under.extend(out)
        self.frame = f'<rect class="frame" x="{l}" y="{t}" width="{r - l}" height="{b - t}"/>'

    def svg(self, label: str = "") -> str:
        """The panel as an ``<svg>`` (every range is chosen to hold its data: nothing is clipped)."""
        return (f'<svg class="chart" viewBox="0 0 {self.w} {self.h}" role="img" aria-label="{escape(label)}">'
                f'{"".join(self.under)}{"".join(self.parts)}{self.frame}</svg>')


# -- HTML around the panels ------------------------------------------------------------------

def key(kind: str, color: str, label: str) -> str:
    """A legend entry: ``kind`` is fill, hatch, line, dash, dot, v (triangle) or x (cross)."""
    c = to_hex(color)
    shape = {
        "fill": f'<rect x="1" y="1" width="20" height="10" fill="{c}"/>',
        "hatch": f'<rect x="1" y="1" width="20" height="10" fill="#fff" stroke="{c}"/>'
                 f'<rect x="1" y="1" width="20" height="10" fill="{HATCH}"/>',
        "line": f'<line x1="1" x2="21" y1="6" y2="6" stroke="{c}" stroke-width="2"/>',
        "dash": f'<line x1="1" x2="21" y1="6" y2="6" stroke="{c}" stroke-width="1.2" stroke-dasharray="4 3"/>',
        "dot": f'<line x1="1" x2="21" y1="6" y2="6" stroke="{c}" stroke-width="1" stroke-dasharray="1 2"/>',
        "v": f'<path d="M6,2h10l-5,8z" fill="{c}"/>',
        "x": f'<path d="M7,2l8,8m0,-8l-8,8" stroke="{c}" stroke-width="2.2"/>',
        "band": f'<rect x="1" y="1" width="20" height="10" fill="{c}" fill-opacity="0.35" stroke="#000"/>',
    }[kind]
    return f'<span class="key"><svg width="22" height="12">{shape}</svg>{escape(label)}</span>'


def figure_body(title: str, keys: list[str], panels: list[tuple[str, str]], cols: int = 4) -> str:
    """A figure's HTML (without its <figure> and caption): title, legend, then the panels
    (title text, svg) in a grid of ``cols`` columns."""
    cells = "".join(f'<div class="panel"><div class="ptitle">{escape(t)}</div>{s}</div>' for t, s in panels)
    legend = f'<div class="legend">{"".join(keys)}</div>' if keys else ""
    return (f'<div class="fig-title">{escape(title)}</div>{legend}'
            f'<div class="panels" style="--cols:{max(1, cols)}">{cells}</div>')
