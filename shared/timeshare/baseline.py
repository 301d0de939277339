"""The old scheduler, for comparison: global priorities and opt-out of preemption.

* Pending work is ordered globally: priority (urgent first), then submit time, then id.
* A workload with ``min_runtime > 0`` counts as having opted out of preemption, allowed while
  its team's non-preemptible GPUs stay within the team's cap (fraction x pool GPUs). Above
  the cap, and with ``min_runtime = 0``, it runs preemptible on idle GPUs.
* A pending workload may preempt preemptible work of strictly lower priority (victims: lowest
  priority, then least progress lost, then id).
* A drain preempts preemptible work at once and must wait for non-preemptible work to end.
"""

from __future__ import annotations

import math

from . import events as ev
from .cluster import Pool
from .placement import find_victims, preemption_cost_gpu_s
from .queue import walk
from .state import SchedulerState, Workload
from .units import Seconds
from .workload import PRIORITY_RANK


def may_end_now(w: Workload, now_s: Seconds) -> bool:
    return not w.non_preemptible


class BaselinePolicy:
    name = "baseline"

    def schedule(self, state: SchedulerState, now_s: Seconds) -> list[ev.Event]:
        state.pass_now_s = now_s
        out = state.expire_protection(now_s)
        # notices: the old scheduler honours them too when the policy gives them (a fair
        # comparison); a preemptor waiting for its victims starts as it would have at once
        out += state.notice_events(now_s, lambda w, nodes: self._started(state, w, nodes, now_s))
        out += state.drain_events(now_s, may_end_now)
        for gpu_type, pool in state.cluster.pools.items():
            if state.pending_by_pool[gpu_type]:
                out += self._schedule_pool(state, pool, now_s)
        return out

    @staticmethod
    def _started(state: SchedulerState, w: Workload, nodes: list, now_s: Seconds) -> ev.WorkloadStarted:
        """The start of ``w``: opted out of preemption when it declares a minimum runtime and its
        team's non-preemptible GPUs stay within the team's cap."""
        pool = state.cluster.pools[w.gpu_type]
        cap = int(state.tree.nodes[w.leaf].fraction * pool.total_gpus)
        opt_out = w.spec.min_runtime_s > 0 and state.nonpreemptible_gpus[w.gpu_type].get(w.leaf, 0) + w.gpus <= cap
        return state.started(w, nodes, now_s, non_preemptible=opt_out, contract=False)

    def drain_blocked_until_s(self, w: Workload, now_s: Seconds) -> Seconds:
        """Non-preemptible work blocks a drain until it completes."""
        return w.run_start_s + w.remaining_s() if w.non_preemptible else now_s

    def _schedule_pool(self, state: SchedulerState, pool: Pool, now_s: Seconds) -> list[ev.Event]:
        out: list[ev.Event] = []
        gpu_type = pool.gpu_type
        queues = [q for (t, _, _), q in sorted(state.queues.items()) if t == gpu_type and q.count]
        caps = {leaf: int(state.tree.nodes[leaf].fraction * pool.total_gpus) for leaf in state.tree.leaves}
        held = state.nonpreemptible_gpus[gpu_type]
        # smallest request that failed to preempt, per priority rank (lower ranks have fewer victims)
        fail_at: dict[int, int | float] = {rank: math.inf for rank in PRIORITY_RANK.values()}
        preemptible_running = [True]
        current_rank = [max(PRIORITY_RANK.values())]

        def limit() -> float:
            # the walk yields higher priorities first, so what is left has at most the
            # current rank, and no more victims than it had
            fail = fail_at[current_rank[0]] if preemptible_running[0] else 0
            return max(pool.fit_limit(), fail - 1) + 1

        preemptible_running[0] = any(not w.non_preemptible for w in state.running.values() if w.gpu_type == gpu_type)
        for key, gpus in walk(queues, limit):
            w = state.workloads[key[2]]
            rank = -key[0]
            current_rank[0] = rank
            nodes = pool.find_free(gpus)
            if nodes is None:
                if gpus >= fail_at[rank] or not preemptible_running[0]:
                    continue
                if rank == 0:  # nothing ranks below the lowest priority: no victims
                    fail_at[0] = min(fail_at[0], gpus)
                    continue

                def may_preempt(v: Workload, rank: int = rank) -> bool:
                    return not v.non_preemptible and PRIORITY_RANK[v.spec.priority] < rank and state.may_take(v)

                def cost(v: Workload, w: Workload = w) -> tuple:
                    return (PRIORITY_RANK[v.spec.priority], preemption_cost_gpu_s(state, v, now_s, w.gpus), v.id)

                plan = find_victims(state, pool, gpus, may_preempt, cost)
                if plan is None:
                    for r in fail_at:
                        if r <= rank:
                            fail_at[r] = min(fail_at[r], gpus)
                    continue
                nodes, victims = plan
                if not state.storage_admits(victims):
                    continue  # rule "storage": a later pass
                reasons = [ev.PreemptionReason(
                    kind="priority", by_workload_id=w.id, by_project=w.leaf, node=nodes[0].name,
                    message=f"{w.id} ({w.spec.priority}) outranks preemptible {v.id} ({v.spec.priority})")
                    for v in victims]
                events, waiting = state.take(w, nodes, victims, reasons, now_s)
                out += events
                if waiting:
                    continue
            opt_out = w.spec.min_runtime_s > 0 and held.get(w.leaf, 0) + gpus <= caps.get(w.leaf, 0)
            e = state.started(w, nodes, now_s, non_preemptible=opt_out, contract=False)
            state.apply(e)
            out.append(e)
            if not opt_out:
                preemptible_running[0] = True
        return out
