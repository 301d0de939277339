"""The discrete-event loop: jumps from one schedulable moment to the next (no wall clock).

Moments are submissions (from the trace, in order), completions, expiries of minimum
runtimes, node events, repairs and resubmissions (a heap). At each moment the loop applies
what happened, then runs one scheduling pass of the policy; the pass's events tell it what
to expect next (a start schedules its completion, a protected start the end of its
protection, a drained node its repair).
"""

from __future__ import annotations

import gc
import heapq
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

import msgspec

from .. import events as ev
from ..baseline import BaselinePolicy
from ..drains import drain_needs_human
from ..fifo import FifoPolicy
from ..scheduler import BudgetPolicy
from ..state import RUNNING, SchedulerState, Workload
from ..units import Seconds, ms_to_s
from .metrics import MetricsCollector
from .scenario import NodeEvent, Scenario
from .storage import CheckpointStorage


class Policy(Protocol):
    """What the loop needs of a policy: a scheduling pass, and how long a drain may wait."""

    def schedule(self, state: SchedulerState, now_s: Seconds) -> list[ev.Event]: ...

    def drain_blocked_until_s(self, w: Workload, now_s: Seconds) -> Seconds: ...


POLICIES: dict[str, Callable[[], Policy]] = {"budget": BudgetPolicy, "baseline": BaselinePolicy, "fifo": FifoPolicy}


def _budget_reference() -> Policy:
    return BudgetPolicy(reference=True)


#: policies a run may name that "all" leaves out: the budget policy with every cache off,
#: which decides exactly as "budget" does, only slower (the proof that its caches are safe)
def _baseline_reference() -> Policy:
    return BaselinePolicy(reference=True)


CHECKS: dict[str, Callable[[], Policy]] = {"budget-reference": _budget_reference,
                                           "baseline-reference": _baseline_reference}

_COMPLETE, _WAKE, _NODE, _REPAIR, _RESUBMIT, _CHECKPOINT = range(6)


#: events that end a run (a checkpoint being written stops with it)
_STOPS = (ev.WorkloadPreempted, ev.WorkloadCompleted, ev.WorkloadFailed, ev.WorkloadCancelled)


@dataclass
class RunResult:
    policy: str
    metrics: dict
    state: SchedulerState
    end_s: Seconds


def run(scenario: Scenario, policy_name: str, on_event: Callable[[ev.Event], None] | None = None,
        progress: Callable[[int], None] | None = None,
        wall_clock: Callable[[], float] = time.perf_counter) -> RunResult:
    """Simulate ``scenario`` under one policy; ``on_event`` sees every event in order.

    ``wall_clock`` only measures how long the run took (for the report); it never steers it."""
    with _collector_for_a_run():
        return _run(scenario, policy_name, on_event, progress, wall_clock)


#: how many allocations between two collections of the youngest generation during a run
#: (Python's default: 700)
RUN_GC_GEN0_THRESHOLD = 20_000


@contextmanager
def _collector_for_a_run() -> Iterator[None]:
    """Python's cyclic garbage collector, set for a run and put back after it.

    A run allocates millions of short-lived tuples, lists and events, and makes few reference
    cycles; the default collector walks the young generation every 700 allocations and, now and
    then, the whole heap, which at 16,384 GPUs holds a hundred thousand live workloads. So what
    exists when the run starts (the scenario, its trace, the cluster, the tree) is frozen out of
    every collection (``gc.freeze``), and the youngest generation is collected every
    RUN_GC_GEN0_THRESHOLD allocations. Measured on 2 days at 16,384 GPUs (docs/records/
    2026-12-02-third-session.md): 0.6 s of 8 s in the collector, 0.3 s with this. Collection
    changes no decision: nothing in the core depends on when an object is freed."""
    thresholds = gc.get_threshold()
    frozen_before = gc.get_freeze_count()
    gc.freeze()
    gc.set_threshold(RUN_GC_GEN0_THRESHOLD, thresholds[1], thresholds[2])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if not frozen_before:
            gc.unfreeze()


