"""timeshare sweep: the grid runs in worker processes, one CSV row per point, bad points as rows."""

from __future__ import annotations

import csv
import itertools

import pytest

from timeshare.cli import main
from timeshare.report.style import layout_problems
from timeshare.report.sweep import METRIC_COLUMNS, SweepPoint, SweepResult, grid_points, headline, parse_grid
from timeshare.report.sweep_html import param_figure
from timeshare.sim.engine import run
from timeshare.sim.scenario import load_scenario

TINY = """
name = "tiny-sweep"
duration = "1d"
seed = 5

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

[generator]
offered_load = 2.0

[[generator.classes]]
kind = "debug"
load_share = 0.1
gpus = { 1 = 2, 2 = 1 }
work = ["2m", "15m"]
min_runtime = "work"
resumable = false

[[generator.classes]]
kind = "training"
load_share = 0.9
gpus = { 4 = 1, 8 = 2 }
work = ["1h", "8h"]
min_runtime = ["30m", "3h"]
resumable = true
checkpoint_interval = "30m"
"""


@pytest.fixture()
def scenario_path(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_two_by_two_sweep_in_parallel(tmp_path, scenario_path):
    out = tmp_path / "sweep"
    code = main(["sweep", str(scenario_path), "--set", "lookback_window=1d,3d", "--set", "max_min_runtime=2h,4h",
                 "--jobs", "2", "--out", str(out), "--no-progress"])
    assert code == 0
    rows = _rows(out / "sweep.csv")
    assert len(rows) == 4
    assert {(r["lookback_window"], r["max_min_runtime"]) for r in rows} == set(
        itertools.product(["1d", "3d"], ["2h", "4h"]))
    assert all(r["policy"] == "budget" and r["error"] == "" for r in rows)
    # a point's numbers are what a direct run with the same settings gives
    r = next(r for r in rows if r["lookback_window"] == "3d" and r["max_min_runtime"] == "2h")
    direct = headline(run(load_scenario(scenario_path, {"lookback_window": "3d", "max_min_runtime": "2h"}),
                          "budget").metrics)
    for column in ("occupancy", "unallocated_share", "preemptions", "p90_wait_s", "debug_p90_wait_s",
                   "wasted_gpu_hours", "drains_needing_human", "attainment_fleet", "attainment_min_team",
                   "attainment_all_work_fleet"):
        assert float(r[column]) == pytest.approx(direct[column]), column
    html = (out / "sweep.html").read_text()
    assert html.count('<img src="data:image/png;base64,') == 2  # one figure per swept parameter
    assert html.count('data-point="') == 4


def test_invalid_point_is_an_error_row(tmp_path, scenario_path):
    out = tmp_path / "sweep"
    code = main(["sweep", str(scenario_path), "--set", "lookback_window=0,1d", "--policy", "budget,fifo",
                 "--jobs", "1", "--out", str(out), "--no-progress"])
    assert code == 0
    rows = _rows(out / "sweep.csv")
    assert len(rows) == 4
    bad = [r for r in rows if r["error"]]
    assert {(r["policy"], r["lookback_window"]) for r in bad} == {("budget", "0"), ("fifo", "0")}
    assert all("lookback_window" in r["error"] and r["occupancy"] == "" for r in bad)
    assert all(float(r["occupancy"]) > 0 for r in rows if not r["error"])


def test_parse_grid_rejects_malformed_settings():
    assert parse_grid(["a=1,2", "policy.x=3"]) == {"a": ["1", "2"], "policy.x": ["3"]}
    for bad in (["a"], ["a="], ["=1"], ["a=1", "a=2"]):
        with pytest.raises(ValueError):
            parse_grid(bad)


def test_sweep_columns_read_funded_attainment_and_all_work_beside_it(scenario_path):
    metrics = run(load_scenario(scenario_path), "budget").metrics
    row = headline(metrics)
    assert row["attainment_fleet"] == metrics["attainment"]["fleet"]
    assert row["attainment_min_team"] == metrics["attainment"]["min_team"]
    assert row["attainment_all_work_fleet"] == metrics["attainment_all_work"]["fleet"]


def test_sweep_figure_titles_and_legends_fit():
    grid = {"lookback_window": ["1d", "3d", "7d"], "max_min_runtime": ["2h", "4h"]}
    points = grid_points(grid, ["budget", "baseline"])
    results = [SweepResult(p, {c: 0.5 + 0.01 * p.index for c in METRIC_COLUMNS}) for p in points]
    for param in grid:
        assert layout_problems(param_figure(param, grid, results)) == [], param


def test_a_sweep_on_a_dask_cluster_gives_the_rows_of_the_local_run(tmp_path, scenario_path):
    distributed = pytest.importorskip("distributed")
    grid = ["--set", "lookback_window=1d,3d", "--policy", "budget,fifo"]
    assert main(["sweep", str(scenario_path), *grid, "--jobs", "1", "--out", str(tmp_path / "local"),
                 "--no-progress"]) == 0
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        assert main(["sweep", str(scenario_path), *grid, "--scheduler", cluster.scheduler_address,
                     "--out", str(tmp_path / "dask"), "--no-progress"]) == 0
    local, remote = _rows(tmp_path / "local" / "sweep.csv"), _rows(tmp_path / "dask" / "sweep.csv")
    for row in local + remote:
        row.pop("wall_s")  # the machine's, not the simulation's
    assert len(local) == 4 and remote == local


def test_a_sweep_whose_dask_scheduler_does_not_answer_is_one_line_and_exit_2(tmp_path, scenario_path, capsys,
                                                                               monkeypatch):
    pytest.importorskip("distributed")
    from timeshare.report import sweep

    monkeypatch.setattr(sweep, "DASK_CONNECT_TIMEOUT_S", 1)
    code = main(["sweep", str(scenario_path), "--set", "lookback_window=1d", "--scheduler", "tcp://127.0.0.1:9",
                 "--out", str(tmp_path / "x"), "--no-progress"])
    assert code == 2
    assert "tcp://127.0.0.1:9" in capsys.readouterr().err
