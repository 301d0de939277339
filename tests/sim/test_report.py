"""report.html: the figures are there, drawn from the run's series, and every number shown is the
one in metrics.json."""

from __future__ import annotations

import colorsys
import itertools
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from matplotlib.colors import to_rgb

from timeshare.cli import main
from timeshare.durations import format_duration_s
from timeshare.report import figures, gantt, series
from timeshare.report.html import _attainment_title, _program_hours, load_results, write_report
from timeshare.report.runlog import GpuRows, load_run
from timeshare.report.palette import program_colors, team_colors
from timeshare.report.style import layout_problems
from timeshare.report.tables import format_value, metrics_table
from timeshare.sim.cli import simulate
from timeshare.sim.metrics import percentiles
from timeshare.sim.scenario import load_scenario

TINY = """
name = "tiny"
duration = "2d"
seed = 3

[policy]
lookback_window = "1d"
max_min_runtime = "4h"

[[pools]]
gpu_type = "H100"
nodes = 4
gpus_per_node = 8

[allocations]
"vision" = 60
"vision/det" = 1
"text" = 40
"text/lm" = 1

[[node_events]]
at = "20h"
node = "H100-001"
kind = "unhealthy"
repair = "3h"
reason = "test drain"

[generator]
offered_load = 2.0
team_spread = 0.3

[[generator.classes]]
kind = "debug"
load_share = 0.05
gpus = { 1 = 2, 2 = 1 }
work = ["2m", "15m"]
min_runtime = "work"
resumable = false

[[generator.classes]]
kind = "training"
load_share = 0.7
gpus = { 4 = 1, 8 = 2, 16 = 1 }
work = ["1h", "10h"]
min_runtime = ["30m", "3h"]
resumable = true
checkpoint_interval = "30m"

[[generator.classes]]
kind = "eval"
load_share = 0.25
gpus = { 2 = 1, 4 = 1 }
work = ["30m", "3h"]
min_runtime = 0
resumable = true
checkpoint_interval = "15m"
"""

POLICIES = ["budget", "baseline"]


class _Page(HTMLParser):
    """Collects the figures (id -> their SVG panels' markup), image sources (there should be
    none), the data-* value cells of the tables (with the id of their table) and the ratio cells,
    in page order; ``order`` lists tables, <details> and figures as met."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.figures: dict[str, list[dict]] = {}  # figure id -> its charts' attributes
        self.series: list[dict] = []  # every element carrying data-values, with its figure's id
        self._figure: str | None = None
        self.cells: list[dict] = []
        self.ratios: list[str] = []
        self.order: list[str] = []
        self.in_details: list[str] = []  # ids of the tables inside a <details>
        self._cell: dict | None = None
        self._table: str | None = None
        self._details = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-values" in a:
            self.series.append({**a, "figure": self._figure})
        if tag == "img":
            self.images.append(a.get("src", ""))
        elif tag == "figure":
            self._figure = a.get("id")
            self.figures[self._figure] = []
            self.order.append("figure")
        elif tag == "svg" and "chart" in a.get("class", "").split():
            self.figures[self._figure].append(a)
        elif tag == "details":
            self._details += 1
            self.order.append("details")
        elif tag == "table":
            self._table = a.get("id")
            self.order.append(f"table#{self._table}")
            if self._details:
                self.in_details.append(self._table)
        elif tag == "td" and "data-metric" in a:
            self._cell = {**a, "text": "", "table": self._table}
            self.cells.append(self._cell)
        elif tag == "td" and "ratio" in a.get("class", "").split():
            self._cell = {"text": ""}
            self.ratios.append(self._cell)

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data

    def handle_endtag(self, tag):
        if tag == "td":
            self._cell = None
        elif tag == "figure":
            self._figure = None
        elif tag == "details":
            self._details -= 1


def _parse(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text())
    return p


def _lookup(metrics: dict, dotted: str):
    """metrics["teams"]["vision/det"]["attainment"] from "teams.vision/det.attainment"; None when
    this policy's metrics lack the path (e.g. no requeues of a kind), which the page shows as "–"."""
    if dotted.startswith("teams."):
        team, field = dotted[len("teams."):].rsplit(".", 1)
        return metrics["teams"][team][field]
    node = metrics
    for part in dotted.split("."):
        if part not in node:
            return None
        node = node[part]
    return node


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    (tmp / "tiny.toml").write_text(TINY)
    out = tmp / "out"
    simulate(str(tmp / "tiny.toml"), POLICIES, out, {}, show_progress=False, report=True)
    return out


