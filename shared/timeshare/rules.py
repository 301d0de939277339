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
* **Victim eligibility** (:func:`victim_cap_gpus`, :func:`above_due_share_down`): allocated
  work past its minimum runtime may go when b runs above its due share by more than the
  hysteresis, so does every level from b down to the victim's leaf, and after the loss b's
  fill stays at least a's with the request (Kueue's "less than or equal to final share"). No
  exception and no second path (the window's memory is in the due share already): a preempted
  subtree never ends below the one that took its GPUs, so it cannot take them back.
* **No cascade** (scheduler.py, ``SchedulerState.lost_at_ms``): a leaf that lost work to
  another leaf's request preempts nothing at that instant (an allocated request taking
  unallocated work, which the contract allows at any time, aside).
* **Victim order** (:func:`victim_cost`, :func:`node_rank`): unallocated work first; then the
  least progress lost (GPU-seconds: an 8-GPU gang loses eight times a 1-GPU workload's per
  second), or for a victim given a notice its checkpoint's GPU time plus the wait it imposes
  on the request (placement.preemption_cost_gpu_s); then the fewest GPUs freed beyond the request (on any node); then the subtree
  running most for its due share; then id.
* **Contract**: work runs on allocated time when it declares a minimum runtime on a leaf with a
  budget (:func:`runs_allocated`); protected work (allocated, within its minimum runtime) is
  never a victim of fair share; unallocated work always may be (state.py,
  ``Workload.is_protected``); so the earliest its GPUs can be freed is :func:`free_at_s`.
* **Headroom** (phase 4 in scheduler.py, ``PolicyConfig.unallocated_headroom``): unallocated
  work does not start where it would bring a pool's free GPUs below the headroom.
"""

from __future__ import annotations

import math

from .fairshare import FairShareView
from .tree import AllocationTree
from .units import Seconds

#: the rule that let a fair-share preemption happen, as its reason names it
RULE_DUE_SHARE = "due_share"
RULE_UNALLOCATED = "unallocated"


def runs_allocated(min_runtime_s: int, fraction: float) -> bool:
    """Rule "allocated": a workload runs on allocated time (charged to its budget, protected
    for its minimum runtime) when it declares a minimum runtime and its leaf has a budget (a
    fraction above 0); otherwise on unallocated time (charged to no one, never protected)."""
    return min_runtime_s > 0 and fraction > 0


def free_at_s(allocated: bool, protected_until_s: Seconds | None, now_s: Seconds,
              non_preemptible: bool = False) -> Seconds:
    """Rule "contract", as a time: when the GPUs of a running workload can be freed at the
    earliest (by a preemption or a drain): now for unallocated work and for allocated work past
    its minimum runtime, the end of its protection for allocated work within it, never (inf)
    for work that opted out of preemption (only the baseline starts such work). Whether one
    request may take it then is the victim rules' question (victims.py)."""
    if non_preemptible:
        return math.inf
    if allocated and protected_until_s is not None and protected_until_s > now_s:
        return protected_until_s
    return now_s


def richer_in_all(view: FairShareView, ai: int, bi: int, gpus: int, hysteresis: float) -> bool:
    """Rule "unallocated sharing": where the paths of a request of ``gpus`` GPUs and a running
    unallocated workload part into *a* and *b*, b runs more of its due share in all (allocated
    and unallocated) than a would with the request, by more than ``hysteresis``: the request may
    take b's unallocated work (phase 4 of a pass)."""
    return view.total_fill_at(ai, gpus) + hysteresis < view.total_fill_at(bi)


def unallocated_cap_gpus(view: FairShareView, ai: int, bi: int, gpus: int) -> int:
    """Rule "unallocated sharing", its end: the most GPUs of unallocated work *b* may lose to a
    request of ``gpus`` GPUs from *a* (where their paths part) and still run at least as much of
    its due share in all as a will with the request (Kueue's "less than or equal to final
    share": a swap may end level, never reversed, so the GPUs cannot come back). The victim
    search takes b's victims within this cap, so that a smaller set is tried when the cheapest
    victims would overshoot."""
    if view.due_at(bi) <= 0:
        return view.unallocated_running_at(bi)  # due nothing: b's fill stays infinite whatever it loses
    target = view.total_fill_at(ai, gpus) - 1e-9
    if target == math.inf:
        return 0
    running_gpus = view.running_at(bi) + view.unallocated_running_at(bi)
    most = int(math.floor(running_gpus - target * view.due_at(bi)))
    while most > 0 and view.total_fill_at(bi, -most) < target:
        most -= 1  # (rounding of the product above)
    return max(most, 0)


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


