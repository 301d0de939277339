"""`make bench`: how fast the simulator and one scheduling pass are, in pure Python and with the
compiled core (benchmarks/compiled.py). Prints timings, never asserts them; exits non-zero only
when the compiled build's events or metrics differ from pure Python's (a bug, not a slow machine).

1. the built-in 30-day, 1024-GPU scenario under the budget policy (target <= 10 s wall);
   the baseline for comparison of the headline metrics;
2. the contended Philly scenario (target <= 5 s) when ../shared/data is present;
3. one full scheduling pass with 10,000 pending workloads on 1,024 GPUs (target <= 20 ms), just
   after four running workloads ended, so that it starts and preempts (five random clusters).

Every measured run is a fresh Python process, pure and compiled alternating, so both see the
same machine; a 10M-iteration Python loop is timed alongside as a reference of the machine's
speed (shared machines vary by tens of percent from one minute to the next).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import compiled  # benchmarks/compiled.py, next to this script

ROOT = Path(__file__).resolve().parent.parent

AI2_LIKE = ROOT / "examples" / "ai2-like" / "scenario.toml"
PHILLY = ROOT.parent / "shared" / "data" / "philly-seed0-contended" / "scenario.toml"


def line(label: str, value: str, target: str = "") -> None:
    print(f"  {label:44s} {value:>20s}   {target}")


def loop_reference_s() -> float:
    """Wall seconds of a 10M-iteration pure Python loop: this machine's speed right now."""
    t0 = time.perf_counter()
    x = 0
    for i in range(10_000_000):
        x += i
    return time.perf_counter() - t0


# -- workers: one measurement in a fresh process (``--worker JSON``), result as JSON --------------

def work_scenario(path: str, policy: str, overrides: dict | None) -> dict:
    import msgspec

    from timeshare.sim.engine import run
    from timeshare.sim.scenario import load_scenario

    scenario = load_scenario(path, overrides)
    events: list = []
    result = run(scenario, policy, on_event=events.append)
    h = hashlib.sha256()
    enc = msgspec.json.Encoder()
    for e in events:
        h.update(enc.encode(e))
        h.update(b"\n")
    return {"metrics": result.metrics, "events": len(events), "sha256": h.hexdigest(), "name": scenario.name,
            "workloads": len(scenario.workloads), "gpus": sum(p.nodes * p.gpus_per_node for p in scenario.pools),
            "days": scenario.duration_s / 86400}


def pass_state(pending: int, seed: int = 1):
    """1,024 GPUs full of running work (some protected), ``pending`` workloads waiting."""
    from timeshare.cluster import Cluster, PoolSpec
    from timeshare.config import PolicyConfig
    from timeshare.scheduler import BudgetPolicy
    from timeshare.state import RUNNING, SchedulerState
    from timeshare.tree import AllocationTree
    from timeshare.workload import WorkloadSpec

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
    # a few workloads end, as before most passes of a simulation: the measured pass has GPUs to
    # fill and decisions to make (with a full cluster and nothing ending it would only look)
    running = sorted(w.id for w in state.workloads.values() if w.state == RUNNING)
    for wid in rng.sample(running, 4):
        state.apply(state.completed(wid, now))
    return state


def work_pass(pending: int, repeats: int) -> dict:
    import msgspec

    from timeshare.scheduler import BudgetPolicy

    times, waiting, counts, digests = [], [], [], []
    for r in range(repeats):
        state = pass_state(pending, seed=r + 1)
        waiting.append(state.pending_count)
        t0 = time.perf_counter()
        events = BudgetPolicy().schedule(state, 86400 + 60)
        times.append(time.perf_counter() - t0)
        counts.append(len(events))
        digests.append(hashlib.sha256(msgspec.json.encode(events)).hexdigest())
    return {"times": times, "waiting": waiting, "events": counts, "sha256": "".join(digests)}


def worker(spec: dict) -> dict:
    import timeshare.scheduler

    out = work_scenario(spec["path"], spec["policy"], spec.get("overrides")) if spec["kind"] == "scenario" \
        else work_pass(spec["pending"], spec["repeats"])
    out["scheduler"] = timeshare.scheduler.__file__
    return out


def measure(build: Path | None, spec: dict) -> dict:
    """One measurement in a fresh process importing the compiled build (None: pure Python)."""
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], env=compiled.env(build),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark worker failed ({'compiled' if build else 'pure'}, {spec}):\n"
                           f"{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    is_compiled = out["scheduler"].endswith((".so", ".pyd"))
    if is_compiled != (build is not None):
        raise RuntimeError(f"expected {'compiled' if build else 'pure'} modules, imported {out['scheduler']}")
    return out


# -- the report -----------------------------------------------------------------------------------

