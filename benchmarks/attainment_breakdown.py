"""Where a policy falls short of all-work attainment (every workload counted as owed; metrics.json
``attainment_all_work``, shown but never a target: the target is ``attainment``, funded work
only): per team, the GPU-hours it was owed but not delivered, split by what the team had waiting
in those hours (funded work, or only unallocated work), and how often it ran above its share.
Prints, never asserts.

    python benchmarks/attainment_breakdown.py [SCENARIO] [--set unallocated_preemption=fair ...]

docs/records/2026-11-measurements.md, "What closing the all-work gap costs", quotes this script's output.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from timeshare import events as ev
from timeshare.sim.engine import run
from timeshare.sim.metrics import HOUR_S, _Rates
from timeshare.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", nargs="?", default=str(ROOT / "examples" / "ai2-like" / "scenario.toml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="policy setting, e.g. unallocated_preemption=fair (repeatable)")
    parser.add_argument("--policy", default="budget")
    args = parser.parse_args()
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[f"policy.{key}"] = value
    scenario = load_scenario(args.scenario, overrides)
    tree = scenario.tree()
    rates = _Rates()  # (leaf, funded, "run" | "wait") -> GPUs
    specs: dict = {}
    running: set[str] = set()

    def funded(spec) -> bool:
        return spec.min_runtime_s > 0 and tree.nodes[spec.project].fraction > 0

    def observe(e: ev.Event) -> None:
        t = e.at_ms / 1000
        if isinstance(e, ev.WorkloadSubmitted):
            s = specs[e.workload.id] = e.workload
            rates.change((s.project, funded(s), "wait"), t, s.gpus)
        elif isinstance(e, ev.WorkloadStarted):
            s = specs[e.workload_id]
            running.add(s.id)
            rates.change((s.project, funded(s), "wait"), t, -s.gpus)
            rates.change((s.project, funded(s), "run"), t, s.gpus)
        elif isinstance(e, (ev.WorkloadPreempted, ev.WorkloadCompleted, ev.WorkloadFailed, ev.WorkloadCancelled)):
            s = specs[e.workload_id]
            if s.id in running:
                running.discard(s.id)
                rates.change((s.project, funded(s), "run"), t, -s.gpus)
                if isinstance(e, ev.WorkloadPreempted) and e.resumable:
                    rates.change((s.project, funded(s), "wait"), t, s.gpus)
            elif not isinstance(e, ev.WorkloadCompleted):
                rates.change((s.project, funded(s), "wait"), t, -s.gpus)

    result = run(scenario, args.policy, on_event=observe)
    rates.close(result.end_s)
    m = result.metrics
    a, f = m["attainment_all_work"], m["attainment"]
    print(f"{scenario.name} [{args.policy}] {' '.join(args.set)}: all-work attainment {_pct(a['fleet'])} / worst "
          f"{_pct(a['min_team'])}; funded (the target) {_pct(f['fleet'])} / {_pct(f['min_team'])}")
    hours = int(result.end_s // HOUR_S) + 1
    print(f"{'team':24s} {'share':>6s} {'all-work':>8s} {'short GPU-h':>11s} {'funded waiting':>15s} "
          f"{'only unalloc':>13s} {'hours >105%':>12s}")
    total_short = total_unalloc_only = 0.0
    for pool in scenario.pools:
        capacity = pool.nodes * pool.gpus_per_node
        for leaf in tree.leaves:
            fraction = tree.nodes[leaf].fraction
            entitled = fraction * capacity * HOUR_S

            def bins(funded_: bool, what: str) -> dict:
                return rates.bins.get((leaf, funded_, what), {})

            f_run, u_run, f_wait, u_wait = bins(True, "run"), bins(False, "run"), bins(True, "wait"), bins(False, "wait")
            short = unalloc_only = 0.0
            over = 0
            for h in range(hours):
                delivered = f_run.get(h, 0.0) + u_run.get(h, 0.0)
                owed = min(entitled, delivered + f_wait.get(h, 0.0) + u_wait.get(h, 0.0))
                if delivered > 1.05 * entitled:
                    over += 1
                missing = owed - delivered
                if missing > 0:
                    short += missing
                    if f_wait.get(h, 0.0) <= 0:
                        unalloc_only += missing
            total_short += short
            total_unalloc_only += unalloc_only
            all_work = _pct(m["teams"][leaf]["attainment_all_work"])
            print(f"{leaf:24s} {fraction:6.3f} {all_work:>8s} {short / HOUR_S:11.0f} "
                  f"{(short - unalloc_only) / HOUR_S:15.0f} {unalloc_only / HOUR_S:13.0f} {over:12d}")
    if total_short:
        print(f"short GPU-hours in all: {total_short / HOUR_S:.0f}, of which {total_unalloc_only / total_short:.0%} in "
              f"hours when the team had only unallocated work waiting")


if __name__ == "__main__":
    main()
