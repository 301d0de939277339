"""Hierarchical fair share over the rolling window, Fair-Tree style, with a due share now.

Two numbers per tree node and GPU type:

* the **usage ratio** (what users see, what the window remembers)::

      ratio = allocated GPU-s in the window / (fraction x pool GPUs x window)

  (until a whole window has been recorded, "window" is the time recorded so far); 1.0 means "used exactly its share over the window"; lower = more deserving;

* the **fill** (what orders the queue now)::

      weight   = share x max(0, 1 + catch_up x (1 - ratio))
      due GPUs = parent's due GPUs x weight / sum of the sibling weights  (root: pool GPUs)
      fill     = allocated GPUs running now / due GPUs

  A subtree that under-used its share over the window is due *more* than its share now
  (ratio 0.7 among siblings at 1.0 -> about 130% of its share with catch_up 1: "it feels
  like 30% more compute"), one that over-used is due less; the due GPUs of all leaves add
  up to the pool, so being within one's due share never crowds out another's, so over the window every busy subtree converges to its share,
  and hour by hour delivery tracks what it is owed instead of swinging between all and
  nothing (ordering by the window ratio alone lets the most deserving team take every free
  GPU for hours before its 7-day ratio moves).

Siblings are ranked by (fill, ratio, path), lowest first, at every level; the order is
depth-first, so every pending workload of a more deserving subtree precedes those of a less
deserving one. Inside a leaf: priority (urgent first), then submit time, then id. A subtree
with no due share (fraction 0) runs only unallocated work.
"""

from __future__ import annotations

import math
from typing import Callable, Collection, Final

from .tree import AllocationTree
from .units import Seconds
from .window import UsageLedger

INFINITE: Final = math.inf


