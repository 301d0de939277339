"""Gang reservations: room for a large gang that protected work keeps fragmenting.

Protected minimum runtimes leave few moments when many nodes can be emptied at once, so a
whole-node gang can wait behind a stream of small protected workloads (the weak spot Ai2
reports). Each pass, the most deserving leaf whose next gang fits within its due share gets
one reservation per pool: the nodes that can be emptied soonest (all their work unallocated,
preemptible by that leaf, or protected only until a known time). Until the gang starts, new
allocated work may use those nodes only if its own protection ends by the time the last of
them can be taken (``until_s``), so it never delays the gang; unallocated work may use them
freely (it can be preempted at any time).

The reservation is recomputed from the state on every pass (nothing to persist, so the live
scheduler and the simulator agree); per-node times are cached and refreshed only for nodes
that changed.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

from .cluster import NODE_HEALTHY, Pool
from .fairshare import FairShareView
from .rules import free_at_s
from .state import SchedulerState, Workload
from .units import Seconds
from .victims import VictimLimit


class Reservation(NamedTuple):
    workload_id: str
    #: the gang's leaf: requests of leaves that stand before it are not kept off the nodes
    leaf: str
    nodes: frozenset[int]
    until_s: Seconds


def keeps_off(reservation: Reservation | None, w: Workload, view: FairShareView, now_s: Seconds) -> bool:
    """Whether ``reservation`` keeps ``w`` off its nodes: unless ``w`` is the gang, its
    protection ends by the time the gang can start, or its leaf stands before the gang's where
    their paths part (rule "reservations obey the order": a reservation never holds GPUs a more
    deserving leaf could use now)."""
    if reservation is None or w.id == reservation.workload_id or now_s + w.min_runtime_s <= reservation.until_s:
        return False
    return keeps_leaf_off(reservation, w.leaf, view)


def keeps_leaf_off(reservation: Reservation, leaf: str, view: FairShareView) -> bool:
    """The part of :func:`keeps_off` that depends only on the request's leaf: whether it does
    not stand before the gang's leaf where their paths part."""
    split = view.tree.divergence(leaf, reservation.leaf)
    return split is None or not view.key(split[0]) < view.key(split[1])


def plan_reservation(state: SchedulerState, pool: Pool, view: FairShareView, now_s: Seconds,
                     victims_for: Callable[[str, int], dict], cached: bool = True) -> Reservation | None:
    gpn = pool.gpus_per_node
    heads = _pending_gangs(state, pool)
    if not heads:
        return None  # most passes: no funded gang waits, so no fair-share order is needed
    index = state.tree.index
    for leaf in view.leaf_order(heads):  # only leaves with a gang pending, in fair-share order
        i = index[leaf]
        # the leaf's first gang (its own order) that fits within its due share: a larger one
        # ahead of it borrows, gets no reservation, and phase 3 passes it over as well
        for head, gpus in heads[leaf]:
            if view.fill_at(i, gpus) <= 1.0 or (view.fill_at(i) < 1.0 and gpus <= view.due_at(i)):
                break
        else:
            continue
        need = gpus // gpn
        if len(pool.buckets[gpn]) >= need:
            return None  # it fits now and starts in this pass
        # per victim leaf, the limits the gang's own victim search will apply (scheduler's
        # _victims_for): a node is takeable only if every workload on it may go for the gang
        allowed = tuple(victims_for(leaf, gpus).items())
        times = _takeable_times(state, pool, leaf, allowed, now_s, cached)
        ready = sorted((t, -pool.nodes[i].free, i) for i, t in times.items() if t < math.inf)
        if len(ready) < need:
            continue
        chosen = ready[:need]
        return Reservation(head[2], leaf, frozenset(i for _, _, i in chosen), max(t for t, _, _ in chosen))
    return None


def _pending_gangs(state: SchedulerState, pool: Pool) -> dict[str, list[tuple[tuple, int]]]:
    """Per leaf with a due share and allocated whole-node gangs pending: the head of each gang
    size, as (queue key, GPUs), in the leaf's own order."""
    gpn = pool.gpus_per_node
    nodes = state.tree.nodes
    heads = {}
    queues = state.leaf_queues.get(pool.gpu_type, {})
    for leaf in state.tree.leaves:
        pair = queues.get(leaf)
        if pair is None:
            continue
        q = pair[1]
        if q is None or not q.count or nodes[leaf].fraction <= 0:
            continue
        # a size's head is its first gang; a later gang of the same size fits no better
        gangs = sorted((keys[0], g) for g, keys in q.by_size.items() if g > gpn)
        if gangs:
            heads[leaf] = gangs
    return heads


def _may_go(gpus: int, limit: VictimLimit | None) -> bool:
    """Whether a workload of ``gpus`` GPUs past its protection may go for the gang, by the limit
    its victim search would apply (the cap counts each workload alone here: the search itself
    checks the sum)."""
    return limit is not None and gpus <= limit.each_gpus


def _takeable_times(state: SchedulerState, pool: Pool, leaf: str, allowed: tuple, now_s: Seconds,
                    use_cache: bool = True) -> dict[int, Seconds]:
    """Per healthy node: when ``leaf`` could empty it (inf: work it may not preempt)."""
    key = (pool.gpu_type, leaf)
    cached = state.caches.reserve_times.get(key) if use_cache else None
    limits = dict(allowed)
    workloads = state.running  # (every holder is running: a small table, see placement.find_victims)
    if cached is not None and cached[1] == allowed:
        # updated in place: the cached dict is this function's own (callers only read it)
        times = cached[2]
        nodes = pool.changed_since(cached[0])
        # a protection that ended since is "now"; other cached times stay right
        for i, t in times.items():
            if now_s > t:
                times[i] = now_s
    else:
        times = {}
        nodes = pool.nodes
    for node in nodes:
        if node.state != NODE_HEALTHY:
            times.pop(node.index, None)
            continue
        t = now_s
        if node.held:
            times[node.index] = math.inf  # GPUs held for a preemptor under notice
            continue
        for wid in node.holders:
            v = workloads[wid]
            if v.notice is not None:
                t = math.inf  # its GPUs are promised to its preemptor
                break
            if not v.allocated:
                continue  # unallocated work goes for an allocated gang at any time (the contract)
            free_s = free_at_s(True, v.protected_until_s, now_s, v.non_preemptible)
            if free_s <= now_s and not _may_go(v.gpus, limits.get(v.leaf)):
                free_s = math.inf  # past its protection, but not for this gang to take
            if free_s > t:
                t = free_s
            if t == math.inf:
                break
        times[node.index] = t
    if use_cache:
        state.caches.reserve_times[key] = (pool.change_seq, allowed, times)
    return times