def _comparable(metrics: dict) -> str:
    """A run's metrics as JSON, less what measures the machine (the metrics are compiled too)."""
    sim = {k: v for k, v in metrics["sim"].items() if k not in ("wall_s", "simulated_s_per_wall_s", "events_per_wall_s")}
    return json.dumps({**metrics, "sim": sim}, sort_keys=True)


class Report:
    def __init__(self, build: Path | None, pure: bool):
        self.build = build
        self.pure = pure
        self.mismatches: list[str] = []

    def both(self, spec: dict) -> tuple[dict | None, dict | None]:
        """Pure then compiled (whichever are enabled), each in its own process."""
        p = measure(None, spec) if self.pure else None
        c = measure(self.build, spec) if self.build is not None else None
        if p is not None and c is not None and p["sha256"] != c["sha256"]:
            self.mismatches.append(f"{spec}: pure {p['sha256'][:16]} ({p.get('events')} events) != compiled "
                                   f"{c['sha256'][:16]} ({c.get('events')} events)")
        if p is not None and c is not None and "metrics" in p and _comparable(p["metrics"]) != _comparable(c["metrics"]):
            self.mismatches.append(f"{spec}: the metrics differ between pure Python and the compiled build")
        return p, c

    @staticmethod
    def pair(p: float | None, c: float | None, fmt: str, unit: str) -> str:
        return " / ".join(fmt.format(v) + unit if v is not None else "-" for v in (p, c))

    def scenario(self, path: Path, policies: list[str], target_s: float, overrides: dict | None) -> None:
        results = {}
        for policy in policies:
            p, c = self.both({"kind": "scenario", "path": str(path), "policy": policy, "overrides": overrides})
            results[policy] = (p, c)
            first = p or c
            assert first is not None
            if policy == policies[0]:
                print(f"\n{first['name']}: {first['workloads']} workloads, {first['gpus']} GPUs, "
                      f"{first['days']:.0f} days (pure / compiled)")
            wp, wc = ((r["metrics"]["sim"]["wall_s"] if r else None) for r in (p, c))
            ratio = " / ".join(f"{w / target_s:.2f}x" for w in (wp, wc) if w is not None)
            speedup = f"; compiled {wp / wc:.2f}x faster" if wp and wc else ""
            line(f"[{policy}] wall time", self.pair(wp, wc, "{:.2f}", " s"),
                 f"target <= {target_s:.0f} s ({ratio} of target){speedup}")
            sim_s = first["metrics"]["sim"]["simulated_s"]
            sim_days = sim_s / 86400
            line(f"[{policy}] simulated seconds per wall second",
                 self.pair(sim_s / wp if wp else None, sim_s / wc if wc else None, "{:,.0f}", ""))
            line(f"[{policy}] simulated days per wall second",
                 self.pair(sim_days / wp if wp else None, sim_days / wc if wc else None, "{:.2f}", ""),
                 "(published peers: 1-2.5 days/s)")
            n_events = first["events"]
            line(f"[{policy}] events per wall second",
                 self.pair(n_events / wp if wp else None, n_events / wc if wc else None, "{:,.0f}", ""))
            same = "" if not (p and c) else ("identical" if p["sha256"] == c["sha256"] else "DIFFERENT")
            line(f"[{policy}] events", f"{first['events']}",
                 f"sha256 {first['sha256'][:16]}" + (f", pure and compiled {same}" if same else ""))
        if "budget" in results and "baseline" in results:
            b, o = ((results[k][0] or results[k][1])["metrics"] for k in ("budget", "baseline"))

            def p90(m: dict, kind: str) -> float | None:
                return m["queue_wait_s"]["by_kind"].get(kind, {}).get("p90")

            print("  headline (budget vs baseline):")
            line("occupancy", f"{b['occupancy']:.3f} / {o['occupancy']:.3f}", "target >= 0.97 both")
            line("unallocated share", f"{b['unallocated_share']:.3f} / {o['unallocated_share']:.3f}", "(Ai2: 0.18)")
            line("attainment (funded) fleet", f"{b['attainment']['fleet']:.3f} / {o['attainment']['fleet']:.3f}",
                 "target >= 0.98")
            line("attainment (funded) worst team",
                 f"{b['attainment']['min_team']:.3f} / {o['attainment']['min_team']:.3f}", "target >= 0.95")
            line("teams >= 95% (funded)",
                 f"{b['attainment']['teams_at_or_above_95']} / {o['attainment']['teams_at_or_above_95']}",
                 f"of {b['attainment']['teams']}")
            ba, oa = b["attainment_all_work"], o["attainment_all_work"]
            line("all-work attainment fleet", f"{ba['fleet']:.3f} / {oa['fleet']:.3f}", "(every workload; no target)")
            line("all-work attainment worst team", f"{ba['min_team']:.3f} / {oa['min_team']:.3f}",
                 f"({ba['teams_at_or_above_95']} / {oa['teams_at_or_above_95']} teams >= 95%)")
            pb, po = p90(b, "debug"), p90(o, "debug")
            if pb is not None and po is not None:
                ratio = pb / po if po else float("nan")
                line("debug p90 wait (s)", f"{pb:.0f} / {po:.0f}",
                     f"target <= 300 s and <= 1/10 of baseline (ratio {ratio:.3f})")
            line("drains needing a human", f"{b['drains']['needing_human']} / {o['drains']['needing_human']}",
                 f"of {b['drains']['total']} drains")
            line("preemptions", f"{b['preemptions']} / {o['preemptions']}")
            line("wasted GPU-hours", f"{b['wasted_gpu_hours']:.0f} / {o['wasted_gpu_hours']:.0f}")

    def one_pass(self, pending: int, repeats: int) -> None:
        print(f"\none full scheduling pass, {pending} pending on 1,024 GPUs (pure / compiled):")
        p, c = self.both({"kind": "pass", "pending": pending, "repeats": repeats})
        first = p or c
        assert first is not None
        # each repeat is another random cluster: passes that preempt and start dozens of
        # workloads take several times longer than those that only look, so each is shown
        for i in range(repeats):
            tp, tc = ((1000 * r["times"][i] if r else None) for r in (p, c))
            line(f"state {i + 1}: {first['waiting'][i]} pending, {first['events'][i]} events",
                 self.pair(tp, tc, "{:.1f}", " ms"))
        med = [1000 * statistics.median(r["times"]) if r else None for r in (p, c)]
        worst = [1000 * max(r["times"]) if r else None for r in (p, c)]
        line("pass time median", self.pair(med[0], med[1], "{:.1f}", " ms"), "target <= 20 ms")
        line("pass time slowest", self.pair(worst[0], worst[1], "{:.1f}", " ms"), "target <= 20 ms")