class FairShareView:
    """Ratios, due GPUs and fills of every tree node for one GPU type at one instant.

    A scheduling pass charges the work it starts or stops (:meth:`charge`) so that later
    choices in the same pass see the new fills."""

    def __init__(self, tree: AllocationTree, ledger: UsageLedger, gpu_type: str, pool_gpus: int, now_s: Seconds,
                 catch_up: float = 1.0):
        self.tree = tree
        self.gpu_type = gpu_type
        self.now_s = now_s
        # float() where Python would convert anyway (int / float, float * int): the same
        # numbers, and native arithmetic when compiled
        entitled_gpu_s = float(pool_gpus * ledger.covered_s(now_s))
        ratios: dict[str, float] = {}
        weight: dict[str, float] = {}
        usage: dict[str, Seconds] = {}
        running: dict[str, int] = {}
        free_running: dict[str, int] = {}
        # what ledger.snapshots would return, read straight from the tracks in node order
        on_tracks, off_tracks = ledger.aligned_tracks(tree.node_paths, gpu_type)
        window_start_s = now_s - ledger.window_s
        i = 0
        for node in tree.node_list:
            path = node.path
            track = on_tracks[i]
            if track is not None and track.times:
                used = track.window_gpu_s(now_s, window_start_s)
                usage[path] = used
                running[path] = track.rates[-1]
            else:
                used = 0
                usage[path] = running[path] = 0
            track = off_tracks[i]
            free_running[path] = track.rates[-1] if track is not None and track.rates else 0
            i += 1
            denominator = node.fraction * entitled_gpu_s
            ratio = float(used) / denominator if denominator > 0 else INFINITE
            ratios[path] = ratio
            weight[path] = node.share * max(0.0, 1.0 + catch_up * (1.0 - ratio)) if denominator > 0 else 0.0

        # the parent's due GPUs are divided among its children by catch-up weight, so the due
        # shares of a sibling set add up to exactly what their parent is due (parents come
        # before their children in tree.sibling_sets)
        due: dict[str, float] = {}
        for parent, siblings in tree.sibling_sets:
            gpus = due[parent] if parent is not None else float(pool_gpus)
            total = 0.0
            for p in siblings:
                total += weight[p]
            for p in siblings:
                due[p] = gpus * weight[p] / total if total > 0 else 0.0

        self.ratios = ratios
        self.unallocated_running_gpus = free_running
        self.due_gpus = due
        self.running_gpus = running
        self.usage_gpu_s = usage
        self._paths = tree.paths
        # keys pick has computed, per key method; charge drops those of the paths it changes
        self._key_memo: dict[str, tuple] = {}
        self._total_key_memo: dict[str, tuple] = {}

    def fill(self, path: str, extra_gpus: int = 0) -> float:
        due = self.due_gpus[path]
        running = self.running_gpus[path] + extra_gpus
        if due > 0:
            return running / due
        return INFINITE

    def key(self, path: str) -> tuple[float, float, str]:
        return (self.fill(path), self.ratios[path], path)

    def total_fill(self, path: str, extra_gpus: int = 0) -> float:
        due = self.due_gpus[path]
        running = self.running_gpus[path] + self.unallocated_running_gpus[path] + extra_gpus
        return running / due if due > 0 else INFINITE

    def total_key(self, path: str) -> tuple[float, float, str]:
        """Order for unallocated work: all GPUs the subtree runs (allocated or not) / due.

        Free capacity is shared fairly too: a team owed its share gets it through
        unallocated work when that is all it asks for."""
        due = self.due_gpus[path]
        running = self.running_gpus[path] + self.unallocated_running_gpus[path]
        return (running / due if due > 0 else INFINITE, self.ratios[path], path)

    def charge(self, leaf: str, delta_gpus: int, allocated: bool = True) -> None:
        """Record GPUs started (or stopped, negative) for ``leaf`` during a pass."""
        running = self.running_gpus if allocated else self.unallocated_running_gpus
        key_memo = self._key_memo
        total_key_memo = self._total_key_memo
        for path in self._paths[leaf]:
            running[path] += delta_gpus
            key_memo.pop(path, None)
            total_key_memo.pop(path, None)

    def leaf_order(self, among: Collection[str] | None = None) -> list[str]:
        """Leaves, most deserving first, ranked depth-first level by level; with ``among``, only
        those leaves, in the same order (subtrees holding none of them are not ranked at all)."""
        out: list[str] = []
        if among is None:
            self._visit(self.tree.roots, out, None)
        else:
            paths = self._paths
            within = {path for leaf in among for path in paths[leaf]}
            self._visit(self.tree.roots, out, within)
        return out

    def _visit(self, siblings: list[str], out: list[str], within: set[str] | None) -> None:
        # a method, not a recursive closure: compiled by mypyc, a closure that calls itself is
        # a reference cycle per call, which only the garbage collector frees
        nodes = self.tree.nodes
        if within is not None:
            # keys are unique (they end in the path), so sorting a subset keeps its order
            siblings = [path for path in siblings if path in within]
        for path in sorted(siblings, key=self.key):
            children = nodes[path].children
            if children:
                self._visit(children, out, within)
            else:
                out.append(path)

    def pick(self, active: dict[str, int], key: Callable[[str], tuple] | None = None) -> str | None:
        """The most deserving leaf among those with ``active[path] > 0`` leaves beneath."""
        # a pass picks again after every start and whenever a leaf runs out of work, while
        # only the paths of charged leaves change: keys are kept until charge drops them
        if key is None or key == self.key:
            return self._pick(active, self._key_memo, False, None)
        if key == self.total_key:
            return self._pick(active, self._total_key_memo, True, None)
        return self._pick(active, None, False, key)

    def pick_by_total(self, active: dict[str, int]) -> str | None:
        """``pick(active, self.total_key)`` (a pass calls it after every start or exhausted leaf)."""
        return self._pick(active, self._total_key_memo, True, None)

    def _pick(self, active: dict[str, int], memo: dict[str, tuple] | None, total: bool,
              key: Callable[[str], tuple] | None) -> str | None:
        """pick with the keys kept in ``memo`` (of :meth:`key`, or of :meth:`total_key` when
        ``total``), or with ``key`` uncached when ``memo`` is None."""
        nodes = self.tree.nodes
        siblings = self.tree.roots
        while True:
            best: str | None = None
            best_key: tuple | None = None
            for path in siblings:
                if active.get(path, 0) > 0:
                    if best is None:
                        best = path  # its key is needed only if another sibling is active
                        continue
                    if best_key is None:
                        best_key = self._memo_key(best, memo, total, key)
                    k = self._memo_key(path, memo, total, key)
                    if k < best_key:
                        best, best_key = path, k
            if best is None:
                return None
            children = nodes[best].children
            if not children:
                return best
            siblings = children

    def _memo_key(self, path: str, memo: dict[str, tuple] | None, total: bool,
                  key: Callable[[str], tuple] | None) -> tuple:
        """``key(path)`` for :meth:`pick`, kept in ``memo`` (that of :meth:`key`, or of
        :meth:`total_key` when ``total``) until :meth:`charge` drops it."""
        if memo is None:
            assert key is not None
            return key(path)
        k = memo.get(path)
        if k is None:
            k = memo[path] = self.total_key(path) if total else self.key(path)
        return k

    def ordering_key(self, leaf: str) -> list[dict]:
        """What users are shown: per level from the top, the subtree's fill and ratio."""
        return [
            {"subtree": path, "fill": round(self.fill(path), 6), "ratio": round(self.ratios[path], 6),
             "due_gpus": round(self.due_gpus[path], 3), "running_gpus": self.running_gpus[path]}
            for path in self._paths[leaf]
        ]

    def divergence(self, leaf_a: str, leaf_b: str) -> tuple[str, str] | None:
        """The two sibling subtrees where the paths of ``leaf_a`` and ``leaf_b`` part, or None."""
        return self.tree.divergence(leaf_a, leaf_b)


def workload_sort_key(priority_rank: int, submit_s: Seconds, workload_id: str) -> tuple[int, Seconds, str]:
    """Order inside a leaf: higher priority first, then earlier submission, then id."""
    return (-priority_rank, submit_s, workload_id)
