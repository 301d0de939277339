"""matplotlib figures (the sweep page): PNG encoding, small multiples with a measured header, a
layout check. Colours and time units are in palette.py."""

from __future__ import annotations

import base64
import io
import itertools
import math
import textwrap
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")  # no display: the report is written to a file

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def png_data_uri(fig: Figure, dpi: int = 100) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


@dataclass
class Grid:
    """Small multiples (see ``grid``): the figure, its visible panels and the panel size."""

    fig: Figure
    axes: list
    nrows: int
    ncols: int
    w: float  # inches per column
    h: float  # inches per row (the panel, its labels and the gap below it)
    titles: dict = field(default_factory=dict)  # panel -> its title (panel_title)


_LEFT_IN, _RIGHT_IN, _BOTTOM_IN, _PAD_IN = 0.6, 0.15, 0.5, 0.1


def grid(n: int, ncols: int = 4, w: float = 3.6, h: float = 2.4, hspace: float = 0.75) -> Grid:
    """``n`` panels in rows of ``ncols``, with margins fixed in inches (constrained layout would
    cost ~0.5 s per figure at 16 panels, most of the report's rendering time). Call
    ``finish_grid`` once the panels are drawn: it adds the header and sizes the top margin."""
    n = max(1, n)
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    width, height = w * ncols, h * nrows
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)  # text is measured while laying out
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True).ravel().tolist()
    fig.subplots_adjust(left=_LEFT_IN / width, right=1 - _RIGHT_IN / width, bottom=_BOTTOM_IN / height,
                        top=1, wspace=0.25, hspace=hspace)
    for ax in axes[n:]:
        ax.set_visible(False)
    return Grid(fig, axes[:n], nrows, ncols, w, h)


def _inches(artist, fig: Figure) -> tuple[float, float]:
    box = artist.get_window_extent(fig.canvas.get_renderer())
    return box.width / fig.dpi, box.height / fig.dpi


def panel_title(g: Grid, ax, text: str, fontsize: float = 8) -> None:
    """A panel's title, left-aligned, its font shrunk (to 6 pt at least) until it fits the
    panel's column, so it never runs into the next panel."""
    title = g.titles[ax] = ax.set_title(text, fontsize=fontsize, loc="left")
    room = g.w - 0.3
    while _inches(title, g.fig)[0] > room and title.get_fontsize() > 6:
        title.set_fontsize(title.get_fontsize() - 0.5)


def finish_grid(g: Grid, title: str, handles: list | None = None, legend_fontsize: float = 8) -> Figure:
    """The header above the panels: the title, then the legend on a line of its own (in as many
    columns as fit the width), both measured, then the first row's panel titles; the figure
    grows by what the header needs, so nothing is cut off and nothing overlaps."""
    fig = g.fig
    width = g.w * g.ncols
    heading = fig.suptitle(title, x=0.01, ha="left", va="top", fontsize=11)
    room = width - 0.2
    while _inches(heading, fig)[0] > room and heading.get_fontsize() > 9:
        heading.set_fontsize(heading.get_fontsize() - 0.5)
    chars = len(title)
    while _inches(heading, fig)[0] > room and chars > 10:  # a narrow figure: wrap the title
        chars = int(chars * 0.9)
        heading.set_text(textwrap.fill(title, chars))
    header_in = _PAD_IN + _inches(heading, fig)[1] + _PAD_IN
    legend = None
    if handles:
        for ncols in range(len(handles), 0, -1):
            legend = fig.legend(handles=handles, loc="upper left", ncols=ncols, fontsize=legend_fontsize,
                                frameon=False, borderaxespad=0, borderpad=0)
            if _inches(legend, fig)[0] <= width - 0.2 or ncols == 1:
                break
            legend.remove()
        legend_top_in = header_in
        header_in += _inches(legend, fig)[1] + _PAD_IN
    titles_in = max((_inches(g.titles[ax], fig)[1] for ax in g.axes[:g.ncols] if ax in g.titles), default=0.0)
    top_in = header_in + titles_in + 0.1
    height = g.h * g.nrows + top_in
    fig.set_size_inches(width, height)
    fig.subplots_adjust(bottom=_BOTTOM_IN / height, top=1 - top_in / height)
    heading.set_y(1 - _PAD_IN / height)
    if legend is not None:
        legend.set_bbox_to_anchor((0.01, 1 - legend_top_in / height), transform=fig.transFigure)
    return fig


def layout_problems(fig: Figure) -> list[str]:
    """What a reader would see as broken in ``fig``: text cut off at the figure's edge, or a
    title, a panel (with its title, labels and legend) or a legend running into another.
    Empty when the figure is clean."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    # (the figure's title is one of its texts)
    boxes = [(f"figure text {t.get_text()!r}", t.get_window_extent(renderer))
             for t in fig.texts if t.get_visible() and t.get_text()]
    boxes += [(f"figure legend {i}", leg.get_window_extent(renderer)) for i, leg in enumerate(fig.legends)]
    for n, ax in enumerate(fig.axes):
        if ax.get_visible():
            label = ax.get_title(loc="left") or ax.get_title() or str(n)
            boxes.append((f"panel {label!r} (with its title and labels)", ax.get_tightbbox(renderer)))
    page = fig.bbox
    problems = [f"{name} is cut off at the figure's edge" for name, b in boxes
                if b.x0 < page.x0 - 1 or b.y0 < page.y0 - 1 or b.x1 > page.x1 + 1 or b.y1 > page.y1 + 1]
    for (a_name, a), (b_name, b) in itertools.combinations(boxes, 2):
        # more than touching: 1 px in from each edge
        if a.x0 + 1 < b.x1 - 1 and b.x0 + 1 < a.x1 - 1 and a.y0 + 1 < b.y1 - 1 and b.y0 + 1 < a.y1 - 1:
            problems.append(f"{a_name} runs into {b_name}")
    return problems
