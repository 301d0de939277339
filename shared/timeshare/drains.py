"""Whether draining a node needs a human: the one rule the simulator and the live placement
service both apply when a node turns unhealthy."""

from __future__ import annotations

from typing import Callable

from .cluster import Node
from .state import SchedulerState, Workload
from .units import Seconds


def drain_needs_human(state: SchedulerState, node: Node, now_s: Seconds,
                      drain_blocked_until_s: Callable[[Workload, Seconds], Seconds]) -> bool:
    """A drain needs a human when the node cannot be emptied within ``drain_human_after`` (by
    default the cap on minimum runtime) without ending work the policy forbids preempting:
    ``drain_blocked_until_s`` is the policy's answer for each workload (never later than its
    protection under the budget policy's contract, never for the old scheduler's
    non-preemptible work)."""
    cap_s = state.config.drain_human_after_s or state.config.max_min_runtime_s
    blocked_s = max((drain_blocked_until_s(state.workloads[w], now_s) - now_s for w in node.workload_ids()),
                    default=0)
    return blocked_s > cap_s
