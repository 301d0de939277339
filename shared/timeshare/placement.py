"""Victim search: the cheapest set of running workloads whose GPUs make a request fit.

The caller says which running workloads may be preempted (``may_preempt``) and how much each
costs (``cost``: a tuple, smaller = cheaper; it must end in the workload id so the choice is
deterministic). Then:

* a request of at most one node's GPUs picks, on every schedulable node where free GPUs plus
  preemptible GPUs suffice, the cheapest victims in cost order until it fits; the node whose
  most expensive victim is cheapest wins (then fewer victims, then the lower node index);
* a whole-node gang needs nodes whose every workload may be preempted; each such node costs
  its most expensive victim (a free node costs nothing); the cheapest nodes win, all from one
  rack when a rack can supply them at no higher cost.

Only nodes with GPUs not blocked by protected work are searched (``Pool.open``).
Protected work is never offered by ``may_preempt``, and only GPUs that are free or held by
chosen victims are given, so no GPU is given twice. The search reads the state and changes
nothing; the caller applies the preemptions and the start.
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import Callable

from .cluster import Node, Pool
from .rules import node_rank
from .state import SchedulerState, Workload
from .units import Seconds

_FREE = (-1,)

#: the most victims on one node whose every set is tried when a cap turns the cheapest ones down
#: (2^10 sets; an 8-GPU node holds at most 8 workloads; beyond it the greedy choice stands)
MAX_VICTIMS_TRIED_IN_SETS = 10


def find_victims(
    state: SchedulerState,
    pool: Pool,
    gpus: int,
    may_preempt: Callable[[Workload], bool],
    cost: Callable[[Workload], tuple],
    only: list[Node] | None = None,
    exclude: frozenset[int] = frozenset(),
    caps: Callable[[Workload], tuple[str, int] | None] | None = None,
    by_fit: bool = False,
    capped: list[bool] | None = None,
    free_limit: int = -1,
    fill_after: Callable[[str, int], float] | None = None,
    side_caps: Callable[[Workload], tuple[str, int] | None] | None = None,
    prune: bool = False,
) -> tuple[list[Node], list[Workload]] | None:
    """Nodes for the request and the workloads to preempt first, or None when nothing works.

    ``free_limit`` (-1: none) is the most free GPUs of a node a single-node request may use (an
    unallocated request that the headroom keeps off the pool's last free GPUs).

    ``only`` (by index) restricts a single-node search to these nodes (the caller knows the others
    cannot serve the request); nodes in ``exclude`` are never used (a gang's reservation).
    ``caps`` names, per victim, a group and the most GPUs that group may lose in all (None: no
    limit; ``capped``, when given, gets True appended when a cap turned a node down: such a
    failure depends on the order of costs, which change with time, so it must not be
    remembered as final); ``by_fit`` ranks candidate nodes by rules.node_rank (victims that free just enough
    first) instead of by their most expensive victim. A cost's second item is then the progress
    lost.

    ``fill_after(group, gpus)`` (with ``caps``): a group's fill once it has lost ``gpus`` GPUs.
    Given, victims on a node are taken one at a time, each time from the group left fullest
    by those taken before (a cost's third item, the victim's side fill, is read after them),
    and nodes rank by the lowest fill their victims leave a group at (rules.node_rank): the
    loss is spread over equally rich teams instead of falling on the one whose id sorts first.

    ``side_caps`` is a second limit of the same kind, apart from ``caps`` so that it changes no
    order or rank: per victim, a group and the most GPUs it may lose (the unallocated work of a
    richer subtree, which must end at least level with the requester). A victim past it is
    skipped and the next one tried (and ``capped`` told).

    ``prune`` (with ``by_fit``; False: every node is ranked, as the reference mode does): once a
    plan is found, a node whose cheapest victim already ranks behind it is not ranked (it
    cannot win); only a search that has found a plan skips, so a failure, and what ``capped``
    says of it, is as without."""
    gpn = pool.gpus_per_node
    if gpus > gpn:
        return _find_gang(state, pool, gpus, may_preempt, cost, exclude, caps, capped, side_caps)
    # every holder of a GPU is running: the running work (thousands at 16,384 GPUs) is a table
    # that stays in the cache, every workload ever seen (hundreds of thousands) is not, and a
    # search reads hundreds of holders
    workloads = state.running
    # (no memo of may_preempt or cost by workload: a victim of a single-node search sits on one
    # node but for a gang, and a dict of each search's hundreds of victims cost more than asking
    # again for the few gangs; both are pure within a search)
    best = None
    if only is None:
        candidates_nodes = pool.open_nodes(gpus, exclude)
    else:
        candidates_nodes = pool.open_among(only, gpus, exclude)
    for node in candidates_nodes:
        free = node.free
        if 0 <= free_limit < free:
            free = free_limit
        if free >= gpus:
            return [node], []
        # costs only for nodes where enough could be freed: most nodes of a search fail
        # here, and a cost is dearer than a yes or no
        reachable = free
        allowed: list[tuple[Workload, int]] = []
        for wid, n in node.holders.items():
            v = workloads[wid]
            if may_preempt(v):
                reachable += n
                allowed.append((v, n))
        if reachable < gpus:
            continue
        candidates: list[tuple[tuple, int]] = [(cost(v), n) for v, n in allowed]
        candidates.sort()
        if prune and best is not None and by_fit:
            # a node takes at least one victim (its free GPUs do not suffice), and a rank begins
            # with (dearest victim's first item, progress lost), neither below the cheapest
            # victim's (losses are not negative): a node whose cheapest victim is dearer than
            # the best rank's start cannot win (nearly every node of a large pool, where one
            # victim frees enough on each)
            cheapest = candidates[0][0]
            best_rank = best[0]
            if cheapest[0] > best_rank[0] or (cheapest[0] == best_rank[0] and cheapest[1] > best_rank[1]):
                continue
        taken_ids: list[str] = []
        got = free
        worst: tuple = ()
        lost: Seconds = 0
        freed = 0  # GPUs the victims free elsewhere
        used: dict[str, int] | None = {} if caps is not None else None
        side_used: dict[str, int] | None = {} if side_caps is not None else None
        if fill_after is not None and caps is not None and used is not None:
            candidates = _spread(candidates, caps, fill_after, workloads)
        side_bound = False
        for c, n in candidates:
            if side_caps is not None and side_used is not None:
                side = side_caps(workloads[c[-1]])
                if side is not None:
                    name, most = side
                    if side_used.get(name, 0) + n > most:
                        side_bound = True
                        if capped is not None:
                            capped.append(True)
                        continue  # its subtree would end below the requester
                    side_used[name] = side_used.get(name, 0) + n
            if caps is not None and used is not None:
                group = caps(workloads[c[-1]])
                if group is not None:
                    name, most = group
                    if used.get(name, 0) + n > most:
                        if capped is not None:
                            capped.append(True)
                        continue  # its group may not lose that many GPUs
                    used[name] = used.get(name, 0) + n
            taken_ids.append(c[-1])
            got += n
            worst = c
            if by_fit:
                lost += c[1]
                freed += workloads[c[-1]].gpus - n  # a gang's GPUs on other nodes go too
            if got >= gpus:
                break
        if side_bound and side_caps is not None and len(candidates) <= MAX_VICTIMS_TRIED_IN_SETS:
            # skipping the victim past a cap and taking the next ones is not the cheapest set
            # within the caps, nor sure to find one (a 2-GPU victim taken first can leave no room
            # under the cap for the 4-GPU one that alone would do): try every set on this node
            within = _cheapest_within_caps(candidates, free, gpus, caps, side_caps, workloads, by_fit)
            if within is None:
                continue
            taken_ids, got, worst, lost, freed, used = within
        elif got < gpus:
            continue
        floor = math.inf
        if fill_after is not None and used:
            for name in sorted(used):
                f = fill_after(name, used[name])
                if f < floor:
                    floor = f
        rank = node_rank(worst, got + freed - gpus, lost, len(taken_ids), node.index, floor) if by_fit \
            else (worst, len(taken_ids), node.index)
        if best is None or rank < best[0]:
            best = (rank, node, taken_ids)
    if best is None:
        return None
    return [best[1]], [workloads[w] for w in best[2]]


def _cheapest_within_caps(candidates: list[tuple[tuple, int]], free: int, gpus: int,
                          caps: Callable[[Workload], tuple[str, int] | None] | None,
                          side_caps: Callable[[Workload], tuple[str, int] | None],
                          workloads: dict[str, Workload], by_fit: bool,
                          ) -> tuple[list[str], int, tuple, Seconds, int, dict[str, int] | None] | None:
    """Of the sets of ``candidates`` (one node's victims, a handful) that free ``gpus`` GPUs with
    ``free`` and keep every group within its caps, the one find_victims would rank best on its
    own: (victim ids, GPUs got, dearest victim's cost, progress lost, GPUs freed elsewhere, GPUs
    lost per ``caps`` group), or None."""
    best_key: tuple = ()
    best: tuple[list[str], int, tuple, Seconds, int, dict[str, int] | None] | None = None
    for size in range(1, len(candidates) + 1):
        for chosen in combinations(candidates, size):
            got = free + sum(n for _, n in chosen)
            if got < gpus:
                continue
            used: dict[str, int] = {}
            side_used: dict[str, int] = {}
            fits = True
            for c, n in chosen:
                for limit, lost_by in ((side_caps, side_used), (caps, used)):
                    group = limit(workloads[c[-1]]) if limit is not None else None
                    if group is not None:
                        lost_by[group[0]] = lost_by.get(group[0], 0) + n
                        fits = fits and lost_by[group[0]] <= group[1]
            if not fits:
                continue
            worst = max(c for c, _ in chosen)
            lost: Seconds = sum(c[1] for c, _ in chosen) if by_fit else 0
            freed = sum(workloads[c[-1]].gpus - n for c, n in chosen) if by_fit else 0
            key = (worst[0], lost, got + freed - gpus, size, worst) if by_fit else (worst, size)
            if best is None or key < best_key:
                best_key = key
                best = ([c[-1] for c, _ in chosen], got, worst, lost, freed, used if caps is not None else None)
    return best


def _spread(candidates: list[tuple[tuple, int]], caps: Callable[[Workload], tuple[str, int] | None],
            fill_after: Callable[[str, int], float], workloads: dict[str, Workload]) -> list[tuple[tuple, int]]:
    """``candidates`` (sorted by cost) reordered so that each next one, among those costing the
    same progress, comes from the group left fullest by the ones before it (see find_victims)."""
    out: list[tuple[tuple, int]] = []
    remaining = list(candidates)
    lost_by_group: dict[str, int] = {}
    while remaining:
        best_i = 0
        best_key: tuple = ()
        for i in range(len(remaining)):
            c, n = remaining[i]
            group = caps(workloads[c[-1]])
            key = c if group is None else (c[0], c[1], -fill_after(group[0], lost_by_group.get(group[0], 0))) + c[3:]
            if i == 0 or key < best_key:
                best_i, best_key = i, key
        c, n = remaining.pop(best_i)
        group = caps(workloads[c[-1]])
        if group is not None:
            lost_by_group[group[0]] = lost_by_group.get(group[0], 0) + n
        out.append((c, n))
    return out


def _find_gang(state: SchedulerState, pool: Pool, gpus: int, may_preempt: Callable[[Workload], bool],
               cost: Callable[[Workload], tuple], exclude: frozenset[int],
               caps: Callable[[Workload], tuple[str, int] | None] | None = None,
               capped: list[bool] | None = None,
               side_caps: Callable[[Workload], tuple[str, int] | None] | None = None,
               ) -> tuple[list[Node], list[Workload]] | None:
    """:func:`find_victims` for a whole-node gang (apart: most searches are for one node, and
    they need none of this, not even the closure below)."""
    workloads = state.running  # (every holder is running: see find_victims)
    gpn = pool.gpus_per_node
    verdict: dict[str, tuple | None] = {}  # workload id -> cost, or None if not preemptible

    def cost_of(wid: str) -> tuple | None:
        if wid in verdict:
            return verdict[wid]
        w = workloads[wid]
        c = cost(w) if may_preempt(w) else None
        verdict[wid] = c
        return c

    need = gpus // gpn
    open_nodes = pool.open_nodes(gpn, exclude)
    if len(open_nodes) < need:
        return None
    node_costs: list[tuple[tuple, int]] = []
    for node in open_nodes:
        if node.free == node.gpus:
            node_costs.append((_FREE, node.index))
            continue
        most: tuple = _FREE  # the node's most expensive victim
        for wid in node.holders:
            c = cost_of(wid)
            if c is None:
                break  # work it may not preempt: not a candidate
            if c > most:
                most = c
        else:
            node_costs.append((most, node.index))
    if len(node_costs) < need:
        return None
    node_costs.sort()
    global_worst = node_costs[need - 1][0]
    chosen = [i for _, i in node_costs[:need]]
    by_rack: dict[int, list[tuple[tuple, int]]] = {}
    for c, i in node_costs:
        by_rack.setdefault(pool.nodes[i].rack, []).append((c, i))
    # one rack wins when its nodes cost no more than the cheapest nodes overall, comparing
    # costs without their final id (the id only breaks ties, it is not a cost)
    racks = [
        (members[need - 1][0], rack)
        for rack, members in by_rack.items()
        if len(members) >= need and members[need - 1][0][:-1] <= global_worst[:-1]
    ]
    if racks and len(by_rack) > 1:
        _, rack = min(racks)
        chosen = [i for _, i in by_rack[rack][:need]]
    nodes = [pool.nodes[i] for i in sorted(chosen)]
    victims = sorted({wid for n in nodes for wid in n.holders})
    for limit in (caps, side_caps):
        if limit is None:
            continue
        used: dict[str, int] = {}
        for wid in victims:
            group = limit(workloads[wid])
            if group is not None:
                name, may_lose = group
                used[name] = used.get(name, 0) + workloads[wid].gpus
                if used[name] > may_lose:
                    if capped is not None:
                        capped.append(True)
                    return None  # the cheapest nodes would take more than a group may lose
    return nodes, [workloads[w] for w in victims]


def takeable_nodes(pool: Pool, since: tuple[int, set[int]] | None, may_preempt: Callable[[Workload], bool],
                   workloads: dict[str, Workload], exclude: frozenset[int] = frozenset()) -> set[int]:
    """Indices of the open nodes a whole-node gang could take (:func:`preemptible_nodes`), kept
    up to date: given ``since`` (a change stamp and the set then, with the same ``may_preempt``),
    only nodes changed after it are checked again (a node under a new notice stays until it
    changes: the set may hold too many, never too few, and find_victims decides)."""
    if since is None:
        return preemptible_nodes(pool, pool.open_nodes(pool.gpus_per_node, exclude), may_preempt, workloads)
    seq, known = since
    if seq == pool.change_seq:
        return known
    moved = pool.changed_since(seq)
    return (known - {n.index for n in moved}) | preemptible_nodes(
        pool, [n for n in moved if n.index not in exclude], may_preempt, workloads)


def preemptible_nodes(pool: Pool, nodes: list[Node], may_preempt: Callable[[Workload], bool],
                      workloads: dict[str, Workload]) -> set[int]:
    """Indices of the given nodes that a whole-node gang could take (all work preemptible)."""
    full = pool.gpus_per_node
    out = set()
    for node in nodes:
        if node.state != "healthy" or node.blocked or node.gpus != full:
            continue
        if all(may_preempt(workloads[wid]) for wid in node.holders):
            out.add(node.index)
    return out


#: how much more a debug request's wait weighs than GPU time (a minute of a debug user's wait
#: as an hour of one GPU): a debug request prefers victims that free their GPUs at once
DEBUG_WAIT_WEIGHT = 60


def preemption_cost_gpu_s(state: SchedulerState, w: Workload, now_s: Seconds, requester_gpus: int = 0,
                          debug: bool = False) -> Seconds:
    """What preempting ``w`` now costs, in GPU-seconds: the progress it loses, plus, when it is
    given a notice, the GPU time its checkpoint takes (its GPUs for its notice) and the wait it
    imposes on the request (the request's GPUs for the notice, weighed DEBUG_WAIT_WEIGHT times
    for a debug request). A victim given a notice loses no progress: it checkpoints before its
    GPUs go (the storage rule admits its checkpoint). Without a notice: :func:`lost_gpu_s`."""
    if not state.gives_notice(w):
        return lost_gpu_s(w, now_s)
    notice_s = w.notice_s
    return (w.gpus + requester_gpus * (DEBUG_WAIT_WEIGHT if debug else 1)) * notice_s


def lost_gpu_s(w: Workload, now_s: Seconds) -> Seconds:
    """GPU-seconds of progress that preempting ``w`` now would throw away."""
    return (now_s - w.run_start_s - (w.saved_progress_s(now_s) - w.progress_s)) * w.gpus
