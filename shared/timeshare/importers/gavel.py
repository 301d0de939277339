"""Gavel's per-team Philly traces (stanford-futuredata/gavel, ``scheduler/traces/msr/...``).

Input: one tab-separated ``<team>.trace`` per virtual cluster, 7 columns, no header::

    job_type  command  steps_arg  needs_data_dir  total_steps  arrival_s  gpus

plus Gavel's ``simulation_throughputs.json``: ``{gpu: {"('<job_type>', <gpus>)": {"null":
steps_per_s, "('<other job>', <n>)": [colocated pair...]}}}`` where ``gpu`` is ``k80``,
``p100``, ``v100`` (and ``*_unconsolidated``) and ``null`` is the isolated throughput.

Mapping (one workload per line):
- ``id`` = ``philly-<file stem>-<line index from 0>`` (the index of the line, so dropped lines
  leave gaps and ids stay stable); ``user`` = ``u<file stem>``;
- ``project`` = ``--project``, else ``<prefix>/<file stem>`` (prefix ``philly``);
- ``submit_s`` = round(arrival_s), rebased so the earliest is 0; ``gpus`` = gpus;
- ``gpu_type`` = ``--gpu-type`` (default V100); its lower-cased name picks the throughput column;
- ``work_s`` = round(total_steps / throughput[gpu][(job_type, gpus)]["null"]);
  a job with no entry (or a zero throughput) is dropped and counted;
- contract fields by ``Rules`` (see ``common``).
"""

from __future__ import annotations

import json
from pathlib import Path

from .common import Collector, ImportResult, RowError, Rules, make_record, parse_int

SOURCE = "gavel"
DEFAULT_GPU_TYPE = "V100"
COLUMNS = ("job_type", "command", "steps_arg", "needs_data_dir", "total_steps", "arrival_s", "gpus")


def load_throughputs(path) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except json.JSONDecodeError as exc:
        raise RowError(str(path), exc.lineno, f"malformed throughput JSON: {exc.msg}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise RowError(str(path), None, "expected {gpu type: {\"('job type', gpus)\": {...}}}")
    return data


def throughput_key(job_type: str, gpus: int) -> str:
    """Gavel writes the key as the str() of a Python tuple: ``('ResNet-18 (batch size 64)', 1)``."""
    return str((job_type, gpus))


def steps_per_s(table: dict, job_type: str, gpus: int) -> float | None:
    entry = table.get(throughput_key(job_type, gpus))
    value = entry.get("null") if isinstance(entry, dict) else entry
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def import_gavel(paths, throughputs, rules: Rules | None = None, strict: bool = True) -> ImportResult:
    """``paths``: team trace files; ``throughputs``: the JSON path or an already loaded dict."""
    rules = rules or Rules()
    table_all = throughputs if isinstance(throughputs, dict) else load_throughputs(throughputs)
    gpu_type = rules.gpu_type or DEFAULT_GPU_TYPE
    table = table_all.get(gpu_type.lower())
    if table is None:
        raise ValueError(f"no throughputs for GPU type {gpu_type!r} (the file has {', '.join(sorted(table_all))})")
    out = Collector(SOURCE, rules, strict)
    for path in map(Path, paths):
        team, file = path.stem, str(path)
        with open(path, encoding="utf-8") as fh:
            for index, raw in enumerate(fh):
                line = index + 1
                text = raw.rstrip("\r\n")
                if not text.strip():
                    continue
                cols = text.split("\t")
                if len(cols) != len(COLUMNS):
                    out.bad(file, line, f"expected {len(COLUMNS)} tab-separated columns", f"got {len(cols)}")
                    continue
                row = dict(zip(COLUMNS, cols))
                try:
                    total_steps = parse_int(row["total_steps"])
                except ValueError:
                    out.bad(file, line, "total_steps is not an integer", repr(row["total_steps"]))
                    continue
                try:
                    arrival_s = float(row["arrival_s"])
                except ValueError:
                    out.bad(file, line, "arrival_s is not a number", repr(row["arrival_s"]))
                    continue
                try:
                    gpus = parse_int(row["gpus"])
                except ValueError:
                    out.bad(file, line, "gpus is not an integer", repr(row["gpus"]))
                    continue
                if gpus < 1 or total_steps < 0 or arrival_s < 0:
                    out.bad(file, line, "negative or zero value",
                            f"gpus={gpus}, total_steps={total_steps}, arrival_s={arrival_s}")
                    continue
                rate = steps_per_s(table, row["job_type"], gpus)
                if rate is None:
                    out.drop(f"no {gpu_type} throughput for (job type, gpus)", file, line)
                    continue
                out.add(make_record(
                    id=f"philly-{team}-{index}", submit_s=round(arrival_s),
                    project=rules.project_for("philly", team), user=f"u{team}",
                    gpu_type=gpu_type, gpus=gpus, work_s=round(total_steps / rate), rules=rules,
                ), file, line)
    return out.finish()
