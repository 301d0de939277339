"""One scheduling pass of the budget policy: snapshot -> order -> fit or preempt -> events.

Phases of a pass (a pure function of the state and ``now_s``; the rules it applies are the
named functions of rules.py, listed with why preemption cannot loop in docs/design/preemption-rules.md;
fills and due shares come from fairshare.py):

1. protection: allocated work whose minimum runtime ended becomes preemptible
   (``workload.min_runtime_reached``);
2. drains: on cordoned nodes, work that may end now is preempted; empty nodes are drained;
3. per GPU type, allocated requests *within due shares* (rules.room_by_depth), the most
   deserving leaf first (re-picked after every start): start on free GPUs, else preempt the
   cheapest eligible victims (unallocated work, or allocated work past its minimum runtime that
   the one rule allows: victims.py), respecting a gang reservation that stands before it;
4. per GPU type, everything else (unallocated requests, allocated requests beyond due
   shares), ordered by all GPUs each subtree runs against its due share; allocated requests
   may preempt any unallocated work (or, with ``unallocated_preemption = "fair"``, their own
   team's, richer subtrees' and any while they stay near their due share), unallocated
   requests only that of subtrees that stay richer (``rules.unallocated_cap_gpus``); unallocated requests
   leave the pool's headroom free (``PolicyConfig.unallocated_headroom``).

A pass walks each queue once; one that preempted is followed at once by another. When no node
changed since the last pass, a pass looks only at work that arrived since (the quick pass, a
rule). Everything else kept between passes (memos of failed searches, walk limits, reservation
times) is a cache: ``BudgetPolicy(reference=True)`` turns them off and decides identically.
"""

from __future__ import annotations

from typing import Any, Final, Iterator

from . import events as ev
from .caches import FailedSearches, covers
from .cluster import Node, Pool
from .config import PolicyConfig
from .durations import format_duration_s
from .fairshare import FairShareView
from .placement import find_victims, takeable_nodes
from .queue import Key, LeafQueue, Limit, walk
from .rejected import rejected_candidates, with_rejected
from .reservation import Reservation, keeps_leaf_off, keeps_off, plan_reservation
from .rules import (RULE_DUE_SHARE, RULE_UNALLOCATED, free_at_s, richer_in_all, room_by_depth, runs_allocated,
                    unallocated_cap_gpus)
from .state import PENDING, SchedulerState, Workload
from .tree import AllocationTree
from .units import Seconds
from .victims import VictimLimit, VictimRules, victims_for


def may_end_now(w: Workload, now_s: Seconds) -> bool:
    """Budget policy: unallocated work always, allocated work once its minimum runtime is over."""
    return not w.allocated or not w.is_protected(now_s)


def drain_blocked_until_s(w: Workload, now_s: Seconds) -> Seconds:
    """When a drain may end ``w`` at the latest under this policy."""
    return free_at_s(w.allocated, w.protected_until_s, now_s)


#: passes of one pool at one instant (see BudgetPolicy.schedule): more would mean a loop
_MAX_PASSES_PER_INSTANT: Final = 50

#: rule "quick pass": a pass may look only at fresh work when no node changed since the last
#: full pass and that pass ran less than this long ago (a request entitled by the window's
#: drift alone waits no longer than this after the next event)
FULL_PASS_EVERY_S: Final = 60

#: rule "no cascade": a pass that held a preemption back runs again this much later (within
#: the minute an entitled request may wait; by then other ends often served it without one)
NO_CASCADE_RETRY_S: Final = 30

class BudgetPolicy:
    """The budget policy. ``reference=True`` runs the same rules with every cache off: no memo of
    failed searches, no walk limits, no reservation times kept between passes, no early outs.
    It decides exactly as the cached policy does (a property test compares their event streams)
    and exists to prove that: every cache only skips work the rules would refuse anyway.

    ``explain_rejected=True`` (the live placement) adds to each preemption's reason the running
    workloads the decision considered and did not take, and why (rejected.py): the same
    decisions, only their reasons say more; the simulator leaves it off."""

    name = "budget"
    #: the simulator's longest stretch without a pass while work is pending (due shares drift
    #: with the window: see FULL_PASS_EVERY_S)
    drift_wake_s = FULL_PASS_EVERY_S

    def __init__(self, reference: bool = False, explain_rejected: bool = False):
        self.reference = reference
        self.explain_rejected = explain_rejected

    def schedule(self, state: SchedulerState, now_s: Seconds) -> list[ev.Event]:
        state.pass_now_s = now_s
        out = state.expire_protection(now_s)
        # victims under notice that checkpointed or reached their deadline end now, and their
        # preemptors start on the GPUs held for them (state.py, "notices")
        out += state.notice_events(now_s)
        out += state.drain_events(now_s, may_end_now)
        cached = not self.reference
        if not cached:
            state.caches.clear()
        for gpu_type, pool in state.cluster.pools.items():
            # a pass walks each queue once; one that preempted may have freed GPUs beyond its
            # need after earlier requests were turned down, so another pass follows at once
            # until one preempts nothing (each preemption moves GPUs to a subtree that ends no
            # higher than its victim's, so this ends; the bound only guards against a bug)
            for _ in range(_MAX_PASSES_PER_INSTANT):
                if not state.pending_by_pool[gpu_type]:
                    break
                made, again = _schedule_pool(state, pool, now_s, cached, self.explain_rejected)
                out += made
                # (and one that gave allocated work beyond a due share GPUs: see _Pass.grew_beyond)
                if not again and not any(isinstance(e, ev.WorkloadPreempted) for e in made):
                    break
                state.pass_seq.pop(gpu_type, None)  # the pass that follows is a full one
        state.tree_changed = False
        return out

    def drain_blocked_until_s(self, w: Workload, now_s: Seconds) -> Seconds:
        return drain_blocked_until_s(w, now_s)


#: "no request failed yet": larger than any request, an int so that limits stay native ints
#: when compiled (a GPU count never comes near it)
_NO_FAILURE: Final = 1 << 60


class _Failed:
    """The smallest request of a leaf and queue class that could neither start nor preempt."""

    __slots__ = ("size",)

    def __init__(self) -> None:
        self.size: int = _NO_FAILURE


#: a placeholder in phase 4's cells of a leaf for a queue class it has no requests of (never written)
_NOT_FAILED: Final = _Failed()


