"""What users are shown: the queue in the order the scheduler takes it, and why a workload waits,
runs or was preempted, in plain language with the numbers (pure, like the rest of the core; the
gateway and the CLI format times).

The order is the pass's (scheduler.py): first allocated requests of leaves with a budget, leaves
ranked by fill (allocated GPUs running / GPUs due now) depth first, inside a leaf by priority,
submit time and id; then everything else (unallocated requests, work of leaves without a
budget), leaves ranked by all the GPUs they run against their due share. A pass also serves
allocated requests beyond a due share in that second phase; they are shown in the first.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import msgspec

from . import events as ev
from .durations import format_duration_s
from .fairshare import FairShareView
from .reservation import Reservation, keeps_off, plan_reservation
from .rules import free_at_s, richer_in_all, room_by_depth
from .state import AWAITING, PENDING, RUNNING, SchedulerState, Workload
from .units import Seconds
from .victims import victims_for


def _view(state: SchedulerState, gpu_type: str, now_s: Seconds) -> FairShareView:
    pool = state.cluster.pool(gpu_type)
    return FairShareView(state.tree, state.ledger, gpu_type, pool.total_gpus, now_s, state.config.catch_up)


def queue_order(state: SchedulerState, gpu_type: str, now_s: Seconds) -> list[tuple[str, Workload]]:
    """Pending work of one GPU type as ``(phase, workload)``, in the order a pass takes it;
    phase is ``allocated`` or ``unallocated``."""
    view = _view(state, gpu_type, now_s)
    nodes = state.tree.nodes
    out: list[tuple[str, Workload]] = []

    def pending(leaf: str, cls: str) -> list[Workload]:
        q = state.queues.get((gpu_type, leaf, cls))
        return [state.workloads[key[2]] for key, _ in q.ordered()] if q is not None and q.count else []

    for leaf in view.leaf_order():
        if nodes[leaf].fraction > 0:
            out += [("allocated", w) for w in pending(leaf, "a")]
    for leaf in view.leaf_order(total=True):
        rest = pending(leaf, "u") + (pending(leaf, "a") if nodes[leaf].fraction <= 0 else [])
        out += [("unallocated", w) for w in sorted(rest, key=lambda w: w.key)]
    return out


def _levels(view: FairShareView, leaf: str) -> list[dict[str, Any]]:
    return [{**level, "ratio": None if level["ratio"] == math.inf else level["ratio"],
             "fill": None if level["fill"] == math.inf else level["fill"]}
            for level in view.ordering_key(leaf)]


def _earliest_room_s(state: SchedulerState, w: Workload, now_s: Seconds,
                     may_take: Callable[[Workload], bool] | None = None,
                     free_limit: int = -1) -> tuple[Seconds, str | None]:
    """When GPUs enough for ``w`` could be freed at the earliest, and the workload whose
    protection ends last among those it needs (None: free or unprotected). Each running
    workload frees its GPUs at :func:`rules.free_at_s`, or never (inf: when it ends, which no
    one knows) if ``may_take`` says this request may not preempt it even past its protection
    (None: counting protections only); ``free_limit`` caps the free GPUs of a node it may use
    (the headroom kept from unallocated work; -1: all)."""
    pool = state.cluster.pool(w.gpu_type)
    per_node: list[tuple[Seconds, str | None, int]] = []  # (time, blocking workload, node index)
    for node in pool.nodes:
        if node.state != "healthy":
            continue
        # when each GPU of the node frees up at the earliest (free GPUs beyond the limit: never)
        usable = node.free if free_limit < 0 else min(node.free, free_limit)
        times: list[tuple[Seconds, str | None]] = [(now_s, None)] * usable + [(math.inf, None)] * (node.free - usable)
        for wid, n in node.holders.items():
            v = state.workloads[wid]
            until = free_at_s(v.allocated, v.protected_until_s, now_s, v.non_preemptible)
            if may_take is not None and not may_take(v):
                until = math.inf
            times += [(until, wid)] * n
        times.sort(key=lambda t: (t[0], t[1] or ""))
        if w.gpus <= pool.gpus_per_node:
            if len(times) >= w.gpus:
                per_node.append((times[w.gpus - 1][0], times[w.gpus - 1][1], node.index))
        elif node.gpus == pool.gpus_per_node:
            per_node.append((times[-1][0] if times else now_s, times[-1][1] if times else None, node.index))
    need = 1 if w.gpus <= pool.gpus_per_node else w.gpus // pool.gpus_per_node
    per_node.sort(key=lambda t: (t[0], t[2]))
    if len(per_node) < need or per_node[need - 1][0] == math.inf:
        return math.inf, None
    at, blocker, _ = per_node[need - 1]
    return at, blocker


def _victim_rules(state: SchedulerState, view: FairShareView, w: Workload, phase: str,
                  within: bool) -> tuple[Callable[[Workload], bool], int]:
    """Which running work the pass may preempt for pending ``w`` once past its protection, and
    the most free GPUs of a node it may use (-1: all), by the phase of the pass that takes it
    (scheduler.py): within its due share (phase 3), any unallocated work and the allocated work
    its victim limits allow (victims.py); otherwise (phase 4, asking for unallocated time or
    beyond its due share) only unallocated work, of subtrees richer in all than its own would
    be with it (rules.richer_in_all; its own leaf's too for an allocated request, or any for
    an allocated one that leaves every level within its due share), and an unallocated request
    only the free GPUs beyond the headroom."""
    config = state.config
    tree = state.tree
    if phase == "allocated" and within:
        limits = victims_for(view, tree, config.preemption_hysteresis, config.unallocated_preemption == "fair",
                             w.leaf, w.gpus)

        def phase3(v: Workload) -> bool:
            if not v.allocated:
                return True
            limit = limits.get(v.leaf)
            return limit is not None and v.gpus <= limit.each_gpus

        return phase3, -1
    allocated = phase == "allocated"
    gpus = w.gpus
    h = config.unallocated_hysteresis
    take_any = allocated and (config.unallocated_preemption == "any" or all(
        view.total_fill_at(i, gpus) <= 1.0 + h for i in tree.path_index[w.leaf]))
    richer = {w.leaf} if allocated else set()
    for _, _, ai, bi, others in tree.split_group_index[w.leaf]:
        if take_any or richer_in_all(view, ai, bi, gpus, h):
            richer.update(other for other, _ in others)
    pool = state.cluster.pool(w.gpu_type)
    spare = pool.free_gpus - (0 if allocated else int(config.unallocated_headroom * pool.total_gpus))
    free_limit = -1 if allocated or gpus <= spare else max(spare, 0)
    return (lambda v: not v.allocated and v.leaf in richer), free_limit


def pool_reservation(state: SchedulerState, gpu_type: str, now_s: Seconds,
                     view: FairShareView | None = None) -> Reservation | None:
    """The gang reservation the next pass of ``gpu_type`` would hold (reservation.py), computed
    afresh from the state (its caches neither read nor written)."""
    pool = state.cluster.pool(gpu_type)
    view = view if view is not None else _view(state, gpu_type, now_s)
    config = state.config
    if not config.gang_reservations:
        return None
    fair = config.unallocated_preemption == "fair"

    def limits(leaf: str, gpus: int) -> dict:
        return victims_for(view, state.tree, config.preemption_hysteresis, fair, leaf, gpus)

    return plan_reservation(state, pool, view, now_s, limits, cached=False)


def node_span(names: list[str]) -> str:
    """Node names as ranges: ``H100-040..071, H100-090``."""
    parts: list[str] = []
    run: list[tuple[str, int]] = []
    for name in sorted(names):
        prefix, _, number = name.rpartition("-")
        item = (prefix, int(number)) if number.isdigit() else (name, -1)
        if run and item[1] >= 0 and item[0] == run[-1][0] and item[1] == run[-1][1] + 1:
            run.append(item)
            continue
        if run:
            parts.append(_span(run))
        run = [item]
    if run:
        parts.append(_span(run))
    return ", ".join(parts)


def _span(run: list[tuple[str, int]]) -> str:
    prefix, first = run[0]
    if first < 0:
        return prefix
    width = 3
    last = run[-1][1]
    return f"{prefix}-{first:0{width}d}" + (f"..{last:0{width}d}" if last != first else "")


def _reservation_lines(state: SchedulerState, w: Workload, view: FairShareView, now_s: Seconds,
                       out: dict[str, Any]) -> list[str]:
    """What the pool's gang reservation means for pending ``w`` (none: no line)."""
    reservation = pool_reservation(state, w.gpu_type, now_s, view)
    if reservation is None:
        return []
    pool = state.cluster.pool(w.gpu_type)
    names = [pool.nodes[i].name for i in sorted(reservation.nodes)]
    span = node_span(names)
    when = "now" if reservation.until_s <= now_s else f"in {format_duration_s(reservation.until_s - now_s)}"
    out["reservation"] = {"workload_id": reservation.workload_id, "project": reservation.leaf, "nodes": names,
                          "until_s": reservation.until_s}
    if reservation.workload_id == w.id:
        return [f"Reserved for it: {span}, free of protected work {when}; until then only work that will be "
                f"preemptible by then, unallocated work and requests of teams before {w.leaf} start there."]
    if keeps_off(reservation, w, view, now_s):
        return [f"It may not start on {span}: they are reserved for {reservation.workload_id} "
                f"({reservation.leaf}), free of protected work {when}, and its protection would last past that."]
    return []


