"""``timeshare sweep`` (a grid of settings, in parallel) and ``timeshare report`` (re-render
``report.html`` of a ``timeshare simulate --out DIR``, e.g. over another time range)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..durations import format_duration_s, parse_duration_s


def add_parser(sub) -> None:
    from ..sim.engine import POLICIES

    p = sub.add_parser("sweep", help="run a scenario over a grid of settings and tabulate the headline metrics")
    p.add_argument("scenario", help="scenario TOML file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="a swept setting and its values, e.g. --set lookback_window=1d,3d,7d (repeatable; "
                        "the grid is their cartesian product; any key simulate --set accepts)")
    p.add_argument("--policy", default="budget",
                   help=f"policy or comma-separated policies ({', '.join(POLICIES)}, or all; default budget)")
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: one per core)")
    p.add_argument("--scheduler", default=None, metavar="tcp://HOST:8786",
                   help="run the points on this Dask cluster instead of local processes (pip install "
                        "'timeshare[dask]'; the workers need timeshare installed, not the scenario file)")
    p.add_argument("--out", default=None, help="directory for sweep.csv and sweep.html (default: out/sweep-<scenario>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=sweep_command)

    r = sub.add_parser("report", help="(re)write report.html for a simulate --out directory")
    r.add_argument("scenario", help="the scenario TOML the directory was simulated from")
    r.add_argument("dir", help="the simulate --out directory (metrics.json, <policy>/events.jsonl)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="the same overrides given to simulate (repeatable)")
    r.add_argument("--window", default=None, metavar="START..END",
                   help="time range of the cluster picture, e.g. 10d..12d or 36h..60h (default: 2 days mid-run)")
    r.add_argument("--max-rows", type=int, default=256, help="most GPU rows in the cluster picture (default 256)")
    r.set_defaults(func=report_command)


def parse_window(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    if ".." not in text:
        raise ValueError(f"--window {text!r}: expected START..END, e.g. 10d..12d")
    a, b = text.split("..", 1)
    start, end = parse_duration_s(a), parse_duration_s(b)
    if end <= start:
        raise ValueError(f"--window {text!r}: END must be after START")
    return start, end


def sweep_command(args) -> int:
    from ..sim.engine import POLICIES
    from .sweep import parse_grid, render_table, run_sweep, write_csv
    from .sweep_html import write_sweep_html

    policies = list(POLICIES) if args.policy == "all" else [p.strip() for p in args.policy.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        print(f"error: unknown policy {', '.join(unknown) or args.policy!r} (expected {', '.join(POLICIES)})",
              file=sys.stderr)
        return 2
    try:
        grid = parse_grid(args.set)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not Path(args.scenario).is_file():
        print(f"error: no such scenario file: {args.scenario}", file=sys.stderr)
        return 2
    out = Path(args.out or Path("out") / f"sweep-{Path(args.scenario).stem}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        results = run_sweep(args.scenario, grid, policies, args.jobs, show_progress=not args.no_progress,
                            scheduler=args.scheduler)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    csv_path = write_csv(out / "sweep.csv", grid, results)
    html_path = write_sweep_html(out / "sweep.html", args.scenario, grid, results)
    errors = [r for r in results if r.error]
    for r in errors:
        print(f"point {r.point.index} ({r.point.policy}, {r.point.settings}): {r.error}", file=sys.stderr)
    print(render_table(grid, results))
    print(f"{len(results)} points ({len(errors)} invalid) in {format_duration_s(time.perf_counter() - t0)}; "
          f"wrote {csv_path} and {html_path}")
    return 1 if errors and len(errors) == len(results) else 0


def report_command(args) -> int:
    from ..sim.cli import parse_overrides
    from ..sim.errors import InputError
    from ..sim.scenario import load_scenario
    from .html import load_results, write_report

    try:
        window = parse_window(args.window)
        scenario = load_scenario(args.scenario, parse_overrides(args.set))
        results = load_results(Path(args.dir))
    except (ValueError, InputError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        path = write_report(Path(args.dir), scenario, results, window=window, max_gpu_rows=args.max_rows)
    except ValueError as exc:  # e.g. a window outside the run
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} in {time.perf_counter() - t0:.1f} s")
    return 0