class _KeptOutFailed:
    """Phase 4: the last allocated request of a leaf kept off the reserved nodes that could
    neither start nor preempt, and the pool's change stamp then (as _LeafTurn.kept_out_fail in
    phase 3)."""

    __slots__ = ("size", "seq")

    def __init__(self) -> None:
        self.size: int = _NO_FAILURE
        self.seq = -1


class _Reach:
    """Phase 4: the most GPUs a leaf's requests of one class could reach, free or by preempting
    unallocated work (_reach_bound), for the pool's change stamp and the view's charges then."""

    __slots__ = ("gpus", "seq", "charges", "spare")

    def __init__(self) -> None:
        self.gpus: int = _NO_FAILURE
        self.seq = -1
        self.charges = -1
        self.spare = -1


class _LeafTurn:
    """A leaf's progress through its queue during one pass."""

    __slots__ = ("leaf", "queue", "walker", "preempt_fail", "kept_out_fail", "kept_out_seq", "limits_seq", "room",
                 "fit", "reach_cap", "free_room")

    def __init__(self, leaf: str, queue: LeafQueue):
        self.leaf = leaf
        self.queue = queue  # its allocated requests
        self.walker: Iterator[tuple[Key, int]] | None = None
        self.preempt_fail: int = _NO_FAILURE  # smallest request of this leaf that found no victims
        #: the last request kept off the reserved nodes that could neither start nor preempt,
        #: and the pool's change stamp then: the walk's limit counts reserved GPUs as free, so
        #: without this every later request as large would search again for nothing
        self.kept_out_fail: int = _NO_FAILURE
        self.kept_out_seq = -1
        #: the parts of the walk's limit that only a start or a stop changes (fills, free
        #: GPUs, the queue, who may be preempted: each moves the pool's change stamp), kept
        #: for that stamp: a long run of requests that fail alike asks for the limit each time
        self.limits_seq = -1
        self.room: int | float = 0  # the largest request within the leaf's due share (rules.room_by_depth)
        self.free_room: int | float = 0  # ... within the due share of every level: what free GPUs may serve
        self.fit = 0
        self.reach_cap = -1  # -1: not worked out for this stamp


class _Statement:
    """The one place a pass changes the state: each start or preemption becomes events, applied
    at once (the state evolves only by events) and charged to the pass's fair-share view, so
    later choices in the pass see the new fills. (KAI's Statement also rolls back tentative
    steps; nothing here is tentative: victim searches read the state and change nothing, so a
    plan is either applied whole or not at all.)"""

    __slots__ = ("state", "view", "now_s", "out")

    def __init__(self, state: SchedulerState, view: FairShareView, now_s: Seconds, out: list[ev.Event]):
        self.state = state
        self.view = view
        self.now_s = now_s
        self.out = out

    def start(self, w: Workload, nodes: list[Node]) -> None:
        e = self.state.started(w, nodes, self.now_s)
        self.state.apply(e)
        self.out.append(e)
        self.view.charge(w.leaf, w.gpus, e.allocated)

    def take(self, w: Workload, nodes: list[Node], victims: list[Workload], reasons: list[ev.PreemptionReason],
             charged: bool = False) -> None:
        """Preempt ``victims`` for ``w`` and start it on ``nodes``; victims given a notice keep
        their GPUs until they end (SchedulerState.take), and ``w`` then starts later, on GPUs
        held for it. The pass's view sees the move at once either way (``charged``: the
        victims were charged already)."""
        events, waiting = self.state.take(w, nodes, victims, reasons, self.now_s)
        self.out += events
        if not charged:
            for v in victims:
                self.view.charge(v.leaf, -v.gpus, v.allocated)
        if waiting:
            self.view.charge(w.leaf, w.gpus, runs_allocated(w.min_runtime_s, self.state.tree.nodes[w.leaf].fraction))
        else:
            self.start(w, nodes)


def _charge_notices(state: SchedulerState, view: FairShareView, gpu_type: str) -> None:
    """A pass sees every preemption decided under notice as done: its victims' GPUs as their
    preemptors' (the GPUs move later, the decision was made), so that no later decision counts
    them twice and the one rule's "b ends no lower than a" holds once they have moved."""
    notices = state.notices
    for wid in sorted(notices):
        v = notices[wid]
        if v.gpu_type == gpu_type:
            view.charge(v.leaf, -v.gpus, v.allocated)
    awaiting = state.awaiting
    for wid in sorted(awaiting):
        w = awaiting[wid]
        if w.gpu_type == gpu_type:
            view.charge(w.leaf, w.gpus, runs_allocated(w.min_runtime_s, state.tree.nodes[w.leaf].fraction))


