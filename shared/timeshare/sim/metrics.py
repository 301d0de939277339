"""Metrics of a run, computed from its event stream (as Ai2 counted them).

* occupancy = busy GPU-s / GPU-s of nodes in service (healthy or still draining);
* unallocated_share = unallocated GPU-s / delivered GPU-s;
* queue waits: submit -> first start per workload; requeue waits (requeue or resubmission ->
  next start) are reported apart. Work still pending at the end counts with the wait so far
  (censored), so starved work is not hidden;
* attainment counts funded work only (a workload with a minimum runtime > 0 on a team with a
  budget), under every policy: unallocated time is free capacity promised to no one.
  owed(team, hour) = min(fraction x pool GPUs x 1 h, GPU-h the team's funded workloads asked
  for in that hour, pending or running); delivered = GPU-h its funded workloads ran;
  attainment = sum of min(delivered, owed) / sum of owed. ``attainment_all_work`` (and per team
  ``attainment_all_work``, ``owed_all_work_gpu_hours``, ``delivered_all_work_gpu_hours``) is the
  same counting every workload as asking and as delivered: shown for comparison, never a target;
* a drain needs a human when its node could not be emptied within the cap on minimum runtime
  without ending work the policy forbids preempting.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Callable, Iterable

from msgspec import UNSET

from .. import events as ev
from ..rules import runs_allocated
from ..tree import AllocationTree
from ..units import Seconds
from ..workload import WorkloadSpec

HOUR_S = 3600


def percentiles(values: list[float]) -> dict[str, Seconds]:
    # (Seconds, not float: "count" is an int, and a compiled build would make a float of it)
    if not values:
        return {"count": 0, "mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    xs = sorted(values)
    n = len(xs)

    def pct(p: float) -> float:
        # nearest-rank percentile: the smallest value with at least p% of values at or below it
        return float(xs[max(0, math.ceil(p / 100 * n) - 1)])

    return {"count": n, "mean": round(sum(xs) / n, 3), "p50": pct(50), "p90": pct(90), "p99": pct(99),
            "max": float(xs[-1])}


def _covered_s(hour: int, span_s: tuple[float, float]) -> float:
    """Seconds of ``hour`` inside ``span_s``."""
    return max(0.0, min((hour + 1) * HOUR_S, span_s[1]) - max(hour * HOUR_S, span_s[0]))


def _hour_bins() -> dict[int, float]:
    # a named function, not a lambda: the ledger pickles its collector into a checkpoint
    return defaultdict(float)


class _Rate:
    """One key's rate: GPUs now, since when, and its hourly bins (None until it first ran)."""

    __slots__ = ("rate", "since", "bins")

    def __init__(self) -> None:
        self.rate = 0
        self.since = 0.0
        self.bins: dict[int, float] | None = None


