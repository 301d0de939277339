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
    choices in the same pass see the new fills.

    The numbers live in lists by node index (``tree.index``; methods ending in ``_at`` take
    one): a pass reads them thousands of times, and an index is cheaper than hashing a path.
    The dicts by path (:attr:`ratios`, :attr:`due_gpus`...) are built on first use, for
    display and tests."""

    def __init__(self, tree: AllocationTree, ledger: UsageLedger, gpu_type: str, pool_gpus: int, now_s: Seconds,
                 catch_up: float = 1.0):
        self.tree = tree
        self.gpu_type = gpu_type
        self.now_s = now_s
        # float() where Python would convert anyway (int / float, float * int): the same
        # numbers, and native arithmetic when compiled
        entitled_gpu_s = float(pool_gpus * ledger.covered_s(now_s))
        n = len(tree.node_list)
        ratios: list[float] = [0.0] * n
        weight: list[float] = [0.0] * n
        usage: list[Seconds] = [0] * n
        running: list[int] = [0] * n
        free_running: list[int] = [0] * n
        # what ledger.snapshots would return, read straight from the tracks in node order
        on_tracks, off_tracks = ledger.aligned_tracks(tree.node_paths, gpu_type)
        window_start_s = now_s - ledger.window_s
        i = 0
        for node in tree.node_list:
            track = on_tracks[i]
            if track is not None and track.times:
                used = track.window_gpu_s(now_s, window_start_s)
                usage[i] = used
                running[i] = track.rates[-1]
            else:
                used = 0
            track = off_tracks[i]
            if track is not None and track.rates:
                free_running[i] = track.rates[-1]
            denominator = node.fraction * entitled_gpu_s
            ratio = float(used) / denominator if denominator > 0 else INFINITE
            ratios[i] = ratio
            weight[i] = node.share * max(0.0, 1.0 + catch_up * (1.0 - ratio)) if denominator > 0 else 0.0
            i += 1

        # the parent's due GPUs are divided among its children by catch-up weight, so the due
        # shares of a sibling set add up to exactly what their parent is due (parents come
        # before their children in tree.sibling_index)
        due: list[float] = [0.0] * n
        for parent, siblings in tree.sibling_index:
            gpus = due[parent] if parent >= 0 else float(pool_gpus)
            total = 0.0
            for j in siblings:
                total += weight[j]
            for j in siblings:
                due[j] = gpus * weight[j] / total if total > 0 else 0.0

        self._ratio = ratios
        self._due = due
        self._running = running
        self._free_running = free_running
        self._usage = usage
        self._entitled = [node.fraction * entitled_gpu_s for node in tree.node_list]
        self._index = tree.index
        self._node_paths = tree.node_paths
        self._children = tree.children_index
        self._path_index = tree.path_index
        #: how many times the pass charged this view: a stamp for what is derived from its fills
        self.charges = 0
        # fills pick has computed (-1: not yet); charge resets those of the nodes it changes
        self._fill_memo: list[float] = [-1.0] * n
        self._total_fill_memo: list[float] = [-1.0] * n
        # the dicts by path, built when first read (running ones again after a charge)
        self._ratios_dict: dict[str, float] | None = None
        self._due_dict: dict[str, float] | None = None
        self._usage_dict: dict[str, Seconds] | None = None
        self._running_dict: dict[str, int] | None = None
        self._free_running_dict: dict[str, int] | None = None

    # -- by path ----------------------------------------------------------------------------
    @property
    def ratios(self) -> dict[str, float]:
        """Usage ratio by path (read only)."""
        d = self._ratios_dict
        if d is None:
            d = self._ratios_dict = dict(zip(self._node_paths, self._ratio))
        return d

    @property
    def due_gpus(self) -> dict[str, float]:
        """GPUs due now by path (read only)."""
        d = self._due_dict
        if d is None:
            d = self._due_dict = dict(zip(self._node_paths, self._due))
        return d

    @property
    def usage_gpu_s(self) -> dict[str, Seconds]:
        """Allocated GPU-s in the window by path (read only)."""
        d = self._usage_dict
        if d is None:
            d = self._usage_dict = dict(zip(self._node_paths, self._usage))
        return d

    @property
    def running_gpus(self) -> dict[str, int]:
        """Allocated GPUs running by path, with what the pass charged (read only)."""
        d = self._running_dict
        if d is None:
            d = self._running_dict = dict(zip(self._node_paths, self._running))
        return d

    @property
    def unallocated_running_gpus(self) -> dict[str, int]:
        """Unallocated GPUs running by path, with what the pass charged (read only)."""
        d = self._free_running_dict
        if d is None:
            d = self._free_running_dict = dict(zip(self._node_paths, self._free_running))
        return d

    def fill(self, path: str, extra_gpus: int = 0) -> float:
        return self.fill_at(self._index[path], extra_gpus)

    def key(self, path: str) -> tuple[float, float, str]:
        i = self._index[path]
        return (self.fill_at(i), self._ratio[i], path)

    def total_fill(self, path: str, extra_gpus: int = 0) -> float:
        return self.total_fill_at(self._index[path], extra_gpus)

    def total_key(self, path: str) -> tuple[float, float, str]:
        """Order for unallocated work: all GPUs the subtree runs (allocated or not) / due.

        Free capacity is shared fairly too: a team owed its share gets it through
        unallocated work when that is all it asks for."""
        i = self._index[path]
        return (self.total_fill_at(i), self._ratio[i], path)

    # -- by node index ----------------------------------------------------------------------
    def fill_at(self, i: int, extra_gpus: int = 0) -> float:
        due = self._due[i]
        running = self._running[i] + extra_gpus
        if due > 0:
            return running / due
        return INFINITE

    def total_fill_at(self, i: int, extra_gpus: int = 0) -> float:
        due = self._due[i]
        running = self._running[i] + self._free_running[i] + extra_gpus
        return running / due if due > 0 else INFINITE

    def ratio_at(self, i: int) -> float:
        return self._ratio[i]

    def ratio_with_at(self, i: int, extra_gpus: int, horizon_s: Seconds) -> float:
        """The usage ratio node ``i`` would reach if it ran its allocated GPUs and ``extra_gpus``
        more for ``horizon_s`` more seconds, against the window's entitlement now."""
        entitled = self._entitled[i]
        if entitled <= 0:
            return INFINITE
        return (float(self._usage[i]) + float((self._running[i] + extra_gpus) * horizon_s)) / entitled

    def due_at(self, i: int) -> float:
        return self._due[i]

    def running_at(self, i: int) -> int:
        return self._running[i]

    def unallocated_running_at(self, i: int) -> int:
        return self._free_running[i]

    def charge(self, leaf: str, delta_gpus: int, allocated: bool = True) -> None:
        """Record GPUs started (or stopped, negative) for ``leaf`` during a pass."""
        self.charges += 1
        running = self._running if allocated else self._free_running
        fill_memo = self._fill_memo
        total_fill_memo = self._total_fill_memo
        for i in self._path_index[leaf]:
            running[i] += delta_gpus
            fill_memo[i] = -1.0
            total_fill_memo[i] = -1.0
        if allocated:
            self._running_dict = None
        else:
            self._free_running_dict = None

    def leaf_order(self, among: Collection[str] | None = None, total: bool = False) -> list[str]:
        """Leaves, most deserving first, ranked depth-first level by level; with ``among``, only
        those leaves, in the same order (subtrees holding none of them are not ranked at all);
        with ``total``, by all GPUs each subtree runs (:meth:`total_key`, phase 4's order)."""
        out: list[str] = []
        within: list[bool] | None = None
        if among is not None:
            within = [False] * len(self._node_paths)
            path_index = self._path_index
            for leaf in among:
                for i in path_index[leaf]:
                    within[i] = True
        self._visit(self.tree.root_index, out, within, total)
        return out

    def _visit(self, siblings: list[int], out: list[str], within: list[bool] | None, total: bool = False) -> None:
        # a method, not a recursive closure: compiled by mypyc, a closure that calls itself is
        # a reference cycle per call, which only the garbage collector frees
        paths = self._node_paths
        # sorted by key(): (fill, ratio, path); paths are unique, so the index is never compared
        # and sorting a subset keeps its order
        ranked: list[tuple[float, float, str, int]] = []
        for i in siblings:
            if within is None or within[i]:
                ranked.append((self.total_fill_at(i) if total else self.fill_at(i), self._ratio[i], paths[i], i))
        ranked.sort()
        for _, _, path, i in ranked:
            children = self._children[i]
            if children:
                self._visit(children, out, within, total)
            else:
                out.append(path)

    def pick(self, active: dict[str, int], key: Callable[[str], tuple] | None = None) -> str | None:
        """The most deserving leaf among those with ``active[path] > 0`` leaves beneath (by
        :meth:`key`, or by another key of the same kind)."""
        if key is None or key == self.key or key == self.total_key:
            by_index = [active.get(path, 0) for path in self._node_paths]
            i = self.pick_at(by_index, key is not None and key == self.total_key)
            return self._node_paths[i] if i >= 0 else None
        nodes = self.tree.nodes
        siblings = self.tree.roots
        while True:
            best: str | None = None
            best_key: tuple | None = None
            for path in siblings:
                if active.get(path, 0) > 0:
                    k = key(path)
                    if best_key is None or k < best_key:
                        best, best_key = path, k
            if best is None:
                return None
            children = nodes[best].children
            if not children:
                return best
            siblings = children

    def pick_by_total(self, active: dict[str, int]) -> str | None:
        """``pick(active, self.total_key)``."""
        return self.pick(active, self.total_key)

    def pick_at(self, active: list[int], total: bool = False) -> int:
        """:meth:`pick` by node index: the index of the most deserving leaf among those with
        ``active[i] > 0`` leaves beneath, ordered by :meth:`key` (by :meth:`total_key` when
        ``total``), or -1. A pass picks after every start and whenever a leaf runs out of
        work, while only the nodes of charged leaves change: fills are kept until then."""
        memo = self._total_fill_memo if total else self._fill_memo
        ratio = self._ratio
        paths = self._node_paths
        siblings = self.tree.root_index
        while True:
            best = -1
            best_fill = best_ratio = 0.0
            keyed = False  # best's fill is needed only if another sibling is active
            for i in siblings:
                if active[i] > 0:
                    if best < 0:
                        best = i
                        continue
                    if not keyed:
                        best_fill = memo[best]
                        if best_fill < 0:
                            best_fill = memo[best] = self.total_fill_at(best) if total else self.fill_at(best)
                        best_ratio = ratio[best]
                        keyed = True
                    f = memo[i]
                    if f < 0:
                        f = memo[i] = self.total_fill_at(i) if total else self.fill_at(i)
                    r = ratio[i]
                    # (f, r, path) < (best_fill, best_ratio, best's path), as tuples compare
                    if f < best_fill or (f == best_fill and (r < best_ratio or (r == best_ratio
                                                                                and paths[i] < paths[best]))):
                        best, best_fill, best_ratio = i, f, r
            if best < 0:
                return -1
            children = self._children[best]
            if not children:
                return best
            siblings = children

    def ordering_key(self, leaf: str) -> list[dict]:
        """What users are shown: per level from the top, the subtree's fill and ratio."""
        return [
            {"subtree": self._node_paths[i], "fill": round(self.fill_at(i), 6), "ratio": round(self._ratio[i], 6),
             "due_gpus": round(self._due[i], 3), "running_gpus": self._running[i]}
            for i in self._path_index[leaf]
        ]

    def divergence(self, leaf_a: str, leaf_b: str) -> tuple[str, str] | None:
        """The two sibling subtrees where the paths of ``leaf_a`` and ``leaf_b`` part, or None."""
        return self.tree.divergence(leaf_a, leaf_b)


def workload_sort_key(priority_rank: int, submit_s: Seconds, workload_id: str) -> tuple[int, Seconds, str]:
    """Order inside a leaf: higher priority first, then earlier submission, then id."""
    return (-priority_rank, submit_s, workload_id)
