"""One scheduling pass of the budget policy: snapshot -> order -> fit or preempt -> events.

Phases of a pass (each pass is a pure function of the state and ``now_s``):

1. protection: allocated work whose minimum runtime ended becomes preemptible
   (``workload.min_runtime_reached``);
2. drains: on cordoned nodes, work that may end now is preempted; empty nodes are drained;
3. per GPU type, allocated requests in fair-share order (most deserving leaf first, then
   priority, submit time, id): start on free GPUs, else preempt the cheapest eligible victims;
4. per GPU type, unallocated requests (min runtime 0, or a leaf with no budget) in the same
   order, on free GPUs only.

A request may preempt unallocated work at any time, and allocated work past its minimum
runtime whose subtree is less deserving than the requester's, at the level where their paths
part, by more than the hysteresis. Victims: unallocated first, then the least deserving, then
the least progress lost, then id.
"""

from __future__ import annotations

import math

from . import events as ev
from .cluster import Pool
from .fairshare import FairShareView
from .placement import find_victims, lost_gpu_s
from .queue import walk
from .state import SchedulerState, Workload


def may_end_now(w: Workload, now_s: float) -> bool:
    """Budget policy: unallocated work always, allocated work once its minimum runtime is over."""
    return not w.allocated or not w.is_protected(now_s)


def drain_blocked_until_s(w: Workload, now_s: float) -> float:
    """When a drain may end ``w`` at the latest under this policy."""
    return now_s if may_end_now(w, now_s) else w.protected_until_s


class BudgetPolicy:
    name = "budget"

    def schedule(self, state: SchedulerState, now_s: float) -> list[ev.Event]:
        out = state.expire_protection(now_s)
        out += state.drain_events(now_s, may_end_now)
        for gpu_type, pool in state.cluster.pools.items():
            if state.pending_by_pool[gpu_type]:
                out += _schedule_pool(state, pool, now_s)
        return out

    def drain_blocked_until_s(self, w: Workload, now_s: float) -> float:
        return drain_blocked_until_s(w, now_s)


def _fit_limit(pool: Pool) -> int:
    """Largest request that fits on free GPUs right now."""
    whole = pool.whole_free_nodes()
    if whole > 1:
        return whole * pool.gpus_per_node
    return pool.max_free_on_a_node()


def _open_limit(pool: Pool) -> int:
    """Largest request a preemption could possibly make room for (protected work stays)."""
    whole = len(pool.open[pool.gpus_per_node])
    if whole > 1:
        return whole * pool.gpus_per_node
    return pool.max_open_on_a_node()


def _schedule_pool(state: SchedulerState, pool: Pool, now_s: float) -> list[ev.Event]:
    out: list[ev.Event] = []
    gpu_type = pool.gpu_type
    tree = state.tree
    view = FairShareView(tree, state.ledger, gpu_type, pool.total_gpus, now_s)
    ratios = view.ratios
    hysteresis = state.config.preemption_hysteresis
    unprotected = state.unprotected_gpus[gpu_type]
    leaves = view.leaf_order()

    def start(w: Workload, nodes) -> None:
        e = state.started(w, nodes, now_s)
        state.apply(e)
        out.append(e)

    # -- phase 3: allocated requests, may preempt -----------------------------------------
    for leaf in leaves:
        q = state.queues.get((gpu_type, leaf, "a"))
        if q is None or not q.count or tree.nodes[leaf].fraction <= 0:
            continue
        min_gpus = q.min_gpus()
        if min_gpus > _fit_limit(pool) and min_gpus > _open_limit(pool):
            continue  # nothing of this leaf can start, even by preempting
        # victim leaf -> (requester's subtree, victim's subtree) where their paths part
        victims_of: dict[str, tuple[str, str]] = {}
        for other in tree.leaves:
            split = tree.divergence(leaf, other)
            if split is not None and ratios[split[0]] + hysteresis < ratios[split[1]]:
                victims_of[other] = split
        reachable_gpus = (state.unallocated_gpus[gpu_type]
                          + sum(unprotected.get(v, 0) for v in victims_of))
        preempt_fail = math.inf

        def limit() -> float:
            cap = min(preempt_fail - 1, _open_limit(pool), pool.free_gpus + reachable_gpus)
            return max(_fit_limit(pool), cap) + 1

        def may_preempt(v: Workload) -> bool:
            if not v.allocated:
                return True
            return v.leaf in victims_of and not v.is_protected(now_s)

        def cost(v: Workload) -> tuple:
            if not v.allocated:
                return (0, 0.0, lost_gpu_s(v, now_s), v.id)
            return (1, -ratios[victims_of[v.leaf][1]], lost_gpu_s(v, now_s), v.id)

        for key, gpus in walk([q], limit):
            w = state.workloads[key[2]]
            nodes = pool.find_free(gpus)
            if nodes is not None:
                start(w, nodes)
                continue
            plan = find_victims(state, pool, gpus, may_preempt, cost)
            if plan is None:
                preempt_fail = gpus
                continue
            nodes, victims = plan
            for v in victims:
                if not v.allocated:
                    reachable_gpus -= v.gpus
                elif v.leaf in victims_of:
                    reachable_gpus -= v.gpus
                for e in state.preempted(v, now_s, _reason(v, w, victims_of, ratios, hysteresis)):
                    state.apply(e)
                    out.append(e)
            start(w, nodes)

    # -- phase 4: unallocated requests, free GPUs only ------------------------------------
    if pool.free_gpus:
        queues = []
        for leaf in leaves:
            q = state.queues.get((gpu_type, leaf, "u"))
            if q is not None and q.count:
                queues.append(q)
            if tree.nodes[leaf].fraction <= 0:
                qa = state.queues.get((gpu_type, leaf, "a"))
                if qa is not None and qa.count:
                    queues.append(qa)
        # leaves are walked one after another: fair-share order first, then the key
        for q in queues:
            if not pool.free_gpus:
                break
            for key, gpus in walk([q], lambda: _fit_limit(pool) + 1):
                nodes = pool.find_free(gpus)
                if nodes is not None:
                    start(state.workloads[key[2]], nodes)
    return out


def _reason(victim: Workload, by: Workload, victims_of, ratios, hysteresis) -> ev.PreemptionReason:
    if not victim.allocated:
        return ev.PreemptionReason(
            kind="unallocated", by_workload_id=by.id, by_project=by.leaf,
            message=f"{victim.id} ran on unallocated time; {by.id} ({by.leaf}) asked for allocated time",
        )
    mine, theirs = victims_of[victim.leaf]
    level = mine.rsplit("/", 1)[0] if "/" in mine else ""
    return ev.PreemptionReason(
        kind="fair_share", by_workload_id=by.id, by_project=by.leaf, level=level,
        preemptor_subtree=mine, victim_subtree=theirs,
        preemptor_ratio=round(ratios[mine], 6), victim_ratio=round(ratios[theirs], 6), hysteresis=hysteresis,
        message=(f"{victim.id} was past its minimum runtime; {mine} had used {ratios[mine]:.2f} of its share "
                 f"and {theirs} {ratios[theirs]:.2f} (more than {hysteresis:.2f} apart), so {by.id} went first"),
    )