class _Pass:
    """One pass over one pool: what every phase reads, and the rules' helpers bound to it."""

    __slots__ = ("state", "pool", "now_s", "now_ms", "cached", "queues", "view", "out", "statement", "fair",
                 "hysteresis", "reservation", "active", "headroom_gpus", "explain_rejected", "held_back",
                 "grew_beyond")

    def __init__(self, state: SchedulerState, pool: Pool, now_s: Seconds, cached: bool,
                 queues: dict[str, list[LeafQueue | None]], explain_rejected: bool = False):
        self.state = state
        self.pool = pool
        self.now_s = now_s
        self.now_ms = state.ms(now_s)
        self.cached = cached
        #: the pool's queues the pass looks at, by leaf: [unallocated, allocated] (None: none)
        self.queues = queues
        #: whether rule "no cascade" held a preemption back in this pass
        self.held_back = False
        #: allocated work beyond a due share started in phase 4: the fills moved, so a request
        #: within its due share that found no victim in phase 3 may find one now; another full
        #: pass follows at once (whether one failed is not asked: the caches skip some failures
        #: the rules would also refuse, and which passes run must not depend on them)
        self.grew_beyond = False
        #: whether each preemption's reason lists the candidates it did not take (rejected.py)
        self.explain_rejected = explain_rejected
        config = state.config
        self.view = FairShareView(state.tree, state.ledger, pool.gpu_type, pool.total_gpus, now_s, config.catch_up)
        if state.notices or state.awaiting:
            _charge_notices(state, self.view, pool.gpu_type)
        self.out: list[ev.Event] = []
        self.statement = _Statement(state, self.view, now_s, self.out)
        self.fair = config.unallocated_preemption == "fair"
        self.hysteresis = config.preemption_hysteresis
        self.reservation: Reservation | None = None
        #: per tree node (by index): how many of the leaves beneath still have requests to look at
        self.active: list[int] = [0] * len(state.tree.node_paths)
        #: GPUs of the pool that unallocated work leaves free (rule "headroom", config.py)
        self.headroom_gpus = int(config.unallocated_headroom * pool.total_gpus)

    def victims_for(self, leaf: str, gpus: int) -> dict[str, VictimLimit]:
        return victims_for(self.view, self.state.tree, self.hysteresis, self.fair, leaf, gpus)

    def may_preempt_others(self, leaf: str) -> bool:
        """Rule "no cascade": a leaf that lost work to another leaf's request at this instant
        preempts nothing now (but the contract's case: its allocated requests may still take
        unallocated work). A pass that holds one back asks for another NO_CASCADE_RETRY_S later."""
        if self.state.lost_at_ms.get(leaf) != self.now_ms:
            return True
        self.held_back = True
        return False

    def excluded_for(self, w: Workload) -> frozenset[int]:
        """The reserved nodes, if the reservation keeps ``w`` off them (reservation.keeps_off)."""
        reservation = self.reservation
        if reservation is None or not keeps_off(reservation, w, self.view, self.now_s):
            return frozenset()
        return reservation.nodes

    def activate(self, leaf: str, delta: int) -> None:
        active = self.active
        for i in self.state.tree.path_index[leaf]:
            active[i] = active[i] + delta

    def rejected(self, w: Workload, victims: list[Workload], nodes: list[Node],
                 victims_of: dict[str, VictimLimit], exclude: frozenset[int],
                 unallocated_from: dict[str, tuple[str, str]] | None = None, free_limit: int = -1,
                 unallocated_caps: dict[str, tuple[str, int]] | None = None,
                 ) -> tuple[int, tuple[ev.RejectedCandidate, ...]] | None:
        """The candidates a preemption for ``w`` did not take and why, when asked for (None: not
        asked); from the state as the search saw it, so before the decision is applied."""
        if not self.explain_rejected:
            return None
        rules = VictimRules(self.state, self.view, w.leaf, victims_of, unallocated_from, self.now_s, w,
                            unallocated_caps)
        reservation = self.reservation
        return rejected_candidates(self.state, self.pool, w, victims, nodes, rules, exclude,
                                   reservation.workload_id if reservation is not None and exclude else None,
                                   self.hysteresis, self.fair, free_limit)


def _schedule_pool(state: SchedulerState, pool: Pool, now_s: Seconds, cached: bool = True,
                   explain_rejected: bool = False) -> tuple[list[ev.Event], bool]:
    """One pass over one pool, in numbered phases (1 and 2 run for the whole cluster first, in
    BudgetPolicy.schedule): its events, and whether another pass should follow at once
    (``_Pass.grew_beyond``)."""
    found = _requests(state, pool, now_s)
    if found is None:
        return [], False
    queues, any_allocated = found
    p = _Pass(state, pool, now_s, cached, queues, explain_rejected)
    # over all pending work: the most deserving gang's nodes (reservation.py); only allocated
    # requests consult it
    p.reservation = plan_reservation(state, pool, p.view, now_s, p.victims_for, cached=cached) \
        if any_allocated and state.config.gang_reservations else None
    _phase3_within_due_shares(p)
    _phase4_everything_else(p)
    state.pass_seq[pool.gpu_type] = pool.change_seq
    if p.held_back:
        # rule "no cascade" held a preemption back: a full pass looks again a little later
        state.pass_seq.pop(pool.gpu_type, None)
        retry = now_s + NO_CASCADE_RETRY_S
        if state.retry_at_s is None or retry < state.retry_at_s:
            state.retry_at_s = retry
    return p.out, p.grew_beyond


def _requests(state: SchedulerState, pool: Pool,
              now_s: Seconds) -> tuple[dict[str, list[LeafQueue | None]], bool] | None:
    """The queues a pass looks at, by leaf ([unallocated, allocated], as
    SchedulerState.leaf_queues), and whether any asks for allocated time (None: nothing to
    look at)."""
    gpu_type = pool.gpu_type
    workloads = state.workloads
    queues = state.leaf_queues.get(gpu_type)
    if queues is None:
        queues = state.leaf_queues[gpu_type] = {}
    fresh = state.fresh_pending[gpu_type]
    # whether any request of this pass asks for allocated time: only those consult the
    # reservation (phase 3, and excluded_for in phase 4)
    any_allocated = True
    if pool.change_seq == state.pass_seq.get(gpu_type) and not state.tree_changed:
        # rule "quick pass" (Slurm's quick scheduling of new jobs between full passes): when no
        # node of the pool changed since the last pass (no start, stop, end of a protection,
        # cordon or repair) and the tree did not change, the pass looks only at work submitted
        # or requeued since. Everything older was turned down then; it is looked at again at the
        # next change. But due shares drift with the window in between, so an allocated request
        # may become entitled with no node changed: every allocated request is looked at again
        # at the first pass FULL_PASS_EVERY_S after they last were (unallocated requests and
        # requests beyond their due share are owed nothing within a minute; they wait for the
        # next change). This is a rule, not a cache: the reference mode applies it too. A quick
        # pass that preempts changes nodes, so the pass that follows it at once is a full one.
        last_s = state.full_pass_s.get(gpu_type)
        stale = last_s is None or now_s - last_s >= FULL_PASS_EVERY_S
        selected: dict[str, list[LeafQueue | None]] = {}
        any_allocated = False
        if stale:
            state.full_pass_s[gpu_type] = now_s
            for leaf, pair in queues.items():
                whole = pair[1]
                if whole is not None and whole.count:
                    selected[leaf] = [None, whole]
                    any_allocated = True
        for wid in fresh:
            w = workloads[wid]
            if w.state == PENDING:
                slot = 0
                if w.queue_class == "a":
                    if stale:
                        continue  # its leaf's whole queue is looked at already
                    any_allocated = True
                    slot = 1
                picked = selected.get(w.leaf)
                if picked is None:
                    picked = selected[w.leaf] = [None, None]
                q = picked[slot]
                if q is None:
                    q = picked[slot] = LeafQueue()
                q.add(w.gpus, w.key, w.min_runtime_s)
        fresh.clear()
        if not selected:
            return None
        return selected, any_allocated
    state.full_pass_s[gpu_type] = now_s
    fresh.clear()
    return queues, any_allocated


