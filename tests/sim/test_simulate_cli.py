"""``timeshare simulate`` on the user's path: the summary first, the core it ran and every file
it wrote named in its last line; a check policy runs alone; a bad --set is one line, exit 2."""

from __future__ import annotations

import json

import pytest

from timeshare.cli import main
from timeshare.sim.scenario import load_scenario

TINY = """
name = "tiny-sweep"
duration = "6h"
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
def scenario(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


def test_the_summary_comes_first_and_the_last_line_names_every_file_written(tmp_path, scenario, capsys):
    out = tmp_path / "out"
    assert main(["simulate", str(scenario), "--policy", "budget", "--out", str(out), "--no-progress"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert "attainment" in captured.out.split("wrote")[0]  # the summary, before the files
    last = lines[-1]
    assert last.startswith("wrote ")
    for name in ("report.html", "metrics.json", "summary.txt", "budget/events.jsonl"):
        assert name in last, name
        assert (out / name).exists(), name
    assert "pure Python core" in last or "compiled core" in last
    assert "with the pure Python core" in captured.err or "with the compiled core" in captured.err
    assert "rendering" in captured.err and "report.html" in captured.err  # not silent while it renders


def test_policies_run_at_once_write_what_they_write_one_after_the_other(tmp_path, scenario, capsys):
    """--jobs 3 forks one process per policy: every policy's events byte for byte and its metrics
    (but the run's own wall time) as with --jobs 1."""
    runs = {}
    for jobs in ("1", "3"):
        out = tmp_path / f"jobs-{jobs}"
        assert main(["simulate", str(scenario), "--out", str(out), "--no-progress", "--no-report", "--jobs", jobs]) == 0
        runs[jobs] = out
    capsys.readouterr()
    for policy in ("budget", "baseline", "fifo"):
        one, three = (runs[j] / policy / "events.jsonl" for j in ("1", "3"))
        assert one.read_bytes() == three.read_bytes() and one.stat().st_size > 0, policy
    metrics = [json.loads((runs[j] / "metrics.json").read_text()) for j in ("1", "3")]
    for m in metrics:
        for per_policy in m.values():
            for timed in ("wall_s", "simulated_s_per_wall_s", "events_per_wall_s"):
                per_policy["sim"].pop(timed)
    assert list(metrics[0]) == ["budget", "baseline", "fifo"] and metrics[0] == metrics[1]


def test_the_reference_policy_runs_on_its_own_and_decides_as_budget_does(tmp_path, scenario, capsys):
    out = tmp_path / "out"
    assert main(["simulate", str(scenario), "--policy", "budget-reference", "--out", str(out), "--no-progress",
                 "--no-report"]) == 0
    reference = (out / "budget-reference" / "events.jsonl").read_bytes()
    assert main(["simulate", str(scenario), "--policy", "budget", "--out", str(out), "--no-progress",
                 "--no-report"]) == 0
    assert reference == (out / "budget" / "events.jsonl").read_bytes()


def test_a_set_into_an_array_of_tables_takes_an_index(tmp_path, scenario, capsys):
    out = tmp_path / "out"
    assert main(["simulate", str(scenario), "--policy", "fifo", "--set", "pools.0.nodes=8", "--out", str(out),
                 "--no-progress", "--no-report"]) == 0
    assert "fifo" in json.loads((out / "metrics.json").read_text())
    assert load_scenario(scenario, {"pools.0.nodes": "8"}).pools[0].nodes == 8


@pytest.mark.parametrize("setting, key", [
    ("pools.0.nodes.x=1", "pools.0.nodes.x"),
    ("pools.3.nodes=8", "pools.3.nodes"),
    ("pools.first.nodes=8", "pools.first.nodes"),
    ("seed.x=1", "seed.x"),
    ("policy..x=1", "policy..x"),
    ("no_such_setting=1", "no_such_setting"),
], ids=["below a value", "an index past the end", "a name where an index goes", "into a number",
        "an empty segment", "an unknown policy setting"])
def test_a_bad_set_is_one_line_naming_the_key_and_exit_2(scenario, capsys, setting, key):
    assert main(["simulate", str(scenario), "--set", setting, "--no-progress"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), captured.err
    assert key in err[0]
    assert "Traceback" not in captured.err


def test_scale_multiplies_the_pools_and_splits_teams_into_projects(scenario):
    plain = load_scenario(scenario)
    scaled = load_scenario(scenario, {"scale.pools": "4", "scale.projects": "10"})
    assert scaled.pools[0].nodes == 4 * plain.pools[0].nodes
    tree, before = scaled.tree(), plain.tree()
    assert len(tree.leaves) == 10 and len(before.leaves) == 2
    for team in before.leaves:  # the same teams and fractions, split evenly
        projects = [leaf for leaf in tree.leaves if leaf.startswith(team + "/")]
        assert len(projects) == 5
        assert sum(tree.fraction(p) for p in projects) == pytest.approx(before.fraction(team))
    assert {w.project for w in scaled.workloads} <= set(tree.leaves)


@pytest.mark.parametrize("setting", ["scale.pools=0", "scale.projects=x", "scale.size=2"])
def test_a_bad_scale_setting_names_the_key(scenario, capsys, setting):
    assert main(["simulate", str(scenario), "--set", setting, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and setting.split("=")[0] in err[0]


def test_a_sweep_prints_its_table_and_writes_under_the_ignored_out_folder(tmp_path, scenario, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(scenario), "--set", "lookback_window=1d,3d", "--jobs", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("policy"))
    assert "lookback_window" in header and "occupancy" in header
    rows = [line for line in out if line.startswith("budget")]
    assert [row.split()[1] for row in rows] == ["1d", "3d"]
    assert (tmp_path / "out" / "sweep-tiny" / "sweep.csv").exists()
    assert not (tmp_path / "sweep-tiny").exists()


@pytest.mark.parametrize("setting", ["duration", "=3d", " =3d"])
def test_a_set_without_a_key_and_equals_is_a_usage_error(scenario, capsys, setting):
    with pytest.raises(SystemExit) as stopped:
        main(["simulate", str(scenario), "--set", setting, "--no-progress"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and repr(setting) in err[0]


@pytest.mark.parametrize("jobs, folded_by_the_runs", [("3", True), ("1", True), ("3", False)])
def test_the_report_drawn_while_simulating_is_the_one_timeshare_report_draws(tmp_path, scenario, capsys, monkeypatch,
                                                                             jobs, folded_by_the_runs):
    """The command's runs fold their own events for the report (in their forked processes, or
    one after the other), or, past REPORT_FOLD_MAX_EVENTS, let the report read events.jsonl:
    the same report.html as `timeshare report` draws from the files."""
    import re

    from timeshare.report.runlog import RunLog
    from timeshare.sim import cli as sim_cli

    if not folded_by_the_runs:
        monkeypatch.setattr(sim_cli, "WRITE_BATCH_EVENTS", 10)
        monkeypatch.setattr(sim_cli, "REPORT_FOLD_MAX_EVENTS", 20)
    logs: dict = {}
    folded = sim_cli.simulate(str(scenario), ["budget"], tmp_path / "logs", {}, show_progress=False, report=False,
                              report_logs=logs)
    assert folded["budget"]["sim"]["events"] > 30
    assert (list(logs) == ["budget"] and isinstance(logs["budget"], RunLog)) if folded_by_the_runs else not logs
    out = tmp_path / "out"
    assert main(["simulate", str(scenario), "--out", str(out), "--no-progress", "--jobs", jobs]) == 0
    early = (out / "report.html").read_text()
    assert main(["report", str(scenario), str(out)]) == 0
    again = (out / "report.html").read_text()
    strip = re.compile(r"rendered in [0-9.]+ s")
    assert '<svg class="chart"' in early and "<img" not in early
    assert strip.sub("", early) == strip.sub("", again)
