"""What every importer shares: the contract rules, the report, row errors and the output.

Foreign traces say when a job arrived, how many GPUs it took and how long it ran; they never
say what timeshare's contract needs (minimum runtime, resumable, checkpoint interval). Those
come from ``Rules``, one documented default per field, each settable from the CLI, so an
imported trace states its assumptions instead of hiding them.

Default rules (the ones that produced ``philly-seed0``):
- ``min_runtime_s`` = min(work, 1h), capped at ``max_min_runtime_s`` (8 h);
- ``resumable`` = true; ``checkpoint_interval_s`` = 1800;
- ``kind`` = debug (work <= 15 min), short (<= 1 h) or long; ``priority`` = normal.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

from ..durations import format_duration_s, parse_duration_s

#: Key order of one trace line (the order of the existing traces, so diffs stay readable).
TRACE_KEYS = ("id", "submit_s", "project", "user", "gpu_type", "gpus", "work_s", "min_runtime_s",
              "resumable", "priority", "kind", "checkpoint_interval_s")
REQUIRED_KEYS = ("id", "submit_s", "project", "gpu_type", "gpus", "work_s", "min_runtime_s", "resumable")
PRIORITIES = ("low", "normal", "high", "urgent")

DEBUG_MAX_S = 15 * 60
SHORT_MAX_S = 3600


class RowError(ValueError):
    """A malformed input row: names the file, the line and why."""

    def __init__(self, file: str, line: int | None, reason: str):
        where = file if line is None else f"{file}:{line}"
        super().__init__(f"{where}: {reason}")
        self.file, self.line, self.reason = file, line, reason


# ---------------------------------------------------------------------------------------------
# Minimum-runtime rule


@dataclass(frozen=True)
class MinRuntimeRule:
    """``min_runtime_s`` from ``work_s``: min(work, bound) when ``bound_by_work``, else constant.

    Grammar (``parse``): ``0`` (unallocated: always preemptible, never charged), a duration
    (``30m``, ``3600``: that constant), ``work`` (the whole run), ``min(work,1h)``.
    The cap is applied afterwards, by ``Rules``.
    """

    text: str
    constant_s: int | None  # None: no constant part ("work")
    bound_by_work: bool

    @classmethod
    def parse(cls, text: str) -> "MinRuntimeRule":
        compact = re.sub(r"\s+", "", str(text)).lower()
        if compact == "work":
            return cls(compact, None, True)
        match = re.fullmatch(r"min\((?:work,(.+)|(.+),work)\)", compact)
        try:
            if match:
                return cls(compact, parse_duration_s(match.group(1) or match.group(2)), True)
            return cls(compact, parse_duration_s(compact), False)
        except ValueError:
            raise ValueError(
                f"not a min-runtime rule: {text!r} (use 0, a duration like 30m, 'work' or 'min(work,1h)')"
            ) from None

    def apply(self, work_s: int) -> int:
        if self.constant_s is None:
            return work_s
        return min(work_s, self.constant_s) if self.bound_by_work else self.constant_s


DEFAULT_MIN_RUNTIME = MinRuntimeRule.parse("min(work,1h)")


@dataclass(frozen=True)
class Rules:
    """How to fill the contract fields a source lacks. ``None`` means "the source's default".

    Importers of foreign traces call ``min_runtime_s()``, ``resumable_value()``... which fall
    back to the documented defaults; the event-log importer overrides only what was set.
    """

    min_runtime: MinRuntimeRule | None = None
    max_min_runtime_s: int = 8 * 3600
    resumable: bool | None = None
    #: 0 = leave the field out (no checkpoints); None = default 1800
    checkpoint_interval_s: int | None = None
    gpu_type: str | None = None
    project_prefix: str | None = None
    #: every workload in this one project (instead of one derived from the input)
    project: str | None = None

    def min_runtime_s(self, work_s: int) -> int:
        rule = self.min_runtime or DEFAULT_MIN_RUNTIME
        return max(0, min(rule.apply(work_s), self.max_min_runtime_s))

    def resumable_value(self) -> bool:
        return True if self.resumable is None else self.resumable

    def checkpoint_value(self) -> int | None:
        if self.checkpoint_interval_s is None:
            return 1800
        return self.checkpoint_interval_s or None

    def project_for(self, default_prefix: str, leaf: str) -> str:
        if self.project:
            return self.project
        prefix = (self.project_prefix if self.project_prefix is not None else default_prefix).strip("/")
        leaf = leaf.strip("/") or "unknown"
        return f"{prefix}/{leaf}" if prefix else leaf

    def describe(self) -> str:
        rule = (self.min_runtime or DEFAULT_MIN_RUNTIME).text
        ckpt = self.checkpoint_value()
        return (f"min_runtime={rule} capped at {format_duration_s(self.max_min_runtime_s)}, "
                f"resumable={str(self.resumable_value()).lower()}, "
                f"checkpoint_interval={format_duration_s(ckpt) if ckpt else 'none'}")


def kind_for(work_s: int) -> str:
    """debug / short / long by total runtime (the labels the debug-wait metric reads)."""
    if work_s <= DEBUG_MAX_S:
        return "debug"
    if work_s <= SHORT_MAX_S:
        return "short"
    return "long"


def make_record(*, id: str, submit_s: int, project: str, gpu_type: str, gpus: int, work_s: int,
                rules: Rules, user: str | None = None, priority: str = "normal", kind: str | None = None,
                min_runtime_s: int | None = None) -> dict:
    """One trace record in ``TRACE_KEYS`` order; the contract fields come from ``rules``."""
    record = {"id": id, "submit_s": submit_s, "project": project}
    if user:
        record["user"] = user
    record.update({
        "gpu_type": gpu_type,
        "gpus": gpus,
        "work_s": work_s,
        "min_runtime_s": rules.min_runtime_s(work_s) if min_runtime_s is None else min_runtime_s,
        "resumable": rules.resumable_value(),
        "priority": priority,
        "kind": kind or kind_for(work_s),
    })
    ckpt = rules.checkpoint_value()
    if ckpt:
        record["checkpoint_interval_s"] = ckpt
    return record


def check_record(record: dict, max_min_runtime_s: int = 8 * 3600) -> str | None:
    """Why ``record`` is not a valid trace line, or None. Guards every importer's output."""
    for key in REQUIRED_KEYS:
        if key not in record:
            return f"missing field {key}"

    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)

    if not isinstance(record["id"], str) or not record["id"]:
        return "id must be a non-empty string"
    if not isinstance(record["project"], str) or not record["project"].strip("/"):
        return "project must be a non-empty slash path"
    if not isinstance(record["gpu_type"], str) or not record["gpu_type"]:
        return "gpu_type must be a non-empty string"
    for key in ("submit_s", "work_s", "min_runtime_s"):
        if not is_int(record[key]) or record[key] < 0:
            return f"{key} must be an integer >= 0, got {record[key]!r}"
    if not is_int(record["gpus"]) or record["gpus"] < 1:
        return f"gpus must be an integer >= 1, got {record['gpus']!r}"
    if record["min_runtime_s"] > max_min_runtime_s:
        return f"min_runtime_s {record['min_runtime_s']} is above the cap {max_min_runtime_s}"
    if not isinstance(record["resumable"], bool):
        return f"resumable must be true or false, got {record['resumable']!r}"
    if "priority" in record and record["priority"] not in PRIORITIES:
        return f"priority must be one of {', '.join(PRIORITIES)}, got {record['priority']!r}"
    ckpt = record.get("checkpoint_interval_s")
    if ckpt is not None and (not is_int(ckpt) or ckpt <= 0):
        return f"checkpoint_interval_s must be an integer > 0, got {ckpt!r}"
    for key in ("user", "kind"):
        if key in record and not isinstance(record[key], str):
            return f"{key} must be a string, got {record[key]!r}"
    return None


