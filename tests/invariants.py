"""Invariants of a simulated run, checked from its event stream and final state (shared by the
property tests and the scenario tests)."""

from __future__ import annotations

from collections import Counter

import pytest

from timeshare import events as ev
from timeshare.state import AWAITING, CANCELLED, COMPLETED, FAILED, PENDING, PREEMPTED, RUNNING


def check_no_gpu_double_booked(events) -> None:
    holder: dict[tuple[str, int], str] = {}
    held: dict[str, list[tuple[str, int]]] = {}
    for e in events:
        if isinstance(e, ev.WorkloadStarted):
            assert e.workload_id not in held, f"{e.workload_id} started twice without stopping"
            gpus = [(p.node, g) for p in e.placement for g in p.gpu_ids]
            assert len(gpus) == e.gpus == len(set(gpus))
            for key in gpus:
                assert key not in holder, f"{key} given to {e.workload_id} while {holder[key]} holds it"
                holder[key] = e.workload_id
            held[e.workload_id] = gpus
        elif isinstance(e, (ev.WorkloadPreempted, ev.WorkloadCompleted, ev.WorkloadFailed, ev.WorkloadCancelled)):
            for key in held.pop(e.workload_id, []):
                del holder[key]


def check_protection(events) -> None:
    until: dict[str, int | None] = {}
    for e in events:
        if isinstance(e, ev.WorkloadStarted):
            until[e.workload_id] = e.protected_until_ms
        elif isinstance(e, ev.WorkloadPreempted) and e.reason.kind != "node_failed":
            protected = until[e.workload_id]
            assert protected is None or e.at_ms >= protected, (
                f"{e.workload_id} preempted ({e.reason.kind}) at {e.at_ms} ms, protected until {protected} ms")


def check_unallocated_never_charged(run) -> None:
    state = run.state
    end_s = run.result.end_s
    expected: Counter = Counter()
    open_: dict[str, tuple[float, int, str, str]] = {}
    for e in run.events:
        if isinstance(e, ev.WorkloadStarted):
            if e.allocated:
                open_[e.workload_id] = (e.at_ms / 1000, e.gpus, e.project, e.gpu_type)
        elif isinstance(e, (ev.WorkloadPreempted, ev.WorkloadCompleted, ev.WorkloadFailed, ev.WorkloadCancelled)):
            if e.workload_id in open_:
                t0, gpus, leaf, gpu_type = open_.pop(e.workload_id)
                expected[(leaf, gpu_type)] += gpus * (e.at_ms / 1000 - t0)
    for t0, gpus, leaf, gpu_type in open_.values():
        expected[(leaf, gpu_type)] += gpus * (end_s - t0)
    for leaf in state.tree.leaves:
        for gpu_type in state.cluster.pools:
            # the window (30 d) covers the whole run: the ledger holds every allocated GPU-second
            charged = state.ledger.usage_gpu_s(leaf, gpu_type, True, end_s)
            assert charged == pytest.approx(expected[(leaf, gpu_type)], abs=1e-6), (leaf, gpu_type)


def check_node_counts(run) -> None:
    """Each node's count of GPUs held by unallocated work (which victim searches trust to skip
    nodes) matches the work it holds at the end."""
    state = run.state
    for pool in state.cluster.pools.values():
        for node in pool.nodes:
            held = sum(n for wid, n in node.holders.items() if not state.workloads[wid].allocated)
            assert node.unallocated == held, (node.name, node.unallocated, held)


