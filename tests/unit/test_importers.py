"""The trace importers: mappings on small real samples, malformed rows, report counts, CLI."""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import pytest

from timeshare.importers import (
    MinRuntimeRule, RowError, Rules, check_record, import_events, import_gavel, import_helios,
    import_openb, import_pai, write_jsonl,
)
from timeshare.importers.cli import add_parser
from timeshare.importers.common import kind_for

DATA = Path(__file__).resolve().parents[1] / "data" / "importers"
GAVEL_TRACE = DATA / "gavel-philly" / "ed69ec.trace"
GAVEL_TPUT = DATA / "gavel-philly" / "simulation_throughputs.isolated.json"
GAVEL_EXPECTED = DATA / "gavel-philly" / "philly-seed0-ed69ec.expected.jsonl"
HELIOS_LOG = DATA / "helios" / "Venus" / "cluster_log.csv"
OPENB_PODS = DATA / "alibaba-openb-2023" / "openb_pod_list_default.csv"
PAI_TASKS = DATA / "alibaba-pai-2020" / "pai_task_table.csv"
PAI_JOBS = DATA / "alibaba-pai-2020" / "pai_job_table.csv"
EVENTS = DATA / "events" / "events.jsonl"


def assert_valid_trace(records, max_min_runtime_s=8 * 3600):
    """Every record is a valid trace line, ids are unique, times rebased and ordered."""
    assert records
    for r in records:
        assert check_record(r, max_min_runtime_s) is None, r
    assert len({r["id"] for r in records}) == len(records)
    assert min(r["submit_s"] for r in records) == 0
    assert [r["submit_s"] for r in records] == sorted(r["submit_s"] for r in records)
    # The scheduler's own decoder must accept the lines too (when the core is importable).
    try:
        import msgspec

        from timeshare.workload import WorkloadSpec, check_contract
    except ImportError:
        return
    for r in records:
        spec = msgspec.json.decode(json.dumps(r).encode(), type=WorkloadSpec)
        check_contract(spec, max_min_runtime_s)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def gavel_lines():
    return GAVEL_TRACE.read_text().splitlines(keepends=True)


# --------------------------------------------------------------------------------- rules


@pytest.mark.parametrize("text, work_s, expected", [
    ("min(work,1h)", 100, 100), ("min(work,1h)", 5000, 3600), ("min( 2h , work )", 9000, 7200),
    ("0", 5000, 0), ("30m", 60, 1800), ("1800", 99999, 1800), ("work", 5000, 5000),
])
def test_min_runtime_rule(text, work_s, expected):
    assert MinRuntimeRule.parse(text).apply(work_s) == expected


@pytest.mark.parametrize("text", ["max(work,1h)", "min(work)", "soon", "-5", ""])
def test_min_runtime_rule_rejects_nonsense(text):
    with pytest.raises(ValueError, match="min-runtime rule"):
        MinRuntimeRule.parse(text)


def test_rules_cap_and_defaults():
    assert Rules(min_runtime=MinRuntimeRule.parse("work")).min_runtime_s(100_000) == 8 * 3600
    assert Rules(min_runtime=MinRuntimeRule.parse("work"), max_min_runtime_s=3600).min_runtime_s(7200) == 3600
    rules = Rules()
    assert (rules.min_runtime_s(1200), rules.resumable_value(), rules.checkpoint_value()) == (1200, True, 1800)
    assert Rules(checkpoint_interval_s=0).checkpoint_value() is None
    assert Rules(project_prefix="").project_for("philly", "t1") == "t1"
    assert Rules(project="a/b").project_for("philly", "t1") == "a/b"


def test_kind_boundaries():
    assert [kind_for(s) for s in (0, 900, 901, 3600, 3601)] == ["debug", "debug", "short", "short", "long"]


# --------------------------------------------------------------------------------- gavel


