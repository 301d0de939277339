"""Clocks of the shell. The core never reads time; the shell passes ``now`` in.

``WallClock`` is the production clock. ``ManualClock`` is set by a driver (tests, the parity
run): services sharing one in a process all see the same controlled time, and placement
only runs scheduling passes on explicit ticks.
"""

from __future__ import annotations

import time


class WallClock:
    manual = False

    def now_ms(self) -> int:
        return int(time.time() * 1000)


class ManualClock:
    manual = True

    def __init__(self, now_ms: int = 0):
        self._now_ms = now_ms

    def now_ms(self) -> int:
        return self._now_ms

    def set_ms(self, now_ms: int) -> None:
        if now_ms < self._now_ms:
            raise ValueError(f"the clock does not go back ({now_ms} < {self._now_ms})")
        self._now_ms = now_ms


def make_clock(kind: str):
    if kind == "wall":
        return WallClock()
    if kind == "manual":
        return ManualClock()
    raise ValueError(f"TIMESHARE_CLOCK must be 'wall' or 'manual', got {kind!r}")
