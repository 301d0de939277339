"""Bad input is refused before anything runs, with an InputError naming the file, the line
and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timeshare.sim.errors import InputError
from timeshare.sim.scenario import load_scenario

SCENARIO = """\
name = "small"
duration = "1d"
seed = 3
[policy]
lookback_window = "7d"
max_min_runtime = "8h"
[[pools]]
gpu_type = "H100"
nodes = 4
gpus_per_node = 8
[allocations]
"lab" = 1
"lab/a" = 2
"lab/b" = 1
[[node_events]]
at = "3h"
node = "H100-001"
kind = "unhealthy"
repair = "2h"
[trace]
path = "trace.jsonl"
"""

GOOD = {"id": "w-1", "submit_s": 0, "project": "lab/a", "gpu_type": "H100", "gpus": 8, "work_s": 3600,
        "min_runtime_s": 600, "resumable": True}


def write(tmp_path: Path, lines: list[str], scenario: str = SCENARIO) -> Path:
    (tmp_path / "trace.jsonl").write_text("".join(line + "\n" for line in lines))
    path = tmp_path / "scenario.toml"
    path.write_text(scenario)
    return path


def line(**changes) -> str:
    return json.dumps({**GOOD, **changes})


def test_a_good_scenario_loads(tmp_path):
    sc = load_scenario(write(tmp_path, [line(), line(id="w-2", submit_s=5)]))
    assert [w.id for w in sc.workloads] == ["w-1", "w-2"]
    assert sc.duration_s == 86400 and sc.policy.max_min_runtime_s == 8 * 3600
    assert sc.node_events[0].at_s == 3 * 3600 and sc.node_events[0].repair_s == 7200


@pytest.mark.parametrize("bad, field, words", [
    (line(id="w-3", project="lab/nope"), "project", "project: 'lab/nope': unknown allocation"),
    (line(id="w-3", project="lab"), "project", "project: 'lab': is a parent of lab/a, lab/b; submit against a leaf"),
    (line(id="w-3", work_s=-5), "work_s", "negative"),
    (line(id="w-3", submit_s=-1), "submit_s", "negative"),
    ('{"id": "w-3", "submit_s": 0,', None, "malformed"),
    (line(id="w-3", min_runtime_s=8 * 3600 + 1), "min_runtime_s", "cap"),
    (line(id="w-3", gpus=12), "gpus", "multiple"),
    (line(id="w-3", gpu_type="B200"), "gpu_type", "B200"),
    (line(id="w-3", gpus="eight"), "gpus", "int"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "work_s"} | {"id": "w-3"}), "work_s", "missing"),
    (line(id="w-3", colour="red"), "colour", "unknown"),
    (line(id="w-3", priority="HIGHEST"), "priority", "urgent"),
    (line(), "id", "duplicate"),
    (line(id="w-3", checkpoint_on_notice_s=301), "checkpoint_on_notice_s", "max_notice of 300s"),
    (line(id="w-3", checkpoint_gb=-1.0), "checkpoint_gb", "negative"),
    (line(id="w-3", suspends_on_notice="yes"), "suspends_on_notice", "bool"),
], ids=["an unknown project", "a parent instead of a leaf", "a negative work", "a negative submit time",
        "a malformed line", "a minimum runtime above the cap", "gpus not a multiple of the node size",
        "an unknown GPU type", "a number of the wrong type", "a missing field", "an unknown field",
        "an unknown priority", "a duplicate id", "a notice above max_notice", "a negative checkpoint size",
        "a suspend that is not true or false"])
def test_a_bad_trace_line_names_file_line_and_field(tmp_path, bad, field, words):
    path = write(tmp_path, [line(), "", line(id="w-2"), bad, line(id="w-4")])
    with pytest.raises(InputError) as err:
        load_scenario(path)
    e = err.value
    assert Path(e.file).name == "trace.jsonl"
    assert e.line == 4  # blank lines count: it is the file's line number
    assert e.field == field
    assert words.lower() in str(e).lower()
    assert "trace.jsonl:4:" in str(e)


def scenario_with(old: str, new: str) -> str:
    assert old in SCENARIO
    return SCENARIO.replace(old, new)


@pytest.mark.parametrize("old, new, field, lineno", [
    ('node = "H100-001"', 'node = "H100-099"', "node_events[0].node", 17),
    ('nodes = 4', 'nodes = -4', "pools[0].nodes", 9),
    ('"lab/b" = 1', '"lab/b" = -1', "allocations.lab/b", 14),
    ('"lab" = 1\n', '', "allocations.lab/a", 12),
    ('lookback_window = "7d"', 'lookback_window = "a week"', "policy.lookback_window", 5),
    ('max_min_runtime = "8h"', 'max_min_runtime = "8h"\ncolour = 1', "policy.colour", 7),
    ('max_min_runtime = "8h"', 'max_min_runtime = "8h"\nunallocated_preemption = "never"',
     "policy.unallocated_preemption", 7),
    ('kind = "unhealthy"', 'kind = "sad"', "node_events[0].kind", 18),
    ('duration = "1d"', 'duration = -1', "duration", 2),
    ('[[pools]]', '[cluster]\ncheckpoint_bandwidth_gbps = -3\n[[pools]]', "cluster.checkpoint_bandwidth_gbps", 8),
    ('[[pools]]', '[cluster]\nbandwidth = 3\n[[pools]]', "cluster.bandwidth", 8),
    ('max_min_runtime = "8h"', 'max_min_runtime = "8h"\npreemption_notice = "sometimes"', "policy.preemption_notice", 7),
], ids=["an unknown node in a node event", "a negative node count", "a negative share",
        "a child without its parent", "a duration that is not one", "an unknown policy setting",
        "an unknown unallocated_preemption mode",
        "an unknown node event kind", "a negative duration", "a negative checkpoint bandwidth",
        "an unknown cluster setting", "a preemption_notice that is not true or false"])
def test_a_bad_scenario_file_names_file_line_and_field(tmp_path, old, new, field, lineno):
    path = write(tmp_path, [line()], scenario_with(old, new))
    with pytest.raises(InputError) as err:
        load_scenario(path)
    assert Path(err.value.file).name == "scenario.toml"
    assert err.value.field == field
    assert err.value.line == lineno


def test_notices_in_the_scenario_file_reach_the_policy_and_the_cluster(tmp_path):
    text = scenario_with('max_min_runtime = "8h"', 'max_min_runtime = "8h"\nmax_notice = "2m"\n'
                         'preemption_notice = false').replace("[[pools]]", "[cluster]\ncheckpoint_bandwidth_gbps = 20\n[[pools]]")
    sc = load_scenario(write(tmp_path, [line(checkpoint_on_notice_s=90, checkpoint_gb=40.0)], text))
    assert (sc.policy.max_notice_s, sc.policy.preemption_notice) == (120, False)
    assert sc.cluster().checkpoint_bandwidth_gbps == 20.0
    assert sc.workloads[0].notice_s == 90 and sc.workloads[0].checkpoint_size_gb == 40.0
    with pytest.raises(InputError) as err:  # the policy's own cap applies to the trace
        load_scenario(write(tmp_path, [line(checkpoint_on_notice_s=150)], text))
    assert err.value.field == "checkpoint_on_notice_s" and err.value.line == 1


def test_invalid_toml_is_an_input_error_with_its_line(tmp_path):
    path = write(tmp_path, [line()], scenario_with('seed = 3', 'seed = = 3'))
    with pytest.raises(InputError, match="not valid TOML") as err:
        load_scenario(path)
    # Python 3.11's TOMLDecodeError has no lineno attribute; the line is in the message
    assert err.value.line == 3 or "line 3" in str(err.value)


def test_a_missing_trace_file_is_named(tmp_path):
    path = tmp_path / "scenario.toml"
    path.write_text(SCENARIO)
    with pytest.raises(InputError, match="no such file") as err:
        load_scenario(path)
    assert err.value.field == "trace.path"


def test_the_error_comes_before_anything_runs_even_when_the_bad_line_is_the_last(tmp_path):
    lines = [line(id=f"w-{i}", submit_s=i) for i in range(500)] + [line(id="late", project="nope", submit_s=10**9)]
    with pytest.raises(InputError) as err:
        load_scenario(write(tmp_path, lines))
    assert err.value.line == 501 and err.value.field == "project"
