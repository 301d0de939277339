"""timeshare's own event log (``events.jsonl`` from the simulator or the services).

Input: JSON Lines, one event per line, each an object with a ``type``. Only
``{"type": "workload.submitted", "at_ms": ..., "cluster": ..., "workload": {<trace record>},
"resubmit_of": null}`` matters; every other type is ignored (and counted), so a production
week can be replayed under another policy.

Mapping (one workload per original submission):
- the ``workload`` object's trace fields are kept as logged (``id``, ``project``, ``user``,
  ``gpu_type``, ``gpus``, ``work_s``, ``min_runtime_s``, ``resumable``, ``priority``, ``kind``,
  ``checkpoint_interval_s``, ``command``); fields the event schema defaults and may omit get
  its defaults (min_runtime_s 0, resumable false, priority normal);
- ``submit_s`` = at_ms // 1000 (when it was really submitted, whole seconds), rebased so the
  earliest is 0 (the logged ``workload.submit_s`` is ignored);
- submissions with ``resubmit_of`` set are the system's (or a user's) retries of a workload
  already in the trace and are skipped: the replay's own policy decides about retries;
- ``cluster``: keep only that cluster's events when given;
- rules override the logged contract only when set (``--min-runtime``, ``--resumable``,
  ``--checkpoint-interval``, ``--gpu-type``, ``--project``), to ask "what if".
"""

from __future__ import annotations

import json
from pathlib import Path

from .common import TRACE_KEYS, Collector, ImportResult, Rules

SOURCE = "events"
EXTRA_KEYS = ("command",)
#: the event schema's defaults for fields an encoder may leave out
SPEC_DEFAULTS = {"min_runtime_s": 0, "resumable": False, "priority": "normal"}


def import_events(paths, rules: Rules | None = None, strict: bool = True,
                  cluster: str | None = None) -> ImportResult:
    rules = rules or Rules()
    out = Collector(SOURCE, rules, strict)
    out.report.rules = _describe_overrides(rules)
    for path in map(Path, paths):
        file = str(path)
        with open(path, encoding="utf-8") as fh:
            for line, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                try:
                    event = json.loads(raw)
                except json.JSONDecodeError as exc:
                    out.bad(file, line, "malformed JSON", exc.msg)
                    continue
                if not isinstance(event, dict) or not isinstance(event.get("type"), str):
                    out.bad(file, line, "not an event (a JSON object with a string \"type\")")
                    continue
                if event["type"] != "workload.submitted":
                    out.drop("other event type (ignored)", file, line)
                    continue
                if cluster is not None and event.get("cluster", "default") != cluster:
                    out.drop("other cluster", file, line)
                    continue
                if event.get("resubmit_of") is not None:
                    out.drop("resubmission of an earlier workload", file, line)
                    continue
                at_ms, workload = event.get("at_ms"), event.get("workload")
                if not isinstance(at_ms, int) or isinstance(at_ms, bool) or at_ms < 0:
                    out.bad(file, line, "at_ms must be an integer >= 0", repr(at_ms))
                    continue
                if not isinstance(workload, dict):
                    out.bad(file, line, "workload.submitted without a workload object")
                    continue
                out.add(_record(workload, at_ms, rules), file, line)
    return out.finish()


def _record(workload: dict, at_ms: int, rules: Rules) -> dict:
    merged = {**SPEC_DEFAULTS, **workload, "submit_s": at_ms // 1000}
    if rules.min_runtime is not None and isinstance(merged.get("work_s"), int):
        merged["min_runtime_s"] = rules.min_runtime_s(merged["work_s"])
    if rules.resumable is not None:
        merged["resumable"] = rules.resumable
    if rules.checkpoint_interval_s is not None:
        merged["checkpoint_interval_s"] = rules.checkpoint_interval_s or None
    if rules.gpu_type:
        merged["gpu_type"] = rules.gpu_type
    if rules.project:
        merged["project"] = rules.project
    # Canonical key order; absent optional fields (None) are left out as in a trace file.
    return {k: merged[k] for k in (*TRACE_KEYS, *EXTRA_KEYS) if merged.get(k) is not None}


def _describe_overrides(rules: Rules) -> str:
    """The report line: the logged contract is kept unless a rule was set."""
    set_ = []
    if rules.min_runtime is not None:
        set_.append(f"min_runtime={rules.min_runtime.text} capped at {rules.max_min_runtime_s}s")
    if rules.resumable is not None:
        set_.append(f"resumable={str(rules.resumable).lower()}")
    if rules.checkpoint_interval_s is not None:
        set_.append(f"checkpoint_interval={rules.checkpoint_interval_s or 'none'}")
    set_ += [f"{k}={v}" for k, v in (("gpu_type", rules.gpu_type), ("project", rules.project)) if v]
    return "as logged" + (f", except {', '.join(set_)}" if set_ else "")
