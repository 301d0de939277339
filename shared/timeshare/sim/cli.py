"""``timeshare simulate``: run a scenario under one or more policies and write the results."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from .. import events as ev
from ..durations import format_duration_s
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
    p.add_argument("--jobs", type=int, default=0, metavar="N",
                   help="policies run at once, each in its own process (default: one per policy, at most the CPUs; "
                        "1: one after the other)")
    p.set_defaults(func=simulate_command)
    c = sub.add_parser("check", help="referee a run: broken promises read from its event log and its scenario")
    c.add_argument("scenario", help="scenario TOML file")
    c.add_argument("events", help="events.jsonl of a run of that scenario")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="the same overrides the run was made with")
    c.add_argument("--limit", type=int, default=20, help="findings to print per kind (default 20)")
    c.set_defaults(func=check_command)


def check_command(args) -> int:
    """``timeshare check``: the referee's findings (sim/referee.py), by kind; exit 1 when any."""
    from .referee import Finding, check

    try:
        scenario = load_scenario(args.scenario, parse_overrides(args.set))
        with open(args.events, "rb") as f:
            decoded = [ev.decoder.decode(line) for line in f if line.strip()]
    except (InputError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    findings = check(scenario, decoded)
    by_kind: dict[str, list[Finding]] = {}
    for f in findings:
        by_kind.setdefault(f.kind, []).append(f)
    for kind in sorted(by_kind):
        print(f"{kind}: {len(by_kind[kind])}")
        for f in by_kind[kind][: args.limit]:
            print(f"  {f}")
    print(f"{len(findings)} findings in {len(decoded)} events")
    return 1 if findings else 0


def parse_overrides(items: list[str]) -> dict[str, str]:
    """``["duration=1d", ...]`` -> ``{"duration": "1d"}``; one line and exit 2 for an item without
    a key and '='."""
    out = {}
    for item in items:
        if "=" not in item or not item.split("=", 1)[0].strip():
            # a usage error, told as argparse tells one: one line, exit status 2
            print(f"timeshare: argument --set: expected KEY=VALUE (e.g. duration=10d), got {item!r}", file=sys.stderr)
            raise SystemExit(2)
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


#: the order runs are made and shown in; a check policy (budget-reference) comes after them
_ORDER = ["budget", "baseline", "fifo"]


def core_kind() -> str:
    """"compiled" when the scheduling core imported is the mypyc build, else "pure Python"."""
    from .. import scheduler

    return "pure Python" if str(scheduler.__file__).endswith(".py") else "compiled"


def simulate(scenario_path: str, policies: list[str], out_dir: Path | None, overrides: dict[str, str],
             show_progress: bool = True, report: bool = True, scenario=None, jobs: int = 1) -> dict[str, dict]:
    """Run ``policies`` and write their results under ``out_dir``; report.html too when
    ``report`` (the command renders it itself, after printing the summary). ``jobs`` > 1 runs
    that many policies at once, each in a forked process (runs are independent: the same
    events and metrics as one after the other; tests/sim/test_simulate_cli.py)."""
    if scenario is None:
        scenario = load_scenario(scenario_path, overrides)
    jobs = min(jobs, len(policies))
    if jobs > 1 and "fork" in multiprocessing.get_all_start_methods():
        global _FORKED_SCENARIO
        # a forked worker inherits the scenario (tens of thousands of workloads) instead of
        # receiving it pickled; each returns only its metrics
        _FORKED_SCENARIO = scenario
        try:
            with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"),
                                     initializer=_quiet_on_ctrl_c) as pool:
                futures = {name: pool.submit(_run_forked, name, out_dir, show_progress, i)
                           for i, name in enumerate(policies)}
                metrics = {name: f.result() for name, f in futures.items()}
        finally:
            _FORKED_SCENARIO = None
    else:
        metrics = {name: run_policy(scenario, name, out_dir, show_progress) for name in policies}
    if out_dir is not None:
        (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        (out_dir / "summary.txt").write_text(render_summary(scenario.name, metrics) + "\n")
        if report:
            render_report(out_dir, scenario, metrics)
    return metrics


#: the scenario a forked worker of ``simulate`` runs (set in the parent just before the fork)
_FORKED_SCENARIO = None


def _quiet_on_ctrl_c() -> None:
    """A worker dies of Ctrl-C at once and silently (the default action, no Python traceback);
    the command says it was interrupted."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run_forked(name: str, out_dir: Path | None, show_progress: bool, position: int) -> dict:
    return run_policy(_FORKED_SCENARIO, name, out_dir, show_progress, position)


def run_policy(scenario, name: str, out_dir: Path | None, show_progress: bool, position: int = 0) -> dict:
    """One policy's run: its events.jsonl and metrics.json under ``out_dir``; its metrics."""
    events_file = None
    if out_dir is not None:
        (out_dir / name).mkdir(parents=True, exist_ok=True)
        events_file = open(out_dir / name / "events.jsonl", "wb")
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=scenario.duration_s, desc=f"{scenario.name} [{name}]", unit="sim-s",
                   unit_scale=True, leave=False, mininterval=0.5, delay=2.0, file=sys.stderr, position=position)
    # events are kept as they come and written 4,096 at a time, encoded in one call each
    buffer: list = []
    keep = buffer.append
    encode_lines = ev.encoder.encode_lines

    def on_event(e):
        keep(e)
        if len(buffer) >= 4096:
            events_file.write(encode_lines(buffer))
            buffer.clear()

    try:
        result = run(scenario, name, on_event if events_file else None, bar.update if bar else None)
    finally:
        if events_file is not None:
            if buffer:
                events_file.write(encode_lines(buffer))
            events_file.close()
        if bar is not None:
            bar.close()
    result.metrics["policy"] = name
    result.metrics["scenario"] = scenario.name
    if out_dir is not None:
        (out_dir / name / "metrics.json").write_text(json.dumps(result.metrics, indent=2) + "\n")
    return result.metrics