@pytest.fixture(scope="module")
def page(run_dir) -> _Page:
    return _parse(run_dir / "report.html")


def _figure_ids(policies) -> set[str]:
    # per policy: cluster picture, team delivery, program delivery; then 2 ratio, waits, preemptions
    return ({f"fig-{kind}-{p}" for p in policies for kind in ("cluster", "delivery", "delivery-programs")}
            | {"fig-ratio-teams", "fig-ratio-programs", "fig-waits", "fig-preemptions"})


def test_report_draws_its_figures_as_inline_svg(run_dir, page):
    assert set(page.figures) == _figure_ids(POLICIES)
    for fig_id, charts in page.figures.items():
        assert charts, fig_id  # every figure has at least one SVG panel
        assert all(c["viewbox"].startswith("0 0 ") for c in charts)
    text = (run_dir / "report.html").read_text()
    # one offline file: no images, scripts or anything fetched from elsewhere
    assert page.images == []
    assert not re.search(r"<script|src=|href=\"(?!#)|url\((?!#)", text)
    # the teams' and programs' delivery panels, one per team or program
    assert len(page.figures["fig-delivery-budget"]) == 2
    assert len(page.figures["fig-delivery-programs-budget"]) == 2


def test_every_table_number_is_metrics_json(run_dir, page):
    metrics = json.loads((run_dir / "metrics.json").read_text())
    seen = set()
    for cell in page.cells:
        policy, path = cell["data-policy"], cell["data-metric"]
        expected = _lookup(metrics[policy], path)
        assert json.loads(cell["data-value"]) == expected, (policy, path)
        if cell["table"] != "headline":  # (the headline's wording: test_headline_...)
            assert cell["text"] == format_value(path, expected), (policy, path)
            seen.add((policy, path))
    for policy in POLICIES:
        for path in ("occupancy", "preemptions", "unallocated_share", "attainment.fleet",
                     "attainment_all_work.fleet", "queue_wait_s.overall.p90", "drains.needing_human",
                     "wasted_gpu_hours"):
            assert (policy, path) in seen
        for team in metrics[policy]["teams"]:
            for field in ("owed_gpu_hours", "delivered_gpu_hours", "attainment", "attainment_all_work"):
                assert (policy, f"teams.{team}.{field}") in seen
    occupancy = next(c for c in page.cells if c["data-metric"] == "occupancy" and c["data-policy"] == "budget")
    assert occupancy["text"] == f"{100 * metrics['budget']['occupancy']:.1f}%"