def test_gavel_reproduces_philly_seed0_lines(tmp_path):
    records, report = import_gavel([GAVEL_TRACE], GAVEL_TPUT)
    expected = [json.loads(line) for line in GAVEL_EXPECTED.read_text().splitlines()]
    assert records == expected
    assert [list(r) for r in records] == [list(r) for r in expected]  # key order too
    out = tmp_path / "t.jsonl"
    write_jsonl(records, out)
    assert out.read_text() == GAVEL_EXPECTED.read_text()  # byte for byte
    assert report.kept == len(gavel_lines()) and not report.dropped
    assert_valid_trace(records)


def test_gavel_work_is_steps_over_the_chosen_gpus_throughput():
    table = json.loads(GAVEL_TPUT.read_text())["k80"]
    records, _ = import_gavel([GAVEL_TRACE], GAVEL_TPUT, Rules(gpu_type="K80"))
    by_id = {r["id"]: r for r in records}
    v100 = {r["id"]: r for r in import_gavel([GAVEL_TRACE], GAVEL_TPUT).records}
    for index, line in enumerate(gavel_lines()):
        cols = line.rstrip("\n").split("\t")
        rate = table[f"('{cols[0]}', {int(cols[6])})"]["null"]
        record = by_id[f"philly-ed69ec-{index}"]
        assert record["work_s"] == round(int(cols[4]) / rate)
        assert record["gpu_type"] == "K80"
        assert record["min_runtime_s"] == min(record["work_s"], 3600)
        assert record["kind"] == kind_for(record["work_s"])
    assert any(by_id[i]["work_s"] != v100[i]["work_s"] for i in by_id)  # the column matters


def test_gavel_drops_jobs_without_throughput_and_keeps_line_index_ids(tmp_path):
    lines = gavel_lines()[:6]
    for i in (1, 4):  # Gavel measured 1, 2, 4 and 8 GPUs only
        cols = lines[i].rstrip("\n").split("\t")
        cols[6] = "16"
        lines[i] = "\t".join(cols) + "\n"
    trace = write(tmp_path / "team7.trace", "".join(lines))
    records, report = import_gavel([trace], GAVEL_TPUT, Rules(project_prefix="msr"))
    assert report.kept == 4
    assert report.dropped == {"no V100 throughput for (job type, gpus)": 2}
    assert report.first_seen["no V100 throughput for (job type, gpus)"] == f"{trace}:2"
    assert [r["id"] for r in records] == ["philly-team7-0", "philly-team7-2", "philly-team7-3", "philly-team7-5"]
    assert {r["project"] for r in records} == {"msr/team7"} and {r["user"] for r in records} == {"uteam7"}


def test_gavel_malformed_row_names_file_line_and_reason(tmp_path):
    lines = gavel_lines()[:5]
    cols = lines[2].split("\t")
    cols[4] = "lots"
    lines[2] = "\t".join(cols)
    lines[3] = "only\ttwo columns\n"
    trace = write(tmp_path / "bad.trace", "".join(lines))
    with pytest.raises(RowError) as err:
        import_gavel([trace], GAVEL_TPUT)
    assert (err.value.file, err.value.line) == (str(trace), 3)
    assert "total_steps is not an integer" in str(err.value) and "'lots'" in str(err.value)
    assert str(err.value).startswith(f"{trace}:3: ")

    records, report = import_gavel([trace], GAVEL_TPUT, strict=False)
    assert report.kept == 3 == len(records)
    assert report.dropped == {"malformed: total_steps is not an integer": 1,
                              "malformed: expected 7 tab-separated columns": 1}
    assert report.first_seen["malformed: expected 7 tab-separated columns"] == f"{trace}:4"


def test_gavel_unknown_gpu_type_is_an_error():
    with pytest.raises(ValueError, match="no throughputs for GPU type 'H100'"):
        import_gavel([GAVEL_TRACE], GAVEL_TPUT, Rules(gpu_type="H100"))


