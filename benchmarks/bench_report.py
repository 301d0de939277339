"""How much report.html adds to a simulation: CPU of the run, then of the report, both ways.

    PYTHONPATH=shared .venv/bin/python benchmarks/bench_report.py [--set duration=3d]

Default: the built-in 30-day ai2-like scenario (1024 GPUs) under budget, baseline and fifo.
``timeshare simulate`` and ``timeshare report`` draw report.html the same way (after the
summary, from the events.jsonl files); it is drawn twice here and the cheaper is reported (the
machine is shared). CPU seconds, and in loops: the CPU of a 10M-iteration Python loop in this
process (this machine's speed right now). Target: the report costs at most 1.5 s of CPU (printed,
never asserted: a shared machine's CPU moves by tens of percent).
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

TARGET_REPORT_CPU_S = 1.5


def loop_cpu_s() -> float:
    """CPU seconds of a 10M-iteration pure Python loop: this machine's speed right now."""
    t0 = time.process_time()
    x = 0
    for i in range(10_000_000):
        x += i
    return time.process_time() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", nargs="?", default=str(ROOT / "examples/ai2-like/scenario.toml"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="scenario override")
    p.add_argument("--policies", default="budget,baseline,fifo")
    p.add_argument("--out", default=None, help="keep the outputs here (default: a temporary directory)")
    args = p.parse_args(argv)
    policies = [x for x in args.policies.split(",") if x]
    overrides = parse_overrides(args.set)
    scenario = load_scenario(args.scenario, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        t0 = time.process_time()
        metrics = simulate(args.scenario, policies, out, overrides, show_progress=True, report=False,
                           scenario=scenario)
        sim_s = time.process_time() - t0
        loops, draws = [loop_cpu_s()], []
        for _ in range(2):
            t0 = time.process_time()
            report = write_report(out, scenario, metrics)
            draws.append(time.process_time() - t0)
            loops.append(loop_cpu_s())
        size_mb = report.stat().st_size / 1e6
    loop = min(loops)
    report_s = min(draws)
    events = sum(m["sim"]["events"] for m in metrics.values())
    print(f"scenario {scenario.name}: {scenario.duration_s / 86400:g} days, "
          f"{sum(pl.nodes * pl.gpus_per_node for pl in scenario.pools)} GPUs, {len(scenario.workloads)} workloads, "
          f"policies {', '.join(policies)} ({events} events); 10M loop {loop:.3f} s CPU")
    print(f"simulation (with events.jsonl): {sim_s:7.2f} s CPU  {sim_s / loop:6.1f} loops")
    print(f"report.html:                    {report_s:7.2f} s CPU  {report_s / loop:6.1f} loops  "
          f"({size_mb:.1f} MB; drawn twice: {', '.join(f'{d:.2f}' for d in draws)} s)")
    print(f"report / simulation:            {report_s / sim_s:7.2f}")
    ok = report_s <= TARGET_REPORT_CPU_S
    print(f"target: the report costs <= {TARGET_REPORT_CPU_S} s of CPU: {'met' if ok else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
