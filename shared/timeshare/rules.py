"""The budget policy's rules, one small named function each (the pass in scheduler.py applies
them; its caches only skip work these rules would refuse anyway, see ``PolicyCaches``).

Words: a *subtree's fill* is the allocated GPUs it runs now over the GPUs it is due now
(fairshare.py). Where the paths of a requester's leaf and a running workload's leaf part, the
two sibling subtrees are *a* (the requester's side) and *b* (the victim's side); nothing above
them changes when GPUs move from b to a, so that level is the one compared.

* **Within due share** (:func:`room_by_depth`): a request is served first (phase 3) when it is
  within its leaf's due share at every level that would gain GPUs. Starting on free GPUs,
  every level gains; taking GPUs from b, only the levels from a down gain. (A single root, or a
  busy program, is always at its due share: asking there too left a small team under a busy
  program with no way to be served.)
* **Victim eligibility** (:func:`victim_cap_gpus`): allocated work of b past its minimum runtime
  may go when b runs above its due share by more than the hysteresis, and after losing it b
  still does not run less of its due share than a with the request (Kueue's "less than or equal
  to final share"): b's fill stays at least a's, or, when the request keeps a within its due
  share, at least b's own due share; a workload larger than b's whole due share may go in any
  case (it could never take GPUs back). A preempted gang's subtree therefore never
  ends below the subtree that took its GPUs, so it cannot take them back, and a subtree left
  at or above its due share has no request within its due share to start a chain with.
* **Window credit** (:func:`credit_allows`, :func:`credit_victim_cap_gpus`): a request larger
  than its leaf's due share now is still served when the leaf has not used its share of the
  window even counting the request over its minimum runtime; it may take from subtrees above
  their due share that have used more of their window share. Fair share never takes from a
  subtree that has used less of its window share than the requester's (by the hysteresis).
* **Victim order** (:func:`victim_cost`, :func:`node_rank`): unallocated work first; then the
  least progress lost (GPU-seconds: an 8-GPU gang loses eight times a 1-GPU workload's per
  second); then the fewest GPUs freed beyond the request (on any node); then the subtree
  running most for its due share; then id.
* **Contract**: work runs on allocated time when it declares a minimum runtime on a leaf with a
  budget (:func:`runs_allocated`); protected work (allocated, within its minimum runtime) is
  never a victim of fair share; unallocated work always may be (state.py,
  ``Workload.is_protected``).
* **Headroom** (phase 4 in scheduler.py, ``PolicyConfig.unallocated_headroom``): unallocated
  work does not start where it would bring a pool's free GPUs below the headroom.
"""

from __future__ import annotations

import math

from .fairshare import FairShareView
from .tree import AllocationTree
from .units import Seconds

#: no victim of this subtree may go
NONE: int = -1
#: the rule that let a fair-share preemption happen, as its reason names it
RULE_DUE_SHARE = "due_share"
RULE_CREDIT = "window_credit"
RULE_UNALLOCATED = "unallocated"


def runs_allocated(min_runtime_s: int, fraction: float) -> bool:
    """Rule "allocated": a workload runs on allocated time (charged to its budget, protected
    for its minimum runtime) when it declares a minimum runtime and its leaf has a budget (a
    fraction above 0); otherwise on unallocated time (charged to no one, never protected)."""
    return min_runtime_s > 0 and fraction > 0


def room_by_depth(view: FairShareView, tree: AllocationTree, leaf: str, fair: bool) -> list[float]:
    """Per depth d of ``leaf``'s path: the largest request that is within the due share of every
    level from d down to the leaf (0: none). A level runs below its due share if it runs fewer
    allocated GPUs than it is due; such a level may take one more request as large as its due
    share ("fair": as large as twice the gap, so that it ends no farther above its due share than
    it was below). Shallower depths constrain more, so the list never decreases with depth."""
    path = tree.path_index[leaf]
    rooms: list[float] = [0.0] * len(path)
    room = math.inf
    for d in range(len(path) - 1, -1, -1):
        i = path[d]
        due = view.due_at(i)
        gap = due - view.running_at(i)
        if gap <= 0:
            room = 0.0
        else:
            allowed = 2 * gap if fair else due
            if allowed < room:
                room = allowed
        rooms[d] = room
    return rooms


def above_due_share(view: FairShareView, bi: int, hysteresis: float) -> bool:
    """Whether subtree ``bi`` runs above its due share by more than the hysteresis: the first
    condition of both fair-share victim rules (a subtree just above its due share is left alone)."""
    return view.fill_at(bi) > 1.0 + hysteresis


def used_less_of_window(view: FairShareView, ai: int, bi: int, hysteresis: float) -> bool:
    """Whether subtree ``bi`` used less of its window share than its sibling ``ai``, by the
    hysteresis: then the due-share rule takes nothing of b for a's sake."""
    return view.ratio_at(bi) + hysteresis < view.ratio_at(ai)