def test_gavel_merges_teams_and_rebases_once(tmp_path):
    a = write(tmp_path / "a.trace", "".join(gavel_lines()[5:10]))  # arrivals start above 0
    b = write(tmp_path / "b.trace", "".join(gavel_lines()[20:22]))
    records, report = import_gavel([a, b], GAVEL_TPUT)
    first_arrival = min(float(l.split("\t")[5]) for l in gavel_lines()[5:10] + gavel_lines()[20:22])
    raw = {f"philly-a-{i}": float(l.split("\t")[5]) for i, l in enumerate(gavel_lines()[5:10])}
    for r in records:
        if r["id"] in raw:
            assert r["submit_s"] == round(raw[r["id"]]) - round(first_arrival)
    assert report.kept == 7 and {r["project"] for r in records} == {"philly/a", "philly/b"}
    assert_valid_trace(records)


# --------------------------------------------------------------------------------- helios


def helios_rows():
    with open(HELIOS_LOG, newline="") as fh:
        return list(csv.DictReader(fh))


def test_helios_sample_mapping_and_counts():
    rows = helios_rows()
    records, report = import_helios([HELIOS_LOG])
    cpu = [r for r in rows if r["gpu_num"] == "0"]
    never = [r for r in rows if r["gpu_num"] != "0" and int(r["duration"]) == 0]
    assert report.dropped == {"CPU-only job (gpu_num 0)": len(cpu), "never ran (no start or duration 0)": len(never)}
    assert report.kept == len(rows) - len(cpu) - len(never) == len(records)
    by_id = {r["id"]: r for r in records}
    big = by_id["Venus-1425516"]  # the cluster comes from the folder of cluster_log.csv
    assert (big["gpus"], big["work_s"], big["project"], big["user"], big["gpu_type"]) == (
        16, 50400, "helios/vc6YE", "u3sYd", "V100")
    assert big["submit_s"] == (44 * 60 + 2) - (41 * 60 + 1)  # 18:44:02 after the first 18:41:01
    assert by_id["Venus-1425511"]["submit_s"] == 0
    for r in records:
        row = next(x for x in rows if f"Venus-{x['job_id']}" == r["id"])
        assert r["work_s"] == int(row["duration"]) and r["gpus"] == int(row["gpu_num"])
    assert_valid_trace(records)


def test_helios_state_filter():
    rows = helios_rows()
    drop = ("FAILED", "TIMEOUT", "NODE_FAIL")
    records, report = import_helios([HELIOS_LOG], drop_states=[s.lower() for s in drop])
    for state in drop:
        n = sum(1 for r in rows if r["state"] == state and r["gpu_num"] != "0")
        assert report.dropped[f"state {state} not kept"] == n > 0
    kept_states = {next(x["state"] for x in rows if f"Venus-{x['job_id']}" == r["id"]) for r in records}
    assert kept_states.isdisjoint(drop)


def test_helios_epoch_times_and_start_end_without_duration(tmp_path):
    log = write(tmp_path / "philly.csv",
                "job_id,user,vc,gpu_num,state,submit_time,start_time,end_time\n"
                "j1,u1,vc1,2,Pass,1507000000,1507000100,1507003700\n"
                "j2,u2,vc2,8,Killed,1507000050.5,1507000900,1507000960\n"
                "j3,u2,vc2,1,Killed,1507000060,,\n")
    records, report = import_helios([log], Rules(project_prefix="philly", gpu_type="P100"))
    assert [(r["id"], r["submit_s"], r["work_s"], r["project"]) for r in records] == [
        ("philly-j1", 0, 3600, "philly/vc1"), ("philly-j2", 50, 60, "philly/vc2")]
    assert report.dropped == {"never ran (no start or duration 0)": 1}
    assert {r["gpu_type"] for r in records} == {"P100"}


def test_helios_duration_wins_over_start_end(tmp_path):
    # duration is the logged execution time; end - start is only the fallback when it is empty
    log = write(tmp_path / "c.csv", "job_id,vc,gpu_num,submit_time,start_time,end_time,duration\n"
                "1,vc1,1,100,100,400,250\n2,vc1,1,100,100,400,\n")
    records, _ = import_helios([log])
    assert [r["work_s"] for r in records] == [250, 300]