def test_curves_from_events_agree_with_metrics(run_dir):
    """The event log the figures are drawn from gives back the metrics' own numbers."""
    scenario = load_scenario(run_dir.parent / "tiny.toml")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    rows = GpuRows.from_scenario(scenario)
    tree = scenario.tree()
    fractions = {t: tree.nodes[t].fraction for t in tree.leaves}
    for policy in POLICIES:
        m = metrics[policy]
        log = load_run(run_dir / policy / "events.jsonl", policy, m["sim"]["simulated_s"], scenario, rows)
        th = series.team_hours(log, fractions, rows.pool_gpus)
        for i, team in enumerate(log.teams):
            t = m["teams"][team]
            # funded work (the target) ...
            assert series.attainment(th.funded[i], th.owed[i]) == pytest.approx(t["attainment"], abs=1e-6)
            assert th.owed[i].sum() / 3600 == pytest.approx(t["owed_gpu_hours"], abs=1e-3)
            assert th.funded[i].sum() / 3600 == pytest.approx(t["delivered_gpu_hours"], abs=1e-3)
            # ... and every workload (shown beside it)
            assert series.attainment(th.delivered[i], th.owed_all_work[i]) == pytest.approx(
                t["attainment_all_work"], abs=1e-6)
            assert th.owed_all_work[i].sum() / 3600 == pytest.approx(t["owed_all_work_gpu_hours"], abs=1e-3)
            assert th.delivered[i].sum() / 3600 == pytest.approx(t["delivered_all_work_gpu_hours"], abs=1e-3)
        assert th.delivered.sum() / 3600 == pytest.approx(m["delivered_gpu_hours"], abs=1e-3)
        assert percentiles(list(log.wait_s))["p90"] == m["queue_wait_s"]["overall"]["p90"]
        for kind, stats in m["queue_wait_s"]["by_kind"].items():
            waits = log.wait_s[log.wait_kind == log.kinds.index(kind)]
            assert percentiles(list(waits))["p90"] == stats["p90"]
        assert len(log.preempt_t_s) == m["preemptions"]
        # each GPU holds one workload at a time: the picture's bars never overlap on a row
        order = np.lexsort((log.seg_t0_s[log.row_seg], log.gpu_row))
        r, s = log.gpu_row[order], log.row_seg[order]
        same_row = r[1:] == r[:-1]
        assert np.all(log.seg_t1_s[s[:-1]][same_row] <= log.seg_t0_s[s[1:]][same_row])


def test_time_range_and_row_thinning(run_dir):
    scenario = load_scenario(run_dir.parent / "tiny.toml")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    out = write_report(run_dir, scenario, metrics, window=(6 * 3600, 12 * 3600), max_gpu_rows=8)
    text = out.read_text()
    assert "6.0 h to 12.0 h" in text
    assert "every 4th GPU: 8 of 32 rows" in text
    with pytest.raises(ValueError):
        write_report(run_dir, scenario, metrics, window=(10 * 86400, 11 * 86400))


def test_report_without_event_logs_still_shows_metrics(tmp_path, run_dir):
    scenario = load_scenario(run_dir.parent / "tiny.toml")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    out = write_report(tmp_path, scenario, metrics)
    p = _parse(out)
    assert p.figures == {} and p.images == []
    assert any(c["data-metric"] == "occupancy" for c in p.cells)


def test_attainment_counts_funded_work_and_all_work_is_shown_beside_it(run_dir):
    # the tiny scenario's eval workloads have no minimum runtime: owed to no one, so the funded
    # count owes less than the all-work one wherever a team asked for eval time
    metrics = json.loads((run_dir / "metrics.json").read_text())
    for policy in POLICIES:
        teams = metrics[policy]["teams"].values()
        assert all(t["owed_all_work_gpu_hours"] >= t["owed_gpu_hours"] for t in teams)
        assert any(t["owed_all_work_gpu_hours"] > t["owed_gpu_hours"] + 1 for t in teams)
        assert all(t["delivered_all_work_gpu_hours"] >= t["delivered_gpu_hours"] for t in teams)
        assert metrics[policy]["attainment"]["teams"] == len(teams)
        assert metrics[policy]["attainment_all_work"]["fleet"] is not None
        assert "attainment_funded" not in metrics[policy]


# -- the headline --------------------------------------------------------------------------------

#: (metrics.json path, the words of its row)
HEADLINE_ROWS = {
    "queue_wait_s.by_kind.debug.p90": "debug p90 wait",
    "occupancy": "occupancy",
    "attainment.fleet": "fleet",
    "attainment.min_team": "worst team",
    "attainment.teams_at_or_above_95": "95%",
    "preemptions": "preemptions",
    "wasted_gpu_hours": "wasted GPU-hours",
}


