"""Hierarchical fair share (Slurm Fair Tree style) over the rolling window.

At every level siblings are ranked by their *usage ratio*::

    ratio = allocated GPU-s in the window / (fraction x pool GPUs x window)

(lower = more deserving; 1.0 means "used exactly its share"). The order is depth-first: every
pending workload of a more deserving subtree precedes those of a less deserving one. Inside a
leaf, priority (urgent first), then submit time, then id. Ties between siblings with equal
ratios break by path, so the order never depends on dict or set order.
"""

from __future__ import annotations

import math

from .tree import AllocationTree
from .window import UsageLedger

INFINITE_RATIO = math.inf


class FairShareView:
    """Usage ratios of every tree node for one GPU type at one instant (immutable snapshot)."""

    def __init__(self, tree: AllocationTree, ledger: UsageLedger, gpu_type: str, pool_gpus: int, now_s: int):
        self.tree = tree
        self.gpu_type = gpu_type
        self.now_s = now_s
        entitled_gpu_s = pool_gpus * ledger.window_s
        ratios: dict[str, float] = {}
        usage: dict[str, int] = {}
        for path, node in tree.nodes.items():
            used = ledger.usage_gpu_s(path, gpu_type, True, now_s)
            usage[path] = used
            denominator = node.fraction * entitled_gpu_s
            ratios[path] = used / denominator if denominator > 0 else INFINITE_RATIO
        self.ratios = ratios
        self.usage_gpu_s = usage
        self._leaf_order: list[str] | None = None
        self._paths = tree.paths

    def ratio(self, path: str) -> float:
        return self.ratios[path]

    def leaf_order(self) -> list[str]:
        """Leaves, most deserving first, ranked depth-first level by level."""
        if self._leaf_order is None:
            out: list[str] = []
            nodes = self.tree.nodes

            def visit(siblings: list[str]) -> None:
                for path in sorted(siblings, key=lambda p: (self.ratios[p], p)):
                    children = nodes[path].children
                    if children:
                        visit(children)
                    else:
                        out.append(path)

            visit(self.tree.roots)
            self._leaf_order = out
        return self._leaf_order

    def ordering_key(self, leaf: str) -> tuple:
        """The key users are shown: (ratio, name) per level from the top, then the leaf's rank."""
        key: list = []
        for path in self._paths[leaf]:
            key.append(round(self.ratios[path], 6))
            key.append(path)
        return tuple(key)

    def divergence(self, leaf_a: str, leaf_b: str) -> tuple[str, str] | None:
        """The two sibling subtrees where the paths of ``leaf_a`` and ``leaf_b`` part, or None."""
        return self.tree.divergence(leaf_a, leaf_b)


def workload_sort_key(priority_rank: int, submit_s: int, workload_id: str) -> tuple[int, int, str]:
    """Order inside a leaf: higher priority first, then earlier submission, then id."""
    return (-priority_rank, submit_s, workload_id)