def test_helios_malformed_rows(tmp_path):
    header = HELIOS_LOG.read_text().splitlines()[0]
    good = HELIOS_LOG.read_text().splitlines()[1]
    log = write(tmp_path / "c.csv", "\n".join([header, good, good.replace(",1,1,1,", ",two,1,1,", 1)
                                               .replace("1425511", "9"), good.replace("1425511", "8")
                                               .replace("2020-06-09 18:41:01", "yesterday", 1)]) + "\n")
    with pytest.raises(RowError) as err:
        import_helios([log])
    assert (err.value.line, "gpu_num is not an integer" in err.value.reason) == (3, True)
    records, report = import_helios([log], strict=False)
    assert report.kept == 1 and report.dropped == {"malformed: gpu_num is not an integer": 1,
                                                   "malformed: submit_time is not a time": 1}
    no_vc = write(tmp_path / "d.csv", "job_id,user,gpu_num,submit_time,duration\n1,u,1,0,5\n")
    with pytest.raises(RowError, match=r"d.csv:1: header lacks required columns: vc"):
        import_helios([no_vc])


def test_helios_duplicate_ids_across_files(tmp_path):
    a = write(tmp_path / "x" / "cluster_log.csv", HELIOS_LOG.read_text())
    b = write(tmp_path / "y" / "x.csv", HELIOS_LOG.read_text())  # same cluster name "x" -> same ids
    with pytest.raises(RowError, match=r"y/x.csv:2: duplicate id: 'x-1425511' already used at .*x/cluster_log.csv:2"):
        import_helios([a, b])
    records, report = import_helios([a, b], strict=False)
    assert report.dropped["malformed: duplicate id"] == report.kept == len(records)


# --------------------------------------------------------------------------------- openb


def openb_rows():
    with open(OPENB_PODS, newline="") as fh:
        return list(csv.DictReader(fh))


def test_openb_sample_mapping_and_counts():
    rows = openb_rows()
    records, report = import_openb([OPENB_PODS])
    gpu = [r for r in rows if r["num_gpu"] != "0"]
    unscheduled = [r for r in gpu if not r["scheduled_time"]]
    assert report.dropped["CPU-only pod (num_gpu 0)"] == len(rows) - len(gpu) > 0
    assert report.dropped["never scheduled (no scheduled_time or deletion_time)"] == len(unscheduled) > 0
    assert report.kept + sum(report.dropped.values()) == len(rows)
    by_name = {r["name"]: r for r in rows}
    fractional = [r for r in records if 0 < int(by_name[r["id"]]["gpu_milli"]) < 1000]
    assert report.adjusted["fractional GPU rounded up to a whole GPU"] == len(fractional) > 0
    start = min(int(by_name[r["id"]]["creation_time"]) for r in records)
    for r in records:
        row = by_name[r["id"]]
        assert r["work_s"] == int(row["deletion_time"]) - int(row["scheduled_time"])
        assert r["submit_s"] == int(row["creation_time"]) - start
        assert r["gpus"] == int(row["num_gpu"]) and r["gpu_type"] == "G2"
        assert r["project"] == "alibaba/openb_pod_list_default" and "user" not in r
        if row["qos"] == "BE":
            assert (r["priority"], r["min_runtime_s"]) == ("low", 0)
        else:
            assert r["min_runtime_s"] == min(r["work_s"], 3600)
            assert r["priority"] == {"LS": "high", "Burstable": "normal"}[row["qos"]]
    assert report.adjusted["BE pod -> unallocated (min runtime 0)"] == sum(
        1 for r in records if by_name[r["id"]]["qos"] == "BE")
    assert_valid_trace(records)


def test_openb_flags_fractional_drop_phases_and_be():
    rows = openb_rows()
    base, _ = import_openb([OPENB_PODS])
    records, report = import_openb([OPENB_PODS], drop_states=["Failed"], fractional="drop", be_unallocated=False)
    by_name = {r["name"]: r for r in rows}
    assert all(int(by_name[r["id"]]["gpu_milli"]) in (0, 1000) for r in records)
    assert all(by_name[r["id"]]["pod_phase"] != "Failed" for r in records)
    assert report.dropped["phase Failed not kept"] > 0 and report.dropped["fractional GPU (gpu_milli < 1000)"] > 0
    assert all(r["min_runtime_s"] == min(r["work_s"], 3600) for r in records)
    assert len(records) < len(base)
    with pytest.raises(ValueError, match="fractional"):
        import_openb([OPENB_PODS], fractional="share")