#: rejected candidates the sentence names (the reason keeps a few more: rejected.SHOWN)
SENTENCE_NAMES = 3


def clock_time(at_s: Seconds) -> str:
    """A moment of the log's clock (epoch seconds) as a UTC time of day, "14:03:30" (pure: the
    moment is an argument; the CLI and the dashboard print UTC too; no datetime in the core)."""
    of_day = int(at_s) % 86400
    return f"{of_day // 3600:02d}:{of_day % 3600 // 60:02d}:{of_day % 60:02d}"


def notice_lines(state: SchedulerState, w: Workload, now_s: Seconds, out: dict[str, Any]) -> list[str]:
    """A victim under notice ("notified at 14:02:00, checkpointing, GPUs free by 14:03:30 at the
    latest") or a preemptor awaiting victims under notice (waiting for their GPUs); [] otherwise."""
    notice = w.notice
    if notice is not None:
        out["notice"] = {"by": notice.by, "notified_s": notice.notified_s, "deadline_s": notice.deadline_s,
                         "checkpointed_s": notice.checkpointed_s}
        by = f" for {notice.by}" if notice.by else ""
        if notice.checkpointed_s is not None:
            return [f"Preempted with notice: notified at {clock_time(notice.notified_s)}, checkpointed at "
                    f"{clock_time(notice.checkpointed_s)}; its GPUs go{by} in the next pass, all its progress kept "
                    f"({notice.reason.message})."]
        return [f"Preempted with notice: notified at {clock_time(notice.notified_s)}, checkpointing, GPUs free"
                f"{by} by {clock_time(notice.deadline_s)} at the latest (in {format_duration_s(max(0, notice.deadline_s - now_s))}; "
                f"killed then, keeping its last periodic checkpoint, unless it reports its checkpoint first). "
                f"{notice.reason.message}."]
    plan = w.plan
    if w.state == AWAITING and plan is not None:
        victims = sorted(plan.victims)
        deadlines = [state.workloads[v].notice.deadline_s for v in victims
                     if v in state.workloads and state.workloads[v].notice is not None]
        latest = max(deadlines) if deadlines else now_s
        out.update(waiting_for_notice=victims, nodes=[n.name for n in plan.nodes],
                   starts_by_s=latest if deadlines else None)
        return [f"Waiting for the GPUs of {', '.join(victims) or 'its victims'} under notice on "
                f"{node_span([n.name for n in plan.nodes])} (they are writing their checkpoints; the GPUs are held "
                f"for it): it starts when they report them, by {clock_time(latest)} at the latest."]
    return []