def _phase3_within_due_shares(p: _Pass) -> None:
    """Phase 3: allocated requests within due shares, the most
    deserving leaf first; each starts on free GPUs or preempts the cheapest eligible victims."""
    state, pool, view, statement = p.state, p.pool, p.view, p.statement
    gpu_type = pool.gpu_type
    tree = state.tree
    config = state.config
    cached = p.cached
    queues = p.queues
    workloads = state.workloads
    fair = p.fair
    hysteresis = p.hysteresis
    unprotected = state.unprotected_gpus[gpu_type]
    reservation = p.reservation
    node_paths = tree.node_paths
    active = p.active
    turns: dict[str, _LeafTurn] = {}
    fit_limit = pool.fit_limit()
    open_limit = pool.open_limit()
    now_s = p.now_s
    leaf: str | None  # the leaf the loop serves (None: pick the next)
    for leaf in tree.leaves:
        pair = queues.get(leaf)
        if pair is None:
            continue
        q = pair[1]
        if q is None or not q.count or tree.nodes[leaf].fraction <= 0:
            continue
        min_gpus = q.min_gpus()
        if min_gpus > fit_limit and min_gpus > open_limit:
            continue  # nothing of this leaf can start, even by preempting
        # (not for a leaf that lost work at this instant: its search is held back by rule "no
        # cascade", which asks for a full pass a little later; skipped, it would not ask)
        if cached and min_gpus > fit_limit and reservation is None and state.lost_at_ms.get(leaf) != p.now_ms:
            memo = state.caches.failed.get((gpu_type, leaf, "in"))
            if memo is not None and memo.seq == pool.change_seq and min_gpus >= memo.size and memo.free_limit < 0 \
                    and memo.key == (tuple(p.victims_for(leaf, min_gpus).items()), None, None, state.storage_key()):
                continue  # its smallest request failed already and nothing changed since
        turns[leaf] = _LeafTurn(leaf, q)
        p.activate(leaf, 1)

    # a request that can neither start nor preempt changes no fill and no active leaf, so the
    # same leaf is picked again: pick anew only after a start or when a leaf runs out
    leaf = None
    while True:
        if leaf is None:
            picked = view.pick_at(active)
            if picked < 0:
                break
            leaf = node_paths[picked]
        turn = turns[leaf]
        if turn.walker is None:
            q = turn.queue

            def limit(turn: _LeafTurn = turn, leaf: str = leaf, q: LeafQueue = q) -> float:
                bound = _phase3_limit(state, pool, view, tree, fair, hysteresis, unprotected, turn, leaf, q, cached)
                if cached and turn.kept_out_seq == pool.change_seq and turn.kept_out_fail < bound:
                    # the requests the check below would skip, a whole size at a time
                    kept = _kept_out_bound(p, q, leaf, turn.kept_out_fail, bound)
                    if kept < bound:
                        return kept
                return bound

            if not q.by_size or q.min_gpus() >= limit():
                # the walk's first step without the walk (as in phase 4): nothing below the limit
                p.activate(leaf, -1)
                leaf = None
                continue
            turn.walker = walk([q], limit)
        item = next(turn.walker, None)
        if item is None:
            p.activate(leaf, -1)
            leaf = None
            continue
        key, gpus = item
        w = workloads[key[2]]
        if w.state != PENDING:
            continue  # a quick pass's copy of a workload that already started
        if gpus > turn.room:
            continue  # beyond its due share: phase 4's
        exclude = p.excluded_for(w)
        if cached and exclude and gpus >= turn.kept_out_fail and turn.kept_out_seq == pool.change_seq:
            # nothing started or stopped since a request of this leaf at most as large, kept
            # off the same nodes, found neither free GPUs nor victims (a larger request fits
            # nowhere a smaller one did not, and may preempt no more): this one fails as well
            continue
        nodes = pool.find_free(gpus, exclude)
        if nodes is not None:
            if gpus <= turn.free_room:
                statement.start(w, nodes)
                leaf = None
            # else beyond the due share of a level above the leaf: free GPUs go to it in phase 4
            continue
        capped: list[bool] = []
        # rule "no cascade": a leaf that lost work at this instant may take only unallocated work
        victims_of = p.victims_for(leaf, gpus) if p.may_preempt_others(leaf) else {}
        plan = _preemption_plan(state, pool, view, w, victims_of, now_s, exclude,
                                reservation if exclude else None, cached=cached, capped=capped)
        if plan is None:
            # a larger request of this leaf fails too, unless this one failed only for being
            # kept off the reserved nodes (the gang is not) or for a cap (which depends on the
            # order of costs)
            if not exclude and not capped:
                turn.preempt_fail = gpus
            if exclude and not capped:
                turn.kept_out_fail, turn.kept_out_seq = gpus, pool.change_seq
            continue
        nodes, victims, victims_of = plan
        if not state.storage_admits(victims):
            continue  # rule "storage": their checkpoints would not fit the bandwidth now; a later pass
        # every reason from the numbers the decision was made on (before any victim is charged),
        # each with what its subtree lost to the victims before it in this plan
        lost_before: dict[str, int] = {}
        reasons = []
        spared = p.rejected(w, victims, nodes, victims_of, exclude)
        for v in victims:
            reasons.append(with_rejected(_reason(v, w, victims_of, view, config, lost_before), spared))
        statement.take(w, nodes, victims, reasons)
        leaf = None