def test_the_report_opens_with_the_headline_and_folds_the_full_table(run_dir, page):
    text = (run_dir / "report.html").read_text()
    # the headline is the first table, before any figure; the full table is folded in <details>
    assert page.order[0] == "table#headline"
    assert page.order.index("details") < page.order.index("table#metrics-table") < page.order.index("figure")
    assert page.in_details == ["metrics-table"]
    assert text.index('id="headline"') < text.index("<details")
    for words in HEADLINE_ROWS.values():
        assert words in text.split('id="headline"', 1)[1].split("</table>", 1)[0]


def test_headline_numbers_are_the_metrics(run_dir, page):
    metrics = json.loads((run_dir / "metrics.json").read_text())
    cells = {(c["data-policy"], c["data-metric"]): c for c in page.cells if c["table"] == "headline"}
    assert set(cells) == {(p, path) for p in POLICIES for path in HEADLINE_ROWS}
    for policy in POLICIES:
        m = metrics[policy]
        shown = {path: cells[(policy, path)]["text"] for path in HEADLINE_ROWS}
        for path in HEADLINE_ROWS:
            assert json.loads(cells[(policy, path)]["data-value"]) == _lookup(m, path)
        debug = m["queue_wait_s"]["by_kind"]["debug"]
        assert shown["queue_wait_s.by_kind.debug.p90"] == format_duration_s(debug["p90"])
        assert shown["occupancy"] == f"{100 * m['occupancy']:.1f}%"
        # attainment is the funded figure
        assert shown["attainment.fleet"] == f"{100 * m['attainment']['fleet']:.1f}%"
        rated = {t: v["attainment"] for t, v in m["teams"].items() if v["attainment"] is not None}
        low = min(rated.values())
        worst = [t for t, a in rated.items() if a == low]
        who = worst[0] if len(worst) == 1 else f"{len(worst)} teams"  # a tie names no one team
        assert shown["attainment.min_team"] == f"{100 * low:.1f}% ({who})"
        assert shown["attainment.teams_at_or_above_95"] == (
            f"{sum(a >= 0.95 for a in rated.values())} of {len(rated)}")
        assert shown["preemptions"] == f"{m['preemptions']:,}"
        assert shown["wasted_gpu_hours"] == f"{m['wasted_gpu_hours']:,.0f}"


_READABLE_RATIO = re.compile(r"^(–|> 100×|< 0\.01×|\d\.\d\d×|\d\d\d?×)$")


def test_ratio_cells_are_readable(page):
    assert page.ratios  # the tiny run has ratio columns (two policies)
    for cell in page.ratios:
        assert _READABLE_RATIO.match(cell["text"]), cell["text"]
    for cell in page.cells + page.ratios:
        assert not re.search(r"∞|\binf\b|\bnan\b|[x×]\d{4}", cell["text"], re.IGNORECASE), cell["text"]


def test_huge_zero_and_tiny_ratios_show_their_bound():
    table = metrics_table({"budget": {"a": 9005.5, "b": 5, "c": 0, "d": 0, "e": 3.0, "f": 12.4, "g": 9.996, "h": 100},
                           "baseline": {"a": 1, "b": 0, "c": 3, "d": 0, "e": 2.0, "f": 1, "g": 1, "h": 1}})
    p = _Page()
    p.feed(table)
    shown = [c["text"] for c in p.ratios]
    assert shown == ["> 100×", "> 100×", "< 0.01×", "–", "1.50×", "12×", "10×", "100×"]
    assert all(_READABLE_RATIO.match(text) for text in shown)


# -- figures -------------------------------------------------------------------------------------