# ---------------------------------------------------------------------------------------------
# Report and collection


@dataclass
class ImportReport:
    """How many rows became workloads, and why the others did not."""

    source: str
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    #: kept rows that a rule changed (e.g. a fractional GPU rounded up), by note
    adjusted: Counter = field(default_factory=Counter)
    #: the first "file:line" of each drop reason, so a surprising count can be looked up
    first_seen: dict = field(default_factory=dict)
    rules: str = ""

    @property
    def total_dropped(self) -> int:
        return sum(self.dropped.values())

    def to_dict(self) -> dict:
        return {"source": self.source, "kept": self.kept, "dropped": dict(self.dropped),
                "adjusted": dict(self.adjusted)}

    def format(self) -> str:
        rows = self.kept + self.total_dropped
        lines = [f"{self.source}: {rows} rows read, {self.kept} kept, {self.total_dropped} dropped"]
        for reason, count in self.dropped.most_common():
            where = self.first_seen.get(reason)
            lines.append(f"  dropped {count:>7}  {reason}" + (f"  (first at {where})" if where else ""))
        for note, count in self.adjusted.most_common():
            lines.append(f"  adjusted {count:>6}  {note}")
        if self.rules:
            lines.append(f"  rules: {self.rules}")
        return "\n".join(lines)


