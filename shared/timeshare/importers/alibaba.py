"""Alibaba GPU traces (alibaba/clusterdata): the 2023 ``openb`` pod lists and the 2020 PAI tables.

openb (``cluster-trace-gpu-v2023/csv/openb_pod_list_*.csv``, CSV with header
``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
deletion_time,scheduled_time``, times in seconds from the trace start). One workload per pod:
- ``id`` = name; ``submit_s`` = creation_time (rebased);
  ``work_s`` = deletion_time - scheduled_time (pods still Running at the trace end are cut there);
- ``gpus`` = num_gpu; num_gpu 0 (CPU pods) is dropped. A shared GPU (0 < gpu_milli < 1000)
  is rounded up to one whole GPU (timeshare allocates whole GPUs), or dropped with
  ``fractional="drop"``; both are counted;
- ``gpu_type`` = the first model of gpu_spec (``V100M16|V100M32`` -> V100M16), else
  ``--gpu-type`` (default G2, the most common model in ``openb_node_list_gpu_node.csv``);
- qos -> priority: LS and Guaranteed -> high, Burstable -> normal, BE -> low. A BE (best
  effort) pod gets ``min_runtime_s`` 0, i.e. unallocated: never charged, always preemptible
  (``be_unallocated=False`` applies the min-runtime rule to it like to the others);
- ``project`` = ``--project``, else ``<prefix>/<file stem>`` (prefix ``alibaba``): the trace
  has no teams or users; no ``user``;
- dropped: pods never scheduled (empty scheduled_time, e.g. Pending), pods that ran 0 s,
  phases in ``drop_states`` (e.g. Failed).

PAI 2020 (``pai_task_table.csv`` and ``pai_job_table.csv``, headerless CSVs with the columns
of ``*.header``: task ``job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,
plan_mem,plan_gpu,gpu_type``; job ``job_name,inst_id,user,status,start_time,end_time``; a
first line equal to the header is skipped). One workload per task (a job's roles, e.g.
``worker`` and ``ps``, are separate tasks; CPU-only roles are dropped):
- ``id`` = ``<job_name>-<task_name>``; ``user`` = the job's user (task joined on job_name);
- ``submit_s`` = the job's start_time (PAI records the job's submission there), else (no job
  row, or a job time after the task's start) the task's start_time, counted as adjusted; rebased;
- ``work_s`` = task end_time - start_time; tasks without both are dropped (never ran);
- ``gpus`` = inst_num * ceil(plan_gpu / 100) (plan_gpu is per instance, 100 = one GPU);
  a fractional plan_gpu is rounded up per instance, or dropped with ``fractional="drop"``;
  plan_gpu empty or 0 is dropped (CPU task);
- ``gpu_type`` = gpu_type column, else ``--gpu-type`` (default MISC, PAI's catch-all class);
- ``project`` = ``--project``, else ``<prefix>/<user>`` (prefix ``pai``; ``pai/unknown``
  when the job row is missing); status in ``drop_states`` (e.g. Failed) is dropped;
- contract fields of both by ``Rules`` (see ``common``).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from .common import Collector, ImportResult, Rules, make_record, parse_int

OPENB_COLUMNS = ("name", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase", "creation_time",
                 "deletion_time", "scheduled_time")
QOS_PRIORITY = {"LS": "high", "GUARANTEED": "high", "BURSTABLE": "normal", "BE": "low", "BESTEFFORT": "low"}
BEST_EFFORT = {"BE", "BESTEFFORT"}
FRACTIONAL_RULES = ("round-up", "drop")

PAI_TASK_COLUMNS = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time", "plan_cpu",
                    "plan_mem", "plan_gpu", "gpu_type")
PAI_JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")


def _empty(text: str | None) -> bool:
    # pandas writes missing values as "nan" in some published copies
    return text is None or text.strip().lower() in ("", "nan", "none", "null")


def _check_fractional(fractional: str) -> None:
    if fractional not in FRACTIONAL_RULES:
        raise ValueError(f"fractional must be one of {', '.join(FRACTIONAL_RULES)}, got {fractional!r}")


# ---------------------------------------------------------------------------------------------
# openb 2023


def import_openb(paths, rules: Rules | None = None, strict: bool = True, drop_states=(),
                 fractional: str = "round-up", be_unallocated: bool = True) -> ImportResult:
    rules = rules or Rules()
    _check_fractional(fractional)
    drop_states = {s.upper() for s in drop_states}
    default_gpu = rules.gpu_type or "G2"
    out = Collector("alibaba-openb", rules, strict)
    for path in map(Path, paths):
        file = str(path)
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            reader.fieldnames = [h.strip() for h in (reader.fieldnames or [])]
            missing = [c for c in OPENB_COLUMNS if c not in reader.fieldnames]
            if missing:
                out.bad(file, 1, "header lacks required columns", ", ".join(missing))
                continue
            for row in reader:
                line = reader.line_num
                if None in row or any(v is None for v in row.values()):
                    out.bad(file, line, f"expected {len(reader.fieldnames)} columns")
                    continue
                _openb_row(out, rules, file, line, {k: v.strip() for k, v in row.items()}, path.stem,
                           drop_states, fractional, be_unallocated, default_gpu)
    return out.finish()


def _openb_row(out, rules, file, line, row, stem, drop_states, fractional, be_unallocated, default_gpu):
    if not row["name"]:
        return out.bad(file, line, "empty name")
    try:
        num_gpu = parse_int(row["num_gpu"])
        gpu_milli = 0 if _empty(row["gpu_milli"]) else parse_int(row["gpu_milli"])
    except ValueError:
        return out.bad(file, line, "num_gpu/gpu_milli is not an integer",
                       f"num_gpu={row['num_gpu']!r}, gpu_milli={row['gpu_milli']!r}")
    try:
        created_s = float(row["creation_time"])
        scheduled_s = None if _empty(row["scheduled_time"]) else float(row["scheduled_time"])
        deleted_s = None if _empty(row["deletion_time"]) else float(row["deletion_time"])
    except ValueError:
        return out.bad(file, line, "creation/scheduled/deletion time is not a number",
                       f"{row['creation_time']!r}, {row['scheduled_time']!r}, {row['deletion_time']!r}")
    if num_gpu < 0 or gpu_milli < 0 or created_s < 0:
        return out.bad(file, line, "negative num_gpu, gpu_milli or creation_time")
    phase, qos = row["pod_phase"], row["qos"].upper()
    if num_gpu == 0:
        return out.drop("CPU-only pod (num_gpu 0)", file, line)
    if phase.upper() in drop_states:
        return out.drop(f"phase {phase} not kept", file, line)
    if scheduled_s is None or deleted_s is None:
        return out.drop("never scheduled (no scheduled_time or deletion_time)", file, line)
    work_s = round(deleted_s - scheduled_s)
    if work_s < 0:
        return out.bad(file, line, "deletion_time before scheduled_time", f"{deleted_s} < {scheduled_s}")
    if work_s == 0:
        return out.drop("ran 0 s", file, line)
    notes = []
    if 0 < gpu_milli < 1000:
        if fractional == "drop":
            return out.drop("fractional GPU (gpu_milli < 1000)", file, line)
        notes.append("fractional GPU rounded up to a whole GPU")
    qos = qos.replace("-", "").replace("_", "")
    priority = QOS_PRIORITY.get(qos)
    if priority is None:
        priority = "normal"
        notes.append(f"unknown qos {row['qos']!r} -> priority normal")
    min_runtime_s = None
    if be_unallocated and qos in BEST_EFFORT:
        min_runtime_s = 0
        notes.append("BE pod -> unallocated (min runtime 0)")
    spec = "" if _empty(row["gpu_spec"]) else row["gpu_spec"].split("|")[0].strip()
    out.add(make_record(
        id=row["name"], submit_s=round(created_s), project=rules.project_for("alibaba", stem),
        gpu_type=spec or default_gpu, gpus=num_gpu, work_s=work_s, rules=rules, priority=priority,
        min_runtime_s=min_runtime_s,
    ), file, line, notes)


# ---------------------------------------------------------------------------------------------
# PAI 2020


def _headerless_rows(path: Path, columns: tuple[str, ...]):
    """(line, row dict or None when the column count is wrong), skipping a header line."""
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        for cols in reader:
            line = reader.line_num
            if not cols or (line == 1 and tuple(c.strip() for c in cols) == columns):
                continue
            if len(cols) != len(columns):
                yield line, None, len(cols)
            else:
                yield line, dict(zip(columns, (c.strip() for c in cols))), len(cols)


def load_pai_jobs(paths, out: Collector) -> dict[str, tuple[str, float | None]]:
    """job_name -> (user, submit time in s or None)."""
    jobs: dict[str, tuple[str, float | None]] = {}
    for path in map(Path, paths):
        for line, row, n in _headerless_rows(path, PAI_JOB_COLUMNS):
            if row is None:
                out.bad(str(path), line, f"job table row: expected {len(PAI_JOB_COLUMNS)} columns", f"got {n}")
                continue
            try:
                submit = None if _empty(row["start_time"]) else float(row["start_time"])
            except ValueError:
                out.bad(str(path), line, "job table row: start_time is not a number", repr(row["start_time"]))
                continue
            jobs[row["job_name"]] = (row["user"], submit)
    return jobs


def import_pai(task_paths, job_paths=(), rules: Rules | None = None, strict: bool = True,
               drop_states=(), fractional: str = "round-up") -> ImportResult:
    rules = rules or Rules()
    _check_fractional(fractional)
    drop_states = {s.upper() for s in drop_states}
    default_gpu = rules.gpu_type or "MISC"
    out = Collector("alibaba-pai", rules, strict)
    jobs = load_pai_jobs(job_paths, out)
    for path in map(Path, task_paths):
        file = str(path)
        for line, row, n in _headerless_rows(path, PAI_TASK_COLUMNS):
            if row is None:
                out.bad(file, line, f"expected {len(PAI_TASK_COLUMNS)} columns", f"got {n}")
                continue
            _pai_row(out, rules, file, line, row, jobs, drop_states, fractional, default_gpu)
    return out.finish()


def _pai_row(out, rules, file, line, row, jobs, drop_states, fractional, default_gpu):
    if not row["job_name"] or not row["task_name"]:
        return out.bad(file, line, "empty job_name or task_name")
    try:
        inst_num = parse_int(row["inst_num"])
        plan_gpu = 0.0 if _empty(row["plan_gpu"]) else float(row["plan_gpu"])
        start_s = None if _empty(row["start_time"]) else float(row["start_time"])
        end_s = None if _empty(row["end_time"]) else float(row["end_time"])
    except ValueError:
        return out.bad(file, line, "inst_num/plan_gpu/start_time/end_time is not a number",
                       f"{row['inst_num']!r}, {row['plan_gpu']!r}, {row['start_time']!r}, {row['end_time']!r}")
    if inst_num < 1 or plan_gpu < 0 or math.isnan(plan_gpu):
        return out.bad(file, line, "inst_num below 1 or negative plan_gpu", f"{inst_num}, {plan_gpu}")
    if plan_gpu == 0:
        return out.drop("CPU-only task (plan_gpu empty or 0)", file, line)
    if row["status"].upper() in drop_states:
        return out.drop(f"status {row['status']} not kept", file, line)
    if start_s is None or end_s is None:
        return out.drop("never ran (no start_time or end_time)", file, line)
    work_s = round(end_s - start_s)
    if work_s < 0:
        return out.bad(file, line, "end_time before start_time", f"{end_s} < {start_s}")
    if work_s == 0:
        return out.drop("ran 0 s", file, line)
    notes = []
    if plan_gpu % 100:
        if fractional == "drop":
            return out.drop("fractional GPU (plan_gpu not a multiple of 100)", file, line)
        notes.append("fractional GPU rounded up to whole GPUs")
    user, job_submit_s = jobs.get(row["job_name"], ("", None))
    if row["job_name"] not in jobs:
        notes.append("no job row: no user, project <prefix>/unknown")
    # A job submitted after its task started would be a logging glitch: trust the task then.
    if job_submit_s is None or job_submit_s > start_s:
        notes.append("submit time = task start (job submit time missing or later)")
        job_submit_s = start_s
    out.add(make_record(
        id=f"{row['job_name']}-{row['task_name']}", submit_s=round(job_submit_s),
        project=rules.project_for("pai", user), user=user or None,
        gpu_type=row["gpu_type"] if not _empty(row["gpu_type"]) else default_gpu,
        gpus=inst_num * math.ceil(plan_gpu / 100), work_s=work_s, rules=rules,
    ), file, line, notes)
