"""Why a preemption spared the others: the running workloads a victim search considered and did
not take, each with the rule or the step of the search that spared it (issue 14: "each
preemption records ... the candidates rejected and why").

Run only when a policy is asked for it (``BudgetPolicy(explain_rejected=True)``: the live
placement; the simulator leaves it off and its events do not change), at the moment of the
decision, before the pass applies it: the fills, protections and nodes are the ones the search
saw. It decides nothing and repeats no rule: it asks the victim rules' own ``VictimRules`` (victims.py) whether
a workload may go (``may_preempt``), the rule functions of rules.py which condition refused it,
and placement.find_victims what its node could have given; rules.node_rank says which node won.

Candidates are sorted closest call first (tiers below, then a number of the tier, then id) and
at most :data:`SHOWN` are kept, with the count of all considered:

0. it may go, but its node ranked lower or cheaper work on its node sufficed;
1. it may go, but its node could not serve the request (reserved for a gang, unhealthy, too
   full of work that may not go, a subtree cap);
2. its subtree may lose GPUs, but fewer than it holds;
3. its subtree may lose nothing to this request (not above its due share, used less of its
   window share, the request beyond the preemptor's due share, not richer in all);
4. protected (its minimum runtime), the nearest end first;
5. never for this request (opted out, the preemptor's own leaf, a request that takes only
   unallocated work).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import msgspec

from . import events as ev
from .cluster import Node, Pool
from .durations import format_duration_s
from .placement import find_victims, lost_gpu_s
from .rules import above_due_share, node_rank, room_by_depth, runs_allocated
from .state import SchedulerState, Workload
from .units import Seconds

if TYPE_CHECKING:
    from .victims import VictimRules

#: rejected candidates a decision keeps (the closest calls; ``considered`` counts them all)
SHOWN = 6


class _Verdict:
    """One candidate's reason while they are sorted."""

    __slots__ = ("tier", "distance", "candidate")

    def __init__(self, tier: int, distance: float, candidate: ev.RejectedCandidate):
        self.tier = tier
        self.distance = distance
        self.candidate = candidate

    def key(self) -> tuple[int, float, str]:
        return self.tier, self.distance, self.candidate.workload_id


def _num(x: float, digits: int = 6) -> float | None:
    return round(x, digits) if math.isfinite(x) else None


def _pct(x: float) -> str:
    return f"{x:.0%}" if math.isfinite(x) else "all (nothing due)"


def _remaining(s: Seconds) -> str:
    """A time left, to the millisecond below a second (the live placement's clock is in ms)."""
    return f"{int(round(s * 1000))} ms" if s < 1 else format_duration_s(s)


def window_name(window_s: int) -> str:
    """The lookback window as a sentence names it (``7-day``)."""
    return f"{window_s // 86400}-day" if window_s % 86400 == 0 else format_duration_s(window_s)


def rejected_candidates(state: SchedulerState, pool: Pool, w: Workload, victims: list[Workload], nodes: list[Node],
                        rules: "VictimRules", exclude: frozenset[int], reserved_for: str | None,
                        hysteresis: float, fair: bool, free_limit: int = -1,
                        shown: int = SHOWN) -> tuple[int, tuple[ev.RejectedCandidate, ...]]:
    """The running workloads of ``pool`` other than ``victims`` that the decision to preempt
    ``victims`` for ``w`` (starting on ``nodes``) did not take: (how many, the ``shown`` closest
    calls with why). ``rules`` is the search's own (same victims allowed, same costs); the
    state must be as the search saw it (before the decision is applied)."""
    ctx = _Context(state, pool, w, victims, nodes, rules, exclude, reserved_for, hysteresis, fair, free_limit)
    taken = {v.id for v in victims}
    verdicts: list[_Verdict] = []
    running = state.running
    for wid in sorted(running):
        v = running[wid]
        if v.gpu_type != pool.gpu_type or wid in taken:
            continue
        verdicts.append(ctx.spared(v) if rules.may_preempt(v) else ctx.refused(v))
    verdicts.sort(key=_Verdict.key)
    return len(verdicts), tuple(x.candidate for x in verdicts[:shown])