def test_openb_gpu_spec_and_malformed(tmp_path):
    header = OPENB_PODS.read_text().splitlines()[0]
    pods = write(tmp_path / "pods.csv", "\n".join([
        header,
        "p1,1000,1024,2,1000,V100M16|V100M32,LS,Succeeded,10,110,20",
        "p2,1000,1024,1,1000,nan,Guaranteed,Succeeded,12,100,12",
        "p3,1000,1024,1,1000,,LS,Succeeded,later,100,12",
    ]) + "\n")
    with pytest.raises(RowError) as err:
        import_openb([pods], Rules(gpu_type="T4"))
    assert err.value.line == 4 and "creation/scheduled/deletion time is not a number" in err.value.reason
    records, report = import_openb([pods], Rules(gpu_type="T4"), strict=False)
    assert [(r["id"], r["gpu_type"], r["gpus"], r["work_s"], r["submit_s"]) for r in records] == [
        ("p1", "V100M16", 2, 90, 0), ("p2", "T4", 1, 88, 2)]
    assert report.dropped == {"malformed: creation/scheduled/deletion time is not a number": 1}


# --------------------------------------------------------------------------------- pai


def pai_tasks():
    with open(PAI_TASKS, newline="") as fh:
        return [dict(zip(("job", "task", "inst", "status", "start", "end", "cpu", "mem", "gpu", "type"), r))
                for r in csv.reader(fh)]


def test_pai_sample_mapping_and_counts():
    tasks = pai_tasks()
    jobs = {r[0]: r for r in csv.reader(open(PAI_JOBS, newline=""))}
    records, report = import_pai([PAI_TASKS], [PAI_JOBS])
    cpu = [t for t in tasks if not t["gpu"]]
    unfinished = [t for t in tasks if t["gpu"] and not t["end"]]
    assert report.dropped == {"CPU-only task (plan_gpu empty or 0)": len(cpu),
                              "never ran (no start_time or end_time)": len(unfinished)}
    assert report.kept == len(tasks) - len(cpu) - len(unfinished) == len(records)
    submits = {}
    for t in tasks:
        if t["gpu"] and t["end"]:
            submits[f"{t['job']}-{t['task']}"] = float(jobs[t["job"]][4]) if t["job"] in jobs else float(t["start"])
    start = min(submits.values())
    by_id = {r["id"]: r for r in records}
    for t in tasks:
        r = by_id.get(f"{t['job']}-{t['task']}")
        if r is None:
            continue
        assert r["gpus"] == int(t["inst"]) * math.ceil(float(t["gpu"]) / 100)
        assert r["work_s"] == round(float(t["end"]) - float(t["start"]))
        assert r["submit_s"] == round(submits[r["id"]]) - round(start)
        assert r["gpu_type"] == (t["type"] or "MISC")
        if t["job"] in jobs:
            assert (r["user"], r["project"]) == (jobs[t["job"]][2], f"pai/{jobs[t['job']][2]}")
        else:
            assert "user" not in r and r["project"] == "pai/unknown"
    assert by_id["d3b7c5a1e9f2048c6b1a3e5d-worker"]["gpus"] == 16  # 2 instances x 800%
    assert by_id["7c1d0e2f3a4b5c6d7e8f9a0b-worker"]["gpus"] == 2  # 2 instances x 50%: a GPU each
    assert report.adjusted["fractional GPU rounded up to whole GPUs"] == sum(
        1 for t in tasks if t["gpu"] and t["end"] and float(t["gpu"]) % 100) > 0
    assert report.adjusted["no job row: no user, project <prefix>/unknown"] == 1
    assert_valid_trace(records)