def _run(scenario: Scenario, policy_name: str, on_event: Callable[[ev.Event], None] | None,
         progress: Callable[[int], None] | None, wall_clock: Callable[[], float]) -> RunResult:
    policy = POLICIES[policy_name]() if policy_name in POLICIES else CHECKS[policy_name]()
    state = SchedulerState(scenario.tree(), scenario.cluster(), scenario.policy, name=scenario.name)
    collector = MetricsCollector(state.tree, {t: p.total_gpus for t, p in state.cluster.pools.items()},
                                 scenario.policy.max_min_runtime_s)
    collector.start(0, {n.name: (p.gpu_type, n.gpus) for p in state.cluster.pools.values() for n in p.nodes})
    wall0 = wall_clock()
    heap: list[tuple] = []
    seq = 0

    # times are Seconds, never float: an int time stays an int (see units.py)
    def push(t: Seconds, kind: int, payload: Any) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, kind, seq, payload))

    for ne in scenario.node_events:
        push(ne.at_s, _NODE, ne)

    # checkpoints written on notice, sharing the cluster's checkpoint bandwidth (storage.py)
    storage = CheckpointStorage(state.cluster.checkpoint_bandwidth_gbps)

    def storage_changed() -> None:
        nxt = storage.next_finish()
        if nxt is not None:
            push(ms_to_s(nxt[0]), _CHECKPOINT, storage.version)

    def emit(e: ev.Event) -> None:
        collector.observe(e)
        if on_event is not None:
            on_event(e)
        if type(e) is ev.WorkloadPreemptionNotice:
            # the victim writes its checkpoint; a pass is due at its deadline in any case
            w = state.workloads[e.workload_id]
            push(ms_to_s(e.deadline_ms), _WAKE, None)
            storage.add(w.id, w.attempt, w.spec.checkpoint_size_gb, w.spec.notice_s, e.at_ms)
            storage_changed()
        elif storage.writers and isinstance(e, _STOPS) and e.workload_id in storage.writers:
            storage.remove(e.workload_id, e.at_ms)
            storage_changed()

    def apply_all(events: list[ev.Event], now_s: Seconds) -> None:
        for e in events:
            state.apply(e)
            emit(e)

    def follow(events: list[ev.Event], now_s: Seconds) -> None:
        """Schedule what the pass's (already applied) events imply."""
        for e in events:
            emit(e)
            if type(e) is ev.WorkloadStarted:
                w = state.workloads[e.workload_id]
                push(now_s + w.remaining_s(), _COMPLETE, (w.id, w.attempt))
                if w.protected_until_s is not None:
                    push(w.protected_until_s, _WAKE, None)
            elif type(e) is ev.WorkloadPreempted and not e.resumable:
                push(now_s + scenario.policy.resubmit_delay_s, _RESUBMIT, e.workload_id)
            elif type(e) is ev.NodeDrained:
                push(now_s + repair_s.get(e.node, 0), _REPAIR, e.node)

    repair_s: dict[str, int] = {}
    drift_wake_s: int | None = getattr(policy, "drift_wake_s", None) if scenario.policy.catch_up > 0 else None
    trace = scenario.workloads
    i_trace = 0
    n_trace = len(trace)
    resubmits: dict[str, int] = {}
    now_s: Seconds = 0
    end_s = scenario.duration_s
    last_progress: Seconds = 0
    while True:
        next_submit = trace[i_trace].submit_s if i_trace < n_trace else None
        next_heap: Seconds | None = heap[0][0] if heap else None
        if next_submit is None and (next_heap is None or (not state.running and not state.pending_count
                                                          and all(k in (_NODE, _REPAIR) for _, k, _, _ in heap))):
            break
        if next_submit is None:
            assert next_heap is not None  # (the loop ended above otherwise)
            now_s = next_heap
        elif next_heap is None or next_submit <= next_heap:  # a tie: the submission (its time is an int)
            now_s = next_submit
        else:
            now_s = next_heap
        if now_s > end_s:
            now_s = end_s
            break
        # 1. what happened at this moment
        while i_trace < n_trace and trace[i_trace].submit_s == now_s:
            spec = trace[i_trace]
            i_trace += 1
            apply_all([state.submitted(spec, now_s)], now_s)
        while heap and heap[0][0] == now_s:
            _, kind, _, payload = heapq.heappop(heap)
            if kind == _COMPLETE:
                wid, attempt = payload
                w = state.workloads[wid]
                if w.state == RUNNING and w.attempt == attempt:
                    apply_all([state.completed(wid, now_s)], now_s)
            elif kind == _NODE:
                _node_event(state, policy, payload, now_s, apply_all, follow, repair_s, push)
            elif kind == _REPAIR:
                node = state.cluster.node(payload)
                if node.state in ("drained", "down"):
                    apply_all([state.node_repaired(payload, now_s)], now_s)
            elif kind == _CHECKPOINT:
                if payload == storage.version:  # else the rates changed since: a later entry holds
                    now_ms = state.ms(now_s)
                    for wid in sorted(storage.writers):
                        if storage.finished(wid, now_ms):
                            w = state.workloads[wid]
                            storage.remove(wid, now_ms)
                            if w.notice is not None and w.notice.checkpointed_s is None \
                                    and now_s <= w.notice.deadline_s:
                                apply_all([state.checkpointed(wid, now_s)], now_s)
                    storage_changed()
            elif kind == _RESUBMIT:
                original = state.workloads[payload]
                n = resubmits[original.id.split("~")[0]] = resubmits.get(original.id.split("~")[0], 0) + 1
                spec = msgspec.structs.replace(original.spec, id=f"{original.id.split('~')[0]}~{n}",
                                               submit_s=int(now_s))
                apply_all([state.submitted(spec, now_s, resubmit_of=original.id)], now_s)
        # 2. one scheduling pass
        follow(policy.schedule(state, now_s), now_s)
        if state.retry_at_s is not None:
            # the pass held a preemption back (rule "no cascade"): look again then
            push(state.retry_at_s, _WAKE, None)
            state.retry_at_s = None
        if drift_wake_s is not None and state.pending_count:
            # due shares drift with the window while nothing happens: a request may become
            # entitled with no event at all, so a quiet stretch gets a pass every drift_wake_s
            # (the live placement's timer does the same)
            quiet_until = min(heap[0][0] if heap else end_s,
                              trace[i_trace].submit_s if i_trace < n_trace else end_s)
            if quiet_until > now_s + drift_wake_s:
                push(now_s + drift_wake_s, _WAKE, None)
        if progress is not None and now_s - last_progress >= 3600:
            progress(int(now_s - last_progress))
            last_progress = now_s
    if progress is not None:
        progress(int(now_s - last_progress))
    wall_s = wall_clock() - wall0
    metrics = collector.finish(now_s, wall_s, now_s)
    metrics["checkpoint_storage"] = {
        "bandwidth_gbps": state.cluster.checkpoint_bandwidth_gbps,
        "peak_gbps": round(storage.peak_gbps, 3),
        "written_gb": round(storage.written_gb, 1),
        "hourly_peak_gbps": storage.hourly_peak_gbps(state.ms(now_s)),
    }
    metrics["workloads"]["pending_at_end"] = state.pending_count
    metrics["workloads"]["running_at_end"] = len(state.running)
    metrics["workloads"]["trace"] = n_trace
    metrics["workloads"]["not_yet_submitted"] = n_trace - i_trace
    metrics["sim"]["simulated_s_per_wall_s"] = round(now_s / wall_s, 1) if wall_s > 0 else None
    metrics["sim"]["events_per_wall_s"] = round(collector.events / wall_s, 1) if wall_s > 0 else None
    return RunResult(policy_name, metrics, state, now_s)


def _node_event(state: SchedulerState, policy: Policy, ne: NodeEvent, now_s: Seconds,
                apply_all: Callable[[list[ev.Event], Seconds], None], follow: Callable[[list[ev.Event], Seconds], None],
                repair_s: dict[str, int], push: Callable[[Seconds, int, Any], None]) -> None:
    node = state.cluster.node(ne.node)
    if node.state != "healthy":
        return  # already out of service; the first fault's repair brings it back
    repair_s[ne.node] = ne.repair_s
    if ne.kind == "failed":
        apply_all(state.node_failed(ne.node, now_s, ne.reason or "scenario fault"), now_s)
        push(now_s + ne.repair_s, _REPAIR, ne.node)
        return
    needs_human = drain_needs_human(state, node, now_s, policy.drain_blocked_until_s)
    apply_all([state.node_unhealthy(ne.node, now_s, ne.reason or "scenario health check failed",
                                    needs_human=needs_human)], now_s)