_SVG = re.compile(r'<svg class="chart" viewBox="0 0 ([0-9.]+) ([0-9.]+)"[^>]*>(.*?)</svg>', re.S)
_TEXT = re.compile(r'<text x="(-?[0-9.]+)" y="(-?[0-9.]+)"(?: text-anchor="(\w+)")?>([^<]*)</text>')


def _text_outside(html: str) -> list[str]:
    """Labels drawn inside an SVG panel whose anchor, or their estimated extent (6 px a character
    at 10 px), falls outside the panel (titles and legends are HTML, laid out by the browser)."""
    problems = []
    for w, h, body in _SVG.findall(html):
        w, h = float(w), float(h)
        for x, y, anchor, text in _TEXT.findall(body):
            x, y, half = float(x), float(y), 3 * len(text)
            lo, hi = {"middle": (x - half, x + half), "end": (x - 2 * half, x)}.get(anchor, (x, x + 2 * half))
            if not (0 <= y <= h) or lo < -1 or (hi > w + 1 and anchor):  # (a node name may run to the edge)
                problems.append(f"{text!r} at ({x}, {y}) outside 0 0 {w} {h}")
    return problems


def test_figure_labels_stay_inside_their_panels_and_titles_are_html(run_dir):
    """Titles and legends are HTML text the browser wraps; what an SVG panel draws itself (tick
    labels, axis titles) stays inside it, on long names and many panels too."""
    scenario = load_scenario(run_dir.parent / "tiny.toml")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    rows = GpuRows.from_scenario(scenario)
    tree = scenario.tree()
    teams = tree.leaves
    fractions = {t: tree.nodes[t].fraction for t in teams}
    logs = {p: load_run(run_dir / p / "events.jsonl", p, metrics[p]["sim"]["simulated_s"], scenario, rows)
            for p in POLICIES}
    colors = team_colors(teams)
    figs = {}
    for policy, log in logs.items():
        th = series.team_hours(log, fractions, rows.pool_gpus)
        # the longest title a team can have: 100.0% of its fraction, six-figure GPU-hours owed
        titles = [_attainment_title(0.999, 1.0, 123456) for _ in teams]
        figs[f"delivery {policy}"] = figures.delivery_figure(policy, th, teams, titles, 1, [colors[t] for t in teams])
        assert all(f'<div class="ptitle">{t}\n{titles[0]}</div>' in figs[f"delivery {policy}"] for t in teams)
        figs[f"cluster {policy}"] = gantt.draw_gantt(log, rows, gantt.choose_view(log.end_s, rows.total), colors)
    edges = series.hour_edges(2 * 86400)
    ones = np.ones((5, len(edges) - 1)) * 3600
    five = series.TeamHours(edges, ones, ones, ones, ones, np.full(5, 0.2))
    figs["delivery five teams"] = figures.delivery_figure(
        "budget", five, [f"program/team-{i}" for i in range(5)], [_attainment_title(0.2, 0.95, 98765)] * 5, 6,
        [f"#{i}{i}{i}{i}{i}{i}" for i in range(5)])
    at = np.arange(0.0, 2 * 86400 + 1, 3600)
    for labels in (["vision/det"], ["a/long/team/name/that/goes/on", "b", "c", "d", "e"]):
        figs[f"ratio {len(labels)}"] = figures.ratio_figure(
            {p: [np.ones(len(at))] * len(labels) for p in ("budget", "baseline", "fifo")}, at, labels, 7 * 86400)
    figs["waits"] = figures.waits_figure(logs, metrics)
    # each panel's title gives the p90 of every policy as metrics.json has it
    first = figs["waits"].split('<div class="ptitle">', 2)[1].split("</div>", 1)[0]
    for policy in POLICIES:
        assert f"{policy} {format_duration_s(metrics[policy]['queue_wait_s']['overall']['p90'])}" in first
    figs["preemptions"] = figures.preemptions_figure(logs, metrics)
    for name, html in figs.items():
        assert _SVG.search(html), name
        assert _text_outside(html) == [], name


