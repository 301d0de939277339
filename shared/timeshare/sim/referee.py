"""The referee: what a user would call a broken promise, read from the event log and the scenario.

It shares no code with the rules (rules.py, scheduler.py, fairshare.py): it rebuilds who runs
where from the events alone, computes each subtree's fraction from the scenario's shares, and
reports, each with the events that show it:

* **take-back**: a leaf that lost work to another leaf's request preempts that leaf's work
  within one ``max_min_runtime``, while, where their paths part, the two sides' standings moved
  in the first taker's favour since by no more than the hysteresis (the taker's fill gained
  plus the loser's fill lost, a fill being the GPUs a side runs over the GPUs it is due, as the
  design defines the due share from the window's usage; allocated GPUs and
  ``preemption_hysteresis`` for fair share, all GPUs and ``unallocated_hysteresis`` for the
  unallocated tier): standings that other starts and ends, or the window, moved may be
  rebalanced;
* **cascade**: a leaf that lost work to another leaf's request preempts at that same instant;
* (notices: a decision against a victim that declared a notice is its
  ``workload.preemption_notice``, the loss its ``workload.preempted``; until then its GPUs are
  busy, and the free GPUs of its preemptor's nodes that its victims will not bring are held for
  the preemptor, which is pending no longer; the standings a take-back is judged by count every
  decided move as done, as the design's view does: a victim under notice runs no more, its
  awaiting preemptor runs already; an exchange's standings are those right after its decision,
  so what moves while its victim writes its checkpoint moves the standings since);
* (in both, an allocated request taking unallocated work is what the contract allows at any
  time, and is neither a loss nor a preemption that counts);
* **not served** (``catch_up = 0``): a pending allocated request stays pending over 60 s while
  it could have started: its leaf, and every level from where its path parts from a victim's,
  would run with it at most its fraction of the pool, and a node (whole nodes, for a gang)
  holds enough GPUs that are free, run unallocated work, or run allocated work past its
  minimum runtime of subtrees that run above their fraction by more than the hysteresis, and
  keep at least their fraction after the loss, at every level from where the paths part down
  to the victim's leaf (Kueue's "less than or equal to final share" at its most demanding),
  unless a pending gang of another leaf, or of its own leaf ahead of it, may hold a reservation
  (what each subtree runs counts every decided move as done, as for a take-back);
* **idle**: free GPUs of healthy nodes fit a pending request for over 60 s, except an
  unallocated request kept off the headroom, and an allocated request while a whole-node gang
  is pending in the pool (a reservation may hold the nodes for it);
* **unfair tier**: two sibling leaves with equal shares above 0, neither of which ran allocated work
  in the window, where for over an hour the poorer one's
  request could have taken one of the richer one's unallocated workloads (at least as large)
  and still run no more than it after, and less than it by the unallocated hysteresis with the
  request (a swap that would only reverse who is richer is no promise);
* **within share taken** (``catch_up = 0``): allocated work is preempted for another leaf's
  allocated request while some subtree from where their paths part down to the victim's leaf
  ran at most its fraction of the pool just before the decision (decided moves counted as
  done, as for a take-back);
* **gang starved** (``catch_up = 0``): a pending allocated whole-node gang stays *entitled*
  for over ``max_min_runtime`` plus one pass (60 s) without starting, while no other allocated
  gang of its pool started (a pool's reservation serves one gang at a time: each start gives
  the next its full term). Entitled: every level of its leaf's path would run, with it, at
  most its fraction of the pool, and enough healthy whole nodes hold only free GPUs,
  unallocated work, and allocated work that "not served" would let go once its minimum
  runtime is over (protections end within ``max_min_runtime``: issue 24's promise that a
  reservation can keep).

Besides the findings, the referee keeps each allocated gang's entitled wait (``gang_waits``:
the time it spent pending while entitled before each start, under any ``catch_up``; with
``catch_up > 0`` the fraction stands in for the due share the policy uses).

``timeshare check SCENARIO EVENTS`` (sim/cli.py) prints the findings (exit 1 when there are any).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Iterable

from msgspec import UNSET

from .. import events as ev
from ..tree import ancestors
from .scenario import Scenario
from ..workload import PRIORITY_RANK

#: how long an entitled request, or a free GPU that fits a request, may wait
SERVE_WITHIN_S = 60
#: how long equal teams' unallocated work may stay unequal
TIER_WITHIN_S = 3600
#: "gang starved": the pass after the last protection ends, on top of max_min_runtime
GANG_PASS_S = SERVE_WITHIN_S


@dataclass
class GangWait:
    """One start of an allocated whole-node gang, and how long it waited for it."""

    workload_id: str
    project: str
    gpus: int
    #: from submission (or requeue) to this start
    wait_s: float
    #: the part of that wait during which the gang was entitled ("gang starved")
    entitled_s: float
    #: the part during which its leaf would have run within its fraction with it (the levels
    #: above and the nodes aside)
    within_s: float
    #: whether this is the workload's first start
    first: bool


@dataclass
class Finding:
    kind: str
    at_s: float
    message: str
    events: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.kind} at {self.at_s:.0f}s: {self.message}" + (
            f" [{', '.join(self.events)}]" if self.events else "")


@dataclass
class _Run:
    leaf: str
    gpu_type: str
    gpus: int
    allocated: bool
    protected_until_ms: int | None
    nodes: list[tuple[str, int]]  # (node, GPUs there)


class _Usage:
    """One subtree's allocated GPUs over time, and their integral (GPU-seconds)."""

    def __init__(self) -> None:
        self.times_ms: list[int] = []
        self.rates: list[int] = []
        self.cums: list[float] = []

    def set(self, at_ms: int, rate: int) -> None:
        if self.times_ms and self.times_ms[-1] == at_ms:
            self.rates[-1] = rate
            return
        cum = self.cum_at(at_ms)
        self.times_ms.append(at_ms)
        self.rates.append(rate)
        self.cums.append(cum)

    def cum_at(self, at_ms: int) -> float:
        i = bisect_right(self.times_ms, at_ms) - 1
        if i < 0:
            return 0.0
        return self.cums[i] + self.rates[i] * (at_ms - self.times_ms[i]) / 1000

    def gpu_s(self, start_ms: int, end_ms: int) -> float:
        return self.cum_at(end_ms) - self.cum_at(start_ms)


