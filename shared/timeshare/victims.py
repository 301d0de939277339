"""Which running work a request may preempt, and in what order: the victim rules of the budget
policy applied to one request (the rules themselves are the named functions of rules.py).

One rule decides allocated victims (rules.victim_cap_gpus, docs/design/preemption-rules.md):
where the paths of the requester's leaf and the victim's leaf part, into sibling subtrees *a*
and *b*, b runs above its due share by more than the hysteresis, so does every level from b
down to the victim's leaf (rules.above_due_share_down), the request is within a's due share
(rules.room_by_depth), and b's fill after losing its victims stays at least a's with the
request (Kueue's "less than or equal to final share"). There is no exception and no second
path: a team back from idle days is served because its due share is larger now.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

from .fairshare import FairShareView
from .placement import preemption_cost_gpu_s
from .rules import above_due_share_down, inner_cap_gpus, room_by_depth, victim_cap_gpus, victim_cost
from .state import SchedulerState, Workload
from .tree import AllocationTree
from .units import Seconds


class VictimLimit(NamedTuple):
    """What a request may take of one other leaf's allocated work past its minimum runtime."""

    #: the requester's side and the victim's side where their paths part
    a: str
    b: str
    #: the most GPUs b may lose to the request in all
    cap_gpus: int
    #: the most GPUs one victim of this leaf may hold: every level between b and the victim's
    #: leaf also ends no lower than a (a loss inside b falls where it leaves no one below the
    #: requester, so the loser has nothing to take from a sibling afterwards)
    each_gpus: int


def victims_for(view: FairShareView, tree: AllocationTree, hysteresis: float, fair: bool, leaf: str,
                gpus: int) -> dict[str, VictimLimit]:
    """Leaves whose allocated work past its minimum runtime a request of ``gpus`` GPUs of
    ``leaf`` may preempt, each with its :class:`VictimLimit` (leaves not named: none)."""
    out: dict[str, VictimLimit] = {}
    rooms = room_by_depth(view, tree, leaf, fair)
    caps: dict[int, int] = {}
    path_index = tree.path_index
    for other, a, b, ai, bi in tree.split_index[leaf]:
        cap = caps.get(bi)
        if cap is None:
            depth = a.count("/")
            cap = caps[bi] = victim_cap_gpus(view, ai, bi, gpus, hysteresis) if gpus <= rooms[depth] else 0
        if cap <= 0:
            continue
        path = path_index[other]
        depth = a.count("/")
        if above_due_share_down(view, path, depth + 1, hysteresis):
            each = cap
            if depth + 1 < len(path):
                each = min(cap, inner_cap_gpus(view, path, depth + 1, view.fill_at(path_index[leaf][depth], gpus)))
            if each > 0:
                out[other] = VictimLimit(a, b, cap, each)
    return out