class _Rates:
    """Integrates piecewise-constant rates per key into hourly bins."""

    __slots__ = ("bins", "_of")

    def __init__(self) -> None:
        #: keys: (leaf, GPU type), or a GPU type; a key's bins appear when its rate first ran
        #: (or when read as ``bins[key]``: the ledger's report adds stored hours so)
        self.bins: dict[object, dict[int, float]] = defaultdict(_hour_bins)
        # one cell per key (a change reads and writes it: one lookup of a tuple key, not five)
        self._of: dict[object, _Rate] = {}

    @property
    def rate(self) -> dict[object, int]:
        """GPUs now per key (a copy, for reports and tests)."""
        return {key: cell.rate for key, cell in self._of.items()}

    def change(self, key: object, t: float, delta: int) -> None:
        cell = self._of.get(key)
        if cell is None:
            cell = self._of[key] = _Rate()
        r = cell.rate
        if r:
            t0 = cell.since
            bins = cell.bins if cell.bins is not None else self._bins_of(key, cell)
            h = int(t0 // HOUR_S)
            if t <= (h + 1) * HOUR_S:
                # within one hour (most changes): _integrate's single step, inline
                if t0 < t:
                    bins[h] += r * (t - t0)
            else:
                _integrate(bins, t0, t, r)
        cell.rate = r + delta
        cell.since = t

    def close(self, t: float) -> None:
        for key, cell in list(self._of.items()):
            if cell.rate:
                bins = cell.bins if cell.bins is not None else self._bins_of(key, cell)
                _integrate(bins, cell.since, t, cell.rate)
                cell.since = t

    def _bins_of(self, key: object, cell: _Rate) -> dict[int, float]:
        """The key's bins, made when its rate first ran (or taken if already read as bins[key])."""
        bins = cell.bins = self.bins[key]
        return bins

    def restart_at(self, t: float) -> None:
        """Every key that runs now counts from ``t`` on (the time before it is not binned)."""
        for cell in self._of.values():
            if cell.rate:
                cell.since = t

    def copy(self) -> _Rates:
        """A copy that changes apart from this one (its bins too)."""
        out = _Rates()
        for key, bins in self.bins.items():
            out.bins[key].update(bins)
        for key, cell in self._of.items():
            c = out._of[key] = _Rate()
            c.rate, c.since, c.bins = cell.rate, cell.since, out.bins.get(key)
        return out


def _integrate(bins: dict[int, float], t0: float, t1: float, r: int) -> None:
    h = int(t0 // HOUR_S)
    while t0 < t1:
        edge = min(t1, (h + 1) * HOUR_S)
        bins[h] += r * (edge - t0)
        t0 = edge
        h += 1


class MetricsCollector:
    def __init__(self, tree: AllocationTree, pool_gpus: dict[str, int], max_min_runtime_s: int):
        self.pool_gpus = pool_gpus
        self.max_min_runtime_s = max_min_runtime_s
        self.specs: dict[str, WorkloadSpec] = {}
        self.resubmit_of: dict[str, str | None] = {}
        self.submit_s: dict[str, float] = {}
        self.requeued_at: dict[str, float] = {}
        self.first_wait: dict[str, float] = {}
        self.requeue_waits: list[float] = []
        self.requeue_waits_by_kind: dict[str, list[float]] = defaultdict(list)
        self.running: dict[str, tuple[float, int, bool, str, str, str]] = {}
        self.start_s: float = 0.0  # when the counting starts (start())
        self.busy_gpu_s = 0.0
        self.unallocated_gpu_s = 0.0
        self.delivered = _Rates()   # (leaf, pool) -> running GPUs
        self.demand = _Rates()      # (leaf, pool) -> pending or running GPUs
        # the same for funded work only (min runtime > 0 on a budget; delivered as allocated)
        self.delivered_funded = _Rates()
        self.demand_funded = _Rates()
        self.in_service = _Rates()  # pool -> GPUs of nodes in service
        self.preemptions = 0
        self.preemptions_by_reason: dict[str, int] = defaultdict(int)
        self.wasted_gpu_s = 0.0
        self.lost_gpu_s = 0.0
        self.checkpoint_gpu_s = 0.0
        self.notices = 0
        self.after_notice: dict[str, int] = defaultdict(int)
        self.sessions_preempted = 0
        self.sessions_state_lost = 0
        self.drains = 0
        self.drains_needing_human = 0
        self.node_failures = 0
        self.completed = 0
        self.ended_other: dict[str, int] = defaultdict(int)
        self.events = 0
        self.node_pool: dict[str, str] = {}
        self.out_of_service: set[str] = set()
        self.node_gpus: dict[str, int] = {}
        self._take_tree(tree)
        self._handlers: dict[type, Callable[[Any, float], None]] = {
            ev.WorkloadSubmitted: self._submitted, ev.WorkloadStarted: self._started,
            ev.WorkloadPreempted: self._preempted, ev.WorkloadRequeued: self._requeued,
            ev.WorkloadCompleted: self._completed, ev.WorkloadFailed: self._failed_or_cancelled,
            ev.WorkloadCancelled: self._failed_or_cancelled, ev.NodeUnhealthy: self._node_unhealthy,
            ev.NodeFailed: self._node_failed, ev.NodeDrained: self._node_drained,
            ev.NodeRepaired: self._node_repaired, ev.WorkloadPreemptionNotice: self._noticed,
        }

    def start(self, t: float, nodes: dict[str, tuple[str, int]]) -> None:
        self.start_s = t
        for name, (pool, gpus) in sorted(nodes.items()):
            self.node_pool[name] = pool
            self.node_gpus[name] = gpus
            self.in_service.change(pool, t, gpus)

    def _stop_running(self, wid: str, t: float) -> float:
        start, gpus, allocated, leaf, pool, _ = self.running.pop(wid)
        ran = (t - start) * gpus
        self.busy_gpu_s += ran
        if not allocated:
            self.unallocated_gpu_s += ran
        self.delivered.change((leaf, pool), t, -gpus)
        if self._funded(self.specs[wid]):
            self.delivered_funded.change((leaf, pool), t, -gpus)
        return t - start

    def _end(self, wid: str, t: float) -> None:
        spec = self.specs[wid]
        self.demand.change((spec.project, spec.gpu_type), t, -spec.gpus)
        if self._funded(spec):
            self.demand_funded.change((spec.project, spec.gpu_type), t, -spec.gpus)

    def _take_tree(self, tree: AllocationTree) -> None:
        self.tree = tree
        #: each tree node's fraction, read per event by _funded (a budget if > 0)
        self._fraction = {path: node.fraction for path, node in tree.nodes.items()}

    def _funded(self, spec: WorkloadSpec) -> bool:
        # a project the tree no longer (or never) names has no budget: its work is unallocated
        fraction = self._fraction.get(spec.project)
        return fraction is not None and runs_allocated(spec.min_runtime_s, fraction)

    def set_tree(self, tree: AllocationTree, t: float, live: Iterable[str]) -> None:
        """A budget change at ``t``: funded from then on as ``tree`` says. ``live``: the workloads
        submitted and not ended (what the funded counts hold now). Those whose project gains or
        loses its budget move between the funded counts at ``t``, so that each one's end takes
        away what the counts hold (funded is asked of the tree at the end as at the start); the
        time before keeps what it was (a team added to the tree is owed from its first minute)."""
        was_funded = [(wid, self._funded(self.specs[wid])) for wid in live]
        self._take_tree(tree)
        for wid, was in was_funded:
            spec = self.specs[wid]
            now = self._funded(spec)
            if now == was:
                continue
            sign = 1 if now else -1
            self.demand_funded.change((spec.project, spec.gpu_type), t, sign * spec.gpus)
            run = self.running.get(wid)
            if run is not None:
                self.delivered_funded.change((run[3], run[4]), t, sign * run[1])

    def observe(self, e: ev.Event) -> None:
        self.events += 1
        # by the event's type (a third of a run's events are min_runtime_reached, counted only)
        handler = self._handlers.get(type(e))
        if handler is not None:
            handler(e, e.at_ms / 1000)

    def _submitted(self, e: ev.WorkloadSubmitted, t: float) -> None:
        spec = e.workload
        self.specs[spec.id] = spec
        self.submit_s[spec.id] = t
        self.resubmit_of[spec.id] = e.resubmit_of
        self.demand.change((spec.project, spec.gpu_type), t, spec.gpus)
        if self._funded(spec):
            self.demand_funded.change((spec.project, spec.gpu_type), t, spec.gpus)

    def _started(self, e: ev.WorkloadStarted, t: float) -> None:
        wid = e.workload_id
        spec = self.specs[wid]
        if wid in self.requeued_at:
            wait = t - self.requeued_at.pop(wid)
            self.requeue_waits.append(wait)
            self.requeue_waits_by_kind[spec.kind].append(wait)
        elif wid not in self.first_wait:
            wait = t - self.submit_s[wid]
            if self.resubmit_of[wid]:
                self.requeue_waits.append(wait)
                self.requeue_waits_by_kind[spec.kind].append(wait)
            self.first_wait[wid] = wait
        self.running[wid] = (t, e.gpus, e.allocated, e.project, e.gpu_type, spec.kind)
        self.delivered.change((e.project, e.gpu_type), t, e.gpus)
        if self._funded(spec):
            self.delivered_funded.change((e.project, e.gpu_type), t, e.gpus)

    def _preempted(self, e: ev.WorkloadPreempted, t: float) -> None:
        self._stop_running(e.workload_id, t)
        self.preemptions += 1
        self.preemptions_by_reason[e.reason.kind] += 1
        # waste = progress lost + GPU time spent writing checkpoints on notice (reported apart)
        checkpoint_gpu_s = e.checkpoint_gpu_s if e.checkpoint_gpu_s is not UNSET else 0
        self.wasted_gpu_s += e.lost_gpu_s + checkpoint_gpu_s
        self.lost_gpu_s += e.lost_gpu_s
        self.checkpoint_gpu_s += checkpoint_gpu_s
        if e.checkpointed is not UNSET:
            self.after_notice[("checkpointed" if e.checkpointed else "killed_at_deadline")] += 1
        if self.specs[e.workload_id].kind == "interactive":
            self.sessions_preempted += 1
            if e.state_saved is not True:
                self.sessions_state_lost += 1
        if not e.resumable:
            self._end(e.workload_id, t)
            self.ended_other["preempted"] += 1

    def _noticed(self, e: ev.WorkloadPreemptionNotice, t: float) -> None:
        self.notices += 1

    def _requeued(self, e: ev.WorkloadRequeued, t: float) -> None:
        self.requeued_at[e.workload_id] = t

    def _completed(self, e: ev.WorkloadCompleted, t: float) -> None:
        self._stop_running(e.workload_id, t)
        self._end(e.workload_id, t)
        self.completed += 1

    def _failed_or_cancelled(self, e: ev.WorkloadFailed | ev.WorkloadCancelled, t: float) -> None:
        wid = e.workload_id
        if wid in self.running:
            ran = self._stop_running(wid, t)
            if isinstance(e, ev.WorkloadFailed):
                self.wasted_gpu_s += ran * self.specs[wid].gpus
        self.requeued_at.pop(wid, None)
        self._end(wid, t)
        self.ended_other["failed" if isinstance(e, ev.WorkloadFailed) else "cancelled"] += 1

    def _node_unhealthy(self, e: ev.NodeUnhealthy, t: float) -> None:
        self.drains += 1
        self.drains_needing_human += int(e.needs_human)

    def _node_failed(self, e: ev.NodeFailed, t: float) -> None:
        self.node_failures += 1
        self._out_of_service(e.node, t)

    def _node_drained(self, e: ev.NodeDrained, t: float) -> None:
        self._out_of_service(e.node, t)

    def _node_repaired(self, e: ev.NodeRepaired, t: float) -> None:
        if e.node in self.out_of_service:
            self.out_of_service.discard(e.node)
            self.in_service.change(self.node_pool[e.node], t, self.node_gpus[e.node])

    def attainment_of(self, delivered: _Rates, demand: _Rates, since_h: float = -math.inf,
                      span_s: tuple[float, float] | None = None) -> tuple[dict[str, dict], dict]:
        """Per team and fleet-wide: owed and delivered GPU-hours and attainment of one counting
        (``delivered_funded`` / ``demand_funded`` for the target), over the hours that end after
        ``since_h``. The one definition: the simulator's metrics and the ledger's live report
        both call it. ``span_s`` (start, end) is what the counting covers: an hour it covers in
        part entitles a team to that part of its share (a live report ten minutes into an hour
        owes ten minutes' worth, not an hour's)."""
        teams: dict[str, dict] = {}
        owed_total = got_total = 0.0
        rated: list[float] = []
        for leaf in self.tree.leaves:
            owed_h = delivered_h = got_h = 0.0
            fraction = self.tree.nodes[leaf].fraction
            for pool, gpus in self.pool_gpus.items():
                entitled = fraction * gpus * HOUR_S
                d_bins = delivered.bins.get((leaf, pool), {})
                for h, asked in demand.bins.get((leaf, pool), {}).items():
                    if h + 1 <= since_h:
                        continue
                    owed = min(entitled if span_s is None else fraction * gpus * _covered_s(h, span_s), asked)
                    owed_h += owed
                    got_h += min(d_bins.get(h, 0.0), owed)
                for h, got in d_bins.items():
                    if h + 1 > since_h:
                        delivered_h += got
            owed_total += owed_h
            got_total += got_h
            attainment = round(got_h / owed_h, 6) if owed_h else None
            if attainment is not None:
                rated.append(attainment)
            teams[leaf] = {"owed_gpu_hours": round(owed_h / HOUR_S, 3),
                           "delivered_gpu_hours": round(delivered_h / HOUR_S, 3), "attainment": attainment}
        fleet = {
            "fleet": round(got_total / owed_total, 6) if owed_total else None,
            "min_team": min(rated) if rated else None,
            "teams_at_or_above_95": sum(1 for a in rated if a >= 0.95),
            "teams": len(rated),
        }
        return teams, fleet

    def _out_of_service(self, node: str, t: float) -> None:
        if node not in self.out_of_service:
            self.out_of_service.add(node)
            self.in_service.change(self.node_pool[node], t, -self.node_gpus[node])

    def finish(self, end_s: float, wall_s: float, simulated_s: Seconds) -> dict:
        for wid in list(self.running):
            self._stop_running(wid, end_s)
        for rates in (self.delivered, self.demand, self.delivered_funded, self.demand_funded):
            rates.close(end_s)
        self.in_service.close(end_s)

        waits: list[float] = []
        by_kind: dict[str, list[float]] = defaultdict(list)
        still_pending = 0
        for wid, spec in self.specs.items():
            if self.resubmit_of[wid]:
                if wid not in self.first_wait:
                    self.requeue_waits.append(end_s - self.submit_s[wid])
                continue
            wait = self.first_wait.get(wid)
            if wait is None:
                wait = end_s - self.submit_s[wid]
                still_pending += 1
            waits.append(wait)
            by_kind[spec.kind].append(wait)
        for wid, t in self.requeued_at.items():
            self.requeue_waits.append(end_s - t)

        span_s = (self.start_s, end_s)
        funded_teams, funded = self.attainment_of(self.delivered_funded, self.demand_funded, span_s=span_s)
        all_teams, all_work = self.attainment_of(self.delivered, self.demand, span_s=span_s)
        teams: dict[str, dict] = {}
        for leaf in self.tree.leaves:
            f, a = funded_teams[leaf], all_teams[leaf]
            teams[leaf] = {
                "fraction": round(self.tree.nodes[leaf].fraction, 6),
                # funded work only: what the budgets promise (the target)
                "owed_gpu_hours": f["owed_gpu_hours"],
                "delivered_gpu_hours": f["delivered_gpu_hours"],
                "attainment": f["attainment"],
                # every workload, unallocated ones included: shown, never a target
                "owed_all_work_gpu_hours": a["owed_gpu_hours"],
                "delivered_all_work_gpu_hours": a["delivered_gpu_hours"],
                "attainment_all_work": a["attainment"],
            }
        in_service_gpu_s = sum(sum(b.values()) for b in self.in_service.bins.values())
        return {
            "occupancy": round(self.busy_gpu_s / in_service_gpu_s, 6) if in_service_gpu_s else 0.0,
            "unallocated_share": round(self.unallocated_gpu_s / self.busy_gpu_s, 6) if self.busy_gpu_s else 0.0,
            "delivered_gpu_hours": round(self.busy_gpu_s / HOUR_S, 3),
            "queue_wait_s": {
                "overall": percentiles(waits),
                "by_kind": {k: percentiles(v) for k, v in sorted(by_kind.items())},
                "requeue": percentiles(self.requeue_waits),
                "requeue_by_kind": {k: percentiles(v) for k, v in sorted(self.requeue_waits_by_kind.items())},
                "still_pending": still_pending,
            },
            "preemptions": self.preemptions,
            "preemptions_by_reason": dict(sorted(self.preemptions_by_reason.items())),
            "wasted_gpu_hours": round(self.wasted_gpu_s / HOUR_S, 3),
            # its two parts, and per 1,000 GPU-hours delivered; notices given and how they ended;
            # interactive sessions preempted and those whose state was lost
            "waste": {"lost_gpu_hours": round(self.lost_gpu_s / HOUR_S, 3),
                      "checkpoint_gpu_hours": round(self.checkpoint_gpu_s / HOUR_S, 3),
                      "per_1000_delivered_gpu_hours": round(1000 * self.wasted_gpu_s / self.busy_gpu_s, 3)
                      if self.busy_gpu_s else 0.0},
            "notices": {"given": self.notices, **dict(sorted(self.after_notice.items()))},
            "sessions": {"preempted": self.sessions_preempted, "state_lost": self.sessions_state_lost},
            "teams": teams,
            # funded work only (min runtime > 0 on a budget), asked for and delivered: what the
            # budgets promise, and the target
            "attainment": funded,
            # the same counting every workload: shown for comparison, never a target
            "attainment_all_work": all_work,
            "drains": {"total": self.drains, "needing_human": self.drains_needing_human},
            "node_failures": self.node_failures,
            "workloads": {"submitted": len(self.specs), "completed": self.completed,
                          **dict(sorted(self.ended_other.items())), "still_pending": still_pending},
            "sim": {"wall_s": round(wall_s, 3), "events": self.events, "simulated_s": simulated_s},
        }