def _phase4_everything_else(p: _Pass) -> None:
    """Phase 4: everything else, by all GPUs each subtree runs against its due share."""
    state, pool, view, statement = p.state, p.pool, p.view, p.statement
    gpu_type = pool.gpu_type
    tree = state.tree
    cached = p.cached
    queues = p.queues
    workloads = state.workloads
    reservation = p.reservation
    node_paths = tree.node_paths
    active = p.active
    now_s = p.now_s
    leaf: str | None
    # -- phase 4: everything else (unallocated work, allocated work beyond due shares),
    # ordered by all GPUs each subtree runs (allocated or not) against its due share. An
    # allocated request may preempt any unallocated work (the contract: unallocated time is
    # never protected; with unallocated_preemption = "fair" only as config.py says), taking
    # it from the subtree that runs most for its due share first;
    # an unallocated request only that of subtrees that run more than it would, counting the
    # request, so free capacity is shared fairly ---------------------------------------------
    for i in range(len(active)):
        active[i] = 0  # (all zero already: phase 3 ends when no leaf is active)
    #: per leaf: its queues and their limits, and the walk over them once it yielded (below)
    walks: dict[str, tuple[list[LeafQueue], list[Limit]]] = {}
    walkers: dict[str, Iterator[tuple[Key, int]]] = {}
    #: per leaf, by queue class (unallocated, allocated: as the queues)
    failed: dict[str, list[_Failed]] = {}
    #: per leaf: its last allocated request kept off the reserved nodes that failed (only
    #: allocated requests are kept off, all of queue class "a")
    kept_out: dict[str, _KeptOutFailed] = {}
    unallocated_gpus = state.unallocated_gpus
    headroom = p.headroom_gpus
    for leaf in tree.leaves:
        pair = queues.get(leaf)
        if pair is None:
            continue
        qs: list[LeafQueue] = []
        limits: list[Limit] = []
        kept_cell = _KeptOutFailed()
        cells = [_NOT_FAILED, _NOT_FAILED]
        for slot in (0, 1):
            q = pair[slot]
            if q is None or not q.count:
                continue
            cls = "u" if slot == 0 else "a"
            # unallocated and allocated requests may preempt different victims, so each
            # class keeps its own smallest failed size
            cell = cells[slot] = _Failed()

            def limit4(cell: _Failed = cell, kept: int = headroom if cls == "u" else 0, q: LeafQueue = q,
                       leaf: str = leaf, kept_out_cell: _KeptOutFailed | None = kept_cell if cls == "a" else None,
                       reach: _Reach = _Reach(), allocated: bool = runs_allocated(1 if cls == "a" else 0,
                                                                                tree.nodes[leaf].fraction)
                       ) -> int:
                # max(fit, min(size - 1, open, spare + unallocated)) + 1, in native ints, where
                # spare is the free GPUs beyond the headroom (unallocated requests) or all
                if not cached:
                    return _NO_FAILURE
                cap = cell.size - 1
                open_gpus = pool.open_limit()
                if open_gpus < cap:
                    cap = open_gpus
                spare = pool.free_gpus - kept
                if spare < 0:
                    spare = 0
                reachable = spare + unallocated_gpus[gpu_type]
                if reachable < cap:
                    cap = reachable
                fit = pool.fit_limit()
                if spare < fit:
                    fit = spare
                if cap > fit and cap > spare:
                    # no request larger than the free GPUs it may use and the unallocated work it
                    # may take could start: the victim search would find too few (below)
                    if reach.seq != pool.change_seq or reach.charges != view.charges or reach.spare != spare:
                        reach.gpus = _reach_bound(p, leaf, allocated, spare)
                        reach.seq, reach.charges, reach.spare = pool.change_seq, view.charges, spare
                    if reach.gpus < cap:
                        cap = reach.gpus
                bound = (fit if fit > cap else cap) + 1
                if kept_out_cell is not None and kept_out_cell.seq == pool.change_seq and kept_out_cell.size < bound:
                    # the requests the check in the loop below would skip, a whole size at a time
                    kept_bound = _kept_out_bound(p, q, leaf, kept_out_cell.size, bound)
                    if kept_bound < bound:
                        return kept_bound
                return bound

            qs.append(q)
            limits.append(limit4)
        if not qs:
            continue
        kept_out[leaf] = kept_cell
        failed[leaf] = cells
        walks[leaf] = (qs, limits)
        p.activate(leaf, 1)
    leaf = None  # picked anew only after a start or when a leaf runs out, as in phase 3
    while True:
        if leaf is None:
            picked = view.pick_at(active, True)
            if picked < 0:
                break
            leaf = node_paths[picked]
        walker = walkers.get(leaf)
        if walker is None:
            # the walk's first step without the walk: in most passes most leaves have no request
            # below their limits (walk reads every limit once, then yields the first request of a
            # size below its queue's limit; the limits have no effect but their memos)
            qs, limits = walks[leaf]
            if not any(q.by_size and q.min_gpus() < limit() for q, limit in zip(qs, limits)):
                p.activate(leaf, -1)
                leaf = None
                continue
            walker = walkers[leaf] = walk(qs, limits)
        item = next(walker, None)
        if item is None:
            p.activate(leaf, -1)
            leaf = None
            continue
        key, gpus = item
        w = workloads[key[2]]
        if w.state != PENDING:
            continue
        allocated = runs_allocated(w.min_runtime_s, tree.nodes[leaf].fraction)
        exclude = p.excluded_for(w) if allocated else frozenset()
        kept = kept_out[leaf]
        if cached and exclude and gpus >= kept.size and kept.seq == pool.change_seq:
            # nothing started or stopped since a request of this leaf at most as large, kept off
            # the same nodes, found neither free GPUs nor victims: this one fails as well (as in
            # phase 3; a larger request fits nowhere a smaller one did not, and with fewer
            # subtrees richer may preempt no more)
            continue
        # rule "headroom": unallocated work leaves the pool's headroom free (config.py)
        spare = pool.free_gpus - (0 if allocated else headroom)
        nodes = pool.find_free(gpus, exclude) if gpus <= spare else None
        if nodes is not None:
            statement.start(w, nodes)
            p.grew_beyond = p.grew_beyond or allocated
            leaf = None
            continue
        failed_cell = failed[leaf][0 if w.queue_class == "u" else 1]
        if cached and not state.unallocated_gpus[gpu_type]:
            if not exclude:  # (kept off the reserved nodes, a larger request may still fit: as below)
                failed_cell.size = gpus
            else:
                kept.size, kept.seq = gpus, pool.change_seq
            continue
        total = view.total_fill
        richer, mask, reachable, take_any, free_limit, side_caps = _unallocated_victims(p, w, gpus, allocated, spare)
        capped: list[bool] = []
        plan = (_preemption_plan(state, pool, view, w, {}, now_s, exclude, reservation if exclude else None,
                                 unallocated_from=richer, unallocated_mask=mask, unallocated_caps=side_caps,
                                 memo_space="beyond" if allocated else "free", cached=cached, free_limit=free_limit,
                                 capped=capped)
                if reachable >= gpus or not cached else None)
        # no victims at all, and no cap turned a node down (a capped failure depends on fills and
        # on the order of costs): a larger request kept off the same nodes finds none either
        if plan is None and exclude and not capped:
            kept.size, kept.seq = gpus, pool.change_seq
        if plan is not None and not allocated and sum(v.gpus for v in plan[1]) < gpus - max(spare, 0):
            plan = None  # it would take free GPUs of the headroom
        if plan is None:
            # a larger request of this leaf and class fails too, unless this one failed only for
            # being kept off the reserved nodes: that depends on its own minimum runtime
            # (reservation.keeps_off), and a larger request with a shorter one may use them
            if not exclude:
                failed_cell.size = gpus
            continue
        nodes, victims, _ = plan
        if not state.storage_admits(victims):
            continue  # rule "storage" (as in phase 3; not a failure a larger request would share)
        spared = p.rejected(w, victims, nodes, {}, exclude, richer, free_limit, side_caps)
        reasons: list[ev.PreemptionReason] = []
        for v in victims:
            a, b = richer[v.leaf]
            reason = ev.PreemptionReason(
                kind="unallocated", rule=RULE_UNALLOCATED, by_workload_id=w.id, by_project=w.leaf,
                preemptor_subtree=a, victim_subtree=b,
                preemptor_fill=round(total(a, gpus), 6), victim_fill=round(total(b), 6),
                message=(f"{v.id} ran on unallocated time ({b} ran {total(b):.0%} of its due share in all); "
                     + (f"{w.id} ({w.leaf}) asked for allocated time" if allocated else
                        f"{a} would run {total(a, gpus):.0%} of its due share with {w.id}")))
            reasons.append(with_rejected(reason, spared))
            view.charge(v.leaf, -v.gpus, v.allocated)  # the next reason sees this one gone
        statement.take(w, nodes, victims, reasons, charged=True)
        p.grew_beyond = p.grew_beyond or allocated
        leaf = None