def test_pai_options_header_and_malformed(tmp_path):
    records, report = import_pai([PAI_TASKS], [PAI_JOBS], drop_states=["failed"], fractional="drop")
    usable = [t for t in pai_tasks() if t["gpu"] and t["end"]]
    assert report.dropped["status Failed not kept"] == sum(t["status"] == "Failed" for t in usable) > 0
    assert report.dropped["fractional GPU (plan_gpu not a multiple of 100)"] == sum(
        float(t["gpu"]) % 100 != 0 and t["status"] != "Failed" for t in usable) > 0
    assert all(float(r["gpus"]).is_integer() for r in records)

    header = "job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type\n"
    lines = PAI_TASKS.read_text().splitlines(keepends=True)
    tasks = write(tmp_path / "tasks.csv", header + lines[0] + "j9,worker,1,Terminated,5,9\n" + lines[1])
    with pytest.raises(RowError) as err:
        import_pai([tasks], [PAI_JOBS])
    assert (err.value.file, err.value.line) == (str(tasks), 3) and "expected 10 columns" in err.value.reason
    records, report = import_pai([tasks], [PAI_JOBS], strict=False)
    assert report.kept == 2 and report.dropped == {"malformed: expected 10 columns": 1}


# --------------------------------------------------------------------------------- events


def event_lines():
    return [json.loads(line) for line in EVENTS.read_text().splitlines()]


def test_events_sample_is_a_real_event_log():
    try:
        from timeshare.events import decoder
    except ImportError:
        pytest.skip("timeshare.events not importable")
    for line in EVENTS.read_bytes().splitlines():
        decoder.decode(line)


def test_events_keep_original_submissions_only():
    events = event_lines()
    records, report = import_events([EVENTS])
    originals = [e for e in events if e["type"] == "workload.submitted" and e["resubmit_of"] is None]
    assert [r["id"] for r in records] == [e["workload"]["id"] for e in sorted(originals, key=lambda e: e["at_ms"])]
    first_ms = min(e["at_ms"] for e in originals)
    for r in records:
        e = next(e for e in originals if e["workload"]["id"] == r["id"])
        assert r["submit_s"] == e["at_ms"] // 1000 - first_ms // 1000
        for key in ("project", "gpu_type", "gpus", "work_s", "min_runtime_s", "resumable", "priority", "kind", "user"):
            assert r[key] == e["workload"][key]
        assert r.get("checkpoint_interval_s") == e["workload"]["checkpoint_interval_s"]
        assert "command" not in r  # null in the log -> left out, as in a trace file
    assert report.dropped == {"other event type (ignored)": sum(e["type"] != "workload.submitted" for e in events),
                              "resubmission of an earlier workload": len(
                                  [e for e in events if e.get("resubmit_of")])}
    assert_valid_trace(records)


def test_events_rules_override_only_when_set_and_cluster_filter():
    records, report = import_events([EVENTS], Rules(min_runtime=MinRuntimeRule.parse("min(work,5m)"),
                                                     resumable=False, checkpoint_interval_s=0))
    assert all(r["min_runtime_s"] == min(r["work_s"], 300) and r["resumable"] is False for r in records)
    assert all("checkpoint_interval_s" not in r for r in records)
    assert "except min_runtime=min(work,5m)" in report.rules
    records, report = import_events([EVENTS], cluster="saturn")
    assert report.rules == "as logged"
    submitted = [e for e in event_lines() if e["type"] == "workload.submitted"]
    assert [r["id"] for r in records] == [e["workload"]["id"] for e in submitted if e["cluster"] == "saturn"]
    assert report.dropped["other cluster"] == sum(e["cluster"] != "saturn" for e in submitted) > 0


def test_events_malformed_lines(tmp_path):
    lines = EVENTS.read_text().splitlines()
    log = write(tmp_path / "ev.jsonl", "\n".join([lines[0], "{not json", '["a list"]', lines[2],
                                                   '{"type": "workload.submitted", "at_ms": -1, "workload": {}}',
                                                   '{"type": "workload.submitted", "at_ms": 5, "workload": {"id": "x"}}'])
                + "\n")
    with pytest.raises(RowError, match=r"ev.jsonl:2: malformed JSON"):
        import_events([log])
    records, report = import_events([log], strict=False)
    assert [r["id"] for r in records] == ["w-1", "w-2"]
    assert report.dropped == {"malformed: malformed JSON": 1,
                              'malformed: not an event (a JSON object with a string "type")': 1,
                              "malformed: at_ms must be an integer >= 0": 1, "malformed: invalid workload": 1}
    assert report.first_seen["malformed: invalid workload"] == f"{log}:6"


