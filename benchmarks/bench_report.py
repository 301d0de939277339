"""How much report.html adds to a simulation: time the run, then the rendering, separately.

    PYTHONPATH=shared .venv/bin/python benchmarks/bench_report.py [--set duration=3d]

Default: the built-in 30-day ai2-like scenario (1024 GPUs) under budget and baseline. Target:
rendering adds at most 10 s. Exit status 1 when it does not.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "shared"))

from timeshare.report.html import write_report  # noqa: E402
from timeshare.sim.cli import parse_overrides, simulate  # noqa: E402
from timeshare.sim.scenario import load_scenario  # noqa: E402

TARGET_RENDER_S = 10.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", nargs="?", default=str(ROOT / "examples/ai2-like/scenario.toml"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="scenario override")
    p.add_argument("--policies", default="budget,baseline")
    p.add_argument("--out", default=None, help="keep the outputs here (default: a temporary directory)")
    args = p.parse_args(argv)
    policies = [x for x in args.policies.split(",") if x]
    overrides = parse_overrides(args.set)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        t0 = time.perf_counter()
        metrics = simulate(args.scenario, policies, out, overrides, show_progress=True, report=False)
        sim_s = time.perf_counter() - t0
        scenario = load_scenario(args.scenario, overrides)  # cheap next to the run; not timed
        t0 = time.perf_counter()
        report = write_report(out, scenario, metrics)
        render_s = time.perf_counter() - t0
        size_mb = report.stat().st_size / 1e6
    events = sum(m["sim"]["events"] for m in metrics.values())
    print(f"scenario {scenario.name}: {scenario.duration_s / 86400:g} days, "
          f"{sum(pl.nodes * pl.gpus_per_node for pl in scenario.pools)} GPUs, {len(scenario.workloads)} workloads, "
          f"policies {', '.join(policies)} ({events} events)")
    print(f"simulation (with events.jsonl): {sim_s:7.2f} s")
    print(f"report rendering:               {render_s:7.2f} s  ({size_mb:.1f} MB report.html)")
    print(f"rendering / simulation:         {render_s / sim_s:7.2f}")
    ok = render_s <= TARGET_RENDER_S
    print(f"target: rendering adds <= {TARGET_RENDER_S:.0f} s: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
