"""Reference policy for cross-checking against other simulators: strict submit order,
head-of-line blocking per GPU type, best-fit placement, no preemption (drains wait for
work to end)."""

from __future__ import annotations

import heapq

from . import events as ev
from .state import PENDING, SchedulerState, Workload
from .units import Seconds


class FifoPolicy:
    name = "fifo"

    def prepare(self, state: SchedulerState) -> dict[str, list[tuple[Seconds, str]]]:
        """Have the state keep pending work in submit order (from now on, heaps: see
        SchedulerState.submit_order); returns that order."""
        if state.submit_order is None:
            state.submit_order = {}
            for w in state.pending():
                state.submit_order.setdefault(w.gpu_type, []).append((w.submit_s, w.id))
            for order in state.submit_order.values():
                order.sort()  # (a sorted list is a heap)
        return state.submit_order

    def schedule(self, state: SchedulerState, now_s: Seconds) -> list[ev.Event]:
        submit_order = self.prepare(state)
        out = state.expire_protection(now_s)
        out += state.drain_events(now_s, lambda w, t: False)  # no preemption: drains wait
        workloads = state.workloads
        for gpu_type, pool in state.cluster.pools.items():
            order = submit_order.get(gpu_type)
            while order:
                submit_s, wid = order[0]
                w = workloads.get(wid)
                if w is None or w.state != PENDING or w.submit_s != submit_s:
                    heapq.heappop(order)  # ended while waiting (or forgotten): its entry goes now
                    continue
                nodes = pool.find_free(w.gpus)
                if nodes is None:
                    break  # head-of-line blocking
                heapq.heappop(order)  # the head starts (a requeue pushes it again)
                e = state.started(w, nodes, now_s)
                state.apply(e)
                out.append(e)
        return out

    def drain_blocked_until_s(self, w: Workload, now_s: Seconds) -> Seconds:
        return w.run_start_s + w.remaining_s()
