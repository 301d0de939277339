"""``timeshare import SOURCE INPUT... --out trace.jsonl``: the importers on the command line.

The main CLI calls ``add_parser(subparsers)``; the parser's default ``func`` is ``run(args)``,
which writes the trace, prints the report (kept, dropped and why) and returns an exit code:
0 written, 1 nothing kept, 2 bad input (a malformed row names its file and line) or options.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..durations import parse_duration_s
from .alibaba import FRACTIONAL_RULES, import_openb, import_pai
from .common import MinRuntimeRule, RowError, Rules, split_list, write_jsonl
from .events_log import import_events
from .gavel import import_gavel
from .helios import import_helios

SOURCES = {
    "gavel": "Gavel per-team Philly traces (<team>.trace, tab separated) + --throughputs JSON",
    "helios": "Helios / Philly cluster_log.csv (HeliosData layout)",
    "alibaba-openb": "Alibaba 2023 openb_pod_list_*.csv",
    "alibaba-pai": "Alibaba PAI 2020 pai_task_table.csv (+ --jobs pai_job_table.csv for users)",
    "events": "timeshare's own events.jsonl (workload.submitted events)",
}
ALIASES = {"openb": "alibaba-openb", "pai": "alibaba-pai", "philly": "helios"}

EPILOG = """\
rules for the fields the sources lack (defaults in brackets):
  --min-runtime      0 | DURATION | work | min(work,DURATION)   [min(work,1h)], capped at --max-min-runtime [8h]
  --resumable / --not-resumable                                  [resumable]
  --checkpoint-interval DURATION | none                          [30m]
  kind = debug (<= 15 min), short (<= 1 h) or long, from the runtime
examples:
  timeshare import gavel traces/*.trace --throughputs simulation_throughputs.json --out philly.jsonl
  timeshare import helios data/Venus/cluster_log.csv --drop-states CANCELLED --out venus.jsonl
  timeshare import openb openb_pod_list_default.csv --min-runtime 0 --out openb.jsonl
  timeshare import events run/events.jsonl --min-runtime "min(work,30m)" --out replay.jsonl
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "import", help="turn another cluster's job log into a timeshare trace",
        description="Import a foreign job trace (or a timeshare event log) as a timeshare trace (JSON Lines).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(p)
    p.set_defaults(func=run)
    return p


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", choices=[*SOURCES, *ALIASES], metavar="SOURCE",
                   help="one of: " + "; ".join(f"{k}: {v}" for k, v in SOURCES.items())
                   + f" (aliases: {', '.join(f'{a}={s}' for a, s in ALIASES.items())})")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="input file(s); several are merged into one trace")
    p.add_argument("--out", "-o", required=True, help="the trace file to write (JSON Lines)")
    rules = p.add_argument_group("contract rules")
    rules.add_argument("--min-runtime", metavar="RULE", help="0, a duration, 'work' or 'min(work,1h)' [min(work,1h)]")
    rules.add_argument("--max-min-runtime", default="8h", metavar="DURATION", help="cap on min runtime [8h]")
    group = rules.add_mutually_exclusive_group()
    group.add_argument("--resumable", dest="resumable", action="store_const", const=True, default=None,
                       help="workloads resume after preemption [default]")
    group.add_argument("--not-resumable", dest="resumable", action="store_const", const=False,
                       help="workloads restart from zero after preemption")
    rules.add_argument("--checkpoint-interval", metavar="DURATION", help="e.g. 30m, or 'none' [30m]")
    mapping = p.add_argument_group("mapping")
    mapping.add_argument("--gpu-type", help="GPU type (gavel: also picks the throughput column) "
                         "[gavel, helios: V100; openb: G2 when gpu_spec is empty; pai: MISC when gpu_type is empty]")
    mapping.add_argument("--project-prefix", help="prefix of derived project paths "
                         "[gavel: philly; helios: helios; openb: alibaba; pai: pai]")
    mapping.add_argument("--project", help="put every workload in this one project")
    mapping.add_argument("--skip-malformed", action="store_true",
                         help="drop and count malformed rows instead of stopping at the first one")
    source = p.add_argument_group("source options")
    source.add_argument("--throughputs", metavar="JSON", help="gavel: simulation_throughputs.json (required)")
    source.add_argument("--jobs", action="append", default=[], metavar="CSV",
                        help="alibaba-pai: pai_job_table.csv, for users and submit times (repeatable)")
    source.add_argument("--drop-states", default="", metavar="A,B",
                        help="helios state / openb pod_phase / pai status values to drop, e.g. FAILED,CANCELLED")
    source.add_argument("--fractional", choices=FRACTIONAL_RULES, default="round-up",
                        help="alibaba: a fraction of a GPU becomes a whole GPU, or the job is dropped [round-up]")
    source.add_argument("--no-be-unallocated", dest="be_unallocated", action="store_false",
                        help="alibaba-openb: apply the min-runtime rule to BE pods too (default: BE -> min runtime 0)")
    source.add_argument("--cluster", help="events: keep only this cluster's events")


def build_rules(args, explicit_only: bool = False) -> Rules:
    """Rules from the flags; raises ValueError with a message for a bad value."""
    ckpt = None
    if args.checkpoint_interval is not None:
        text = args.checkpoint_interval.strip().lower()
        ckpt = 0 if text in ("none", "off", "0") else parse_duration_s(text)
    return Rules(
        min_runtime=MinRuntimeRule.parse(args.min_runtime) if args.min_runtime is not None else None,
        max_min_runtime_s=parse_duration_s(args.max_min_runtime),
        resumable=args.resumable, checkpoint_interval_s=ckpt, gpu_type=args.gpu_type,
        project_prefix=args.project_prefix, project=args.project,
    )


def run(args) -> int:
    source = ALIASES.get(args.source, args.source)
    try:
        rules = build_rules(args)
    except ValueError as exc:
        print(f"timeshare import: {exc}", file=sys.stderr)
        return 2
    strict, drop_states = not args.skip_malformed, split_list(args.drop_states)
    out = Path(args.out)
    if any(Path(i).resolve() == out.resolve() for i in args.inputs):
        print("timeshare import: --out must not be one of the inputs", file=sys.stderr)
        return 2
    try:
        if source == "gavel":
            if not args.throughputs:
                print("timeshare import: gavel needs --throughputs simulation_throughputs.json", file=sys.stderr)
                return 2
            result = import_gavel(args.inputs, args.throughputs, rules, strict)
        elif source == "helios":
            result = import_helios(args.inputs, rules, strict, drop_states)
        elif source == "alibaba-openb":
            result = import_openb(args.inputs, rules, strict, drop_states, args.fractional, args.be_unallocated)
        elif source == "alibaba-pai":
            result = import_pai(args.inputs, args.jobs, rules, strict, drop_states, args.fractional)
        else:
            result = import_events(args.inputs, rules, strict, args.cluster)
    except RowError as exc:
        print(f"timeshare import: {exc}\n  (use --skip-malformed to drop and count such rows)", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"timeshare import: {exc}", file=sys.stderr)
        return 2
    records, report = result
    print(report.format())
    if not records:
        print("timeshare import: no workload kept; nothing written", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    write_jsonl(records, out)
    print(f"wrote {len(records)} workloads to {out}")
    return 0


def main(argv=None) -> int:
    """Standalone entry point: ``python -m timeshare.importers.cli gavel ...``."""
    parser = argparse.ArgumentParser(prog="timeshare")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["import", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