def _values(item: dict) -> np.ndarray:
    return np.array([float(v) for v in item["data-values"].split()])


def test_the_figures_carry_the_series_they_draw(run_dir, page):
    """Each curve's values are in the page (data-values), and they are the run's series: what
    each team delivered and was owed, its usage ratio, the wait CDF, the preemptions per bin."""
    scenario = load_scenario(run_dir.parent / "tiny.toml")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    rows = GpuRows.from_scenario(scenario)
    tree = scenario.tree()
    teams = tree.leaves
    fractions = {t: tree.nodes[t].fraction for t in teams}
    total_gpus = sum(rows.pool_gpus.values())
    programs = figures.programs_of(teams)
    at = np.arange(0.0, 2 * 86400 + 1, 3600)
    for policy in POLICIES:
        m = metrics[policy]
        log = load_run(run_dir / policy / "events.jsonl", policy, m["sim"]["simulated_s"], scenario, rows)
        th = series.team_hours(log, fractions, rows.pool_gpus)
        width_h = np.diff(th.edges_s) / 3600  # (two days: hourly bins, values in mean GPUs)
        for fig_id, hours in ((f"fig-delivery-{policy}", th), (f"fig-delivery-programs-{policy}",
                                                               _program_hours(th, programs))):
            drawn = [s for s in page.series if s["figure"] == fig_id]
            for name, want in (("funded", hours.funded), ("other", hours.other), ("owed", hours.owed)):
                got = [_values(s) for s in drawn if s["data-series"] == name]
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    np.testing.assert_allclose(g, w / 3600 / width_h, rtol=1e-3, atol=1e-9)
        # the team's owed GPU-hours in metrics.json, read back from the figure
        owed = [_values(s) for s in page.series if s["figure"] == f"fig-delivery-{policy}"
                and s["data-series"] == "owed"]
        for team, values in zip(teams, owed):
            assert (values * width_h).sum() == pytest.approx(m["teams"][team]["owed_gpu_hours"], rel=1e-3)
        ratios = [_values(s) for s in page.series if s["figure"] == "fig-ratio-teams" and s["data-policy"] == policy]
        for i, team in enumerate(teams):
            want = series.usage_ratio(log, lambda x, i=i: x == i, fractions[team], total_gpus,
                                      scenario.policy.lookback_window_s, at)
            np.testing.assert_allclose(ratios[i], want, rtol=1e-3, atol=1e-9)
        # the wait CDF: 0.9 of the workloads waited at most the p90 metrics.json gives
        cdf = next(s for s in page.series if s["figure"] == "fig-waits" and s["data-policy"] == policy)
        x = np.array([float(v) for v in cdf["data-x"].split()])
        y = _values(cdf)
        p90 = max(1.0, m["queue_wait_s"]["overall"]["p90"])
        assert y[np.searchsorted(x, p90, side="right") - 1] <= 0.9 + 1e-9 or x[0] >= p90
        assert y[-1] == 1.0 and np.all(np.diff(y) >= 0)
        # (x is written with four digits: the CDF lies between its values just below and above x)
        assert np.all(figures.cdf_at(log.wait_s, x * (1 - 1e-3)) <= y + 1e-4)
        assert np.all(y <= figures.cdf_at(log.wait_s, x * (1 + 1e-3)) + 1e-4)
        # preemptions per bin, by reason, add up to metrics.json's totals
        drawn = [s for s in page.series if s["figure"] == "fig-preemptions" and "data-reason" in s]
        per_policy = len(drawn) // len(POLICIES)
        mine = drawn[POLICIES.index(policy) * per_policy:(POLICIES.index(policy) + 1) * per_policy]
        assert {s["data-reason"]: int(_values(s).sum()) for s in mine} == {
            r: m["preemptions_by_reason"].get(r, 0) for r in (s["data-reason"] for s in mine)}
        assert sum(int(_values(s).sum()) for s in mine) == m["preemptions"]


