"""Read-only views of the scheduler state for queries (queue order, tree, nodes, digest)."""

from __future__ import annotations

import hashlib

import msgspec

from timeshare.explain import queue_order
from timeshare.fairshare import FairShareView
from timeshare.state import SchedulerState


def _num(now_s: float):
    return int(now_s) if now_s == int(now_s) else now_s


def queue_view(state: SchedulerState, now_s: float, gpu_type: str | None = None, limit: int = 1000) -> dict:
    """Pending work in the order the next pass considers it (the core's ``queue_order``, the
    scheduler's own order), with each workload's ordering key."""
    out = []
    for gt, pool in state.cluster.pools.items():
        if gpu_type and gt != gpu_type:
            continue
        view = FairShareView(state.tree, state.ledger, gt, pool.total_gpus, _num(now_s), state.config.catch_up)
        for position, (phase, w) in enumerate(queue_order(state, gt, _num(now_s)), start=1):
            if len(out) >= limit:
                break
            leaf = w.leaf
            out.append({
                "position": position, "workload_id": w.id, "project": leaf, "user": w.spec.user,
                "gpu_type": gt, "gpus": w.gpus, "phase": phase, "priority": w.spec.priority,
                "submitted_s": w.submit_s, "queued_since_s": w.queued_since_s,
                "ordering_key": [phase, *view.ordering_key(leaf), *w.key],
                "leaf_ratio": round(view.ratios[leaf], 6) if view.ratios[leaf] != float("inf") else None,
            })
    return {"now_s": now_s, "pending": state.pending_count, "workloads": out}


def tree_view(state: SchedulerState, now_s: float) -> dict:
    nodes = {}
    views = {gt: FairShareView(state.tree, state.ledger, gt, p.total_gpus, _num(now_s))
             for gt, p in state.cluster.pools.items()}
    for path, node in sorted(state.tree.nodes.items()):
        usage = {}
        for gt, view in views.items():
            ratio = view.ratios[path]
            usage[gt] = {
                "allocated_gpu_s": view.usage_gpu_s[path],
                "unallocated_gpu_s": state.ledger.usage_gpu_s(path, gt, False, _num(now_s)),
                "running_gpus": state.ledger.running_gpus(path, gt, True) + state.ledger.running_gpus(path, gt, False),
                "ratio": None if ratio == float("inf") else round(ratio, 6),
            }
        nodes[path] = {"share": node.share, "fraction": round(node.fraction, 6), "parent": node.parent,
                       "children": list(node.children), "usage": usage}
    return {"now_s": now_s, "window_s": state.config.lookback_window_s, "nodes": nodes}


def nodes_view(state: SchedulerState) -> dict:
    # free GPUs held for a preemptor whose victims under notice are still checkpointing: per node,
    # preemptor id -> GPUs (no other request may take them; ``free`` does not count them)
    held: dict[str, dict[str, int]] = {}
    for pid in sorted(state.awaiting):
        plan = state.awaiting[pid].plan
        if plan is None:
            continue
        for node in plan.nodes:
            n = plan.holds.get(node.index, 0)
            if n:
                held.setdefault(node.name, {})[pid] = n
    out = []
    for gt, pool in state.cluster.pools.items():
        for n in pool.nodes:
            out.append({"name": n.name, "gpu_type": gt, "rack": n.rack, "gpus": n.gpus, "free": n.free,
                        "state": n.state, "workloads": n.workload_ids(), "held": held.get(n.name, {})})
    return {"nodes": out}


def workload_view(state: SchedulerState, workload_id: str) -> dict | None:
    w = state.workloads.get(workload_id)
    if w is None:
        return None
    return {"id": w.id, "state": w.state, "attempt": w.attempt, "progress_s": w.progress_s,
            "allocated": w.allocated, "protected_until_s": w.protected_until_s, "preemptions": w.preemptions,
            "placement": [{"node": n.name, "gpu_ids": ids} for n, ids in w.placement]}


def digest(state: SchedulerState) -> str:
    """A fingerprint of everything that steers decisions (equal states give equal digests).

    Work that ended for good steers nothing and is left out: a leader that forgot it
    (``forget_ended``) and one that replayed the whole log hold the same live state."""
    h = hashlib.sha256()
    for wid in sorted(state.workloads):
        w = state.workloads[wid]
        if w.ended_s is not None:
            continue
        h.update(msgspec.json.encode([wid, w.state, w.attempt, w.progress_s, w.allocated, w.protected_until_s,
                                      [(n.name, ids) for n, ids in w.placement], w.preemptions]))
    for name in sorted(state.cluster.nodes_by_name):
        n = state.cluster.nodes_by_name[name]
        h.update(msgspec.json.encode([name, n.state, n.slots]))
    h.update(msgspec.json.encode(state.tree.shares()))
    h.update(msgspec.json.encode([state.pending_count, len(state.running)]))
    return h.hexdigest()
