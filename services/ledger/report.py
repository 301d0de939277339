"""The owed / delivered / attainment report of the live system: the simulator's definitions,
computed by the same function (``MetricsCollector.attainment_of``).

owed(team, hour) = min(fraction x pool GPUs x 1 h, GPU-h the team's *funded* workloads (minimum
runtime > 0 on a budget) asked for in that hour); attainment = sum of min(delivered, owed) / sum
of owed, over the hours of [from_s, to_s). ``attainment_all_work`` counts every workload as owed
(shown, never a target): unallocated time is free capacity promised to no one. Waste is the
collector's too: ``wasted_gpu_hours`` and its parts ``waste.lost_gpu_hours`` (progress lost to
preemption) and ``waste.checkpoint_gpu_hours`` (GPU time writing checkpoints on notice).
"""

from __future__ import annotations

import math

from timeshare import events as ev
from timeshare.sim.metrics import HOUR_S, MetricsCollector
from timeshare.tree import AllocationTree


def attainment_report(events: list[ev.Event], tree: AllocationTree, pool_gpus: dict[str, int],
                      nodes: dict[str, tuple[str, int]], max_min_runtime_s: int,
                      from_s: float | None, to_s: float) -> dict:
    collector = MetricsCollector(tree, pool_gpus, max_min_runtime_s)
    first_s = events[0].at_ms / 1000 if events else to_s
    collector.start(min(first_s, from_s if from_s is not None else first_s), nodes)
    for e in events:
        if e.at_ms / 1000 > to_s:
            break
        collector.observe(e)
    metrics = collector.finish(to_s, 0.0, to_s)
    since_h = -math.inf if from_s is None else from_s / HOUR_S
    span_s = (collector.start_s, to_s)
    funded_teams, funded = collector.attainment_of(collector.delivered_funded, collector.demand_funded, since_h, span_s)
    all_teams, all_work = collector.attainment_of(collector.delivered, collector.demand, since_h, span_s)
    teams = {}
    for leaf in tree.leaves:
        f, a = funded_teams[leaf], all_teams[leaf]
        teams[leaf] = {"fraction": round(tree.nodes[leaf].fraction, 6), "owed_gpu_hours": f["owed_gpu_hours"],
                       "delivered_gpu_hours": f["delivered_gpu_hours"], "attainment": f["attainment"],
                       "attainment_all_work": a["attainment"]}
    return {
        "from_s": from_s, "to_s": to_s, "teams": teams,
        "attainment": funded, "attainment_all_work": all_work,
        "occupancy": metrics["occupancy"], "unallocated_share": metrics["unallocated_share"],
        "preemptions": metrics["preemptions"], "preemptions_by_reason": metrics["preemptions_by_reason"],
        "queue_wait_s": metrics["queue_wait_s"]["overall"],
        "wasted_gpu_hours": metrics["wasted_gpu_hours"], "waste": metrics["waste"],
    }
