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
             show_progress: bool = True, report: bool = True, scenario=None, jobs: int = 1,
             report_logs: dict | None = None) -> dict[str, dict]:
    """Run ``policies`` and write their results under ``out_dir``; report.html too when
    ``report`` (the command renders it itself, after printing the summary, from ``report_logs``:
    given, each run folds its own events for the report into it, runlog.RunLog by policy). ``jobs``
    > 1 runs that many policies at once, each in a forked process (runs are independent: the same
    events and metrics as one after the other; tests/sim/test_simulate_cli.py)."""
    if scenario is None:
        scenario = load_scenario(scenario_path, overrides)
    fold = out_dir is not None and (report or report_logs is not None) and _report_installed()
    logs: dict = {} if report_logs is None else report_logs
    jobs = min(jobs, len(policies))
    if jobs > 1 and "fork" in multiprocessing.get_all_start_methods():
        global _FORKED_SCENARIO
        # a forked worker inherits the scenario (tens of thousands of workloads) instead of
        # receiving it pickled (and the report's modules, imported above); each returns its
        # metrics and its folded log
        _FORKED_SCENARIO = scenario
        try:
            with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"),
                                     initializer=_quiet_on_ctrl_c) as pool:
                futures = {name: pool.submit(_run_forked, name, out_dir, show_progress, i, fold)
                           for i, name in enumerate(policies)}
                results = {name: f.result() for name, f in futures.items()}
        finally:
            _FORKED_SCENARIO = None
    else:
        results = {name: run_policy(scenario, name, out_dir, show_progress, fold=fold) for name in policies}
    metrics = {name: r[0] for name, r in results.items()}
    logs.update({name: r[1] for name, r in results.items() if r[1] is not None})
    if out_dir is not None:
        (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        (out_dir / "summary.txt").write_text(render_summary(scenario.name, metrics) + "\n")
        if report:
            render_report(out_dir, scenario, metrics, logs)
    return metrics


#: events encoded and written in one call
WRITE_BATCH_EVENTS = 4096
#: a run of at most this many events folds them for report.html itself, from the events it holds
#: (about 300 bytes each, so at most about 150 MB more per run's process): the command then does
#: not read events.jsonl back (0.95 s of CPU for the built-in month's three runs, 196,162 events
#: the largest); a longer run lets them go and the report reads the file
REPORT_FOLD_MAX_EVENTS = 500_000


def _report_installed() -> bool:
    """Whether report.html can be drawn (its extra packages are installed); imports the fold, so
    that forked workers inherit numpy instead of each importing it."""
    try:
        from ..report import runlog  # noqa: F401
    except ImportError:
        return False
    return True


#: the scenario a forked worker of ``simulate`` runs (set in the parent just before the fork)
_FORKED_SCENARIO = None


def _quiet_on_ctrl_c() -> None:
    """A worker dies of Ctrl-C at once and silently (the default action, no Python traceback);
    the command says it was interrupted."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run_forked(name: str, out_dir: Path | None, show_progress: bool, position: int, fold: bool) -> tuple:
    return run_policy(_FORKED_SCENARIO, name, out_dir, show_progress, position, fold)


def run_policy(scenario, name: str, out_dir: Path | None, show_progress: bool, position: int = 0,
               fold: bool = False) -> tuple:
    """One policy's run: its events.jsonl and metrics.json under ``out_dir``; its metrics, and
    when ``fold`` its events folded for the report (runlog.RunLog; None when the run had more than
    REPORT_FOLD_MAX_EVENTS events or nothing was written)."""
    events_file = None
    if out_dir is not None:
        (out_dir / name).mkdir(parents=True, exist_ok=True)
        events_file = open(out_dir / name / "events.jsonl", "wb")
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=scenario.duration_s, desc=f"{scenario.name} [{name}]", unit="sim-s",
                   unit_scale=True, leave=False, mininterval=0.5, delay=2.0, file=sys.stderr, position=position)
    # events are kept as they come and written WRITE_BATCH_EVENTS at a time, encoded in one call
    # each; for the report, all of them are kept (up to REPORT_FOLD_MAX_EVENTS) and folded at the end
    kept: list = []
    keep = kept.append
    written = 0
    encode_lines = ev.encoder.encode_lines
    folding = fold and events_file is not None

    def on_event(e):
        nonlocal written, folding
        keep(e)
        if len(kept) - written >= WRITE_BATCH_EVENTS:
            events_file.write(encode_lines(kept[written:] if written else kept))
            written = len(kept)
            if not folding or written >= REPORT_FOLD_MAX_EVENTS:
                folding = False
                kept.clear()
                written = 0

    try:
        result = run(scenario, name, on_event if events_file else None, bar.update if bar else None)
    finally:
        if events_file is not None:
            if len(kept) > written:
                events_file.write(encode_lines(kept[written:]))
            events_file.close()
        if bar is not None:
            bar.close()
    result.metrics["policy"] = name
    result.metrics["scenario"] = scenario.name
    log = None
    if out_dir is not None:
        (out_dir / name / "metrics.json").write_text(json.dumps(result.metrics, indent=2) + "\n")
        if folding:
            from ..report.runlog import GpuRows, fold_events

            log = fold_events(kept, name, float(result.end_s), scenario.tree().leaves, GpuRows.from_scenario(scenario))
    return result.metrics, log


def default_jobs(policies: int) -> int:
    """One process per policy, at most the CPUs this process may use."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(policies, cpus))


def render_report(out_dir: Path, scenario, metrics: dict[str, dict], logs: dict | None = None) -> Path | None:
    """Write ``out_dir/report.html`` (None: the report's extra packages are not installed);
    ``logs``: the runs' events as they folded them (the others' are read from events.jsonl)."""
    try:
        from ..report.html import write_report
    except ImportError:
        return None
    return write_report(out_dir, scenario, metrics, logs=logs)


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
        logs: dict = {}
        metrics = simulate(args.scenario, policies, out_dir, {}, show_progress=not args.no_progress,
                           report=False, scenario=scenario, jobs=args.jobs or default_jobs(len(policies)),
                           report_logs=None if args.no_report else logs)
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
            path = render_report(out_dir, scenario, metrics, logs)
        except (ValueError, OSError) as exc:
            print(f"error: report.html: {exc}", file=sys.stderr)
            path = None
        if path is not None:
            written.insert(0, path)
            print(f"report.html in {time.perf_counter() - t1:.1f} s", file=sys.stderr)
    print(f"\nwrote {', '.join(str(p) for p in written)} in {time.perf_counter() - t0:.1f} s ({core_kind()} core)")
    return 0