def _unallocated_victims(p: _Pass, w: Workload, gpus: int, allocated: bool, spare: int
                         ) -> tuple[dict[str, tuple[str, str]], int, int, bool, int, dict[str, tuple[str, int]] | None]:
    """Phase 4: whose unallocated work a request may preempt (rules "contract" and "unallocated
    sharing"): any, for an allocated request (the contract), or that of subtrees that run more
    of their due share in all than the requester would with it, by the hysteresis. Returns
    (per such leaf, the two subtrees where the paths part; the same leaves as a bit per tree node
    index, the memo's key; the GPUs free or held by them; whether any unallocated work may go;
    the most free GPUs of a node the request may use, -1: all; per such leaf of another team,
    its subtree b and the most GPUs b may lose and stay at least level, rules.unallocated_cap_gpus:
    None when any unallocated work may go)."""
    state, view = p.state, p.view
    tree = state.tree
    path_index = tree.path_index
    leaf = w.leaf
    config = state.config
    unallocated_hysteresis = config.unallocated_hysteresis
    any_unallocated = config.unallocated_preemption == "any"
    pool = p.pool
    richer: dict[str, tuple[str, str]] = {}
    side_caps: dict[str, tuple[str, int]] = {}
    # an unallocated request may use free GPUs only beyond the headroom
    free_limit = -1 if allocated or gpus <= spare else max(spare, 0)
    reachable = pool.free_gpus if free_limit < 0 else free_limit
    take_any = allocated and (any_unallocated or all(
        # "fair": an allocated request that keeps every subtree above it within its due
        # share plus the hysteresis, in all it runs, still takes any unallocated work
        view.total_fill_at(i, gpus) <= 1.0 + unallocated_hysteresis for i in path_index[leaf]))
    leaf_i = path_index[leaf][-1]
    mask = 0  # the leaves of richer, a bit per node index (the memo's key)
    if allocated and view.unallocated_running_at(leaf_i):
        # its own team's unallocated work: the swap changes no other team's share
        richer[leaf] = (leaf, leaf)
        mask |= 1 << leaf_i
        reachable += view.unallocated_running_at(leaf_i)
    # rule "no cascade": an unallocated request of a leaf that lost work at this instant
    # takes nothing now (an allocated request may still take unallocated work: the contract)
    guarded = not allocated and state.lost_at_ms.get(leaf) == p.now_ms
    for a, b, ai, bi, others in tree.split_group_index[leaf]:
        if view.unallocated_running_at(bi):  # counts add up the tree: some leaf under b runs unallocated work
            # rule "unallocated sharing": b runs more of its due share in all than a would
            # with the request, by the hysteresis, and b stays at least level with a once its
            # victims are gone: the victim search keeps b's loss within unallocated_cap_gpus
            if take_any or richer_in_all(view, ai, bi, gpus, unallocated_hysteresis):
                if guarded:
                    p.held_back = True
                    continue
                most = -1 if take_any else unallocated_cap_gpus(view, ai, bi, gpus)
                if most == 0:
                    continue  # b would end below a whatever it lost
                for other, other_i in others:
                    if view.unallocated_running_at(other_i):
                        richer[other] = (a, b)
                        if most > 0:
                            side_caps[other] = (b, most)
                        mask |= 1 << other_i
                        reachable += view.unallocated_running_at(other_i)
    return richer, mask, reachable, take_any, free_limit, None if take_any else side_caps


def _reach_bound(p: _Pass, leaf: str, allocated: bool, spare: int) -> int:
    """Phase 4: at least the GPUs (free, or held by unallocated work it may take) that
    :func:`_unallocated_victims` finds reachable for any request of ``leaf`` larger than
    ``spare`` (its free GPUs beyond the headroom, at least 0); _NO_FAILURE when no bound holds.

    It is that function's sum for the smallest such request: a larger request counts no more
    free GPUs, makes its side no poorer and no subtree b richer by the hysteresis
    (rules.richer_in_all, a fill that grows with the request), lets b lose no more
    (rules.unallocated_cap_gpus) and keeps every subtree above it within its due share less
    often (take_any), so it reaches no more. A request that reaches fewer GPUs than it asks for
    finds no victims, so the walk need not yield it. Not for a leaf rule "no cascade" guards:
    its search must be reached, to hold the preemption back and ask for the next full pass."""
    state, view, pool = p.state, p.view, p.pool
    tree = state.tree
    config = state.config
    if not allocated and state.lost_at_ms.get(leaf) == p.now_ms:
        return _NO_FAILURE
    gpus = 1 if allocated else spare + 1
    hysteresis = config.unallocated_hysteresis
    reachable = pool.free_gpus if allocated else spare
    take_any = allocated and (config.unallocated_preemption == "any" or all(
        view.total_fill_at(i, gpus) <= 1.0 + hysteresis for i in tree.path_index[leaf]))
    if allocated:
        reachable += view.unallocated_running_at(tree.path_index[leaf][-1])
    for a, b, ai, bi, others in tree.split_group_index[leaf]:
        if view.unallocated_running_at(bi):
            if take_any or richer_in_all(view, ai, bi, gpus, hysteresis):
                if not take_any and unallocated_cap_gpus(view, ai, bi, gpus) == 0:
                    continue
                for other, other_i in others:
                    reachable += view.unallocated_running_at(other_i)
    return reachable