def used_more_of_window_than_with(view: FairShareView, ai: int, bi: int, gpus: int, min_runtime_s: int,
                                  hysteresis: float) -> bool:
    """Whether subtree ``bi`` used more of its window share than ``ai`` will have with a request of
    ``gpus`` GPUs over ``min_runtime_s``, by more than the hysteresis (the window-credit order)."""
    return view.ratio_at(bi) > view.ratio_with_at(ai, gpus, min_runtime_s) + hysteresis


def victim_cap_gpus(view: FairShareView, ai: int, bi: int, gpus: int, hysteresis: float) -> tuple[int, int]:
    """Which allocated work past its minimum runtime of sibling subtree ``bi`` a request of
    ``gpus`` GPUs from subtree ``ai`` may preempt, as (the most GPUs b may lose in all, the
    smallest workload that may go whatever that cap): ``(NONE, NONE)`` for none.

    b must run above its due share by more than the hysteresis now. Then it may lose GPUs as
    long as its fill stays at least a's fill with the request, or, when the
    request keeps a within its due share, at least 1 (its own due share). (The hysteresis guards
    the first condition: a b just above its due share is left alone.) And a workload larger
    than b's whole due share may go whatever b keeps: it could never take GPUs back (no request
    larger than a due share counts as within it), so the cap would only starve a request within
    its due share where gangs are large for the shares (three teams of 5 GPUs on 8-GPU nodes)."""
    if not above_due_share(view, bi, hysteresis):
        return NONE, NONE
    if used_less_of_window(view, ai, bi, hysteresis):
        return NONE, NONE  # b has used less of its window share: it is not taken from for a's sake
    fill_a = view.fill_at(ai, gpus)
    floor_fill = fill_a if fill_a > 1.0 else min(fill_a, 1.0)
    due_b = view.due_at(bi)
    # (the tolerance keeps "b ends level with a" from failing on a rounding error)
    cap = math.floor(view.running_at(bi) - floor_fill * due_b + 1e-9)
    return (int(cap) if cap > 0 else 0), int(math.floor(due_b)) + 1


def credit_allows(view: FairShareView, tree: AllocationTree, leaf: str, depth: int, gpus: int,
                  min_runtime_s: int) -> bool:
    """Rule "window credit": a request larger than its due share now is still owed when every
    level from ``depth`` down to ``leaf`` stays within its share of the window counting the
    request (its usage ratio, if it ran what it runs now plus the request for the request's
    minimum runtime, stays at most 1), and runs below its due share now: the overshoot is one
    request at a time. (A team that used nothing all week may run an 8-GPU
    debug workload although a tenth of 32 GPUs is 3.2; the window bounds how much.)"""
    path = tree.path_index[leaf]
    for d in range(depth, len(path)):
        i = path[d]
        if view.running_at(i) >= view.due_at(i) or view.ratio_with_at(i, gpus, min_runtime_s) > 1.0:
            return False
    return True


def credit_victim_cap_gpus(view: FairShareView, ai: int, bi: int, gpus: int, min_runtime_s: int,
                           hysteresis: float) -> tuple[int, int]:
    """How many GPUs of allocated work past its minimum runtime subtree ``bi`` may lose to a
    request owed by window credit (:func:`credit_allows`) from sibling ``ai``: any, when b runs
    above its due share by more than the hysteresis now and has used more of its window share
    than a will have with the request, by more than the hysteresis (the order Ai2 ranks by); else
    :data:`NONE`. b cannot take the GPUs back while a's window ratio stays the lower
    (:func:`victim_cap_gpus` refuses it), so no ping-pong follows."""
    if not above_due_share(view, bi, hysteresis):
        return NONE, NONE
    if not used_more_of_window_than_with(view, ai, bi, gpus, min_runtime_s, hysteresis):
        return NONE, NONE
    return view.running_at(bi), NONE


def victim_cost(allocated: bool, lost_gpu_s: Seconds, victim_side_fill: float, workload_id: str) -> tuple:
    """Order of victims on a node, cheapest first: unallocated work, then the least progress
    lost, then the subtree running most for its due share, then id."""
    return (1 if allocated else 0, lost_gpu_s, -victim_side_fill, workload_id)


def node_rank(worst: tuple, freed_beyond: int, lost_gpu_s: Seconds, victims: int, node_index: int) -> tuple:
    """Order of candidate nodes for a request of at most one node, best first: no allocated
    victim; then the least progress lost, in GPU-seconds (an 8-GPU gang loses eight times what
    a 1-GPU workload loses per second since its checkpoint, so a smaller victim that frees
    enough wins unless it would lose more); then the fewest GPUs freed beyond the request (a
    victim's GPUs on other nodes count); then fewer victims; then the dearest victim's cost
    (the subtree running most for its due share goes first); then the lower node index.

    Measured on the built-in month (docs/2026-12-01-promise.md): ranking the GPUs freed beyond
    the request before the progress lost, or victims on one node before the progress lost,
    wasted 1,450 to 2,500 GPU-hours more, most of it interactive sessions past their minimum
    runtime (not resumable) taken for 1-GPU debug work because they fitted exactly."""
    return (worst[0], lost_gpu_s, freed_beyond, victims, worst, node_index)
