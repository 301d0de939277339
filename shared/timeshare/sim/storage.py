"""The checkpoint storage the simulator models: checkpoints written on notice share the cluster's
checkpoint bandwidth (``checkpoint_bandwidth_gbps``, GB/s; None: unlimited).

A fluid model. Each checkpoint writes ``checkpoint_gb`` and takes at least its declared time
(``checkpoint_on_notice_s``): on its own it writes at ``gb / declared_s``. Checkpoints written
at the same time share the bandwidth max-min fairly (each gets its own rate or an equal part of
what the others leave, whichever is less), so a checkpoint takes ``max(declared, gb / its
share)``. Rates change only when a checkpoint starts or ends; finish times are recomputed then.
Times are whole milliseconds (event times), rounded up.
"""

from __future__ import annotations

import math

from ..units import Seconds, ms_to_s


class _Writer:
    __slots__ = ("attempt", "gb_left", "own_gbps", "earliest_ms", "rate")

    def __init__(self, attempt: int, gb: float, own_gbps: float, earliest_ms: int):
        self.attempt = attempt
        self.gb_left = gb
        self.own_gbps = own_gbps
        self.earliest_ms = earliest_ms
        self.rate = 0.0


class CheckpointStorage:
    """Checkpoints being written, their shares of the bandwidth, and the demand over time."""

    def __init__(self, bandwidth_gbps: float | None):
        self.bandwidth_gbps = bandwidth_gbps
        self.writers: dict[str, _Writer] = {}
        self.last_ms = 0
        #: (ms, GB/s written at the moment) at every change: the storage demand over time
        self.series: list[tuple[int, float]] = []
        self.peak_gbps = 0.0
        self.written_gb = 0.0
        #: moves at every change: a finish computed before is stale after
        self.version = 0

    def _advance(self, now_ms: int) -> None:
        dt_s = (now_ms - self.last_ms) / 1000
        if dt_s > 0:
            for w in self.writers.values():
                done = min(w.gb_left, w.rate * dt_s)
                w.gb_left -= done
                self.written_gb += done
                if w.gb_left < 1e-6:
                    w.gb_left = 0.0
        self.last_ms = now_ms

    def _share(self, now_ms: int) -> None:
        """Max-min fair rates (water-filling) for the writers with data left."""
        active = sorted((w.own_gbps, wid) for wid, w in self.writers.items() if w.gb_left > 1e-6)
        for w in self.writers.values():
            w.rate = 0.0
        left = math.inf if self.bandwidth_gbps is None else self.bandwidth_gbps
        n = len(active)
        for own, wid in active:
            rate = min(own, left / n)
            self.writers[wid].rate = rate
            left -= rate
            n -= 1
        total = sum(w.rate for w in self.writers.values())
        self.series.append((now_ms, total))
        if total > self.peak_gbps:
            self.peak_gbps = total
        self.version += 1

    def add(self, workload_id: str, attempt: int, gb: float, declared_s: Seconds, now_ms: int) -> None:
        self._advance(now_ms)
        own = gb / declared_s if declared_s > 0 else math.inf
        self.writers[workload_id] = _Writer(attempt, gb, own, now_ms + int(round(declared_s * 1000)))
        self._share(now_ms)

    def remove(self, workload_id: str, now_ms: int) -> None:
        if workload_id not in self.writers:
            return
        self._advance(now_ms)
        del self.writers[workload_id]
        self._share(now_ms)

    def finish_ms(self, workload_id: str) -> int | None:
        w = self.writers[workload_id]
        if w.gb_left <= 1e-6:
            return max(w.earliest_ms, self.last_ms)
        if w.rate <= 0:
            return None
        # (less a rounding error: at its own rate a checkpoint ends at its declared time exactly)
        return max(w.earliest_ms, self.last_ms + math.ceil(w.gb_left / w.rate * 1000 - 1e-6))

    def next_finish(self) -> tuple[int, str] | None:
        """(ms, workload id) of the next checkpoint to finish at the current rates, or None."""
        best: tuple[int, str] | None = None
        for wid in sorted(self.writers):
            t = self.finish_ms(wid)
            if t is not None and (best is None or t < best[0]):
                best = (t, wid)
        return best

    def finished(self, workload_id: str, now_ms: int) -> bool:
        """Whether ``workload_id``'s checkpoint is written by ``now_ms`` (advancing to then)."""
        self._advance(now_ms)
        w = self.writers.get(workload_id)
        return w is not None and w.gb_left <= 1e-6 and w.earliest_ms <= now_ms

    def hourly_peak_gbps(self, end_ms: int) -> list[float]:
        """The highest demand of each hour of the run (GB/s)."""
        hours = max(1, math.ceil(end_ms / 3_600_000))
        out = [0.0] * hours
        series = self.series
        for i, (t, rate) in enumerate(series):
            until = series[i + 1][0] if i + 1 < len(series) else end_ms
            h0 = min(t // 3_600_000, hours - 1)
            h1 = min(max(until - 1, t) // 3_600_000, hours - 1)
            for h in range(h0, h1 + 1):
                if rate > out[h]:
                    out[h] = rate
        return [round(x, 3) for x in out]


def ms_time(ms: int) -> Seconds:
    return ms_to_s(ms)