@dataclass
class _Node:
    name: str
    gpu_type: str
    gpus: int
    healthy: bool = True
    holders: dict[str, int] = field(default_factory=dict)
    #: free GPUs held for a preemptor awaiting victims under notice
    held: int = 0

    @property
    def free(self) -> int:
        return self.gpus - sum(self.holders.values()) - self.held


def _fractions(allocations: dict[str, float]) -> tuple[dict[str, float], dict[str, float], dict[str, str | None]]:
    """Fraction, share and parent of every node, from the scenario's shares."""
    share = {str(p): float(s) for p, s in allocations.items()}
    parent = {p: (p.rsplit("/", 1)[0] if "/" in p else None) for p in share}
    children: dict[str | None, list[str]] = {}
    for p in sorted(share):
        children.setdefault(parent[p], []).append(p)
    fraction: dict[str, float] = {}

    def assign(siblings: list[str], above: float) -> None:
        total = sum(share[p] for p in siblings)
        for p in siblings:
            fraction[p] = above * share[p] / total if total > 0 else 0.0
            assign(children.get(p, []), fraction[p])

    assign(children.get(None, []), 1.0)
    return fraction, share, parent


class _Stretches:
    """Per pending workload: since when a condition holds, and how long it held before."""

    def __init__(self) -> None:
        self.since: dict[str, int] = {}
        self.before_ms: dict[str, int] = {}

    def hold(self, now_true: set[str], now_ms: int) -> None:
        for wid in list(self.since):
            if wid not in now_true:
                self.before_ms[wid] = self.before_ms.get(wid, 0) + now_ms - self.since.pop(wid)
        for wid in now_true:
            self.since.setdefault(wid, now_ms)

    def total_ms(self, wid: str, now_ms: int) -> int:
        since = self.since.get(wid)
        return self.before_ms.get(wid, 0) + (now_ms - since if since is not None else 0)

    def close(self, wid: str, now_ms: int) -> int:
        """The time the condition held for ``wid`` up to ``now_ms``; forgets ``wid``."""
        total = self.total_ms(wid, now_ms)
        self.since.pop(wid, None)
        self.before_ms.pop(wid, None)
        return total


def _parting(a: str, b: str) -> int:
    """The depth at which the paths of two leaves part (their first differing level)."""
    pa, pb = a.split("/"), b.split("/")
    d = 0
    while d < min(len(pa), len(pb)) and pa[d] == pb[d]:
        d += 1
    return d


