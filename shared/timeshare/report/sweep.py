"""Parameter sweeps: run a scenario over the cartesian product of settings, one row per point.

Each point loads the scenario with its overrides (any key ``load_scenario`` accepts: policy
settings by their short name, ``duration``, ``seed`` or dotted paths such as
``generator.offered_load``) and runs ``engine.run`` without an event sink, in a worker process.
A point whose settings make the scenario invalid becomes an error row; the sweep goes on.
"""

from __future__ import annotations

import csv
import itertools
import os
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

#: the headline columns of sweep.csv, after the swept parameters. Attainment counts funded work
#: (metrics.json "attainment"); the all-work figure is shown for comparison, never a target.
METRIC_COLUMNS = (
    "occupancy", "unallocated_share", "attainment_fleet", "attainment_min_team", "debug_p90_wait_s",
    "p90_wait_s", "preemptions", "wasted_gpu_hours", "drains_needing_human", "attainment_all_work_fleet", "wall_s",
)


@dataclass
class SweepPoint:
    index: int
    policy: str
    settings: dict[str, str]  # parameter -> value as written on the command line


@dataclass
class SweepResult:
    point: SweepPoint
    metrics: dict[str, float | int | None] = field(default_factory=dict)
    error: str = ""


def parse_grid(items: list[str]) -> dict[str, list[str]]:
    """["lookback_window=1d,3d", "seed=1"] -> {"lookback_window": ["1d", "3d"], "seed": ["1"]}."""
    grid: dict[str, list[str]] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE[,VALUE...]")
        key, values = item.split("=", 1)
        key = key.strip()
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not key or not vals:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE[,VALUE...]")
        if key in grid:
            raise ValueError(f"--set {key} given twice")
        grid[key] = vals
    return grid


def grid_points(grid: dict[str, list[str]], policies: list[str]) -> list[SweepPoint]:
    keys = list(grid)
    points = []
    for policy in policies:
        for combo in itertools.product(*(grid[k] for k in keys)):
            points.append(SweepPoint(len(points), policy, dict(zip(keys, combo))))
    return points


def headline(metrics: dict) -> dict[str, float | int | None]:
    """The sweep's columns, read from one run's metrics dict (as in metrics.json)."""
    waits = metrics["queue_wait_s"]
    debug = waits["by_kind"].get("debug")
    return {
        "occupancy": metrics["occupancy"],
        "unallocated_share": metrics["unallocated_share"],
        "attainment_fleet": metrics["attainment"]["fleet"],
        "attainment_min_team": metrics["attainment"]["min_team"],
        "debug_p90_wait_s": debug["p90"] if debug else None,
        "p90_wait_s": waits["overall"]["p90"],
        "preemptions": metrics["preemptions"],
        "wasted_gpu_hours": metrics["wasted_gpu_hours"],
        "drains_needing_human": metrics["drains"]["needing_human"],
        "attainment_all_work_fleet": metrics["attainment_all_work"]["fleet"],
        "wall_s": metrics["sim"]["wall_s"],
    }


def run_point(scenario_path: str, point: SweepPoint, fixed: dict[str, str], text: str | None = None) -> SweepResult:
    """Worker: load the scenario with this point's overrides and simulate it (no event log).
    ``text``: the scenario file's contents, read by the caller (a Dask worker on another
    machine need not see the file; a trace it names must be at the same path there)."""
    from ..sim.engine import run
    from ..sim.errors import InputError
    from ..sim.scenario import load_scenario

    try:
        scenario = load_scenario(scenario_path, {**fixed, **point.settings}, text=text)
    except (InputError, ValueError) as exc:
        return SweepResult(point, error=f"invalid scenario: {exc}")
    try:
        result = run(scenario, point.policy, None)
    except Exception as exc:  # noqa: BLE001 - one broken point must not sink the sweep
        last = traceback.extract_tb(exc.__traceback__)[-1]
        return SweepResult(point, error=f"{type(exc).__name__}: {exc} ({Path(last.filename).name}:{last.lineno})")
    return SweepResult(point, headline(result.metrics))