class ImportResult(NamedTuple):
    records: list
    report: ImportReport


class Collector:
    """Accumulates records and drops while an importer walks its rows.

    ``strict``: a malformed row raises ``RowError`` (file, line, reason); otherwise it is
    dropped and counted under ``malformed: <reason>``. Rows that are well formed but unusable
    (CPU-only, never ran, no throughput...) are always dropped and counted, never errors.
    """

    def __init__(self, source: str, rules: Rules, strict: bool = True):
        self.rules, self.strict = rules, strict
        self.report = ImportReport(source, rules=rules.describe())
        self._records: list[dict] = []
        self._where: list[str] = []

    def add(self, record: dict, file: str, line: int | None, notes: Iterable[str] = ()) -> None:
        problem = check_record(record, self.rules.max_min_runtime_s)
        if problem:
            # The source gave values the contract cannot hold (e.g. a cap below a logged min runtime).
            self.bad(file, line, "invalid workload", problem)
            return
        self._records.append(record)
        self._where.append(f"{file}:{line}")
        for note in notes:
            self.report.adjusted[note] += 1

    def drop(self, reason: str, file: str, line: int | None) -> None:
        self.report.dropped[reason] += 1
        self.report.first_seen.setdefault(reason, f"{file}:{line}")

    def bad(self, file: str, line: int | None, reason: str, detail: str = "") -> None:
        """A malformed row: raise when strict, else count it under its (value-free) reason."""
        if self.strict:
            raise RowError(file, line, f"{reason}: {detail}" if detail else reason)
        self.drop(f"malformed: {reason}", file, line)

    def finish(self) -> ImportResult:
        """Drop duplicate ids, rebase submit times so the earliest is 0, order by submit time."""
        seen: dict[str, str] = {}
        records = []
        for record, where in zip(self._records, self._where):
            first = seen.get(record["id"])
            if first is not None:
                file, _, line = where.rpartition(":")
                self.bad(file, int(line) if line.isdigit() else None, "duplicate id",
                         f"{record['id']!r} already used at {first}")
                continue
            seen[record["id"]] = where
            records.append(record)
        if records:
            start_s = min(r["submit_s"] for r in records)
            for r in records:
                r["submit_s"] -= start_s
        records.sort(key=lambda r: r["submit_s"])  # stable: ties keep input order
        self.report.kept = len(records)
        return ImportResult(records, self.report)


# ---------------------------------------------------------------------------------------------
# Small parsers shared by the CSV sources


def parse_int(text: str) -> int:
    """An integer that may be written "8", "8.0" or " 8 "; ValueError otherwise."""
    value = float(text)
    if value != int(value):
        raise ValueError(f"not a whole number: {text!r}")
    return int(value)


def split_list(text: str | None) -> tuple[str, ...]:
    return tuple(s.strip() for s in (text or "").split(",") if s.strip())


def write_jsonl(records: Iterable[dict], path) -> int:
    """Write one JSON object per line (json.dumps defaults: the existing traces' spelling)."""
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record) + "\n")
            n += 1
    return n
