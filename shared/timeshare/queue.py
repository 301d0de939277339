"""Pending work of one leaf and GPU type, ordered, and grouped by GPU count.

Grouping by GPU count lets a scheduling pass skip, in one step, every request at least as
large as one that could not be placed: a pass over thousands of pending workloads only
touches the few that can still be placed.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import Callable, Iterator, Union

Key = tuple  # (-priority rank, submit_s, workload id)
#: the largest GPU count a walk may still yield, plus one (re-read after every item)
Limit = Callable[[], float]


class LeafQueue:
    __slots__ = ("by_size", "count", "version", "runtimes", "_shortest", "_min_gpus")

    def __init__(self) -> None:
        self.by_size: dict[int, list[Key]] = {}
        self.count = 0
        self.version = 0  # moves on every change: a walk re-finds its place only then
        #: per GPU count, how many of its requests declare each minimum runtime (seconds): a
        #: pass skips, in one step, the sizes whose every request a gang reservation keeps off
        #: its nodes (reservation.keeps_off depends on the minimum runtime)
        self.runtimes: dict[int, dict[int, int]] = {}
        #: per GPU count, min(runtimes[gpus]) once asked for (dropped when it may have moved)
        self._shortest: dict[int, int] = {}
        #: min(by_size) once asked for, -1: not known (every pass's walk limits ask for it)
        self._min_gpus = -1

    def add(self, gpus: int, key: Key, min_runtime_s: int = 0) -> None:
        insort(self.by_size.setdefault(gpus, []), key)
        if gpus < self._min_gpus:
            self._min_gpus = gpus
        self.count += 1
        self.version += 1
        counts = self.runtimes.get(gpus)
        if counts is None:
            counts = self.runtimes[gpus] = {}
        counts[min_runtime_s] = counts.get(min_runtime_s, 0) + 1
        shortest = self._shortest.get(gpus)
        if shortest is not None and min_runtime_s < shortest:
            self._shortest[gpus] = min_runtime_s

    def remove(self, gpus: int, key: Key, min_runtime_s: int = 0) -> None:
        """Take out the request added as ``(gpus, key, min_runtime_s)``."""
        keys = self.by_size[gpus]
        i = bisect_left(keys, key)
        if i == len(keys) or keys[i] != key:
            raise KeyError(key)
        del keys[i]
        if not keys:
            del self.by_size[gpus]
            if gpus == self._min_gpus:
                self._min_gpus = -1
        self.count -= 1
        self.version += 1
        counts = self.runtimes[gpus]
        left = counts[min_runtime_s] - 1
        if left:
            counts[min_runtime_s] = left
        else:
            del counts[min_runtime_s]
            if not counts:
                del self.runtimes[gpus]
            if self._shortest.get(gpus) == min_runtime_s:
                del self._shortest[gpus]

    def shortest_runtime_s(self, gpus: int) -> int:
        """The shortest minimum runtime among the requests of ``gpus`` GPUs (0: none)."""
        shortest = self._shortest.get(gpus)
        if shortest is None:
            counts = self.runtimes.get(gpus)
            if not counts:
                return 0
            shortest = self._shortest[gpus] = min(counts)
        return shortest

    def min_gpus(self) -> int:
        """The smallest GPU count pending (0: none)."""
        if self._min_gpus < 0:
            if not self.by_size:
                return 0
            self._min_gpus = min(self.by_size)
        return self._min_gpus

    def ordered(self) -> list[tuple[Key, int]]:
        """All entries in order (for display; passes use :meth:`walk`)."""
        return sorted((k, g) for g, keys in self.by_size.items() for k in keys)

    def walk(self, limit: Limit) -> Iterator[tuple[Key, int]]:
        """Yield ``(key, gpus)`` in order among sizes below ``limit()`` (see :func:`walk`)."""
        return walk([self], limit)


def walk(queues: list[LeafQueue], limit: Union[Limit, list[Limit]]) -> Iterator[tuple[Key, int]]:
    """Yield ``(key, gpus)`` of several queues merged in key order, among sizes below ``limit()``.

    ``limit`` (one callable, or one per queue) is re-read after every item, so a caller
    that learns a size cannot be placed
    lowers it and larger groups drop out. The walk only moves forward in key order: an entry
    a limit kept out as the walk went past it is not yielded later, even if the limit rises
    (as if it had been tried and failed). Entries may be removed or added during the walk;
    nothing is yielded twice (an entry added behind the walk's position waits for the next
    pass).
    """
    groups = [(g, keys, qi) for qi, q in enumerate(queues) for g, keys in q.by_size.items()]
    n = len(groups)
    last: list[Key | None] = [None] * n
    #: per group, the index of its next key, valid while its queue's version is the one seen
    #: and the group was never kept out (so its next key lies beyond the cursor): most steps
    #: need no binary search and no key comparison with the cursor
    resume = [0] * n
    seen_by_group = [queues[qi].version for _, _, qi in groups]
    ahead = [True] * n
    limits = limit if isinstance(limit, (list, tuple)) else None
    one = None if isinstance(limit, (list, tuple)) else limit
    bounds: list[float] = [0.0] * (len(limits) if limits is not None else 0)
    #: the last key yielded by any group: the walk never goes back before it, so a request the
    #: limit kept out when its turn came (it could not start then) is not tried later in the
    #: same walk either, exactly as if it had been tried and had failed
    cursor: Key | None = None
    while True:
        if limits is not None:
            for qi in range(len(limits)):
                bounds[qi] = limits[qi]()
        bound = one() if one is not None else 0.0
        best: Key | None = None
        best_i = best_c = -1
        for i in range(n):
            g, keys, qi = groups[i]
            if g >= (bounds[qi] if limits is not None else bound) or not keys:
                ahead[i] = False  # kept out (or empty) while the walk may move past it
                continue
            version = queues[qi].version
            if ahead[i] and seen_by_group[i] == version:
                c = resume[i]
            else:
                # find its place again: just past its last key and past the cursor
                after = last[i]
                if cursor is not None and (after is None or after < cursor):
                    after = cursor
                c = bisect_right(keys, after) if after is not None else 0
                resume[i] = c
                seen_by_group[i] = version
                ahead[i] = True
            if c < len(keys):
                k = keys[c]
                if best is None or k < best:
                    best, best_i, best_c = k, i, c
        if best is None:
            return
        last[best_i] = best
        resume[best_i] = best_c + 1
        cursor = best
        yield best, groups[best_i][0]
