"""The owed / delivered / attainment report, with the simulator's definitions (sim/metrics.py).

owed(team, hour) = min(fraction x pool GPUs x 1 h, GPU-h the team asked for in that hour);
attainment = sum of min(delivered, owed) / sum of owed — over the hours of [from_s, to_s).
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
    first_h = -math.inf if from_s is None else from_s / HOUR_S
    teams = {}
    owed_total = got_total = 0.0
    for leaf in tree.leaves:
        fraction = tree.nodes[leaf].fraction
        owed_h = delivered_h = got_h = 0.0
        for pool, gpus in pool_gpus.items():
            entitled = fraction * gpus * HOUR_S
            d_bins = collector.delivered.bins.get((leaf, pool), {})
            for h, asked in collector.demand.bins.get((leaf, pool), {}).items():
                if h + 1 <= first_h:
                    continue
                owed = min(entitled, asked)
                owed_h += owed
                got_h += min(d_bins.get(h, 0.0), owed)
            delivered_h += sum(v for h, v in d_bins.items() if h + 1 > first_h)
        owed_total += owed_h
        got_total += got_h
        teams[leaf] = {"fraction": round(fraction, 6), "owed_gpu_hours": round(owed_h / HOUR_S, 4),
                       "delivered_gpu_hours": round(delivered_h / HOUR_S, 4),
                       "attainment": round(got_h / owed_h, 6) if owed_h else None}
    rated = [t["attainment"] for t in teams.values() if t["attainment"] is not None]
    return {
        "from_s": from_s, "to_s": to_s, "teams": teams,
        "attainment": {"fleet": round(got_total / owed_total, 6) if owed_total else None,
                       "min_team": min(rated) if rated else None,
                       "teams_at_or_above_95": sum(1 for a in rated if a >= 0.95), "teams": len(rated)},
        "occupancy": metrics["occupancy"], "unallocated_share": metrics["unallocated_share"],
        "preemptions": metrics["preemptions"], "preemptions_by_reason": metrics["preemptions_by_reason"],
        "queue_wait_s": metrics["queue_wait_s"]["overall"],
    }