class VictimRules:
    """Which running workloads a request may preempt, and what each costs (placement.find_victims
    asks). ``victims_of`` holds the allocated victims' limits; ``unallocated_from`` (None: any)
    the leaves whose unallocated work may go."""

    __slots__ = ("state", "view", "leaf", "victims_of", "unallocated_from", "now_s", "unallocated_side",
                 "allocated_side", "requester_gpus", "debug", "limited_storage", "unallocated_caps")

    def __init__(self, state: SchedulerState, view: FairShareView, leaf: str, victims_of: dict[str, VictimLimit],
                 unallocated_from: dict[str, tuple[str, str]] | None, now_s: Seconds,
                 requester: Workload | None = None,
                 unallocated_caps: dict[str, tuple[str, int]] | None = None):
        self.state = state
        self.view = view
        self.leaf = leaf
        self.victims_of = victims_of
        self.unallocated_from = unallocated_from
        self.now_s = now_s
        # the fill part of a cost, per victim leaf: fills do not change during one search
        self.unallocated_side: dict[str, float] = {}
        self.allocated_side: dict[str, float] = {}
        # a victim's cost counts the wait its notice imposes on the request (placement.py)
        self.requester_gpus = requester.gpus if requester is not None else 0
        self.debug = requester is not None and requester.spec.kind == "debug"
        self.limited_storage = state.cluster.checkpoint_bandwidth_gbps is not None
        # rule "unallocated sharing": the most unallocated GPUs each richer subtree may lose
        # (find_victims skips a victim past it and tries the next, so a smaller set is found)
        self.unallocated_caps = unallocated_caps

    # (properties, not attributes holding bound methods: a bound method kept on its own object
    # is a reference cycle, and one per search left the cyclic collector a VictimRules, its
    # dicts and its view to find, thousands a day)
    @property
    def side_caps(self) -> Callable[[Workload], tuple[str, int] | None] | None:
        """:meth:`side_cap` when some richer subtree's loss is capped, else None."""
        return self.side_cap if self.unallocated_caps else None

    @property
    def caps(self) -> Callable[[Workload], tuple[str, int] | None] | None:
        """:meth:`cap` when allocated work may go, else None (no allocated victim, no cap:
        find_victims then skips spreading a node's victims over groups, which only reorders
        allocated ones)."""
        return self.cap if self.victims_of else None

    def may_preempt(self, v: Workload) -> bool:
        # under notice already (its GPUs are promised), or its checkpoint would not fit the
        # storage now (rule "storage"): not a victim now. Notices change when GPUs move and
        # which eligible victim is cheapest, never who may preempt whom
        if v.notice is not None or (self.limited_storage and not self.state.may_take(v)):
            return False
        if not v.allocated:
            unallocated_from = self.unallocated_from
            return unallocated_from is None or v.leaf in unallocated_from
        limit = self.victims_of.get(v.leaf)
        # (non-preemptible work, which only the baseline starts, never goes: its GPUs are
        # blocked like protected ones, and reservation.py counts it as staying)
        return limit is not None and v.gpus <= limit.each_gpus and not v.is_protected(self.now_s) \
            and not v.non_preemptible

    def cap(self, v: Workload) -> tuple[str, int] | None:
        """The subtree an allocated victim belongs to and the most GPUs it may lose in all."""
        if not v.allocated:
            return None
        limit = self.victims_of[v.leaf]
        return limit.b, limit.cap_gpus

    def side_cap(self, v: Workload) -> tuple[str, int] | None:
        """The subtree whose unallocated work ``v`` is and the most GPUs it may lose in all
        (None: no limit: allocated work, the requester's own team, or any may go)."""
        caps = self.unallocated_caps
        if v.allocated or caps is None:
            return None
        return caps.get(v.leaf)

    def fill_after(self, subtree: str, lost_gpus: int) -> float:
        """A victim subtree's fill once it has lost ``lost_gpus`` GPUs (placement.find_victims
        spreads a loss over equally rich subtrees with it)."""
        i = self.state.tree.index[subtree]
        due = self.view.due_at(i)
        return (self.view.running_at(i) - lost_gpus) / due if due > 0 else math.inf

    def cost(self, v: Workload) -> tuple:
        if not v.allocated:
            # the subtree running most for its due share in all goes first among equal losses
            # (the requester's own team counts its own fill: taking its own work changes no share)
            side = self.unallocated_side.get(v.leaf)
            if side is None:
                split = self.state.tree.divergence(self.leaf, v.leaf)
                side = self.unallocated_side[v.leaf] = self.view.total_fill(split[1] if split else self.leaf)
            return victim_cost(False, preemption_cost_gpu_s(self.state, v, self.now_s, self.requester_gpus, self.debug),
                               side, v.id)
        side = self.allocated_side.get(v.leaf)
        if side is None:
            side = self.allocated_side[v.leaf] = self.view.fill(self.victims_of[v.leaf].b)
        return victim_cost(True, preemption_cost_gpu_s(self.state, v, self.now_s, self.requester_gpus, self.debug),
                           side, v.id)
