"""The allocation tree: slash paths, shares among siblings, fractions of the cluster.

A node's fraction is the product of ``share / sum(sibling shares)`` down its path. Work is
submitted against a leaf. A share of 0 is allowed and means "no budget" (like a Kueue
ClusterQueue with nominal quota 0): the node keeps its history but its fraction is 0, so its
work can only run unallocated. Negative or non-finite shares are errors.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any


class TreeError(ValueError):
    """An invalid allocation tree or a path that is not what the caller needs."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass
class TreeNode:
    path: str
    share: float
    parent: str | None
    depth: int
    children: list[str] = field(default_factory=list)
    fraction: float = 0.0

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


#: the largest share a change may set: shares are proportions among siblings, so a bigger
#: number says nothing a smaller one cannot, and 4e16 next to 1 makes every sibling's fraction 0
MAX_SHARE = 1_000_000.0
#: the longest path and the deepest tree a change may create (the org chart is 3-5 levels)
MAX_PATH_CHARS = 256
MAX_DEPTH = 8
#: a node name a change may create: lower case, digits, '.', '_', '-', starting with a letter
#: or digit (so not '.', '..' or '-x'); it is a path segment, a subject-safe label, a file name
NODE_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
#: names that are devices on Windows (a report written to disk per team would break there)
RESERVED_NAMES = frozenset({"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)),
                            *(f"lpt{i}" for i in range(10))})


def check_change(tree: "AllocationTree", changes: dict[Any, Any], work_by_leaf: dict[str, int]) -> "AllocationTree":
    """The tree after a manager's change of ``{path: share}``, or TreeError naming the path.

    Stricter than :meth:`AllocationTree.from_shares` (which also reads scenario files): a share
    must be finite, at least 0 (0 = "no budget") and at most MAX_SHARE; a new node's name follows
    NODE_NAME and is not reserved, within MAX_DEPTH levels and MAX_PATH_CHARS; and a leaf that
    holds work (``work_by_leaf``: pending or running workloads per leaf) cannot become a parent,
    since work is charged to leaves and its queue would no longer be read."""
    for path in sorted(changes, key=str):
        share = changes[path]
        if not isinstance(path, str) or not path:
            raise TreeError(str(path), "a node is a slash path like 'program/project/team'")
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share):
            raise TreeError(path, f"share must be a finite number, got {share!r}")
        if share < 0:
            raise TreeError(path, f"share must not be negative, got {share!r} (0 means no budget)")
        if share > MAX_SHARE:
            raise TreeError(path, f"share {share!r} is above the maximum of {MAX_SHARE:g} (shares are "
                                  "proportions among siblings: scale them all down)")
        if path in tree.nodes:
            continue
        if len(path) > MAX_PATH_CHARS:
            raise TreeError(path[:40] + "...", f"a path has at most {MAX_PATH_CHARS} characters")
        segments = path.split("/")
        if len(segments) > MAX_DEPTH:
            raise TreeError(path, f"the tree is at most {MAX_DEPTH} levels deep")
        for name in segments:
            if not NODE_NAME.match(name):
                raise TreeError(path, f"node name {name!r}: use lower case letters, digits, '.', '_' or '-', "
                                      "starting with a letter or digit, at most 63 characters")
            if name in RESERVED_NAMES:
                raise TreeError(path, f"node name {name!r} is reserved (a device name on Windows)")
        parent = path.rsplit("/", 1)[0] if "/" in path else None
        if parent is not None and parent in tree.nodes and tree.nodes[parent].is_leaf and work_by_leaf.get(parent):
            raise TreeError(path, f"{parent} is a leaf holding {work_by_leaf[parent]} pending or running "
                                  "workload(s); giving it a child would take that work out of the queue. "
                                  "Add a sibling instead, or let the work end first")
    return tree.with_shares(changes)


def check_removal(tree: "AllocationTree", path: str, work_by_leaf: dict[str, int]) -> "AllocationTree":
    """The tree without ``path`` and its subtree, or TreeError when it is unknown or holds work."""
    tree.node(path)
    busy = sorted((leaf, n) for leaf, n in work_by_leaf.items() if n and is_within(leaf, path))
    if busy:
        listed = ", ".join(f"{leaf} ({n})" for leaf, n in busy[:5])
        raise TreeError(path, f"still holds pending or running work: {listed}; cancel it or let it end first")
    if len(tree.roots) == 1 and tree.roots[0] == path:
        raise TreeError(path, "is the only top-level node; the tree cannot be empty")
    return tree.without(path)


