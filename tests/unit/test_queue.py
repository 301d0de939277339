"""A leaf's queue keeps, per GPU count, the shortest minimum runtime of its requests as a walk of
them would find it (queue.LeafQueue: what lets a pass skip sizes a gang reservation keeps off)."""

from __future__ import annotations

import random

import pytest

from timeshare.queue import LeafQueue


@pytest.mark.parametrize("seed", range(8))
def test_the_shortest_minimum_runtime_of_each_size_is_what_a_walk_of_the_requests_finds(seed):
    rng = random.Random(seed)
    q = LeafQueue()
    queued: dict[tuple, tuple[int, int]] = {}  # key -> (gpus, min_runtime_s)
    for step in range(600):
        if queued and rng.random() < 0.45:
            key = rng.choice(sorted(queued))
            gpus, runtime = queued.pop(key)
            q.remove(gpus, key, runtime)
        else:
            key = (rng.randint(-2, 0), rng.randint(0, 50), f"w{step}")
            gpus, runtime = rng.choice([1, 2, 4, 8, 16]), rng.choice([0, 60, 600, 3600, 7200])
            q.add(gpus, key, runtime)
            queued[key] = (gpus, runtime)
        for gpus in (1, 2, 4, 8, 16):
            runtimes = [r for g, r in queued.values() if g == gpus]
            if rng.random() < 0.5 or not runtimes:  # asked for now and then: the kept minimum must stay right
                assert q.shortest_runtime_s(gpus) == (min(runtimes) if runtimes else 0)
        assert q.count == len(queued)
        assert sorted(q.by_size) == sorted({g for g, _ in queued.values()})
