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
from typing import Callable

from . import events as ev
from .cluster import Node, Pool
from .placement import find_victims, preemption_cost_gpu_s, takeable_nodes
from .queue import LeafQueue, walk
from .state import SchedulerState, Workload
from .units import Seconds
from .workload import PRIORITY_RANK


def may_end_now(w: Workload, now_s: Seconds) -> bool:
    return not w.non_preemptible


class BaselinePolicy:
    """``reference``: every cache off (the same decisions, slower: tests/sim/test_reference.py)."""

    name = "baseline"

    def __init__(self, reference: bool = False):
        self.cached = not reference

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
        queues = self._queues(state, gpu_type)
        # the cached mode's groups at the start of the pass (_queues), taken when the pass first
        # preempts: only a preemption adds work during a pass (its requeued victims), so until
        # then every group is one the pass started with (starts only take work out)
        at_start: dict[tuple[str, str, int], list[tuple]] | None = None
        # smallest request that failed to preempt, per priority rank (lower ranks have fewer victims)
        fail_at: dict[int, int | float] = {rank: math.inf for rank in PRIORITY_RANK.values()}
        if self.cached:
            self._failed_before(state, pool, fail_at)
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
            if at_start is not None and at_start.get((w.leaf, w.queue_class, gpus)) is not \
                    state.queues[(gpu_type, w.leaf, w.queue_class)].by_size.get(gpus):
                continue  # added during the walk to a group the pass did not start with
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

                plan = self._victims(state, pool, gpus, rank, may_preempt, cost)
                if plan is None:
                    for r in fail_at:
                        if r <= rank:
                            fail_at[r] = min(fail_at[r], gpus)
                    continue
                nodes, victims = plan
                if not state.storage_admits(victims):
                    continue  # rule "storage": a later pass
                if self.cached and at_start is None:
                    at_start = self._groups(state, gpu_type)
                reasons = [ev.PreemptionReason(
                    kind="priority", by_workload_id=w.id, by_project=w.leaf, node=nodes[0].name,
                    message=f"{w.id} ({w.spec.priority}) outranks preemptible {v.id} ({v.spec.priority})")
                    for v in victims]
                events, waiting = state.take(w, nodes, victims, reasons, now_s)
                out += events
                if waiting:
                    continue
            e = self._started(state, w, nodes, now_s)
            state.apply(e)
            out.append(e)
            if not e.non_preemptible:
                preemptible_running[0] = True
        return out

    def _queues(self, state: SchedulerState, gpu_type: str) -> list[LeafQueue]:
        """The queues one walk of the pool merges in the global order (keys are unique); what
        to skip of them: :meth:`_groups`.

        The rule, as the reference mode walks it: every leaf's and class's queue, each size of
        each a group, the groups being those there when the pass starts; so work added during
        the pass (a requeued victim) waits for the next pass unless its group was there (and
        the walk has not gone past it). Walking these queues costs a step per group per item
        (a hundred groups on the built-in cluster), so the cached mode walks one queue per pool
        (kept by the state once asked for) and skips what lies in a group, a list of keys, that
        was not there at the start: (leaf, class, size) -> that list, as it was."""
        if not self.cached:
            return [q for (t, _, _), q in sorted(state.queues.items()) if t == gpu_type and q.count]
        if state.pool_queues is None:
            state.pool_queues = {}
            for (t, _, _), q in state.queues.items():
                merged = state.pool_queues.get(t)
                if merged is None:
                    merged = state.pool_queues[t] = LeafQueue()
                for g, keys in q.by_size.items():
                    for key in keys:
                        merged.add(g, key)
        pool_queue = state.pool_queues.get(gpu_type)
        return [pool_queue] if pool_queue is not None and pool_queue.count else []

    @staticmethod
    def _groups(state: SchedulerState, gpu_type: str) -> dict[tuple[str, str, int], list[tuple]]:
        """(leaf, class, size) -> its group, the list of keys, as it is now."""
        at_start: dict[tuple[str, str, int], list[tuple]] = {}
        for (t, leaf, cls), q in state.queues.items():
            if t == gpu_type and q.count:
                for g, keys in q.by_size.items():
                    at_start[(leaf, cls, g)] = keys
        return at_start

    def _victims(self, state: SchedulerState, pool: Pool, gpus: int, rank: int,
                 may_preempt: Callable[[Workload], bool], cost: Callable[[Workload], tuple],
                 ) -> tuple[list[Node], list[Workload]] | None:
        """find_victims, remembering failures across passes: a search of priority rank r for g
        GPUs that found nothing still finds nothing on the nodes unchanged since (their work,
        its priorities and its notices only ever leave fewer victims), for any request of rank
        at most r and at least g GPUs, as long as the storage admits the same checkpoints. So
        only nodes changed since are searched (a gang, which may combine them with unchanged
        nodes, only when nothing changed at all is skipped)."""
        if not self.cached:
            return find_victims(state, pool, gpus, may_preempt, cost)
        memo = state.caches.priority_failed
        gpu_type = pool.gpu_type
        storage = state.storage_key()
        failed_seq = -1
        for (t, r, g), (seq, key) in memo.items():
            if t == gpu_type and r >= rank and g <= gpus and key == storage and seq > failed_seq:
                failed_seq = seq
        if failed_seq < 0:
            plan = find_victims(state, pool, gpus, may_preempt, cost)
        elif failed_seq == pool.change_seq:
            plan = None
        elif gpus > pool.gpus_per_node:
            plan = find_victims(state, pool, gpus, may_preempt, cost) if self._gang_may_fit(
                state, pool, gpus, rank, may_preempt, storage) else None
        else:
            changed = pool.open_changed_since(failed_seq, gpus)
            plan = find_victims(state, pool, gpus, may_preempt, cost, only=changed) if changed else None
        if plan is None:
            memo[(gpu_type, rank, gpus)] = (pool.change_seq, storage)
        return plan

    @staticmethod
    def _failed_before(state: SchedulerState, pool: Pool, fail_at: dict[int, int | float]) -> None:
        """Start the pass's ``fail_at`` from the searches :meth:`_victims` remembers as failed on
        the pool as it is now (nothing changed since, the same checkpoints admitted): a request
        they cover would be searched on no node and fail, so the walk need not yield it.

        The same decisions: such a failure holds for the rest of the pass as well, as a failure
        within the pass does (the rule ``fail_at`` keeps): a pass's starts and preemptions only
        take free GPUs and victims away from the lower priorities it walks next. It saves the
        walk a step and a memo scan for each such request in every pass."""
        storage = state.storage_key()
        now_seq = pool.change_seq
        gpu_type = pool.gpu_type
        for (t, r, g), (seq, key) in state.caches.priority_failed.items():
            if seq == now_seq and t == gpu_type and key == storage:
                for rank in fail_at:
                    if rank <= r and g < fail_at[rank]:
                        fail_at[rank] = g

    @staticmethod
    def _gang_may_fit(state: SchedulerState, pool: Pool, gpus: int, rank: int,
                      may_preempt: Callable[[Workload], bool], storage: int | None) -> bool:
        """Whether enough whole nodes could be emptied for a gang of priority rank ``rank`` (the
        set of such nodes kept per rank: placement.takeable_nodes)."""
        key = (pool.gpu_type, rank)
        memo = state.caches.priority_gang_nodes.get(key)
        since = (memo[0], memo[2]) if memo is not None and memo[1] == storage else None
        takeable = takeable_nodes(pool, since, may_preempt, state.workloads)
        state.caches.priority_gang_nodes[key] = (pool.change_seq, storage, takeable)
        return len(takeable) * pool.gpus_per_node >= gpus
