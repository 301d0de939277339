"""``timeshare simulate``: run a scenario under one or more policies and write the results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .. import events as ev
from .engine import CHECKS, POLICIES, run
from .errors import InputError
from .scenario import load_scenario
from .summary import render_summary


def add_parsers(sub) -> None:
    p = sub.add_parser("simulate", help="replay a scenario under the budget, baseline and fifo policies")
    p.add_argument("scenario", help="scenario TOML file")
    p.add_argument("--policy", default="all", choices=[*POLICIES, *CHECKS, "all"],
                   help="policy to run (default: all; budget-reference: the budget policy with every cache off)")
    p.add_argument("--out", help="directory for metrics.json, events.jsonl and the report")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario setting, e.g. --set lookback_window=3d (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    p.set_defaults(func=simulate_command)


def parse_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            # a usage error, told as argparse tells one: one line, exit status 2
            print(f"timeshare: argument --set: expected KEY=VALUE (e.g. duration=10d), got {item!r}", file=sys.stderr)
            raise SystemExit(2)
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def simulate(scenario_path: str, policies: list[str], out_dir: Path | None, overrides: dict[str, str],
             show_progress: bool = True, report: bool = True) -> dict[str, dict]:
    scenario = load_scenario(scenario_path, overrides)
    results = {}
    for name in policies:
        events_file = None
        if out_dir is not None:
            (out_dir / name).mkdir(parents=True, exist_ok=True)
            events_file = open(out_dir / name / "events.jsonl", "wb")
        bar = None
        if show_progress:
            from tqdm import tqdm

            bar = tqdm(total=scenario.duration_s, desc=f"{scenario.name} [{name}]", unit="sim-s",
                       unit_scale=True, leave=False, mininterval=0.5, delay=2.0, file=sys.stderr)
        encode = ev.encoder.encode
        buffer: list[bytes] = []

        def on_event(e, buffer=buffer, events_file=events_file):
            buffer.append(encode(e))
            if len(buffer) >= 4096:
                events_file.write(b"\n".join(buffer) + b"\n")
                buffer.clear()

        try:
            result = run(scenario, name, on_event if events_file else None, bar.update if bar else None)
        finally:
            if events_file is not None:
                if buffer:
                    events_file.write(b"\n".join(buffer) + b"\n")
                events_file.close()
            if bar is not None:
                bar.close()
        result.metrics["policy"] = name
        result.metrics["scenario"] = scenario.name
        results[name] = result
        if out_dir is not None:
            (out_dir / name / "metrics.json").write_text(json.dumps(result.metrics, indent=2) + "\n")
    metrics = {name: r.metrics for name, r in results.items()}
    if out_dir is not None:
        (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        (out_dir / "summary.txt").write_text(render_summary(scenario.name, metrics) + "\n")
        if report:
            try:
                from ..report.html import write_report
            except ImportError:
                pass
            else:
                write_report(out_dir, scenario, results)
    return metrics


def simulate_command(args) -> int:
    policies = list(POLICIES) if args.policy == "all" else [args.policy]
    policies = sorted(policies, key=lambda p: ["budget", "baseline", "fifo"].index(p))
    out_dir = Path(args.out) if args.out else None
    try:
        metrics = simulate(args.scenario, policies, out_dir, parse_overrides(args.set),
                           show_progress=not args.no_progress, report=not args.no_report)
    except (InputError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    scenario_name = next(iter(metrics.values()))["scenario"]
    print(render_summary(scenario_name, metrics))
    if out_dir is not None:
        print(f"\nwrote {out_dir}/metrics.json, {out_dir}/<policy>/events.jsonl")
    return 0
