"""Rolling-window occupancy: GPU-seconds per tree node and GPU type over the lookback window.

Each (node, GPU type, allocated?) track keeps the piecewise-linear cumulative integral of its
GPU count: breakpoints ``(t, cumulative GPU-s at t, GPUs from t on)``. Usage in the window is
``cum(now) - cum(now - window)``, which is exact (integers in, integers out), includes the
running part up to ``now``, and costs one binary search. Breakpoints older than the window
are dropped as time moves on, so memory is bounded by the events inside one window.

Queries must not go back in time: ``now_s`` is non-decreasing across calls.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Final, Iterable

from .tree import ancestors
from .units import Seconds

_COMPACT_AT: Final = 4096


class _Track:
    __slots__ = ("times", "cums", "rates", "head", "cursor")

    def __init__(self) -> None:
        self.times: list[Seconds] = []
        self.cums: list[Seconds] = []
        self.rates: list[int] = []
        self.head = 0
        #: the breakpoint the last query before "now" found: the window's start moves forward
        #: only, so the next such query walks on from here instead of searching
        self.cursor = 0

    def cum_at(self, t: Seconds) -> Seconds:
        times = self.times
        if t >= times[-1]:  # "now": past the last breakpoint, no search needed
            return self.cums[-1] + self.rates[-1] * (t - times[-1])
        head = self.head
        if t < times[head]:
            # before the first kept breakpoint: only possible before any usage at all
            return self.cums[head] if head > 0 else 0
        # the last breakpoint at or before t (times increase): walk on from the cursor, or
        # search when the query is before it
        i = self.cursor
        if i <= head:
            i = head
        elif times[i] > t:
            i = bisect_right(times, t, head) - 1
        last = len(times) - 1
        while i < last and times[i + 1] <= t:
            i += 1
        self.cursor = i
        return self.cums[i] + self.rates[i] * (t - times[i])

    def window_gpu_s(self, now_s: Seconds, window_start_s: Seconds) -> Seconds:
        """``cum_at(now_s) - cum_at(window_start_s)`` (the same arithmetic), for a track with
        breakpoints and a query at or after the last one: one call instead of two."""
        times = self.times
        last = len(times) - 1
        if now_s >= times[last]:
            now_cum = self.cums[last] + self.rates[last] * (now_s - times[last])
        else:
            now_cum = self.cum_at(now_s)
        return now_cum - self.cum_at(window_start_s)

    def rate(self) -> int:
        return self.rates[-1] if self.rates else 0

    def add(self, now_s: Seconds, delta_gpus: int, window_s: int) -> None:
        times = self.times
        if times and times[-1] == now_s:
            self.rates[-1] += delta_gpus
            return
        cum = self.cum_at(now_s) if times else 0
        times.append(now_s)
        self.cums.append(cum)
        self.rates.append(self.rate() + delta_gpus)
        # keep one breakpoint at or before the window start, drop the rest lazily
        horizon = now_s - window_s
        head = self.head
        while head + 1 < len(times) and times[head + 1] <= horizon:
            head += 1
        self.head = head
        if head >= _COMPACT_AT:
            del times[:head], self.cums[:head], self.rates[:head]
            self.head = 0
            self.cursor = max(0, self.cursor - head)


class UsageLedger:
    """Allocated / unallocated GPU-seconds per tree node (aggregated up) and GPU type."""

    def __init__(self, window_s: int, origin_s: Seconds = 0):
        if window_s <= 0:
            raise ValueError("lookback window must be positive")
        self.window_s = window_s
        #: when records begin: until a whole window has passed, shares are measured against
        #: the time since then (a team is not "under-used" for days before the scheduler ran)
        self.origin_s = origin_s
        self._tracks: dict[tuple[str, str, bool], _Track] = {}
        #: the same tracks by (GPU type, allocated?) then path, for :meth:`snapshots`
        self._by_kind: dict[tuple[str, bool], dict[str, _Track]] = {}
        self._paths: dict[str, list[str]] = {}
        #: per GPU type: (paths, track count, allocated tracks, unallocated tracks) aligned with
        #: the paths a pass last asked about (see :meth:`aligned_tracks`)
        self._aligned: dict[str, tuple[list[str], int, list[_Track | None], list[_Track | None]]] = {}

    def covered_s(self, now_s: Seconds) -> Seconds:
        """The part of the window that has records: min(window, now - origin), at least 1 s."""
        return max(1.0, min(self.window_s, now_s - self.origin_s))

    def _track(self, path: str, gpu_type: str, allocated: bool) -> _Track:
        key = (path, gpu_type, allocated)
        track = self._tracks.get(key)
        if track is None:
            track = self._tracks[key] = _Track()
            self._by_kind.setdefault((gpu_type, allocated), {})[path] = track
        return track

    def add_running(self, leaf: str, gpu_type: str, allocated: bool, delta_gpus: int, now_s: Seconds) -> None:
        """Record that ``delta_gpus`` more (or fewer, if negative) GPUs run for ``leaf`` from now on.

        The path "" is the whole cluster."""
        paths = self._paths.get(leaf)
        if paths is None:
            paths = self._paths[leaf] = ["", *ancestors(leaf)]
        for path in paths:
            self._track(path, gpu_type, allocated).add(now_s, delta_gpus, self.window_s)

    def usage_gpu_s(self, path: str, gpu_type: str, allocated: bool, now_s: Seconds) -> Seconds:
        """GPU-seconds used by ``path``'s subtree in ``(now - window, now]``."""
        track = self._tracks.get((path, gpu_type, allocated))
        if track is None or not track.times:
            return 0
        return track.cum_at(now_s) - track.cum_at(now_s - self.window_s)

    def snapshot(self, path: str, gpu_type: str, now_s: Seconds) -> tuple[Seconds, int, int]:
        """(allocated GPU-s in the window, allocated GPUs running, unallocated GPUs running)."""
        tracks = self._tracks
        used: Seconds = 0
        running = 0
        track = tracks.get((path, gpu_type, True))
        if track is not None and track.times:
            used = track.cum_at(now_s) - track.cum_at(now_s - self.window_s)
            running = track.rates[-1]
        track = tracks.get((path, gpu_type, False))
        free_running = track.rates[-1] if track is not None and track.rates else 0
        return used, running, free_running

    def snapshots(self, paths: Iterable[str], gpu_type: str, now_s: Seconds
                  ) -> tuple[dict[str, Seconds], dict[str, int], dict[str, int]]:
        """:meth:`snapshot` of many paths at once (one scheduling pass reads every tree node):
        allocated GPU-s in the window, allocated GPUs running, unallocated GPUs running, by path."""
        allocated = self._by_kind.get((gpu_type, True), {})
        unallocated = self._by_kind.get((gpu_type, False), {})
        window_start_s = now_s - self.window_s
        used: dict[str, Seconds] = {}
        running: dict[str, int] = {}
        free_running: dict[str, int] = {}
        for path in paths:
            track = allocated.get(path)
            if track is not None and track.times:
                used[path] = track.cum_at(now_s) - track.cum_at(window_start_s)
                running[path] = track.rates[-1]
            else:
                used[path] = running[path] = 0
            track = unallocated.get(path)
            free_running[path] = track.rates[-1] if track is not None and track.rates else 0
        return used, running, free_running

    def aligned_tracks(self, paths: list[str], gpu_type: str) -> tuple[list[_Track | None], list[_Track | None]]:
        """The allocated and the unallocated track of each of ``paths`` (None: no usage yet), as
        lists in the order of ``paths``. Kept while ``paths`` is the same list object and no
        track was added: every pass reads every tree node, and index beats dict lookup."""
        cached = self._aligned.get(gpu_type)
        if cached is not None and cached[0] is paths and cached[1] == len(self._tracks):
            return cached[2], cached[3]
        allocated = self._by_kind.get((gpu_type, True), {})
        unallocated = self._by_kind.get((gpu_type, False), {})
        on: list[_Track | None] = [allocated.get(p) for p in paths]
        off: list[_Track | None] = [unallocated.get(p) for p in paths]
        self._aligned[gpu_type] = (paths, len(self._tracks), on, off)
        return on, off

    def running_gpus(self, path: str, gpu_type: str, allocated: bool) -> int:
        track = self._tracks.get((path, gpu_type, allocated))
        return track.rate() if track else 0

    def gpu_types(self) -> list[str]:
        return sorted({k[1] for k in self._tracks})