def ancestors(path: str) -> list[str]:
    """Paths from the top level down to and including ``path``: a/b/c -> [a, a/b, a/b/c]."""
    parts = path.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def is_within(path: str, subtree: str) -> bool:
    """True when ``path`` is ``subtree`` or lies below it."""
    return path == subtree or path.startswith(subtree + "/")


#: how many per-leaf split lists a tree keeps at once, counted in entries (one per other leaf):
#: a small tree keeps every leaf's list; a tree of 10,000 leaves keeps 50 and makes the rest on
#: demand, in the time the caller then takes to walk one anyway
SPLIT_CACHE_ENTRIES = 500_000


class SplitIndex:
    """Per leaf, every other leaf in ``tree.leaves`` order with the two sibling subtrees where
    their paths part and those subtrees' node indices: ``(other, a, b, index of a, index of b)``.

    Made on demand from per-node data (a leaf's path, each node's range of leaves), never a
    table of leaf pairs: a tree of n leaves holds O(n) numbers, and a lookup costs one pass over
    the other leaves, as walking the answer does."""

    def __init__(self, tree: "AllocationTree"):
        self._tree = tree
        self._cache: dict[str, list[tuple[str, str, str, int, int]]] = {}
        self._cached_entries = 0

    def __getitem__(self, leaf: str) -> list[tuple[str, str, str, int, int]]:
        found = self._cache.get(leaf)
        if found is not None:
            return found
        tree = self._tree
        leaves = tree.leaves
        paths = tree.node_paths
        out: list[tuple[str, str, str, int, int]] = []
        for start, end, ai, bi in tree.split_ranges(leaf):
            a = paths[ai]
            b = paths[bi]
            for j in range(start, end):
                out.append((leaves[j], a, b, ai, bi))
        if self._cached_entries + len(out) > SPLIT_CACHE_ENTRIES:
            self._cache.clear()
            self._cached_entries = 0
        self._cache[leaf] = out
        self._cached_entries += len(out)
        return out

    def __contains__(self, leaf: object) -> bool:
        return leaf in self._tree.leaf_position


class SplitGroupIndex:
    """:class:`SplitIndex` grouped by subtree pair, in the same order: per leaf, ``(a, b, index
    of a, index of b, [(other, index of other) for the leaves under b])``; a pass compares the
    two subtrees once per pair instead of once per other leaf."""

    def __init__(self, tree: "AllocationTree"):
        self._tree = tree
        self._cache: dict[str, list[tuple[str, str, int, int, list[tuple[str, int]]]]] = {}
        self._cached_entries = 0

    def __getitem__(self, leaf: str) -> list[tuple[str, str, int, int, list[tuple[str, int]]]]:
        found = self._cache.get(leaf)
        if found is not None:
            return found
        tree = self._tree
        leaves = tree.leaves
        leaf_index = tree.leaf_node_index
        paths = tree.node_paths
        out: list[tuple[str, str, int, int, list[tuple[str, int]]]] = []
        entries = 0
        for start, end, ai, bi in tree.split_ranges(leaf):
            out.append((paths[ai], paths[bi], ai, bi, [(leaves[j], leaf_index[j]) for j in range(start, end)]))
            entries += end - start
        if self._cached_entries + entries > SPLIT_CACHE_ENTRIES:
            self._cache.clear()
            self._cached_entries = 0
        self._cache[leaf] = out
        self._cached_entries += entries
        return out

    def __contains__(self, leaf: object) -> bool:
        return leaf in self._tree.leaf_position


