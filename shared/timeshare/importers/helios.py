"""Helios / Philly ``cluster_log.csv`` (S-Lab-System-Group/HeliosData, Slurm job logs).

Input: CSV with a header; the HeliosData layout is
``job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue``
(columns are found by name; ``cpu_num``, ``node_num``, ``queue``, ``user``, ``state`` are
optional). Times are datetimes (``2020-04-01 00:00:02``, ISO ``T`` allowed, read as naive:
only differences matter) or epoch seconds.

Mapping (one workload per row):
- ``id`` = ``<cluster>-<job_id>``, cluster = the file stem, or its folder's name when the file
  is called ``cluster_log.csv`` (HeliosData keeps ``data/<Cluster>/cluster_log.csv``);
- ``project`` = ``--project``, else ``<prefix>/<vc>`` (prefix ``helios``); ``user`` = user;
- ``submit_s`` = submit_time, rebased; ``gpus`` = gpu_num; ``gpu_type`` = ``--gpu-type``
  (default V100: the logs do not name the GPU);
- ``work_s`` = duration, or end_time - start_time when duration is empty;
- dropped and counted: ``gpu_num`` 0 (CPU jobs), jobs that never ran (work 0 or no start),
  and jobs whose state is in ``drop_states`` (default none: a failed or cancelled job still
  held its GPUs for its duration);
- contract fields by ``Rules`` (see ``common``).
"""

from __future__ import annotations

import csv
from datetime import datetime, timezone
from pathlib import Path

from .common import Collector, ImportResult, Rules, make_record, parse_int

SOURCE = "helios"
DEFAULT_GPU_TYPE = "V100"
REQUIRED = ("job_id", "vc", "gpu_num", "submit_time")


def parse_time_s(text: str) -> float:
    """Epoch seconds, or a datetime string read as UTC (a consistent origin is all we need)."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    stamp = datetime.fromisoformat(text)  # accepts "2020-04-01 00:00:02" and "...T..."
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=timezone.utc)
    return stamp.timestamp()


def cluster_name(path: Path) -> str:
    return path.parent.name if path.stem == "cluster_log" and path.parent.name else path.stem


def import_helios(paths, rules: Rules | None = None, strict: bool = True,
                  drop_states=()) -> ImportResult:
    rules = rules or Rules()
    drop_states = {s.upper() for s in drop_states}
    gpu_type = rules.gpu_type or DEFAULT_GPU_TYPE
    out = Collector(SOURCE, rules, strict)
    for path in map(Path, paths):
        file, cluster = str(path), cluster_name(path)
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = [h.strip() for h in (reader.fieldnames or [])]
            reader.fieldnames = header
            missing = [c for c in REQUIRED if c not in header]
            if missing or not ("duration" in header or {"start_time", "end_time"} <= set(header)):
                need = missing or ["duration (or start_time and end_time)"]
                out.bad(file, 1, "header lacks required columns", ", ".join(need))
                continue
            for row in reader:
                line = reader.line_num
                if None in row or any(row.get(c) is None for c in header):
                    out.bad(file, line, f"expected {len(header)} columns", f"got {len(row) - (None in row)}")
                    continue
                row = {k: (v or "").strip() for k, v in row.items()}
                if not row["job_id"]:
                    out.bad(file, line, "empty job_id")
                    continue
                if not row["vc"] and not rules.project:
                    out.bad(file, line, "empty vc (set --project to put such jobs in one project)")
                    continue
                try:
                    gpus = parse_int(row["gpu_num"])
                except ValueError:
                    out.bad(file, line, "gpu_num is not an integer", repr(row["gpu_num"]))
                    continue
                try:
                    submit = parse_time_s(row["submit_time"])
                except ValueError:
                    out.bad(file, line, "submit_time is not a time", repr(row["submit_time"]))
                    continue
                try:
                    work_s = _work_s(row)
                except (ValueError, OverflowError) as exc:
                    out.bad(file, line, "bad duration/start_time/end_time", str(exc))
                    continue
                state = row.get("state", "").upper()
                if gpus < 0 or (work_s is not None and work_s < 0):
                    out.bad(file, line, "negative gpu_num or duration", f"gpu_num={gpus}, work_s={work_s}")
                elif gpus == 0:
                    out.drop("CPU-only job (gpu_num 0)", file, line)
                elif state in drop_states:
                    out.drop(f"state {state} not kept", file, line)
                elif not work_s:
                    out.drop("never ran (no start or duration 0)", file, line)
                else:
                    out.add(make_record(
                        id=f"{cluster}-{row['job_id']}", submit_s=round(submit),
                        project=rules.project_for("helios", row["vc"]), user=row.get("user") or None,
                        gpu_type=gpu_type, gpus=gpus, work_s=work_s, rules=rules,
                    ), file, line)
    return out.finish()


def _work_s(row: dict) -> int | None:
    """duration if given, else end - start; None when the job never started."""
    if row.get("duration"):
        return round(float(row["duration"]))
    if row.get("start_time") and row.get("end_time"):
        return round(parse_time_s(row["end_time"]) - parse_time_s(row["start_time"]))
    if row.get("start_time") or row.get("end_time"):
        raise ValueError("one of start_time/end_time is empty and duration is missing")
    return None