def with_rejected(reason: ev.PreemptionReason, found: tuple[int, tuple[ev.RejectedCandidate, ...]] | None
                  ) -> ev.PreemptionReason:
    """``reason`` carrying the rejected candidates (unchanged when none were asked for)."""
    if found is None:
        return reason
    return msgspec.structs.replace(reason, considered=found[0], rejected=found[1])


class _Context:
    __slots__ = ("state", "pool", "w", "victims", "nodes", "rules", "exclude", "reserved_for", "hysteresis",
                 "fair", "free_limit", "view", "tree", "now_s", "splits", "rooms", "chosen_lost", "window", "plans")

    def __init__(self, state: SchedulerState, pool: Pool, w: Workload, victims: list[Workload], nodes: list[Node],
                 rules: "VictimRules", exclude: frozenset[int], reserved_for: str | None, hysteresis: float,
                 fair: bool, free_limit: int):
        self.state = state
        self.pool = pool
        self.w = w
        self.victims = victims
        self.nodes = nodes
        self.rules = rules
        self.exclude = exclude
        self.reserved_for = reserved_for
        self.hysteresis = hysteresis
        self.fair = fair
        self.free_limit = free_limit
        self.view = rules.view
        self.tree = state.tree
        self.now_s: Seconds = rules.now_s
        #: other leaf -> (a, b, index of a, index of b): where its path and the preemptor's part
        self.splits = {other: (a, b, ai, bi) for other, a, b, ai, bi in state.tree.split_index[w.leaf]}
        self.rooms = room_by_depth(self.view, state.tree, w.leaf, fair)
        self.chosen_lost = int(round(sum(lost_gpu_s(v, self.now_s) for v in victims)))
        self.window = window_name(state.config.lookback_window_s)
        #: node index -> the search's plan on that node alone (None: none) and whether a cap refused one
        self.plans: dict[int, tuple[tuple[list[Node], list[Workload]] | None, bool]] = {}

    def _candidate(self, v: Workload, reason: str, message: str, **numbers: object) -> ev.RejectedCandidate:
        node = v.placement[0][0].name if v.placement else ""
        return ev.RejectedCandidate(workload_id=v.id, project=v.leaf, gpus=v.gpus, node=node, reason=reason,
                                    message=message, **numbers)  # type: ignore[arg-type]

    # -- refused by a rule: may_preempt said no ------------------------------------------------
    def refused(self, v: Workload) -> _Verdict:
        w, view, h = self.w, self.view, self.hysteresis
        if v.non_preemptible:
            return _Verdict(5, 0, self._candidate(v, "non_preemptible", "it opted out of preemption"))
        if v.notice is not None:
            return _Verdict(5, 0, self._candidate(
                v, "under_notice", "it is under notice already: its GPUs are promised "
                                   + (f"to {v.notice.by}" if v.notice.by else "to no one (a drain)")))
        if not self.state.may_take(v):
            return _Verdict(4, 0, self._candidate(
                v, "storage", "its checkpoint on notice would not fit the checkpoint bandwidth now (rule "
                              "\"storage\"): a later pass"))
        if v.allocated and v.is_protected(self.now_s):
            until = v.protected_until_s if v.protected_until_s is not None else self.now_s
            return _Verdict(4, until, self._candidate(
                v, "protected", f"protected for {_remaining(until - self.now_s)} more (its minimum runtime)",
                protected_until_ms=self.state.ms(until)))
        if not v.allocated:
            return self._refused_unallocated(v)
        if self.rules.unallocated_from is not None:
            # phase 4: a request beyond its due share (or asking for unallocated time)
            what = "is beyond its due share" if runs_allocated(w.min_runtime_s, self.tree.nodes[w.leaf].fraction) \
                else "asks for unallocated time"
            return _Verdict(5, 0, self._candidate(
                v, "only_unallocated", f"{w.id} {what}: it may take only unallocated work, and {v.id} runs on "
                                       f"allocated time"))
        split = self.splits.get(v.leaf)
        if split is None:
            return _Verdict(5, 0, self._candidate(
                v, "same_leaf", f"it runs in {w.leaf} too: fair share moves no GPUs inside a leaf"))
        a, b, ai, bi = split
        depth = a.count("/")
        gpus = w.gpus
        room = self.rooms[depth]
        fill_a = view.fill_at(ai, gpus)
        fill_b = view.fill_at(bi)
        ratio_a = view.ratio_at(ai)
        ratio_b = view.ratio_at(bi)
        due_b = view.due_at(bi)
        numbers: dict[str, object] = {"subtree": b, "fill": _num(fill_b), "ratio": _num(ratio_b),
                                      "due_gpus": _num(due_b, 3), "preemptor_fill": _num(fill_a),
                                      "preemptor_ratio": _num(ratio_a)}
        limit = self.rules.victims_of.get(v.leaf)
        if limit is not None:  # its subtree may lose GPUs, fewer than it holds
            may_lose = limit.each_gpus
            return _Verdict(2, v.gpus - may_lose, self._candidate(
                v, "subtree_cap", f"{b} may lose at most {may_lose} GPUs to {w.id} and still run no less of its due "
                                  f"share than {a} (at {_pct(fill_a)} with the request); {v.id} holds {v.gpus}",
                may_lose_gpus=may_lose, **numbers))
        if self.state.lost_at_ms.get(w.leaf) == self.state.ms(self.now_s):
            return _Verdict(3, 0, self._candidate(
                v, "no_cascade", f"{w.leaf} lost work to another team's request at this instant: it preempts "
                                 f"nothing now (it looks again within a minute)", **numbers))
        if gpus > room:
            within_what = "already runs at least its due share" if room <= 0 else \
                f"may take {room:.1f} GPUs within its due share"
            return _Verdict(3, gpus - room, self._candidate(
                v, "beyond_due_share", f"{a} {within_what}, so {w.id} ({gpus} GPUs) may take nothing of {b}",
                **numbers))
        if not above_due_share(view, bi, h):
            return _Verdict(3, 1.0 + h - fill_b, self._candidate(
                v, "not_above_due_share", f"{b} runs {_pct(fill_b)} of its due share ({view.running_at(bi)} of "
                                          f"{due_b:.1f} GPUs), not above it by more than the hysteresis {h}",
                **numbers))
        path = self.tree.path_index[v.leaf]
        for d in range(depth + 1, len(path)):
            i = path[d]
            if not above_due_share(view, i, h):
                inner = self.tree.node_paths[i]
                return _Verdict(3, 1.0 + h - view.fill_at(i), self._candidate(
                    v, "not_above_due_share", f"{inner} runs {_pct(view.fill_at(i))} of its due share "
                                              f"({view.running_at(i)} of {view.due_at(i):.1f} GPUs), not above it by "
                                              f"more than the hysteresis {h}: work within its due share is never taken",
                    **numbers))
        return _Verdict(2, v.gpus, self._candidate(
            v, "subtree_cap", f"{b} would end below {a} (at {_pct(fill_a)} with the request) after losing any of it",
            may_lose_gpus=0, **numbers))

    def _refused_unallocated(self, v: Workload) -> _Verdict:
        w = self.w
        split = self.tree.divergence(w.leaf, v.leaf)
        if split is None:
            return _Verdict(5, 0, self._candidate(
                v, "same_leaf", f"it runs in {w.leaf} too, and {w.id} asks for unallocated time: no share "
                                f"changes hands"))
        a, b = split
        hysteresis = self.state.config.unallocated_hysteresis
        total_a = self.view.total_fill(a, w.gpus)
        total_b = self.view.total_fill(b)
        before_a = self.view.total_fill(a)
        return _Verdict(3, before_a + hysteresis - total_b, self._candidate(
            v, "not_richer", f"{b} runs {_pct(total_b)} of its due share in all: not more than {a} "
                             f"({_pct(before_a)}) by the hysteresis {hysteresis}, or it would end below {a} "
                             f"with {w.id} ({_pct(total_a)})",
            subtree=b, fill=_num(total_b), preemptor_fill=_num(total_a)))

    # -- allowed by the rules, spared by the search --------------------------------------------
    def spared(self, v: Workload) -> _Verdict:
        lost = int(round(lost_gpu_s(v, self.now_s)))
        if self.w.gpus > self.pool.gpus_per_node:
            return self._spared_by_gang(v, lost)
        best: _Verdict | None = None
        for node, _ in v.placement:
            verdict = self._spared_on(v, node, lost)
            if best is None or verdict.key() < best.key():
                best = verdict
        assert best is not None  # a running workload holds GPUs on some node
        return best

    def _spared_on(self, v: Workload, node: Node, lost: int) -> _Verdict:
        w, gpus = self.w, self.w.gpus
        chosen = self.nodes[0]
        if node.index in self.exclude:
            return _Verdict(1, lost, self._candidate(
                v, "reserved_node", f"a gang reservation holds {node.name} for {self.reserved_for}", lost_gpu_s=lost))
        if node.state != "healthy":
            return _Verdict(1, lost, self._candidate(
                v, "node_unavailable", f"{node.name} is {node.state}", lost_gpu_s=lost))
        found = self.plans.get(node.index)
        if found is None:
            capped: list[bool] = []
            # the search itself, on this node alone: what it could have taken there
            found = self.plans[node.index] = (find_victims(
                self.state, self.pool, gpus, self.rules.may_preempt, self.rules.cost, only=[node],
                exclude=self.exclude, caps=self.rules.caps, by_fit=True, capped=capped, free_limit=self.free_limit,
                fill_after=self.rules.fill_after, side_caps=self.rules.side_caps),
                bool(capped))
        plan = found[0]
        if plan is None:
            if found[1]:
                return _Verdict(1, lost, self._candidate(
                    v, "subtree_cap_on_node", f"on {node.name}, freeing {gpus} GPUs would take more from a subtree "
                                              f"than it may lose", lost_gpu_s=lost))
            held = node.gpus - node.free - sum(n for wid, n in node.holders.items()
                                               if self.rules.may_preempt(self.state.workloads[wid]))
            return _Verdict(1, lost, self._candidate(
                v, "node_short", f"{node.name} could not hold {gpus} GPUs even with it gone: {held} of its "
                                 f"{node.gpus} GPUs hold work that may not go", lost_gpu_s=lost))
        there = plan[1]
        ids = ", ".join(x.id for x in there)
        if all(x.id != v.id for x in there):
            where = f"the request fitted on {node.name} with cheaper work ({ids or 'free GPUs'})" if node is chosen \
                else f"on {node.name} cheaper work ({ids or 'free GPUs'}) would go first, and {chosen.name} ranked first"
            return _Verdict(0, lost, self._candidate(v, "cheaper_on_node", where, lost_gpu_s=lost,
                                                     chosen_lost_gpu_s=self.chosen_lost))
        return _Verdict(0, lost, self._candidate(v, "ranked_lower", self._ranked(node, there, chosen),
                                                 lost_gpu_s=lost,
                                                 chosen_lost_gpu_s=self.chosen_lost))

    def _rank(self, node: Node, victims: list[Workload]) -> tuple:
        """rules.node_rank of a plan, from its victims (as find_victims ranks a node)."""
        free = node.free if self.free_limit < 0 or node.free <= self.free_limit else self.free_limit
        worst = max((self.rules.cost(x) for x in victims), default=(-1,))
        beyond = free + sum(x.gpus for x in victims) - self.w.gpus
        lost_by_group: dict[str, int] = {}
        for x in victims:
            group = self.rules.cap(x)
            if group is not None:
                on_node = next((len(ids) for nd, ids in x.placement if nd is node), x.gpus)
                lost_by_group[group[0]] = lost_by_group.get(group[0], 0) + on_node
        floor = min((self.rules.fill_after(g, n) for g, n in sorted(lost_by_group.items())), default=math.inf)
        return node_rank(worst, beyond, sum(lost_gpu_s(x, self.now_s) for x in victims), len(victims), node.index,
                         floor)

    def _ranked(self, node: Node, there: list[Workload], chosen: Node) -> str:
        """Which criterion of rules.node_rank put ``chosen`` before ``node``."""
        mine, theirs = self._rank(chosen, self.victims), self._rank(node, there)
        if mine[0] != theirs[0]:
            return f"{chosen.name} needed only unallocated work, {node.name} allocated work"
        if mine[1] != theirs[1]:
            return (f"{chosen.name} ranked first: its victims lose {mine[1]:g} GPU-s of progress, those on {node.name} "
                    f"(with it) {theirs[1]:g}")
        if mine[2] != theirs[2]:
            return (f"{chosen.name} ranked first: its victims leave their team at {-mine[2]:.0%} of its due share "
                    f"at the lowest, those on {node.name} at {-theirs[2]:.0%}")
        if mine[3] != theirs[3]:
            return (f"{chosen.name} ranked first: it frees {mine[3]} GPUs beyond the request, {node.name} "
                    f"{theirs[3]}")
        if mine[4] != theirs[4]:
            return f"{chosen.name} ranked first: {mine[4]} victims against {theirs[4]} on {node.name}"
        return (f"{chosen.name} and {node.name} lose the same progress ({mine[1]:g} GPU-s); {chosen.name} ranked "
                f"first by its victims' order and node index")

    def _spared_by_gang(self, v: Workload, lost: int) -> _Verdict:
        rules = self.rules
        workloads = self.state.workloads
        taken = {x.id for x in self.victims}
        for node, _ in v.placement:
            if node.index in self.exclude:
                return _Verdict(1, lost, self._candidate(
                    v, "reserved_node", f"a gang reservation holds {node.name} for {self.reserved_for}",
                    lost_gpu_s=lost))
            if node.state != "healthy":
                return _Verdict(1, lost, self._candidate(v, "node_unavailable", f"{node.name} is {node.state}",
                                                         lost_gpu_s=lost))
            held = [wid for wid in sorted(node.holders) if wid not in taken and not rules.may_preempt(workloads[wid])]
            if held:
                return _Verdict(1, lost, self._candidate(
                    v, "gang_node_held", f"{self.w.id} needs whole nodes, and {node.name} also holds {held[0]}, "
                                         f"which may not go", lost_gpu_s=lost))
        # placement's gang search ranks nodes by their dearest victim's cost (rules.victim_cost:
        # unallocated work first, then the progress lost), then prefers one rack
        worst = max(rules.cost(x) for x in self.victims)
        node = v.placement[0][0]
        dearest = max(rules.cost(workloads[wid]) for wid in node.holders)
        took = f"{self.w.id} took {len(self.nodes)} whole nodes"
        if worst[0] != dearest[0]:
            why = f"{took} that held only unallocated work; {node.name} holds allocated work"
        elif worst[1] != dearest[1]:
            why = (f"{took} whose dearest victim loses {worst[1]:g} GPU-s of progress; on {node.name} "
                   f"{dearest[-1]} would lose {dearest[1]:g}")
        else:
            why = f"{took} costing as much as {node.name}, in one rack or by node order"
        return _Verdict(0, lost, self._candidate(v, "ranked_lower", why, lost_gpu_s=lost,
                                                 chosen_lost_gpu_s=self.chosen_lost))
