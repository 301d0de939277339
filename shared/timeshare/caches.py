"""Every cache of the budget policy, in one typed object kept with the state it describes.

None of them decides anything: each remembers that a search failed (or which nodes a gang could
empty, or when) at a change stamp of the pool (``Pool.change_seq``, moved by every start, stop,
end of a protection and node state change) and for the exact rules' inputs it was made with, so
that the same search is redone only on nodes changed since. ``BudgetPolicy(reference=True)``
clears them before every pass and skips every shortcut; a property test compares the two event
streams byte for byte (tests/sim/test_reference.py).
"""

from __future__ import annotations

from .units import Seconds


class FailedSearches:
    """Single-node victim searches of one leaf (and memo space) that found nothing: the latest
    (change stamp, victims allowed, size), and the latest per size."""

    __slots__ = ("seq", "key", "size", "by_size")

    def __init__(self) -> None:
        self.seq = -1
        self.key: tuple = ()
        self.size = 0  # 0: none yet (a request asks for at least one GPU)
        self.by_size: dict[int, tuple[int, tuple]] = {}


class PolicyCaches:
    """The budget policy's caches for one cluster's state."""

    __slots__ = ("failed", "gang_nodes", "reserve_times", "priority_failed", "priority_gang_nodes")

    def __init__(self) -> None:
        #: (GPU type, leaf, memo space: "in" phase 3, "beyond"/"free" phase 4) -> failed searches
        self.failed: dict[tuple[str, str, str], FailedSearches] = {}
        #: (GPU type, leaf, memo space) -> (change stamp, victims allowed, nodes a gang could empty)
        self.gang_nodes: dict[tuple[str, str, str], tuple[int, tuple, set[int]]] = {}
        #: (GPU type, leaf) -> (change stamp, victims allowed, per node: when the leaf could empty it)
        self.reserve_times: dict[tuple[str, str], tuple[int, tuple, dict[int, Seconds]]] = {}
        #: the old scheduler's (baseline.py) failed victim searches: (GPU type, priority rank,
        #: GPUs) -> (change stamp, storage key) of the latest failure
        self.priority_failed: dict[tuple[str, int, int], tuple[int, int | None]] = {}
        #: and per (GPU type, priority rank): (change stamp, storage key, nodes a gang of that
        #: rank could empty)
        self.priority_gang_nodes: dict[tuple[str, int], tuple[int, int | None, set[int]]] = {}

    def clear(self) -> None:
        self.failed.clear()
        self.gang_nodes.clear()
        self.reserve_times.clear()
