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
    (change stamp, victims allowed, size, free limit), and the latest per size and free limit.

    The free limit (the most free GPUs of a node the request could use, -1: all) is kept apart
    from the victims allowed because a failure covers every smaller limit (:func:`covers`):
    the headroom's limit of an unallocated request moves with the pool's free GPUs at every
    start and stop, and as part of the key it made a 16,384-GPU pool search every node again
    for most retries (docs/records/2026-12-02-per-event.md)."""

    __slots__ = ("seq", "key", "size", "free_limit", "by_size")

    def __init__(self) -> None:
        self.seq = -1
        self.key: tuple = ()
        self.size = 0  # 0: none yet (a request asks for at least one GPU)
        self.free_limit = -1
        #: (size, free limit) -> (change stamp, victims allowed): a retry with a larger limit
        #: than the latest failure's still finds an earlier one that covers it
        self.by_size: dict[tuple[int, int], tuple[int, tuple]] = {}


def covers(failed_free_limit: int, free_limit: int) -> bool:
    """Whether a search that failed using at most ``failed_free_limit`` free GPUs of a node
    (-1: all) also fails, on the nodes unchanged since, for a request that may use at most
    ``free_limit``: it may use no more free GPUs on any node, and the victims allowed are the
    same (the rest of the memo's key), so no node that was short is enough now."""
    return failed_free_limit < 0 or 0 <= free_limit <= failed_free_limit


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