def check_nothing_lost(run, scenario) -> None:
    state = run.state
    submitted = [e.workload.id for e in run.of_type(ev.WorkloadSubmitted)]
    assert len(submitted) == len(set(submitted))
    assert set(submitted) == set(state.workloads)
    in_trace = {w.id for w in scenario.workloads}
    resubmitted = {e.workload.id for e in run.of_type(ev.WorkloadSubmitted) if e.resubmit_of}
    late = {w.id for w in scenario.workloads if w.submit_s > run.result.end_s}
    assert set(submitted) == (in_trace - late) | resubmitted
    # every submitted workload is in exactly one of these states, and it agrees with the events
    last: dict[str, str] = {}
    for e in run.events:
        wid = getattr(e, "workload_id", None)
        if isinstance(e, ev.WorkloadSubmitted):
            last[e.workload.id] = PENDING
        elif isinstance(e, ev.WorkloadStarted):
            last[wid] = RUNNING
        elif isinstance(e, ev.WorkloadPreempted):
            last[wid] = PREEMPTED
        elif isinstance(e, ev.WorkloadRequeued):
            last[wid] = PENDING
        elif isinstance(e, ev.WorkloadCompleted):
            last[wid] = COMPLETED
        elif isinstance(e, ev.WorkloadFailed):
            last[wid] = FAILED
        elif isinstance(e, ev.WorkloadCancelled):
            last[wid] = CANCELLED
    for wid, w in state.workloads.items():
        assert w.state in (PENDING, AWAITING, RUNNING, COMPLETED, PREEMPTED, FAILED, CANCELLED)
        # a preemptor awaiting victims under notice is pending as far as the events go
        assert last[wid] == (PENDING if w.state == AWAITING else w.state), wid
        if w.state == PREEMPTED:
            assert not w.spec.resumable  # a resumable one is always requeued
    counts = Counter(w.state for w in state.workloads.values())
    assert counts[PENDING] == state.pending_count
    assert counts[RUNNING] == len(state.running)


def check_fair_share_preemptions_follow_their_rule(events) -> None:
    """P2, from the numbers each fair-share preemption carries: the victim's subtree ran above its
    due share by more than the hysteresis; under ``due_share`` it ends no lower than the
    preemptor's subtree with the request (or, when the request keeps the preemptor within its
    due share, at or above its own due share; or the victim was larger than its subtree's whole
    due share and could never take GPUs back); under ``window_credit`` it had used more of its
    window share than the preemptor's subtree. And no ping-pong: a preempted workload never
    takes GPUs back, at the same instant, from the subtree that preempted it."""
    gpus: dict[str, int] = {}
    taken_by: dict[tuple[str, int], str] = {}  # (victim's id, at_ms) -> preemptor's subtree
    taken: dict[tuple[str | None, int, str | None], int] = {}
    for e in events:
        if isinstance(e, ev.WorkloadSubmitted):
            gpus[e.workload.id] = e.workload.gpus
        if not isinstance(e, ev.WorkloadPreempted) or e.reason.kind != "fair_share":
            continue
        r = e.reason
        tolerance = 1e-6
        assert r.victim_fill > 1.0 + r.hysteresis - tolerance, (e.workload_id, r.message)
        # a decision that takes several victims reports each with the numbers it was made on;
        # the GPUs its earlier victims took from the same subtree count against this one
        key = (r.by_workload_id, e.at_ms, r.victim_subtree)
        taken[key] = taken.get(key, 0) + gpus[e.workload_id]
        left = r.victim_running_gpus - taken[key]
        after = left / r.victim_due_gpus if r.victim_due_gpus > 0 else (float("inf") if left > 0 else 0.0)
        if r.rule == "due_share":
            assert (after >= r.preemptor_fill - 1e-3 or (r.preemptor_fill <= 1.0 and after >= 1.0 - 1e-3)
                    or gpus[e.workload_id] > r.victim_due_gpus), (e.workload_id, after, r.message)
        else:
            assert r.rule == "window_credit", r
            assert r.victim_ratio > r.preemptor_ratio, (e.workload_id, r.message)
        back = taken_by.get((r.by_workload_id, e.at_ms))
        assert back is None or not r.victim_subtree.startswith(back), (
            f"ping-pong at {e.at_ms} ms: {r.by_workload_id} was preempted by {back} and took GPUs back")
        taken_by[(e.workload_id, e.at_ms)] = r.preemptor_subtree