class Referee:
    """Reads one run's events in order and collects findings."""

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        policy = scenario.policy
        self.hysteresis = policy.preemption_hysteresis
        self.unallocated_hysteresis = policy.unallocated_hysteresis
        self.max_min_runtime_ms = policy.max_min_runtime_s * 1000
        self.window_ms = policy.lookback_window_s * 1000
        self.catch_up_zero = policy.catch_up == 0
        self.fraction, self.share, self.parent = _fractions(scenario.allocations)
        self.children: dict[str | None, list[str]] = {}
        for p in sorted(self.fraction):
            self.children.setdefault(self.parent[p], []).append(p)
        #: allocated GPUs running over time per (GPU type, subtree): the window's usage
        self.usage: dict[tuple[str, str], _Usage] = {}
        self.leaves = sorted(p for p in self.fraction if not any(q.startswith(p + "/") for q in self.fraction))
        self.pool_gpus = {p.gpu_type: p.nodes * p.gpus_per_node for p in scenario.pools}
        self.gpn = {p.gpu_type: p.gpus_per_node for p in scenario.pools}
        self.headroom = {t: int(policy.unallocated_headroom * g) for t, g in self.pool_gpus.items()}
        self.nodes: dict[str, _Node] = {}
        for p in scenario.pools:
            for i in range(p.nodes):
                name = f"{p.gpu_type}-{i:03d}"
                self.nodes[name] = _Node(name, p.gpu_type, p.gpus_per_node)
        self.specs: dict[str, object] = {}
        self.pending: dict[str, object] = {}
        #: (GPU type, allocated, GPUs) -> pending workloads per project: the waiting checks look
        #: at groups of equal requests, not at each of tens of thousands pending
        self.pending_index: dict[tuple[str, bool, int], dict[str, int]] = {}
        #: pending allocated whole-node gangs (a reservation may hold nodes for them)
        self.pending_gangs: dict[str, object] = {}
        self.pending_since_ms: dict[str, int] = {}
        self.running: dict[str, _Run] = {}
        # per (GPU type, subtree): allocated GPUs and all GPUs running
        self.alloc: dict[tuple[str, str], int] = {}
        #: alloc with every decided move counted as done (_conditions)
        self.alloc_decided: dict[tuple[str, str], int] = self.alloc
        self.total: dict[tuple[str, str], int] = {}
        # the last time each leaf started allocated work (for the tier check's "no allocated use")
        self.last_allocated_ms: dict[str, int] = {}
        # exchanges: (loser leaf, taker leaf) -> (at_ms, tier, taker side GPUs, loser side GPUs)
        self.exchanges: dict[tuple[str, str], tuple[int, str, int, int, str]] = {}
        # leaves that lost work to another leaf's request at the current instant
        self.lost_now: dict[str, str] = {}
        self.now_ms = 0
        self.findings: list[Finding] = []
        # waiting conditions: key -> since (ms)
        self.entitled_since: dict[str, int] = {}
        self.idle_since: dict[tuple, int] = {}
        self.tier_since: dict[tuple, int] = {}
        self.reported: set = set()
        # decisions seen this instant: preemptor id -> counts before its first victim
        self.decision_before: dict[str, dict[tuple[str, str], int]] = {}
        # "gang starved": pending allocated gangs' stretches of being entitled, and of their
        # leaf being within its fraction with them (measured only); per GPU type, when an
        # allocated gang last started
        self.gang_entitled = _Stretches()
        self.gang_within = _Stretches()
        self.gang_started_ms: dict[str, int] = {}
        self.started_before: set[str] = set()
        self.gang_waits: list[GangWait] = []
        #: victims under notice -> their preemptor (None: a drain); preemptors awaiting them ->
        #: (their nodes, GPUs per node)
        self.under_notice: dict[str, str | None] = {}
        self.awaiting: dict[str, tuple[list[str], int]] = {}
        #: victims under notice -> the standings (taker's fill, loser's fill) right after the
        #: decision, for the exchange their loss records
        self.noticed_standings: dict[str, tuple[float, float]] = {}

    # -- reading ---------------------------------------------------------------------------
    def read(self, events: Iterable[ev.Event], end_s: float | None = None) -> list[Finding]:
        instant: list[ev.Event] = []
        for e in events:
            if instant and e.at_ms != instant[0].at_ms:
                self._instant(instant)
                instant = []
            instant.append(e)
        if instant:
            self._instant(instant)
        end_ms = int((end_s if end_s is not None else self.scenario.duration_s) * 1000)
        if end_ms >= self.now_ms:
            self._waits(end_ms, final=True)
        return self.findings

    def _instant(self, events: list[ev.Event]) -> None:
        at_ms = events[0].at_ms
        self._waits(at_ms)
        self.now_ms = at_ms
        self.lost_now = {}
        self.decision_before = {}
        starts = {e.workload_id: e for e in events if isinstance(e, ev.WorkloadStarted)}
        for e in events:
            self._apply(e, starts)
        if self.awaiting or any(n.held for n in self.nodes.values()):
            self._holds()
        self._conditions()

    def _holds(self) -> None:
        """The GPUs held for each awaiting preemptor: on each of its nodes, what it needs there
        beyond what its victims under notice will bring, of the GPUs no one holds."""
        for n in self.nodes.values():
            n.held = 0
        for pid in sorted(self.awaiting):
            names, per_node = self.awaiting[pid]
            for name in names:
                n = self.nodes[name]
                coming = sum(k for wid, k in n.holders.items() if self.under_notice.get(wid, "") == pid)
                n.held += max(0, min(per_node - coming, n.free))

    def _is_allocated_request(self, wid: str, starts: dict[str, ev.WorkloadStarted]) -> bool:
        e = starts.get(wid)
        if e is not None:
            return e.allocated
        spec = self.specs.get(wid)
        return spec is not None and spec.min_runtime_s > 0 and self.fraction.get(spec.project, 0) > 0

    def _charge(self, r: _Run, sign: int) -> None:
        for p in ancestors(r.leaf):
            key = (r.gpu_type, p)
            self.total[key] = self.total.get(key, 0) + sign * r.gpus
            if r.allocated:
                self.alloc[key] = self.alloc.get(key, 0) + sign * r.gpus
                self.usage.setdefault(key, _Usage()).set(self.now_ms, self.alloc[key])

    def _due(self, gpu_type: str) -> dict[str, float]:
        """The GPUs each subtree is due now, by the design's definition (BRIEF.md, "hierarchical
        fair share"): a share weighted by ``1 + catch_up x (1 - usage ratio)`` over the window,
        divided among siblings, the top level dividing the pool. Computed here from the events,
        not by the rules' code."""
        pool = self.pool_gpus[gpu_type]
        now_s = self.now_ms / 1000
        covered_s = max(1.0, min(self.window_ms / 1000, now_s))
        start_ms = self.now_ms - self.window_ms
        catch_up = self.scenario.policy.catch_up
        due: dict[str, float] = {}

        def weight(p: str) -> float:
            entitled = self.fraction.get(p, 0) * pool * covered_s
            if entitled <= 0:
                return 0.0
            track = self.usage.get((gpu_type, p))
            used = track.gpu_s(start_ms, self.now_ms) if track is not None else 0.0
            return self.share[p] * max(0.0, 1.0 + catch_up * (1.0 - used / entitled))

        def divide(siblings: list[str], gpus: float) -> None:
            weights = {p: weight(p) for p in siblings}
            total = sum(weights.values())
            for p in siblings:
                due[p] = gpus * weights[p] / total if total > 0 else 0.0
                divide(self.children.get(p, []), due[p])

        divide(self.children.get(None, []), float(pool))
        return due

    def _fill(self, gpu_type: str, side: str, tier: str, due: dict[str, float], extra: int = 0) -> float:
        d = due.get(side, 0.0)
        return (self._side_counts(gpu_type, side, tier) + extra) / d if d > 0 else math.inf

    def _apply(self, e: ev.Event, starts: dict[str, ev.WorkloadStarted]) -> None:
        if isinstance(e, ev.WorkloadSubmitted):
            self.specs[e.workload.id] = e.workload
            self._pend(e.workload.id, e.workload)
            self.pending_since_ms[e.workload.id] = e.at_ms
        elif isinstance(e, ev.WorkloadPreemptionNotice):
            self._noticed(e, starts)
        elif isinstance(e, ev.WorkloadStarted):
            self.awaiting.pop(e.workload_id, None)
            if e.workload_id in self.pending_gangs:
                self._gang_started(e)
            self._unpend(e.workload_id)
            r = _Run(e.project, e.gpu_type, e.gpus, e.allocated, e.protected_until_ms,
                     [(p.node, len(p.gpu_ids)) for p in e.placement])
            self.running[e.workload_id] = r
            for node, n in r.nodes:
                self.nodes[node].holders[e.workload_id] = n
            self._charge(r, +1)
            if e.allocated:
                self.last_allocated_ms[e.project] = e.at_ms
        elif isinstance(e, ev.WorkloadPreempted):
            self._preempted(e, starts)
        elif isinstance(e, ev.WorkloadRequeued):
            spec = self.specs.get(e.workload_id)
            if spec is not None:
                self._pend(e.workload_id, spec)
                self.pending_since_ms[e.workload_id] = e.at_ms
        elif isinstance(e, (ev.WorkloadCompleted, ev.WorkloadFailed, ev.WorkloadCancelled)):
            self._unpend(e.workload_id)
            self._stop(e.workload_id)
            self.under_notice.pop(e.workload_id, None)
            self.noticed_standings.pop(e.workload_id, None)
            self.awaiting.pop(e.workload_id, None)
        elif isinstance(e, ev.NodeUnhealthy) or isinstance(e, ev.NodeFailed):
            if e.node in self.nodes:
                self.nodes[e.node].healthy = False
            # a preemptor awaiting GPUs there goes back to the queue
            for pid in sorted(self.awaiting):
                if e.node in self.awaiting[pid][0]:
                    del self.awaiting[pid]
                    spec = self.specs.get(pid)
                    if spec is not None:
                        self._pend(pid, spec)
        elif isinstance(e, ev.NodeRepaired):
            if e.node in self.nodes:
                self.nodes[e.node].healthy = True

    def _gang_started(self, e: ev.WorkloadStarted) -> None:
        wid = e.workload_id
        self.gang_waits.append(GangWait(wid, e.project, e.gpus, (e.at_ms - self.pending_since_ms[wid]) / 1000,
                                        self.gang_entitled.close(wid, e.at_ms) / 1000,
                                        self.gang_within.close(wid, e.at_ms) / 1000, wid not in self.started_before))
        self.started_before.add(wid)
        self.gang_started_ms[e.gpu_type] = e.at_ms

    def _pend(self, wid: str, spec) -> None:
        if wid in self.pending:
            return
        self.pending[wid] = spec
        key = (spec.gpu_type, self._allocated_spec(spec), spec.gpus)
        group = self.pending_index.setdefault(key, {})
        group[spec.project] = group.get(spec.project, 0) + 1
        if key[1] and spec.gpu_type in self.gpn and spec.gpus > self.gpn[spec.gpu_type]:
            self.pending_gangs[wid] = spec

    def _unpend(self, wid: str) -> None:
        spec = self.pending.pop(wid, None)
        if spec is None:
            return
        self.pending_gangs.pop(wid, None)
        key = (spec.gpu_type, self._allocated_spec(spec), spec.gpus)
        group = self.pending_index[key]
        group[spec.project] -= 1
        if not group[spec.project]:
            del group[spec.project]
            if not group:
                del self.pending_index[key]

    def _stop(self, wid: str) -> _Run | None:
        r = self.running.pop(wid, None)
        if r is None:
            return None
        for node, _ in r.nodes:
            self.nodes[node].holders.pop(wid, None)
        self._charge(r, -1)
        return r

    def _side_counts(self, gpu_type: str, side: str, tier: str) -> int:
        """The GPUs ``side`` runs in ``tier`` with every decided move counted as done (the design,
        "notices": a victim under notice runs no more, an awaiting preemptor runs already), as
        the rules' view counts them: a decision and its move are one step of the standings."""
        table = self.alloc if tier == "allocated" else self.total
        n = table.get((gpu_type, side), 0)
        for (t, p), k in self._decided_moves(tier):
            if t == gpu_type and p == side:
                n += k
        return n

    def _alloc_decided(self) -> dict[tuple[str, str], int]:
        """``alloc`` with every decided move counted as done (a copy)."""
        counts = dict(self.alloc)
        for key, k in self._decided_moves("allocated"):
            counts[key] = counts.get(key, 0) + k
        return counts

    def _decided_moves(self, tier: str) -> Iterable[tuple[tuple[str, str], int]]:
        """Per (GPU type, subtree) on the way, the GPUs decided moves not yet made change in
        ``tier``: minus each victim under notice, plus each preemptor awaiting its victims."""
        for wid in self.under_notice:
            r = self.running.get(wid)
            if r is not None and (tier != "allocated" or r.allocated):
                for p in ancestors(r.leaf):
                    yield (r.gpu_type, p), -r.gpus
        for wid in self.awaiting:
            spec = self.specs.get(wid)
            if spec is not None and (tier != "allocated" or self._allocated_spec(spec)):
                for p in ancestors(spec.project):
                    yield (spec.gpu_type, p), spec.gpus

    def _noticed(self, e: ev.WorkloadPreemptionNotice, starts: dict[str, ev.WorkloadStarted]) -> None:
        """A decision to preempt a victim with a notice: judged now; it ends at workload.preempted."""
        victim = self.running.get(e.workload_id)
        if victim is None:
            return
        by_id = e.reason.by_workload_id
        # judged as a preemption without notice is: with its victim still running
        self._decide(e.workload_id, e.event_id, e.at_ms, victim, e.reason, starts)
        self.under_notice[e.workload_id] = by_id
        if by_id is not None and e.preemptor_nodes is not UNSET and by_id in self.pending:
            self._unpend(by_id)
            nodes = list(e.preemptor_nodes)
            spec = self.specs[by_id]
            self.awaiting[by_id] = (nodes, spec.gpus if len(nodes) == 1 else spec.gpus // len(nodes))
        sides = self._sides(victim, e.reason, starts)
        if sides is not None and not sides[0]:
            # the exchange's standings are the decision's (its move counted as done): other
            # moves before the loss move the standings since, as they would after it
            assert by_id is not None and e.reason.by_project is not None  # (sides checked them)
            standings = self._standings(victim, by_id, sides)
            self.noticed_standings[e.workload_id] = standings
            self.exchanges[(victim.leaf, e.reason.by_project)] = (e.at_ms, sides[4], *standings, e.event_id)

    def _standings(self, victim: _Run, by_id: str, sides: tuple[bool, int, str, str, str]) -> tuple[float, float]:
        """The taker's and the loser's fills right after a decision between them, every decided
        move counted as done (the preemptor starts in this decision, or awaits its victims under
        notice and is counted already: _side_counts)."""
        _, _, taker_side, loser_side, tier = sides
        spec = self.specs.get(by_id)
        g = spec.gpus if spec is not None and by_id not in self.awaiting else 0
        due = self._due(victim.gpu_type)
        return (self._fill(victim.gpu_type, taker_side, tier, due, g),
                self._fill(victim.gpu_type, loser_side, tier, due))

    def _preempted(self, e: ev.WorkloadPreempted, starts: dict[str, ev.WorkloadStarted]) -> None:
        victim = self.running.get(e.workload_id)
        if victim is None:
            return
        if e.workload_id in self.under_notice:
            # the decision was its notice, judged then; the loss happens now
            self.under_notice.pop(e.workload_id)
            self._lost(e, victim, starts)
            return
        self._decide(e.workload_id, e.event_id, e.at_ms, victim, e.reason, starts)
        self._lost(e, victim, starts)

    def _sides(self, victim: _Run, reason: ev.PreemptionReason,
               starts: dict[str, ev.WorkloadStarted]) -> tuple[bool, int, str, str, str] | None:
        """(contract, parting depth, taker's side, loser's side, tier) of a decision between two
        leaves (None: a drain, or a leaf's own work: no promise between two leaves)."""
        by_id = reason.by_workload_id
        by_leaf = reason.by_project
        if by_id is None or by_leaf is None or by_leaf == victim.leaf or reason.kind not in (
                "fair_share", "unallocated"):
            return None
        by_allocated = self._is_allocated_request(by_id, starts)
        contract = by_allocated and not victim.allocated  # what the contract allows at any time
        d = _parting(by_leaf, victim.leaf)
        return (contract, d, "/".join(by_leaf.split("/")[: d + 1]), "/".join(victim.leaf.split("/")[: d + 1]),
                "allocated" if victim.allocated else "all")

    def _lost(self, e: ev.WorkloadPreempted, victim: _Run, starts: dict[str, ev.WorkloadStarted]) -> None:
        """``e``'s victim stops: a loss of its leaf's to another leaf's request, if it was one."""
        sides = self._sides(victim, e.reason, starts)
        self._stop(e.workload_id)
        if sides is None or sides[0]:
            return
        tier = sides[4]
        by_id, by_leaf = e.reason.by_workload_id, e.reason.by_project
        assert by_id is not None and by_leaf is not None  # (sides checked them)
        self.lost_now[victim.leaf] = e.event_id
        # the sides' standings right after the exchange: those of its notice, if it had one
        standings = self.noticed_standings.pop(e.workload_id, None)
        if standings is None:
            standings = self._standings(victim, by_id, sides)
        self.exchanges[(victim.leaf, by_leaf)] = (e.at_ms, tier, *standings, e.event_id)

    def _decide(self, wid: str, event_id: str, at_ms: int, victim: _Run, reason: ev.PreemptionReason,
                starts: dict[str, ev.WorkloadStarted]) -> None:
        """Judge a decision to preempt ``victim`` (cascade, take-back, within share taken)."""
        by_id = reason.by_workload_id
        by_leaf = reason.by_project
        sides = self._sides(victim, reason, starts)
        if sides is None:
            return
        assert by_id is not None and by_leaf is not None  # (sides checked them)
        contract, d, taker_side, loser_side, tier = sides
        by_allocated = self._is_allocated_request(by_id, starts)
        gpu_type = victim.gpu_type
        if by_id not in self.decision_before:
            # what each subtree runs, every decided move counted as done (as for a take-back)
            self.decision_before[by_id] = self._alloc_decided()
        if not contract:
            # cascade: the preemptor's leaf lost work to another leaf at this instant
            lost_to = self.lost_now.get(by_leaf)
            if lost_to is not None:
                self._find("cascade", f"{by_leaf} lost work at this instant ({lost_to}) and its request "
                                      f"{by_id} preempts {wid} of {victim.leaf}", [lost_to, event_id])
            # take-back: the victim's leaf had taken this leaf's work within max_min_runtime
            before = self.exchanges.get((by_leaf, victim.leaf))
            if before is not None and at_ms - before[0] <= self.max_min_runtime_ms and before[1] == tier:
                _, _, took_fill_then, lost_fill_then, first_event = before
                # this time the roles turn: the victim's side took then, the preemptor's side lost;
                # how far the standings moved since in the first taker's favour (other starts and
                # ends, and the window's drift of what each side is due)
                due = self._due(gpu_type)
                moved = (self._fill(gpu_type, loser_side, tier, due) - took_fill_then) + (
                    lost_fill_then - self._fill(gpu_type, taker_side, tier, due))
                h = self.hysteresis if tier == "allocated" else self.unallocated_hysteresis
                if moved <= h:
                    self._find("take-back", f"{by_leaf} lost work to {victim.leaf} at {before[0] / 1000:.0f}s and "
                                            f"its request {by_id} takes {wid} back", [first_event, event_id])
        if self.catch_up_zero and victim.allocated and by_allocated:
            counts = self.decision_before[by_id]
            pool = self.pool_gpus[gpu_type]
            path = ancestors(victim.leaf)
            for p in path[d:]:
                running = counts.get((gpu_type, p), 0)
                if running <= self.fraction.get(p, 0) * pool + 1e-9:
                    self._find("within share taken", f"{wid} of {victim.leaf} preempted for {by_id} of "
                                                     f"{by_leaf} while {p} ran {running} GPUs, within its fraction "
                                                     f"({self.fraction.get(p, 0) * pool:.2f})", [event_id])
                    break

    def _find(self, kind: str, message: str, events: list[str], at_ms: int | None = None) -> None:
        self.findings.append(Finding(kind, (self.now_ms if at_ms is None else at_ms) / 1000, message, events))

    # -- waiting conditions ----------------------------------------------------------------
    def _waits(self, at_ms: int, final: bool = False) -> None:
        """Conditions that held since the last instant: report those held too long."""
        for wid, since in list(self.entitled_since.items()):
            if wid in self.pending and at_ms - since > SERVE_WITHIN_S * 1000 and ("served", wid) not in self.reported:
                self.reported.add(("served", wid))
                self._find("not served", f"{wid} ({self.pending[wid].project}, {self.pending[wid].gpus} GPUs) "
                                         f"could start from {since / 1000:.0f}s", [], since + SERVE_WITHIN_S * 1000)
        for key, since in list(self.idle_since.items()):
            if at_ms - since > SERVE_WITHIN_S * 1000 and ("idle", key, since) not in self.reported:
                self.reported.add(("idle", key, since))
                self._find("idle", f"free GPUs of {key[0]} fit a pending {key[2]} request of {key[1]} GPUs "
                                   f"from {since / 1000:.0f}s", [], since + SERVE_WITHIN_S * 1000)
        if self.catch_up_zero:
            term_ms = self.max_min_runtime_ms + GANG_PASS_S * 1000
            for wid, since in self.gang_entitled.since.items():
                spec = self.pending.get(wid)
                if spec is None or ("gang", wid) in self.reported:
                    continue
                clock = max(since, self.gang_started_ms.get(spec.gpu_type, since))
                if at_ms - clock > term_ms:
                    self.reported.add(("gang", wid))
                    self._find("gang starved", f"{wid} ({spec.project}, {spec.gpus} GPUs) entitled from "
                                               f"{clock / 1000:.0f}s, no gang of {spec.gpu_type} started since",
                               [], clock + term_ms)
        for key, since in list(self.tier_since.items()):
            if at_ms - since > TIER_WITHIN_S * 1000 and ("tier", key, since) not in self.reported:
                self.reported.add(("tier", key, since))
                self._find("unfair tier", f"{key[1]} and {key[2]} ({key[0]}) ran unequal unallocated work "
                                          f"from {since / 1000:.0f}s", [], since + TIER_WITHIN_S * 1000)

    def _conditions(self) -> None:
        now = self.now_ms
        # entitlement is judged as decisions are: every decided move counted as done (a victim
        # under notice runs no more, an awaiting preemptor runs already)
        self.alloc_decided = self._alloc_decided() if self.under_notice or self.awaiting else self.alloc
        entitled: set[str] = set()
        idle: set[tuple] = set()
        for gpu_type in sorted({k[0] for k in self.pending_index}):
            if gpu_type not in self.pool_gpus:
                continue
            nodes = [n for n in self.nodes.values() if n.gpu_type == gpu_type and n.healthy]
            gpn = self.gpn[gpu_type]
            max_free = max((n.free for n in nodes), default=0)
            whole_free = sum(1 for n in nodes if n.free == n.gpus)
            free_total = sum(n.free for n in nodes)
            gangs_pending = {spec.project for spec in self.pending_gangs.values() if spec.gpu_type == gpu_type}
            for (t, allocated, g), projects in self.pending_index.items():
                if t != gpu_type:
                    continue
                fits_free = (g <= max_free) if g <= gpn else whole_free >= math.ceil(g / gpn)
                if not fits_free:
                    continue
                if allocated:
                    # exempt only while a gang is pending that a reservation may hold nodes for:
                    # another leaf's, or one of the same leaf (its own queue may put it first)
                    exempt = bool(gangs_pending)
                else:
                    exempt = free_total - g < self.headroom[gpu_type]
                if not exempt:
                    idle.add((gpu_type, g, "allocated" if allocated else "unallocated"))
        if self.catch_up_zero:
            for wid, spec in self.pending.items():
                if spec.gpu_type in self.pool_gpus and self._allocated_spec(spec) \
                        and not self._behind_a_gang(wid, spec):
                    nodes = [n for n in self.nodes.values() if n.gpu_type == spec.gpu_type and n.healthy]
                    if self._could_start(spec, nodes, self.gpn[spec.gpu_type]):
                        entitled.add(wid)
        entitled_gangs, within_gangs = self._entitled_gangs()
        self.gang_entitled.hold(entitled_gangs, now)
        self.gang_within.hold(within_gangs, now)
        for wid in list(self.entitled_since):
            if wid not in entitled:
                del self.entitled_since[wid]
        for wid in entitled:
            self.entitled_since.setdefault(wid, now)
        for key in list(self.idle_since):
            if key not in idle:
                del self.idle_since[key]
        for key in idle:
            self.idle_since.setdefault(key, now)
        tier = self._tier_pairs()
        for key in list(self.tier_since):
            if key not in tier:
                del self.tier_since[key]
        for key in tier:
            self.tier_since.setdefault(key, now)

    def _entitled_gangs(self) -> tuple[set[str], set[str]]:
        """Pending allocated gangs that are entitled now (see the module's "gang starved"), and
        those whose leaf would run within its fraction with them (issue 24's words; the levels
        above and the nodes aside: measured, never a finding)."""
        entitled: set[str] = set()
        within: set[str] = set()
        if not self.pending_gangs:
            return entitled, within
        known: dict[tuple[str, str, int], tuple[bool, bool]] = {}
        for wid in sorted(self.pending_gangs):
            spec = self.pending_gangs[wid]
            key = (spec.gpu_type, spec.project, spec.gpus)
            ok = known.get(key)
            if ok is None:
                gpu_type, leaf, g = key
                ok = known[key] = (self._gang_within(gpu_type, ancestors(leaf), g) and self._gang_nodes(*key),
                                   self._gang_within(gpu_type, [leaf], g))
            if ok[0]:
                entitled.add(wid)
            if ok[1]:
                within.add(wid)
        return entitled, within

    def _gang_within(self, gpu_type: str, levels: list[str], g: int) -> bool:
        """Whether each of ``levels`` would run, with ``g`` more GPUs, at most its fraction of
        the pool."""
        if gpu_type not in self.pool_gpus:
            return False
        pool = self.pool_gpus[gpu_type]
        return all(self.alloc_decided.get((gpu_type, p), 0) + g <= self.fraction.get(p, 0) * pool + 1e-9
                   for p in levels)

    def _gang_nodes(self, gpu_type: str, leaf: str, g: int) -> bool:
        """Whether enough healthy whole nodes hold only free GPUs, unallocated work and
        allocated work that may go for ``leaf`` once its minimum runtime is over."""
        pool = self.pool_gpus[gpu_type]
        h = self.hysteresis
        parting_ok: dict[str, tuple[str, ...] | None] = {}

        def sides(r: _Run) -> tuple[str, ...] | None:
            """The victim's levels from the parting down, if its work may go once protection
            ends (None: it stays)."""
            if r.leaf in parting_ok:
                return parting_ok[r.leaf]
            d = _parting(leaf, r.leaf)
            out: tuple[str, ...] | None = tuple(ancestors(r.leaf)[d:])
            for p in out or ():
                if self.alloc_decided.get((gpu_type, p), 0) <= (1 + h) * self.fraction.get(p, 0) * pool + 1e-9:
                    out = None
                    break
            parting_ok[r.leaf] = out
            return out

        need = math.ceil(g / self.gpn[gpu_type])
        chosen = 0
        lost: dict[str, int] = {}
        for n in sorted((n for n in self.nodes.values() if n.gpu_type == gpu_type and n.healthy),
                        key=lambda n: (-n.free, n.name)):
            extra: dict[str, int] = {}
            ok = True
            if n.held:
                continue  # held for a preemptor under notice
            for wid in sorted(n.holders):
                r = self.running[wid]
                if wid in self.under_notice:
                    ok = False
                    break
                if not r.allocated:
                    continue
                s = None if r.leaf == leaf else sides(r)
                if s is None:
                    ok = False
                    break
                for side in s:
                    extra[side] = extra.get(side, 0) + r.gpus
            if not ok or any(lost.get(s, 0) + k > self.alloc_decided.get((gpu_type, s), 0)
                             - self.fraction.get(s, 0) * pool + 1e-9 for s, k in extra.items()):
                continue
            for s, k in extra.items():
                lost[s] = lost.get(s, 0) + k
            chosen += 1
            if chosen >= need:
                return True
        return False

    def _behind_a_gang(self, wid: str, spec) -> bool:
        """Whether a pending gang may hold a reservation that ``spec`` yields to: another leaf's
        (the order between leaves is the policy's to judge), or its own leaf's ahead of it in the
        leaf's own order (priority, then submission)."""
        mine = (-PRIORITY_RANK.get(spec.priority, 1), spec.submit_s, wid)
        for gid, g in self.pending_gangs.items():
            if gid != wid and g.gpu_type == spec.gpu_type and (
                    g.project != spec.project or (-PRIORITY_RANK.get(g.priority, 1), g.submit_s, gid) < mine):
                return True
        return False

    def _allocated_spec(self, spec) -> bool:
        return spec.min_runtime_s > 0 and self.fraction.get(spec.project, 0) > 0

    def _could_start(self, spec, nodes: list[_Node], gpn: int) -> bool:
        """Whether free GPUs, unallocated work, or allocated work the promise lets go could hold
        ``spec`` now (see the module's "not served")."""
        gpu_type = spec.gpu_type
        pool = self.pool_gpus[gpu_type]
        leaf = spec.project
        g = spec.gpus
        if self.alloc_decided.get((gpu_type, leaf), 0) + g > self.fraction.get(leaf, 0) * pool + 1e-9:
            return False
        h = self.hysteresis

        def takeable(wid: str) -> tuple[tuple[str, ...], int] | None:
            """(the victim's levels from the parting down, GPUs) for allocated work that may go;
            ((), n) for unallocated work."""
            r = self.running[wid]
            if wid in self.under_notice:
                return None  # its GPUs are promised to its preemptor
            if not r.allocated:
                return (), r.gpus
            if r.leaf == leaf or (r.protected_until_ms is not None and r.protected_until_ms > self.now_ms):
                return None
            d = _parting(leaf, r.leaf)
            for p in ancestors(leaf)[d:]:
                if self.alloc_decided.get((gpu_type, p), 0) + g > self.fraction.get(p, 0) * pool + 1e-9:
                    return None
            for p in ancestors(r.leaf)[d:]:
                if self.alloc_decided.get((gpu_type, p), 0) <= (1 + h) * self.fraction.get(p, 0) * pool + 1e-9:
                    return None
            return tuple(ancestors(r.leaf)[d:]), r.gpus

        def room(side: str) -> float:
            return self.alloc_decided.get((gpu_type, side), 0) - self.fraction.get(side, 0) * pool

        if g <= gpn:
            for n in nodes:
                have = n.free
                lost: dict[str, int] = {}
                for wid, k in sorted(n.holders.items(), key=lambda x: x[1]):
                    t = takeable(wid)
                    if t is None:
                        continue
                    sides, size = t
                    # every level from the parting down keeps at least its fraction
                    if any(lost.get(side, 0) + size > room(side) + 1e-9 for side in sides):
                        continue
                    for side in sides:
                        lost[side] = lost.get(side, 0) + size
                    have += k
                    if have >= g:
                        return True
                if have >= g:
                    return True
            return False
        need = math.ceil(g / gpn)
        chosen = 0
        lost = {}
        for n in sorted(nodes, key=lambda n: (-n.free, n.name)):
            extra: dict[str, int] = {}
            ok = True
            for wid, _ in n.holders.items():
                t = takeable(wid)
                if t is None:
                    ok = False
                    break
                for side in t[0]:
                    extra[side] = extra.get(side, 0) + t[1]
            if not ok or any(lost.get(s, 0) + k > room(s) + 1e-9 for s, k in extra.items()):
                continue
            for s, k in extra.items():
                lost[s] = lost.get(s, 0) + k
            chosen += 1
            if chosen >= need:
                return True
        return False

    def _tier_pairs(self) -> set[tuple]:
        """Sibling leaves of equal shares, neither having run allocated work within the window,
        where the poorer one's pending unallocated request could take one of the richer one's
        unallocated workloads (as large, or larger) and still run no more than it afterwards,
        while running less than it by more than the hysteresis with the request."""
        out: set[tuple] = set()
        pending_u: dict[tuple[str, str], list[int]] = {}
        for (t, allocated, g), projects in self.pending_index.items():
            if not allocated:
                for project in projects:
                    pending_u.setdefault((t, project), []).append(g)
        if not pending_u:
            return out
        running_u: dict[tuple[str, str], list[int]] = {}
        for r in self.running.values():
            if not r.allocated:
                running_u.setdefault((r.gpu_type, r.leaf), []).append(r.gpus)
        keys = sorted(set(pending_u) | set(running_u))
        for i, (t, a) in enumerate(keys):
            for t2, b in keys[i + 1:]:
                if t2 != t or self.parent.get(a) != self.parent.get(b) or self.share.get(a) != self.share.get(b) \
                        or not self.fraction.get(a, 0) > 0:
                    continue  # (leaves without a share are promised nothing, not even an equal part)
                if any(self.now_ms - self.last_allocated_ms.get(x, -10 ** 15) < self.window_ms for x in (a, b)):
                    continue
                ta, tb = self.total.get((t, a), 0), self.total.get((t, b), 0)
                rich, poor = (a, b) if ta > tb else (b, a)
                t_rich, t_poor = max(ta, tb), min(ta, tb)
                due = self.fraction[a] * self.pool_gpus[t]
                gpn = self.gpn[t]
                if any(v >= g and (g <= gpn or v > gpn) and t_poor + g <= t_rich - v
                       and (t_poor + g) / due + self.unallocated_hysteresis < t_rich / due
                       for g in pending_u.get((t, poor), []) for v in running_u.get((t, rich), [])):
                    out.add((t, a, b))
        return out


def check(scenario: Scenario, events: Iterable[ev.Event], end_s: float | None = None) -> list[Finding]:
    """Every finding of one run (see the module's docstring)."""
    return Referee(scenario).read(events, end_s)
