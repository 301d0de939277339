"""`make bench`: how fast the simulator and one scheduling pass are. Prints, never asserts.

1. the built-in 30-day, 1024-GPU scenario under the budget policy (target <= 10 s wall);
   the baseline in the same process for comparison of the headline metrics;
2. the contended Philly scenario (target <= 5 s) when ../shared/data is present;
3. one full scheduling pass with 10,000 pending workloads on 1,024 GPUs (target <= 20 ms).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from timeshare.cluster import Cluster, PoolSpec
from timeshare.config import PolicyConfig
from timeshare.scheduler import BudgetPolicy
from timeshare.sim.engine import run
from timeshare.sim.scenario import load_scenario
from timeshare.state import SchedulerState
from timeshare.tree import AllocationTree
from timeshare.workload import WorkloadSpec

ROOT = Path(__file__).resolve().parent.parent
PHILLY = ROOT.parent / "shared" / "data" / "philly-seed0-contended" / "scenario.toml"


def line(label: str, value: str, target: str = "") -> None:
    print(f"  {label:44s} {value:>18s}   {target}")


def bench_scenario(path: Path, policies: list[str], target_s: float, overrides=None) -> dict:
    scenario = load_scenario(path, overrides)
    print(f"\n{scenario.name}: {len(scenario.workloads)} workloads, "
          f"{sum(p.nodes * p.gpus_per_node for p in scenario.pools)} GPUs, {scenario.duration_s / 86400:.0f} days")
    out = {}
    for policy in policies:
        result = run(scenario, policy)
        m = result.metrics
        out[policy] = m
        sim = m["sim"]
        line(f"[{policy}] wall time", f"{sim['wall_s']:.2f} s",
             f"target <= {target_s:.0f} s ({sim['wall_s'] / target_s:.2f}x of target)" if policy == "budget" else "")
        line(f"[{policy}] simulated days per wall second", f"{sim['simulated_s'] / 86400 / sim['wall_s']:.2f}",
             "(published peers: 1-2.5 days/s)")
        line(f"[{policy}] events per second", f"{sim['events_per_wall_s']:.0f}", f"({sim['events']} events)")
    if "budget" in out and "baseline" in out:
        b, o = out["budget"], out["baseline"]

        def p90(m, kind):
            return m["queue_wait_s"]["by_kind"].get(kind, {}).get("p90")

        print("  headline (budget vs baseline):")
        line("occupancy", f"{b['occupancy']:.3f} / {o['occupancy']:.3f}", "target >= 0.97 both")
        line("unallocated share", f"{b['unallocated_share']:.3f} / {o['unallocated_share']:.3f}", "(Ai2: 0.18)")
        line("attainment fleet", f"{b['attainment']['fleet']:.3f} / {o['attainment']['fleet']:.3f}", "target >= 0.98")
        line("attainment worst team", f"{b['attainment']['min_team']:.3f} / {o['attainment']['min_team']:.3f}",
             "target >= 0.95")
        line("teams >= 95%", f"{b['attainment']['teams_at_or_above_95']} / {o['attainment']['teams_at_or_above_95']}",
             f"of {b['attainment']['teams']}")
        bf, of = b["attainment_funded"], o["attainment_funded"]
        line("funded attainment fleet", f"{bf['fleet']:.3f} / {of['fleet']:.3f}", "(funded work only)")
        line("funded attainment worst team", f"{bf['min_team']:.3f} / {of['min_team']:.3f}",
             f"({bf['teams_at_or_above_95']} / {of['teams_at_or_above_95']} teams >= 95%)")
        if p90(b, "debug") is not None:
            ratio = p90(b, "debug") / p90(o, "debug") if p90(o, "debug") else float("nan")
            line("debug p90 wait (s)", f"{p90(b, 'debug'):.0f} / {p90(o, 'debug'):.0f}",
                 f"target <= 300 s and <= 1/10 of baseline (ratio {ratio:.3f})")
        line("drains needing a human", f"{b['drains']['needing_human']} / {o['drains']['needing_human']}",
             f"of {b['drains']['total']} drains")
        line("preemptions", f"{b['preemptions']} / {o['preemptions']}")
        line("wasted GPU-hours", f"{b['wasted_gpu_hours']:.0f} / {o['wasted_gpu_hours']:.0f}")
    return out


def pass_state(pending: int, seed: int = 1) -> SchedulerState:
    """1,024 GPUs full of running work (some protected), ``pending`` workloads waiting."""
    rng = random.Random(seed)
    shares = {"p": 1}
    for i in range(3):
        shares[f"p/g{i}"] = 1 + i
        for j in range(5):
            shares[f"p/g{i}/t{j}"] = 1 + (i + j) % 3
    tree = AllocationTree.from_shares(shares)
    config = PolicyConfig()
    state = SchedulerState(tree, Cluster([PoolSpec("H100", 128, 8, 16)]), config)
    policy = BudgetPolicy()
    leaves = tree.leaves
    n = 0
    # history and running work: fill the cluster over a simulated day
    for t in range(0, 86400, 600):
        for _ in range(20):
            gpus = rng.choice([1, 2, 4, 8, 8, 16, 32])
            spec = WorkloadSpec(id=f"r{n}", submit_s=t, project=rng.choice(leaves), gpu_type="H100", gpus=gpus,
                                work_s=rng.randint(3600, 86400 * 3), min_runtime_s=rng.choice([0, 1800, 3600, 14400]),
                                resumable=True, checkpoint_interval_s=1800)
            n += 1
            state.apply(state.submitted(spec, t))
        policy.schedule(state, t)
    now = 86400
    for i in range(pending):
        gpus = rng.choice([1, 2, 4, 8, 8, 16, 32, 64])
        spec = WorkloadSpec(id=f"q{i}", submit_s=now, project=rng.choice(leaves), gpu_type="H100", gpus=gpus,
                            work_s=rng.randint(600, 86400), min_runtime_s=rng.choice([0, 600, 3600, 14400]),
                            resumable=True, priority=rng.choice(["normal", "high"]))
        state.apply(state.submitted(spec, now))
    return state


def bench_pass(pending: int, repeats: int) -> None:
    print(f"\none full scheduling pass, {pending} pending on 1,024 GPUs:")
    times = []
    for r in range(repeats):
        state = pass_state(pending, seed=r + 1)
        waiting = state.pending_count
        t0 = time.perf_counter()
        events = BudgetPolicy().schedule(state, 86400 + 60)
        times.append(time.perf_counter() - t0)
        if r == 0:
            line("pending before / events of the pass", f"{waiting} / {len(events)}")
    line("pass time median (min..max)", f"{1000 * statistics.median(times):.1f} ms",
         f"({1000 * min(times):.1f}..{1000 * max(times):.1f} ms over {repeats}); target <= 20 ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 simulated days instead of 30")
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args()
    overrides = {"duration": "3d"} if args.quick else None
    policies = ["budget"] if args.no_baseline else ["budget", "baseline"]
    bench_scenario(ROOT / "examples" / "ai2-like" / "scenario.toml", policies, 10.0, overrides)
    if PHILLY.exists():
        bench_scenario(PHILLY, ["budget"], 5.0)
    else:
        print(f"\n(skipping the contended Philly scenario: {PHILLY} not found)")
    bench_pass(10_000, 5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