def test_the_layout_check_sees_a_title_running_into_a_legend():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 2))
    fig.subplots()
    fig.suptitle("a long title across the whole top of the figure", x=0.01, ha="left")
    fig.legend(handles=[plt_line("budget"), plt_line("baseline")], loc="upper right", ncols=2)
    problems = layout_problems(fig)
    assert any("runs into figure legend" in p for p in problems)
    assert any("cut off" in p for p in problems)  # (the title is wider than 4 in)


def plt_line(label):
    from matplotlib.lines import Line2D

    return Line2D([], [], label=label)


AI2_TEAMS = ["prior/olmo/pretrain", "prior/olmo/midtrain", "prior/olmo/eval", "prior/molmo/vision",
             "prior/molmo/data", "prior/infra", "tulu/sft", "tulu/rl", "tulu/safety", "tulu/reasoning",
             "tulu/code", "science/climate", "science/bio", "science/semantic", "science/agents"]


def _lab(rgb) -> np.ndarray:
    """sRGB -> CIELAB (D65)."""
    c = np.array(to_rgb(rgb), float)
    c = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ c
    xyz /= np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _hue_deg(rgb) -> float:
    return 360 * colorsys.rgb_to_hls(*to_rgb(rgb))[0]


def _hue_gap(a: float, b: float) -> float:
    return min(abs(a - b), 360 - abs(a - b))


def test_a_program_has_one_hue_whatever_its_name_sorts_beside():
    # "a-b/y" sorts before "a/x" ('-' < '/') while program "a" sorts before "a-b": each team takes
    # its own program's hue, and the program's own colour is of that hue
    colors = team_colors(["a/x", "a/z", "a-b/y"])
    programs = program_colors(["a/x", "a/z", "a-b/y"])
    assert _hue_gap(_hue_deg(colors["a/x"]), _hue_deg(programs["a"])) <= 35
    assert _hue_gap(_hue_deg(colors["a-b/y"]), _hue_deg(programs["a-b"])) <= 35
    assert _hue_gap(_hue_deg(programs["a"]), _hue_deg(programs["a-b"])) >= 45


def test_fifteen_team_colours_are_a_hue_per_program_and_can_be_told_apart():
    colors = team_colors(AI2_TEAMS)
    assert set(colors) == set(AI2_TEAMS)
    programs: dict[str, list[str]] = {}
    for t in AI2_TEAMS:
        programs.setdefault(t.split("/")[0], []).append(t)
    hues = {p: [_hue_deg(colors[t]) for t in members] for p, members in programs.items()}
    # one hue per program: its teams' hues within 35 degrees of each other ...
    for p, hs in hues.items():
        assert max(_hue_gap(a, b) for a, b in itertools.combinations(hs, 2)) <= 35, p
    # ... and programs' hues at least 45 degrees apart
    for (p, a), (q, b) in itertools.combinations(hues.items(), 2):
        assert min(_hue_gap(x, y) for x in a for y in b) >= 45, (p, q)
    # every two teams differ by a colour difference one sees at a glance (CIE76 delta E >= 12)
    for a, b in itertools.combinations(AI2_TEAMS, 2):
        assert np.linalg.norm(_lab(colors[a]) - _lab(colors[b])) >= 12, (a, b)


# -- empty and tiny traces -----------------------------------------------------------------------

def _trace_scenario(tmp_path: Path, lines: list[dict]) -> Path:
    """The tiny scenario reading its workloads from a trace file of ``lines``."""
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    toml = TINY.split("[generator]", 1)[0] + '[trace]\npath = "trace.jsonl"\n'
    (tmp_path / "scenario.toml").write_text(toml)
    return tmp_path / "scenario.toml"