def default_jobs(policies: int) -> int:
    """One process per policy, at most the CPUs this process may use."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(policies, cpus))


def render_report(out_dir: Path, scenario, metrics: dict[str, dict]) -> Path | None:
    """Write ``out_dir/report.html`` (None: the report's extra packages are not installed)."""
    try:
        from ..report.html import write_report
    except ImportError:
        return None
    return write_report(out_dir, scenario, metrics)


def simulate_command(args) -> int:
    policies = list(POLICIES) if args.policy == "all" else [args.policy]
    policies = sorted(policies, key=lambda p: (_ORDER.index(p) if p in _ORDER else len(_ORDER), p))
    out_dir = Path(args.out) if args.out else None
    t0 = time.perf_counter()
    try:
        scenario = load_scenario(args.scenario, parse_overrides(args.set))
        print(f"simulating {scenario.name} ({format_duration_s(scenario.duration_s)}, {len(scenario.workloads)} "
              f"workloads; {', '.join(policies)}) with the {core_kind()} core", file=sys.stderr, flush=True)
        # report.html is drawn after the summary, in this process: about two seconds of CPU for the
        # built-in month (a worker drawing it beside the next policy's run cost more CPU in all)
        metrics = simulate(args.scenario, policies, out_dir, {}, show_progress=not args.no_progress,
                           report=False, scenario=scenario, jobs=args.jobs or default_jobs(len(policies)))
    except (InputError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, BrokenProcessPool):
        # Ctrl-C reaches the workers too (they die of it: _quiet_on_ctrl_c), and the parent may
        # hear of their end before its own KeyboardInterrupt; a worker killed otherwise (out of
        # memory) ends the command the same way
        print("\ninterrupted: a run was stopped (Ctrl-C, or its process was killed); the files of the runs that had "
              "not ended are incomplete", file=sys.stderr)
        return 130
    print(render_summary(scenario.name, metrics), flush=True)
    if out_dir is None:
        print(f"\nsimulated in {time.perf_counter() - t0:.1f} s ({core_kind()} core); nothing written (no --out)")
        return 0
    written = [out_dir / "summary.txt", out_dir / "metrics.json", *(out_dir / p / "events.jsonl" for p in policies)]
    if not args.no_report:
        print(f"\nrendering {out_dir / 'report.html'} (the summary above is final)...", file=sys.stderr, flush=True)
        t1 = time.perf_counter()
        try:
            path = render_report(out_dir, scenario, metrics)
        except (ValueError, OSError) as exc:
            print(f"error: report.html: {exc}", file=sys.stderr)
            path = None
        if path is not None:
            written.insert(0, path)
            print(f"report.html in {time.perf_counter() - t1:.1f} s", file=sys.stderr)
    print(f"\nwrote {', '.join(str(p) for p in written)} in {time.perf_counter() - t0:.1f} s ({core_kind()} core)")
    return 0