def _phase3_limit(state: SchedulerState, pool: Pool, view: FairShareView, tree: AllocationTree, fair: bool,
                  hysteresis: float, unprotected: dict[str, int], turn: _LeafTurn, leaf: str,
                  q: LeafQueue, cached: bool = True) -> int | float:
    """One more than the largest request of ``leaf`` that phase 3 could start now: within its
    due share (the rule), and no larger than free GPUs plus what it may preempt (or than its
    last failure: caches, off in the reference mode)."""
    if turn.limits_seq != pool.change_seq or not cached:
        turn.limits_seq = pool.change_seq
        rooms = room_by_depth(view, tree, leaf, fair)
        turn.room = rooms[-1]
        turn.free_room = rooms[0]
        if not cached:
            return turn.room + 1
        turn.fit = pool.fit_limit()
        turn.reach_cap = -1
    room = turn.room
    fit = turn.fit
    if turn.preempt_fail <= 1 or room < 1:
        return min(fit, room) + 1
    if turn.reach_cap < 0:
        reachable = state.unallocated_gpus[pool.gpu_type]
        for v in victims_for(view, tree, hysteresis, fair, leaf, q.min_gpus() if q.count else 1):
            reachable += unprotected.get(v, 0)
        turn.reach_cap = min(pool.open_limit(), pool.free_gpus + reachable)
    cap = min(turn.preempt_fail - 1, turn.reach_cap)
    return min(max(fit, cap), room) + 1


def _preemption_plan(state: SchedulerState, pool: Pool, view: FairShareView, w: Workload,
                     victims_of: dict[str, VictimLimit], now_s: Seconds, exclude: frozenset[int],
                     reservation: Reservation | None, unallocated_from: dict[str, tuple[str, str]] | None = None,
                     unallocated_mask: int = 0, memo_space: str = "in", cached: bool = True,
                     capped: list[bool] | None = None, free_limit: int = -1,
                     unallocated_caps: dict[str, tuple[str, int]] | None = None,
                     ) -> tuple[list[Node], list[Workload], dict[str, VictimLimit]] | None:
    """Victims that make room for ``w``, or None. Remembers failures per leaf: with the same
    victims allowed (and the same reservation kept out), a failed search is redone only on
    nodes that changed since.

    ``unallocated_from`` (None: any) holds the leaves whose unallocated work may go, and
    ``unallocated_mask`` the same leaves as a bit per tree node index: what the memo compares
    (phase 4 retries failed requests a million times a month; sorting names each time cost
    more than the rest of a retry). ``free_limit`` (-1: none): the most free GPUs of a node the
    request may use (the headroom, for an unallocated request; part of the memo's key).
    ``unallocated_caps`` (None: none): per leaf of ``unallocated_from``, its subtree and the most
    GPUs that subtree may lose (rules.unallocated_cap_gpus); a failure a cap caused is not
    remembered (it depends on fills, which change without the nodes changing)."""
    gpu_type = pool.gpu_type
    gpn = pool.gpus_per_node
    gpus = w.gpus
    leaf = w.leaf
    if capped is None:
        capped = []  # gets True when a victim's subtree cap turned a node down (see find_victims)
    # what decides which victims may go (the single-node memo keeps the free limit apart: caches.covers)
    allowed_key = (tuple(victims_of.items()), (reservation.workload_id, reservation.nodes) if reservation else None,
                   unallocated_mask if unallocated_from is not None else None, state.storage_key())
    eligible_key = (allowed_key, free_limit)

    if not cached:
        rules = VictimRules(state, view, leaf, victims_of, unallocated_from, now_s, w, unallocated_caps)
        plan = find_victims(state, pool, gpus, rules.may_preempt, rules.cost, exclude=exclude, caps=rules.caps,
                            side_caps=rules.side_caps,
                            by_fit=True, fill_after=rules.fill_after, free_limit=free_limit)
    elif gpus > gpn:
        rules = VictimRules(state, view, leaf, victims_of, unallocated_from, now_s, w, unallocated_caps)
        # whole-node gangs: keep the set of nodes this leaf could empty, refreshed only where
        # nodes changed; search only when enough of them exist
        gang_memo = state.caches.gang_nodes.get((gpu_type, leaf, memo_space))
        since = (gang_memo[0], gang_memo[2]) if gang_memo is not None and gang_memo[1] == eligible_key else None
        takeable = takeable_nodes(pool, since, rules.may_preempt, state.running, exclude)  # (holders are running)
        state.caches.gang_nodes[(gpu_type, leaf, memo_space)] = (pool.change_seq, eligible_key, takeable)
        if len(takeable) * gpn < gpus:
            return None
        plan = find_victims(state, pool, gpus, rules.may_preempt, rules.cost,
                            caps=rules.caps, side_caps=rules.side_caps, by_fit=True, fill_after=rules.fill_after,
                            capped=capped, exclude=exclude)
    else:
        memo_key = (gpu_type, leaf, memo_space)
        memo: FailedSearches | None = state.caches.failed.get(memo_key)
        if memo is None:
            memo = state.caches.failed[memo_key] = FailedSearches()
        # a failure of a request no larger, with the same victims allowed and a free limit
        # at least as large, holds on every node unchanged since (caches.covers)
        narrowed = memo.size > 0 and gpus >= memo.size and memo.key == allowed_key \
            and covers(memo.free_limit, free_limit)
        failed_seq = memo.seq if narrowed else -1
        for (size, failed_limit), (seq, key) in memo.by_size.items():
            if size <= gpus and seq > failed_seq and key == allowed_key and covers(failed_limit, free_limit):
                failed_seq = seq
        if failed_seq >= 0:
            # only nodes changed since that failure can serve it now, and only those where a
            # preemption could open enough GPUs: often none, and then no search is needed
            changed = pool.open_changed_since(failed_seq, gpus, exclude)
            if changed and not victims_of:
                # only unallocated work may go: a node short even with all of it freed is out
                changed = [n for n in changed if _usable_free(n, free_limit) + n.unallocated >= gpus]
            if changed:
                rules = VictimRules(state, view, leaf, victims_of, unallocated_from, now_s, w, unallocated_caps)
                plan = find_victims(state, pool, gpus, rules.may_preempt, rules.cost, caps=rules.caps,
                                    side_caps=rules.side_caps, by_fit=True,
                                    fill_after=rules.fill_after, capped=capped, only=changed, exclude=exclude,
                                    free_limit=free_limit, prune=True)
            else:
                plan = None
        else:
            rules = VictimRules(state, view, leaf, victims_of, unallocated_from, now_s, w, unallocated_caps)
            if victims_of:
                plan = find_victims(state, pool, gpus, rules.may_preempt, rules.cost, caps=rules.caps,
                                    side_caps=rules.side_caps, by_fit=True,
                                    fill_after=rules.fill_after, capped=capped, exclude=exclude, free_limit=free_limit,
                                    prune=True)
            else:
                # only unallocated work may go: the nodes where free GPUs and the work that may
                # go could make enough (of some leaves only: Pool.groups; nodes that cannot serve
                # the request are skipped by find_victims as well, so the plan is the same)
                only = pool.reachable_nodes(gpus, exclude, free_limit) if unallocated_from is None \
                    else pool.reachable_from(gpus, unallocated_from, exclude, free_limit)
                plan = find_victims(state, pool, gpus, rules.may_preempt, rules.cost,
                                    caps=rules.caps, side_caps=rules.side_caps, by_fit=True,
                                    fill_after=rules.fill_after, capped=capped,
                                    exclude=exclude, free_limit=free_limit, only=only, prune=True)
        if plan is None and not capped:
            if not narrowed or gpus == memo.size:
                memo.seq, memo.key, memo.size, memo.free_limit = pool.change_seq, allowed_key, gpus, free_limit
            memo.by_size[(gpus, free_limit)] = (pool.change_seq, allowed_key)
    if plan is None:
        return None
    return plan[0], plan[1], victims_of