def run_sweep(scenario_path: str, grid: dict[str, list[str]], policies: list[str], jobs: int | None = None,
              fixed: dict[str, str] | None = None, show_progress: bool = True,
              scheduler: str | None = None) -> list[SweepResult]:
    """Run every point, in ``jobs`` worker processes (default: one per core), or on the Dask
    cluster whose scheduler is at ``scheduler`` (``tcp://HOST:8786``); rows in grid order."""
    points = grid_points(grid, policies)
    fixed = fixed or {}
    if scheduler:
        return _run_on_dask(scheduler, scenario_path, points, fixed, show_progress)
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(points)))
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(points), desc="sweep", unit="point", file=sys.stderr)
    results: dict[int, SweepResult] = {}
    try:
        if jobs == 1:
            for p in points:
                results[p.index] = run_point(scenario_path, p, fixed)
                if bar is not None:
                    bar.update(1)
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = {pool.submit(run_point, scenario_path, p, fixed): p for p in points}
                for fut in as_completed(futures):
                    p = futures[fut]
                    try:
                        results[p.index] = fut.result()
                    except Exception as exc:  # noqa: BLE001 - e.g. a worker killed by the OS
                        results[p.index] = SweepResult(p, error=f"worker failed: {type(exc).__name__}: {exc}")
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return [results[p.index] for p in points]


#: how long ``--scheduler`` waits for the Dask scheduler to answer
DASK_CONNECT_TIMEOUT_S = 30


def _run_on_dask(address: str, scenario_path: str, points: list[SweepPoint], fixed: dict[str, str],
                 show_progress: bool) -> list[SweepResult]:
    """:func:`run_sweep` on a Dask cluster: one task per point (the scenario's text goes with
    each, so workers need only this package installed), results as they come."""
    try:
        from distributed import Client, as_completed as dask_completed
    except ImportError:
        raise ValueError("--scheduler needs Dask's distributed package: pip install 'timeshare[dask]'") from None
    text = Path(scenario_path).read_text()
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(points), desc="sweep (dask)", unit="point", file=sys.stderr)
    results: dict[int, SweepResult] = {}
    try:
        with Client(address, timeout=DASK_CONNECT_TIMEOUT_S) as client:
            futures = {client.submit(run_point, scenario_path, p, fixed, text, pure=False, key=f"sweep-point-{p.index}-"
                                     f"{os.getpid()}"): p for p in points}
            for fut in dask_completed(list(futures)):
                p = futures[fut]
                try:
                    results[p.index] = fut.result()
                except Exception as exc:  # noqa: BLE001 - e.g. a worker lost
                    results[p.index] = SweepResult(p, error=f"worker failed: {type(exc).__name__}: {exc}")
                if bar is not None:
                    bar.update(1)
    except OSError as exc:
        raise ValueError(f"--scheduler {address}: {exc}") from None
    finally:
        if bar is not None:
            bar.close()
    return [results[p.index] for p in points]


def write_csv(path: Path, grid: dict[str, list[str]], results: list[SweepResult]) -> Path:
    """One row per point: policy, the swept values as given, the headline metrics, error."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", *grid, *METRIC_COLUMNS, "error"])
        for r in results:
            values = ["" if r.metrics.get(c) is None else r.metrics[c] for c in METRIC_COLUMNS]
            w.writerow([r.point.policy, *(r.point.settings[k] for k in grid), *values, r.error])
    return Path(path)


#: the columns ``timeshare sweep`` prints (sweep.csv has them all): header, key, format
TABLE_COLUMNS = (("occupancy", "occupancy", "{:.3f}"), ("attain", "attainment_fleet", "{:.3f}"),
                 ("min team", "attainment_min_team", "{:.3f}"), ("p90 wait h", "p90_wait_s", "{:.1f}"),
                 ("preempt", "preemptions", "{:.0f}"), ("wasted GPU-h", "wasted_gpu_hours", "{:.0f}"))


def render_table(grid: dict[str, list[str]], results: list[SweepResult]) -> str:
    """The headline metrics of every point as a fixed-width text table, one line per point."""
    header = ["policy", *grid, *(h for h, _, _ in TABLE_COLUMNS)]
    rows = []
    for r in results:
        cells = [r.point.policy, *(r.point.settings[k] for k in grid)]
        if r.error:
            cells.append(f"error: {r.error.splitlines()[0][:80]}")
        else:
            for _, key, fmt in TABLE_COLUMNS:
                value = r.metrics.get(key)
                if value is None:
                    cells.append("-")
                else:
                    cells.append(fmt.format(value / 3600 if key.endswith("_s") else value))
        rows.append(cells)
    n = len(header)
    widths = [max(len(str(row[i])) for row in [header, *rows] if i < len(row)) for i in range(n)]
    lines = []
    for row in [header, *rows]:
        cells = [str(c).rjust(widths[i]) if i >= 1 + len(grid) else str(c).ljust(widths[i])
                 for i, c in enumerate(row[:n])]
        if len(row) > n:  # an error message spans the metric columns
            cells.append(row[n])
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