def test_events_round_trip_of_an_imported_trace(tmp_path):
    """A trace replayed through an event log comes back unchanged."""
    trace, _ = import_gavel([GAVEL_TRACE], GAVEL_TPUT)
    log = tmp_path / "events.jsonl"
    with open(log, "w") as fh:
        for i, r in enumerate(trace):
            fh.write(json.dumps({"type": "workload.submitted", "event_id": f"e{i}", "at_ms": r["submit_s"] * 1000,
                                 "cluster": "c", "workload": r, "resubmit_of": None}) + "\n")
    assert import_events([log]).records == trace


# --------------------------------------------------------------------------------- report and CLI


def test_report_format_names_reasons_and_places():
    _, report = import_openb([OPENB_PODS])
    text = report.format()
    assert f"{report.kept} kept" in text and f"{sum(report.dropped.values())} dropped" in text
    for reason, count in report.dropped.items():
        assert f"{count}  {reason}" in text
    assert f"first at {OPENB_PODS}:" in text and "min_runtime=min(work,1h)" in text
    assert report.to_dict()["dropped"] == dict(report.dropped)


def parse(argv):
    parser = argparse.ArgumentParser(prog="timeshare")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_cli_gavel_with_rules(tmp_path, capsys):
    out = tmp_path / "out" / "trace.jsonl"
    args = parse(["import", "gavel", str(GAVEL_TRACE), "--throughputs", str(GAVEL_TPUT), "--out", str(out),
                  "--min-runtime", "30m", "--not-resumable", "--checkpoint-interval", "none",
                  "--project-prefix", "msr"])
    assert args.func(args) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == len(gavel_lines())
    assert {(r["min_runtime_s"], r["resumable"], r["project"]) for r in records} == {(1800, False, "msr/ed69ec")}
    assert all("checkpoint_interval_s" not in r for r in records)
    printed = capsys.readouterr().out
    assert f"{len(records)} kept, 0 dropped" in printed and f"wrote {len(records)} workloads" in printed


def test_cli_openb_alias_and_default_rules(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    args = parse(["import", "openb", str(OPENB_PODS), "--out", str(out), "--fractional", "drop"])
    assert args.func(args) == 0
    expected, report = import_openb([OPENB_PODS], fractional="drop")
    assert [json.loads(line) for line in out.read_text().splitlines()] == expected
    assert "fractional GPU (gpu_milli < 1000)" in capsys.readouterr().out


def test_cli_errors(tmp_path, capsys):
    bad = write(tmp_path / "bad.trace", "x\ty\n")
    out = tmp_path / "t.jsonl"
    args = parse(["import", "gavel", str(bad), "--throughputs", str(GAVEL_TPUT), "--out", str(out)])
    assert args.func(args) == 2 and not out.exists()
    assert f"{bad}:1: expected 7 tab-separated columns" in capsys.readouterr().err

    args = parse(["import", "gavel", str(bad), "--throughputs", str(GAVEL_TPUT), "--out", str(out), "--skip-malformed"])
    assert args.func(args) == 1 and not out.exists()  # nothing kept
    assert "malformed: expected 7 tab-separated columns" in capsys.readouterr().out

    args = parse(["import", "gavel", str(GAVEL_TRACE), "--out", str(out)])
    assert args.func(args) == 2 and "--throughputs" in capsys.readouterr().err
    args = parse(["import", "helios", str(HELIOS_LOG), "--out", str(out), "--min-runtime", "forever"])
    assert args.func(args) == 2 and "not a min-runtime rule" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(["import", "slurm", str(HELIOS_LOG), "--out", str(out)])