def _kept_out_bound(p: _Pass, q: LeafQueue, leaf: str, failed: int, below: int | float) -> int:
    """A walk limit for phases 3 and 4 (a cache: the reference mode has none). A request of
    ``leaf`` of ``failed`` GPUs kept off the reserved nodes found neither free GPUs nor victims,
    and nothing started or stopped since: a larger request kept off the same nodes fails as well,
    and the loop skips it; one that is not kept off may still fit. Returns one more than the
    largest GPU count in [failed, below) of ``q`` with a request the reservation does not keep off
    (reservation.keeps_off: the gang itself, or a minimum runtime that ends by the time the gang
    can start), at least ``failed``: every request from there to ``below`` would be skipped, so
    the walk skips them a size at a time instead (the smaller requests kept off still one by one).
    _NO_FAILURE when the reservation keeps no request of ``leaf`` off."""
    reservation = p.reservation
    if reservation is None or not reservation.nodes or not keeps_leaf_off(reservation, leaf, p.view):
        return _NO_FAILURE
    now_s = p.now_s
    until_s = reservation.until_s
    gang = p.state.workloads.get(reservation.workload_id)
    gang_gpus = gang.gpus if gang is not None and gang.leaf == leaf else -1
    bound = failed
    for gpus in q.by_size:
        # (the same comparison as keeps_off's, for the shortest minimum runtime of the size)
        if bound <= gpus < below and (gpus == gang_gpus or now_s + q.shortest_runtime_s(gpus) <= until_s):
            bound = gpus + 1
    return bound


def _usable_free(node: Node, free_limit: int) -> int:
    """The free GPUs of ``node`` a request may use (``free_limit`` -1: all)."""
    return node.free if free_limit < 0 or node.free <= free_limit else free_limit


def _reason(victim: Workload, by: Workload, victims_of: dict[str, VictimLimit], view: FairShareView,
            config: PolicyConfig, lost_before: dict[str, int]) -> ev.PreemptionReason:
    """Why ``victim`` goes for ``by``: the numbers of the rule that allowed it, as they were when
    the decision was made, and a sentence made from the same numbers. ``lost_before`` counts,
    per victim subtree, the GPUs earlier victims of the same decision took (updated here)."""
    if not victim.allocated:
        return ev.PreemptionReason(
            kind="unallocated", by_workload_id=by.id, by_project=by.leaf, rule=RULE_UNALLOCATED,
            message=f"{victim.id} ran on unallocated time, which any allocated request may take; "
                    f"{by.id} ({by.leaf}) asked for allocated time",
        )
    mine, theirs, _, _ = victims_of[victim.leaf]
    lost = lost_before.get(theirs, 0) + victim.gpus  # what its subtree loses to this decision so far
    lost_before[theirs] = lost
    rule = RULE_DUE_SHARE
    level = mine.rsplit("/", 1)[0] if "/" in mine else ""
    index = view.tree.index
    i_mine = index[mine]
    i_theirs = index[theirs]
    fill_mine = view.fill_at(i_mine, by.gpus)
    fill_theirs = view.fill_at(i_theirs)
    ratio_mine = view.ratio_at(i_mine)
    ratio_theirs = view.ratio_at(i_theirs)
    running_theirs = view.running_at(i_theirs)
    due_theirs = view.due_at(i_theirs)
    fill_after = (running_theirs - lost) / due_theirs if due_theirs > 0 else 0.0
    # the number as configured, read untyped: a compiled build would turn an int given for
    # this float field into a float on the way (see units.py)
    hysteresis: Any = getattr(config, "preemption_hysteresis")
    window_s = config.lookback_window_s
    window = f"{window_s // 86400}-day" if window_s % 86400 == 0 else format_duration_s(window_s)
    where = f"at the level of {level}" if level else "at the top of the tree"
    why = (f"{mine} would be at {fill_mine:.0%} of its due share with {by.id} and {theirs} at "
           f"{fill_after:.0%} without {victim.id}" + (f" and the {lost - victim.gpus} GPUs taken with it"
                                                      if lost > victim.gpus else "")
           + f", so {theirs} is not left below {mine}")
    return ev.PreemptionReason(
        kind="fair_share", by_workload_id=by.id, by_project=by.leaf, level=level,
        preemptor_subtree=mine, victim_subtree=theirs,
        preemptor_ratio=round(ratio_mine, 6), victim_ratio=round(ratio_theirs, 6),
        preemptor_fill=round(fill_mine, 6), victim_fill=round(fill_theirs, 6),
        victim_running_gpus=running_theirs, victim_due_gpus=round(due_theirs, 3),
        hysteresis=hysteresis, rule=rule,
        victim_protected_until_ms=int(round((victim.run_start_s + victim.min_runtime_s) * 1000)),
        message=(f"{victim.id} was past its minimum runtime; {where}, {theirs} ran {running_theirs} GPUs, "
                 f"{fill_theirs:.0%} of the {due_theirs:.1f} it is due now ({window} usage ratio "
                 f"{ratio_theirs:.2f}, above its due share by more than the hysteresis {hysteresis}); {why}"),
    )