class AllocationTree:
    """An immutable, validated allocation tree. Build with :meth:`from_shares`.

    Everything it holds is per node (depth, parent, path, range of leaves), so a tree of n
    nodes takes O(n) space; where two leaves' paths part is found on demand
    (:meth:`divergence`, :attr:`split_index`)."""

    def __init__(self, nodes: dict[str, TreeNode], like: "AllocationTree | None" = None):
        self.nodes = nodes
        if like is not None:
            # the same paths as ``like`` (only shares differ): every structural index is shared
            self._share_structure(like)
            return
        self.roots = sorted(p for p, n in nodes.items() if n.parent is None)
        self.leaves = sorted(p for p, n in nodes.items() if n.is_leaf)
        self.max_depth = max((n.depth for n in nodes.values()), default=0)
        self.paths = {leaf: ancestors(leaf) for leaf in self.leaves}
        #: every node and its path, in ``nodes`` order, as lists: a scheduling pass reads every
        #: node, and a list walks faster than a dict (a tree is immutable, so they never go stale)
        self.node_list: list[TreeNode] = list(nodes.values())
        self.node_paths: list[str] = list(nodes)
        #: (parent, its children) for every parent, roots first as (None, roots); a parent
        #: always comes before its children
        self.sibling_sets: list[tuple[str | None, list[str]]] = [(None, self.roots)]
        for parent, siblings in self.sibling_sets:
            for p in siblings:
                if nodes[p].children:
                    self.sibling_sets.append((p, nodes[p].children))
        #: the same structure by node index (the position in ``node_list``): a scheduling pass
        #: keeps its per-node numbers in lists, read by index instead of hashing paths
        self.index: dict[str, int] = {p: i for i, p in enumerate(self.node_paths)}
        index = self.index
        self.root_index: list[int] = [index[p] for p in self.roots]
        self.children_index: list[list[int]] = [[index[c] for c in n.children] for n in self.node_list]
        #: per node index, its parent's index (-1 for a top-level node) and its depth (0 on top)
        self.parent_index: list[int] = [index[n.parent] if n.parent is not None else -1 for n in self.node_list]
        self.depth: list[int] = [n.depth for n in self.node_list]
        #: per leaf, the indices of its path from the top level down (``paths`` by index)
        self.path_index: dict[str, list[int]] = {leaf: [index[p] for p in self.paths[leaf]] for leaf in self.leaves}
        self.sibling_index: list[tuple[int, list[int]]] = [
            (index[parent] if parent is not None else -1, [index[p] for p in siblings])
            for parent, siblings in self.sibling_sets]
        #: per leaf its position in ``leaves``, and per position the leaf's node index
        self.leaf_position: dict[str, int] = {leaf: j for j, leaf in enumerate(self.leaves)}
        self.leaf_node_index: list[int] = [index[leaf] for leaf in self.leaves]
        #: per node index, the range of ``leaves`` under it, [start, end): the leaves below a
        #: node share the prefix "path/", so they sit next to each other in sorted order
        n = len(self.node_list)
        leaf_start = [-1] * n
        leaf_end = [-1] * n
        for j, leaf in enumerate(self.leaves):
            for i in self.path_index[leaf]:
                if leaf_start[i] < 0:
                    leaf_start[i] = j
                leaf_end[i] = j + 1
        self.leaf_start: list[int] = leaf_start
        self.leaf_end: list[int] = leaf_end
        #: per leaf, every other leaf with the two sibling subtrees where their paths part,
        #: and the subtrees' indices (made on demand, see :class:`SplitIndex`)
        self.split_index = SplitIndex(self)
        self.split_group_index = SplitGroupIndex(self)

    def __getstate__(self) -> dict:
        # the nodes say everything; the indices are rebuilt on load (O(nodes)), so a snapshot
        # holds no per-leaf tables, and one taken by older code loads into this class too
        return {"nodes": self.nodes}

    def __setstate__(self, state: dict) -> None:
        AllocationTree.__init__(self, state["nodes"])

    def _share_structure(self, like: "AllocationTree") -> None:
        nodes = self.nodes
        self.roots = like.roots
        self.leaves = like.leaves
        self.max_depth = like.max_depth
        self.paths = like.paths
        self.node_list = list(nodes.values())
        self.node_paths = like.node_paths
        self.sibling_sets = like.sibling_sets
        self.index = like.index
        self.root_index = like.root_index
        self.children_index = like.children_index
        self.parent_index = like.parent_index
        self.depth = like.depth
        self.path_index = like.path_index
        self.sibling_index = like.sibling_index
        self.leaf_position = like.leaf_position
        self.leaf_node_index = like.leaf_node_index
        self.leaf_start = like.leaf_start
        self.leaf_end = like.leaf_end
        # the splits depend on paths only: the new tree reads the old one's cache
        self.split_index = like.split_index
        self.split_group_index = like.split_group_index

    def split_ranges(self, leaf: str) -> list[tuple[int, int, int, int]]:
        """Where ``leaf``'s path parts from every other leaf's, as ``(start, end, a, b)``
        sorted by start: the leaves ``leaves[start:end]`` part from ``leaf`` between the sibling
        subtrees of node indices ``a`` (on ``leaf``'s path) and ``b`` (theirs). The ranges cover
        every other leaf once."""
        path = self.path_index[leaf]
        leaf_start = self.leaf_start
        leaf_end = self.leaf_end
        out: list[tuple[int, int, int, int]] = []
        parent = -1
        for ai in path:
            for bi in (self.children_index[parent] if parent >= 0 else self.root_index):
                if bi != ai:
                    out.append((leaf_start[bi], leaf_end[bi], ai, bi))
            parent = ai
        out.sort()
        return out

    @property
    def splits(self) -> dict[str, list[tuple[str, str, str]]]:
        """Every leaf's splits by path (:attr:`split_index` without the indices): O(leaves²),
        for tests and display of small trees only."""
        return {leaf: [(other, a, b) for other, a, b, _, _ in self.split_index[leaf]] for leaf in self.leaves}

    def divergence(self, leaf_a: str, leaf_b: str) -> tuple[str, str] | None:
        """The two sibling subtrees where the paths of two leaves part (None for the same leaf)."""
        path_a = self.path_index[leaf_a]
        path_b = self.path_index[leaf_b]
        for k in range(min(len(path_a), len(path_b))):
            if path_a[k] != path_b[k]:
                return self.node_paths[path_a[k]], self.node_paths[path_b[k]]
        return None

    @classmethod
    def from_shares(cls, shares: dict[Any, Any], like: "AllocationTree | None" = None) -> "AllocationTree":
        """Validate ``{path: share}`` and compute fractions; raise TreeError naming the path.

        ``shares`` is what a caller gave (a file, a request), checked here: typed ``Any`` so that
        a compiled build sees the values as given, as the checks below do. With ``like`` (a tree
        of exactly the same paths), the new tree shares its structure and only the fractions
        are computed again."""
        if like is not None and len(shares) == len(like.nodes) and all(p in like.nodes for p in shares):
            nodes: dict[str, TreeNode] = {}
            for path in like.node_paths:
                share = shares[path]
                if isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share):
                    raise TreeError(path, f"share must be a number, got {share!r}")
                if share < 0:
                    raise TreeError(path, f"share must not be negative, got {share!r}")
                old = like.nodes[path]
                # the children list is shared: a tree never changes it once built
                nodes[path] = TreeNode(path=path, share=float(share), parent=old.parent, depth=old.depth,
                                       children=old.children)
            tree = cls(nodes, like)
            tree._compute_fractions()
            return tree
        nodes = {}
        for path in sorted(shares):
            share = shares[path]
            if not isinstance(path, str) or not path or path.startswith("/") or path.endswith("/") or "//" in path:
                raise TreeError(str(path), "a node is a slash path like 'program/project/team'")
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share):
                raise TreeError(path, f"share must be a number, got {share!r}")
            if share < 0:
                raise TreeError(path, f"share must not be negative, got {share!r}")
            parent = path.rsplit("/", 1)[0] if "/" in path else None
            nodes[path] = TreeNode(path=path, share=float(share), parent=parent, depth=path.count("/"))
        for path in nodes:
            parent = nodes[path].parent
            if parent is not None:
                if parent not in nodes:
                    raise TreeError(path, f"unknown parent {parent!r} (declare it with a share)")
                nodes[parent].children.append(path)
        if not nodes:
            raise TreeError("(tree)", "the allocation tree is empty")
        tree = cls(nodes)
        tree._compute_fractions()
        return tree

    def _compute_fractions(self) -> None:
        def assign(siblings: list[str], parent_fraction: float) -> None:
            total = sum(self.nodes[p].share for p in siblings)
            for p in siblings:
                node = self.nodes[p]
                node.fraction = parent_fraction * node.share / total if total > 0 else 0.0
                assign(node.children, node.fraction)

        assign(self.roots, 1.0)

    def shares(self) -> dict[str, float]:
        return {p: self.nodes[p].share for p in sorted(self.nodes)}

    def fraction(self, path: str) -> float:
        return self.node(path).fraction

    def node(self, path: str) -> TreeNode:
        try:
            return self.nodes[path]
        except KeyError:
            raise TreeError(path, "unknown allocation") from None

    def require_leaf(self, path: str) -> TreeNode:
        """The leaf at ``path``; work can only be submitted against a leaf."""
        node = self.node(path)
        if not node.is_leaf:
            raise TreeError(path, f"is a parent of {', '.join(node.children)}; submit against a leaf")
        return node

    def with_shares(self, changes: dict[str, float]) -> "AllocationTree":
        """A new tree with some shares changed or nodes added (validated as a whole; when no
        node is added, only the fractions are computed again)."""
        merged = self.shares()
        merged.update(changes)
        return AllocationTree.from_shares(merged, like=self)

    def without(self, path: str) -> "AllocationTree":
        """A new tree without ``path`` and its subtree."""
        return AllocationTree.from_shares({p: s for p, s in self.shares().items() if not is_within(p, path)})