def reference_mode(days: str) -> None:
    """The budget policy with every cache off (the readable reference of the same rules) against
    the cached policy, both pure Python, on the first days of the built-in month: their times,
    and whether their events are identical (they must be)."""
    overrides = {"duration": days}
    cached = measure(None, {"kind": "scenario", "path": str(AI2_LIKE), "policy": "budget", "overrides": overrides})
    reference = measure(None, {"kind": "scenario", "path": str(AI2_LIKE), "policy": "budget-reference",
                               "overrides": overrides})
    wc, wr = cached["metrics"]["sim"]["wall_s"], reference["metrics"]["sim"]["wall_s"]
    print(f"\nreference mode (every cache off), pure Python, first {days} of the built-in month:")
    line("[budget] cached / reference wall time", f"{wc:.2f} s / {wr:.2f} s", f"caches save {wr / wc:.1f}x")
    same = "identical" if cached["sha256"] == reference["sha256"] else "DIFFERENT (a cache changed a decision)"
    line("[budget] events, cached vs reference", f"{cached['events']}", same)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 simulated days instead of 30")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--no-pure", action="store_true", help="the compiled core only")
    parser.add_argument("--no-compiled", action="store_true", help="pure Python only (no C compiler needed)")
    parser.add_argument("--reference-days", default="1d",
                        help="simulated time of the reference-mode run (every cache off, ~90x slower; default 1d)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    build = None
    if not args.no_compiled:
        if compiled.find_compiler() is None:
            print("(no C compiler found: pure Python only)")
        else:
            t0 = time.perf_counter()
            build = compiled.build()
            took = time.perf_counter() - t0
            print(f"compiled core: {build.relative_to(ROOT)} (mypyc {compiled.mypy_version()}"
                  f"{f', built in {took:.0f} s' if took > 5 else ''})")
    report = Report(build, pure=not args.no_pure)
    print(f"machine reference: 10M-iteration Python loop {loop_reference_s():.2f} s")
    overrides = {"duration": "3d"} if args.quick else None
    policies = ["budget"] if args.no_baseline else ["budget", "baseline"]
    report.scenario(AI2_LIKE, policies, 10.0, overrides)
    if PHILLY.exists():
        report.scenario(PHILLY, ["budget"], 5.0, None)
    else:
        print(f"\n(skipping the contended Philly scenario: {PHILLY} not found)")
    report.one_pass(10_000, 5)
    reference_mode(args.reference_days)
    print(f"\nmachine reference: 10M-iteration Python loop {loop_reference_s():.2f} s")
    if report.mismatches:
        print("\nCOMPILED CORE DIFFERS FROM PURE PYTHON (a bug in the compiled build; see benchmarks/compiled.py):",
              *report.mismatches, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
