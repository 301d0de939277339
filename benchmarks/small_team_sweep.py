"""A small team's debug work under saturated training, at tree depths 1-4, on 4- and 8-GPU nodes,
with one or two GPU types: 16 nodes per type; three training teams (share 30 each) keep long
gangs of one or two nodes queued (minimum runtime 1-8 h, resumable); a team of share 10 submits a
1- to 8-GPU debug job (15 min minimum runtime) every 10-60 minutes for four days.

Prints, per shape, the debug waits and the small team's funded attainment; asserts nothing.
    .venv/bin/python benchmarks/small_team_sweep.py
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.builders import ScenarioBuilder, simulate  # noqa: E402

HOUR_S = 3600


def build(depth: int, gpus_per_node: int, gpu_types: list[str], seed: int, nodes: int = 16, days: int = 4):
    rnd = random.Random(seed)
    builder = ScenarioBuilder(duration=f"{days}d").policy(lookback_window_s="7d")
    for gpu_type in gpu_types:
        builder.pool(gpu_type, nodes, gpus_per_node)
    parents = ["/".join(f"l{i}" for i in range(k + 1)) for k in range(depth - 1)]
    for parent in parents:
        builder.team(parent, 1)
    prefix = parents[-1] + "/" if parents else ""
    teams = {f"{prefix}big{i}": 30 for i in range(3)} | {f"{prefix}small": 10}
    for path, share in teams.items():
        builder.team(path, share)
    n = 0
    for gpu_type in gpu_types:
        for team in teams:
            if team.endswith("small"):
                continue
            for _ in range(nodes):
                builder.workload(f"w{n}", team, gpu_type=gpu_type, gpus=gpus_per_node * rnd.choice([1, 1, 2]),
                                 work=f"{rnd.randint(20, 200)}h", min_runtime=f"{rnd.randint(1, 8)}h", resumable=True,
                                 checkpoint="30m", submit=rnd.randint(0, HOUR_S), kind="training")
                n += 1
    at_s = 6 * HOUR_S
    while at_s < days * 86400 - HOUR_S:
        builder.workload(f"w{n}", f"{prefix}small", gpu_type=rnd.choice(gpu_types),
                         gpus=rnd.choice([1, 1, 2, 4, gpus_per_node]), work=rnd.randint(120, 900), min_runtime="15m",
                         submit=at_s, kind="debug")
        n += 1
        at_s += rnd.randint(600, 3600)
    return builder.build()


def main() -> None:
    for depth in (1, 2, 3, 4):
        for gpus_per_node in (4, 8):
            for gpu_types in (["H100"], ["H100", "A100"]):
                metrics = simulate(build(depth, gpus_per_node, gpu_types, seed=depth * 10 + gpus_per_node)).metrics
                debug = metrics["queue_wait_s"]["by_kind"]["debug"]
                small = next(v for k, v in metrics["teams"].items() if k.endswith("small"))
                print(f"depth {depth}, {gpus_per_node}-GPU nodes, {len(gpu_types)} GPU type(s): debug "
                      f"n={debug['count']} p50={debug['p50']:.0f} s p90={debug['p90']:.0f} s; small team's funded "
                      f"attainment {small['attainment']:.1%}; preemptions {metrics['preemptions']}")


if __name__ == "__main__":
    main()