def above_due_share_down(view: FairShareView, path: list[int], depth: int, hysteresis: float) -> bool:
    """Whether every level of a victim's ``path`` from ``depth`` down to its leaf runs above its
    due share by more than the hysteresis: work is never taken from a subtree within its due
    share, at whatever level (taking it would leave that subtree owed GPUs, and its own request
    would then preempt a sibling: a cascade)."""
    for d in range(depth, len(path)):
        if not above_due_share(view, path[d], hysteresis):
            return False
    return True


def victim_cap_gpus(view: FairShareView, ai: int, bi: int, gpus: int, hysteresis: float) -> int:
    """The one fair-share preemption rule: how many GPUs of allocated work past its minimum
    runtime sibling subtree ``bi`` may lose to a request of ``gpus`` GPUs from subtree ``ai``
    (0: none).

    b must run above its due share by more than the hysteresis now, and after the loss its fill
    stays at least a's fill with the request (Kueue's "less than or equal to final share"). No
    exception: a request that this leaves unserved waits for free or unallocated GPUs or for a
    reservation. Because b ends no lower than a, b's work, requeued, cannot take its GPUs back
    (it would need a above b), and the potential docs/design/preemption-rules.md names strictly
    falls with every preemption."""
    if not above_due_share(view, bi, hysteresis):
        return 0
    fill_a = view.fill_at(ai, gpus)
    # (the tolerance keeps "b ends level with a" from failing on a rounding error)
    cap = math.floor(view.running_at(bi) - fill_a * view.due_at(bi) + 1e-9)
    return int(cap) if cap > 0 else 0


def inner_cap_gpus(view: FairShareView, path: list[int], depth: int, fill_a: float) -> int:
    """The most GPUs a victim's leaf may lose so that every level of its ``path`` from ``depth``
    down still runs no less of its due share than the requester's side will (``fill_a``): the
    final-share rule asked below the parting too."""
    cap: int = 1 << 60
    for d in range(depth, len(path)):
        i = path[d]
        c = int(math.floor(view.running_at(i) - fill_a * view.due_at(i) + 1e-9))
        if c < cap:
            cap = c
    return cap if cap > 0 else 0


def victim_cost(allocated: bool, lost_gpu_s: Seconds, victim_side_fill: float, workload_id: str) -> tuple:
    """Order of victims on a node, cheapest first: unallocated work, then the least progress
    lost (with a notice: the checkpoint's GPU time and the request's wait instead,
    placement.preemption_cost_gpu_s), then the subtree running most for its due share, then id."""
    return (1 if allocated else 0, lost_gpu_s, -victim_side_fill, workload_id)


def node_rank(worst: tuple, freed_beyond: int, lost_gpu_s: Seconds, victims: int, node_index: int,
              floor_fill: float = math.inf) -> tuple:
    """Order of candidate nodes for a request of at most one node, best first: no allocated
    victim; then the least progress lost, in GPU-seconds (an 8-GPU gang loses eight times what
    a 1-GPU workload loses per second since its checkpoint, so a smaller victim that frees
    enough wins unless it would lose more); then the fewest GPUs freed beyond the request (a
    victim's GPUs on other nodes count); (before that, among nodes losing the same progress, the
    higher lowest fill the victims leave a subtree at, ``floor_fill``: two equally rich teams
    each lose a part instead of one losing it all); then fewer victims; then the dearest victim's cost
    (the subtree running most for its due share goes first); then the lower node index.

    Measured on the built-in month (docs/records/2026-12-01-promise.md): ranking the GPUs freed beyond
    the request before the progress lost, or victims on one node before the progress lost,
    wasted 1,450 to 2,500 GPU-hours more, most of it interactive sessions past their minimum
    runtime (not resumable) taken for 1-GPU debug work because they fitted exactly."""
    return (worst[0], lost_gpu_s, -floor_fill, freed_beyond, victims, worst, node_index)
