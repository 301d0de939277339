"""report.html: the figures are there and every number shown is the one in metrics.json."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from timeshare.report import series
from timeshare.report.html import write_report
from timeshare.report.runlog import GpuRows, load_run
from timeshare.report.tables import format_value
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

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
POLICIES = ["budget", "baseline"]


class _Page(HTMLParser):
    """Collects image sources and the data-* value cells of the tables."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.cells: list[dict] = []
        self._cell: dict | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.images.append(a.get("src", ""))
        elif tag == "td" and "data-metric" in a:
            self._cell = {**a, "text": ""}
            self.cells.append(self._cell)

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data

    def handle_endtag(self, tag):
        if tag == "td":
            self._cell = None


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
    p = _Page()
    p.feed((run_dir / "report.html").read_text())
    return p


def test_report_embeds_png_figures(page):
    data_imgs = [s for s in page.images if s.startswith("data:image/png;base64,")]
    # per policy: cluster picture, team delivery, program delivery; then 2 ratio, waits, preemptions
    assert len(data_imgs) == 3 * len(POLICIES) + 4
    assert len(data_imgs) == len(page.images)  # nothing refers outside the file
    for src in data_imgs:
        raw = base64.b64decode(src.split(",", 1)[1])
        assert raw[:8] == PNG_MAGIC
        assert len(raw) > 2000  # not an empty canvas


def test_every_table_number_is_metrics_json(run_dir, page):
    metrics = json.loads((run_dir / "metrics.json").read_text())
    seen = set()
    for cell in page.cells:
        policy, path = cell["data-policy"], cell["data-metric"]
        expected = _lookup(metrics[policy], path)
        assert json.loads(cell["data-value"]) == expected, (policy, path)
        assert cell["text"] == format_value(path, expected), (policy, path)
        seen.add((policy, path))
    for policy in POLICIES:
        for path in ("occupancy", "preemptions", "unallocated_share", "attainment.fleet",
                     "queue_wait_s.overall.p90", "drains.needing_human", "wasted_gpu_hours"):
            assert (policy, path) in seen
        for team in metrics[policy]["teams"]:
            assert (policy, f"teams.{team}.attainment") in seen
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
            assert series.attainment(th.delivered[i], th.owed[i]) == pytest.approx(m["teams"][team]["attainment"],
                                                                                  abs=1e-6)
            assert th.owed[i].sum() / 3600 == pytest.approx(m["teams"][team]["owed_gpu_hours"], abs=1e-3)
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
    out = write_report(run_dir, scenario, metrics, window=(6 * 3600, 12 * 3600), max_gpu_rows=8, jobs=1)
    text = out.read_text()
    assert "6.0 h to 12.0 h" in text
    assert "every 4th GPU: 8 of 32 rows" in text
    with pytest.raises(ValueError):
        write_report(run_dir, scenario, metrics, window=(10 * 86400, 11 * 86400))


def test_report_without_event_logs_still_shows_metrics(tmp_path, run_dir):
    scenario = load_scenario(run_dir.parent / "tiny.toml")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    out = write_report(tmp_path, scenario, metrics)
    p = _Page()
    p.feed(out.read_text())
    assert p.images == []
    assert any(c["data-metric"] == "occupancy" for c in p.cells)