def test_an_empty_trace_gives_a_report(tmp_path, capsys):
    scenario = _trace_scenario(tmp_path, [])
    out = tmp_path / "out"
    # as `timeshare simulate` runs it, every policy
    assert main(["simulate", str(scenario), "--out", str(out), "--no-progress"]) == 0
    page = _parse(out / "report.html")
    metrics = json.loads((out / "metrics.json").read_text())
    assert page.figures == {} and page.images == []  # nothing to draw ...
    assert "Nothing ran" in (out / "report.html").read_text()
    headline = [c for c in page.cells if c["table"] == "headline"]
    assert {c["data-policy"] for c in headline} == set(metrics) == {"budget", "baseline", "fifo"}
    for c in headline:  # ... but the headline is there, every number "–" or 0
        assert c["text"] in ("–", "0", "0.0%", "0 of 0"), (c["data-metric"], c["text"])
    assert "attainment (funded)" in capsys.readouterr().out


def test_a_one_workload_trace_gives_a_report(tmp_path):
    scenario = _trace_scenario(tmp_path, [{
        "id": "only", "submit_s": 0, "project": "vision/det", "gpu_type": "H100", "gpus": 8, "work_s": 7200,
        "min_runtime_s": 3600, "resumable": True, "kind": "training", "checkpoint_interval_s": 1800}])
    out = tmp_path / "out"
    metrics = simulate(str(scenario), POLICIES, out, {}, show_progress=False, report=True)
    page = _parse(out / "report.html")
    assert set(page.figures) == _figure_ids(POLICIES)
    assert all(page.figures.values())
    for policy in POLICIES:
        m = metrics[policy]
        assert m["workloads"]["completed"] == 1
        assert m["attainment"]["fleet"] == 1.0  # it started at once on an idle cluster
        cell = next(c for c in page.cells if c["table"] == "headline" and c["data-policy"] == policy
                    and c["data-metric"] == "attainment.teams_at_or_above_95")
        assert cell["text"] == "1 of 1"  # text/lm asked for nothing: owed nothing, not rated
        cell = next(c for c in page.cells if c["table"] == "headline" and c["data-policy"] == policy
                    and c["data-metric"] == "attainment.min_team")
        assert cell["text"] == "100.0% (vision/det)"


def test_a_metrics_json_from_before_the_rename_is_read_with_the_funded_figure_as_attainment(run_dir, tmp_path):
    """`timeshare report` on an older output directory must not show the all-work figure as the target."""
    current = json.loads((run_dir / "metrics.json").read_text())
    old = {}
    for policy, m in current.items():  # the keys as metrics.py wrote them before 2026-12-01
        o = {k: v for k, v in m.items() if k not in ("attainment", "attainment_all_work", "teams")}
        o["attainment"], o["attainment_funded"] = m["attainment_all_work"], m["attainment"]
        o["teams"] = {name: {"fraction": t["fraction"], "owed_gpu_hours": t["owed_all_work_gpu_hours"],
                             "delivered_gpu_hours": t["delivered_all_work_gpu_hours"],
                             "attainment": t["attainment_all_work"], "funded_owed_gpu_hours": t["owed_gpu_hours"],
                             "funded_attainment": t["attainment"]} for name, t in m["teams"].items()}
        old[policy] = o
    (tmp_path / "metrics.json").write_text(json.dumps(old))
    read = load_results(tmp_path)
    for policy, m in current.items():
        assert read[policy]["attainment"] == m["attainment"]
        assert read[policy]["attainment_all_work"] == m["attainment_all_work"]
        for name, t in m["teams"].items():
            r = read[policy]["teams"][name]
            assert (r["attainment"], r["owed_gpu_hours"]) == (t["attainment"], t["owed_gpu_hours"])
            assert (r["attainment_all_work"], r["owed_all_work_gpu_hours"]) == (
                t["attainment_all_work"], t["owed_all_work_gpu_hours"])
    assert load_results(run_dir) == current  # a current file as it is