def rejected_sentence(reason: Any) -> str:
    """One sentence of a preemption's reason (a ``PreemptionReason`` or the JSON of one): how many
    other running workloads the decision considered and spared, and why the closest were spared,
    from the reason's ``rejected`` candidates ("" when it has none: the simulator's, or a
    decision of an older placement)."""
    if isinstance(reason, dict):
        reason = msgspec.convert(reason, ev.PreemptionReason)
    considered = reason.considered
    if considered is msgspec.UNSET:
        return ""
    if not considered:
        return "No other running workload could have gone instead."
    closest = "; ".join(f"{c.workload_id} ({c.project}, {c.gpus} GPUs on {c.node}): {c.message}"
                        for c in reason.rejected[:SENTENCE_NAMES])
    others = "other running workload was" if considered == 1 else "other running workloads were"
    return f"{considered} {others} considered and spared; the closest: {closest}."


def explain(state: SchedulerState, workload_id: str, now_s: Seconds, last_preemption: Any = None) -> dict[str, Any]:
    """Why ``workload_id`` waits, runs or was preempted: ``{"state", "summary", ...numbers}``.

    ``last_preemption`` is the reason of its latest ``workload.preempted`` event, if any (the
    state keeps no history; the caller's projection does)."""
    w = state.workloads.get(workload_id)
    if w is None:
        raise KeyError(workload_id)
    view = _view(state, w.gpu_type, now_s)
    window = format_duration_s(state.config.lookback_window_s)
    out: dict[str, Any] = {"workload_id": w.id, "state": w.state, "project": w.leaf, "gpu_type": w.gpu_type,
                           "gpus": w.gpus, "levels": _levels(view, w.leaf), "window": window}
    lines: list[str] = []
    if last_preemption is not None:
        out["last_preemption"] = last_preemption
        spared = rejected_sentence(last_preemption)
        lines.append(f"Last preempted: {getattr(last_preemption, 'message', '')}" + (f". {spared}" if spared else ""))
    if w.state == PENDING:
        order = queue_order(state, w.gpu_type, now_s)
        position = next(i for i, (_, x) in enumerate(order) if x.id == w.id) + 1
        phase = next(p for p, x in order if x.id == w.id)
        rooms = room_by_depth(view, state.tree, w.leaf, state.config.unallocated_preemption == "fair")
        within = phase == "allocated" and w.gpus <= rooms[-1]
        may_take, free_limit = _victim_rules(state, view, w, phase, within)
        at_s, blocker = _earliest_room_s(state, w, now_s, may_take, free_limit)
        out.update(position=position, queued=len(order), phase=phase, within_due_share=within,
                   ahead=[x.id for _, x in order[:position - 1]][:20],
                   earliest_room_in_s=None if at_s == math.inf else at_s - now_s, waiting_for=blocker)
        leaf_level = out["levels"][-1]
        lines.append(f"Pending: {position} of {len(order)} in the order the scheduler takes them "
                     f"({'allocated requests first' if phase == 'allocated' else 'after every allocated request'}).")
        lines.append(f"{w.leaf} runs {leaf_level['running_gpus']} allocated GPUs of the {leaf_level['due_gpus']:.1f} "
                     f"it is due now (usage ratio over {window}: "
                     f"{'none' if leaf_level['ratio'] is None else format(leaf_level['ratio'], '.2f')}).")
        if phase == "unallocated":
            pool = state.cluster.pool(w.gpu_type)
            headroom_gpus = int(state.config.unallocated_headroom * pool.total_gpus)
            lines.append("It asks for unallocated time (minimum runtime 0 or no budget): it starts on free GPUs "
                         "or on unallocated work of teams that run more of their share, and may be preempted "
                         "by any allocated request."
                         + (f" Unallocated work leaves {headroom_gpus} {w.gpu_type} GPUs free for funded work "
                            f"to start on (the headroom; {pool.free_gpus} are free now)." if headroom_gpus else ""))
        elif within:
            lines.append("It is within its team's due share: it may preempt unallocated work and allocated work "
                         "past its minimum runtime of teams above their due share.")
        else:
            lines.append(f"It is larger than its team's due share now ({rooms[-1]:.1f} GPUs): it waits for "
                         "free GPUs or unallocated work, unless its team has not used its share of the window.")
        if at_s == math.inf and _earliest_room_s(state, w, now_s)[0] == math.inf:
            lines.append(f"No healthy {w.gpu_type} nodes can hold {w.gpus} GPUs.")
        elif at_s == math.inf:
            # the sentence above says what it may take; none of that makes room now
            lines.append("No preemption can make room for it now; it starts when other work ends.")
        elif at_s <= now_s:
            lines.append(f"GPUs enough for it are free or held by work that may be preempted now"
                         + ("; it goes in the next pass its turn comes" if position > 1 else "") + ".")
        else:
            unit = "whole nodes" if w.gpus > state.cluster.pool(w.gpu_type).gpus_per_node else "GPUs on one node"
            lines.append(f"It needs {w.gpus} {w.gpu_type} {unit}; the earliest they can be freed is in "
                         f"{format_duration_s(at_s - now_s)}, when the protection of {blocker} ends.")
        if phase == "allocated":
            lines += _reservation_lines(state, w, view, now_s, out)
    elif w.state == AWAITING:
        lines += notice_lines(state, w, now_s, out)
    elif w.state == RUNNING and w.notice is not None:
        out.update(allocated=w.allocated, nodes=[n.name for n, _ in w.placement])
        lines += notice_lines(state, w, now_s, out)
    elif w.state == RUNNING:
        out.update(allocated=w.allocated, protected_until_s=w.protected_until_s, nodes=[n.name for n, _ in w.placement])
        if not w.allocated:
            lines.append("Running on unallocated time: charged to no budget, never protected; any allocated request "
                         "may preempt it.")
        elif w.protected_until_s is not None and w.protected_until_s > now_s:
            lines.append(f"Running on allocated time, protected for {format_duration_s(w.protected_until_s - now_s)} "
                         f"more (its minimum runtime); after that it runs while {w.leaf} stays within its due share.")
        else:
            lines.append(f"Running on allocated time past its minimum runtime: a request of a team below its due "
                         f"share may preempt it while {w.leaf}'s side runs above its own due share.")
    else:
        lines.append(f"{w.state.capitalize()}.")
    out["summary"] = " ".join(lines)
    return out
