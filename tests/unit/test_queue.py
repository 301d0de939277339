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


def test_a_snapshot_from_before_the_queues_by_leaf_rebuilds_them_and_decides_the_same():
    """A pass reads each leaf's queues from SchedulerState.leaf_queues; a state pickled before
    that index existed rebuilds it from its queues on load, and its next pass decides as the
    state that kept it does."""
    import pickle

    from tests.builders import ScenarioBuilder, spec
    from timeshare.state import SchedulerState

    h = ScenarioBuilder().pool(nodes=2, gpus_per_node=8).teams(a=1, b=1).harness()
    h.submit(spec("a-big", "a", gpus=8, min_runtime="1h"), spec("a-free", "a", gpus=4),
             spec("b-big", "b", gpus=8, min_runtime="1h"), spec("b-more", "b", gpus=8, min_runtime="1h"),
             spec("b-free", "b", gpus=2))
    h.schedule(0)
    assert h.state.pending_count > 0
    d = pickle.loads(pickle.dumps(h.state)).__dict__
    del d["leaf_queues"]
    old = SchedulerState.__new__(SchedulerState)
    old.__setstate__(d)
    # the same queue objects, in the same places
    assert {(t, leaf, cls): q for t, by_leaf in old.leaf_queues.items() for leaf, pair in by_leaf.items()
            for cls, q in zip("ua", pair) if q is not None} == old.queues
    kept = pickle.loads(pickle.dumps(h.state))
    for state in (old, kept):
        state.apply(state.completed("a-big", 3600))
    passes = [[(type(e).__name__, getattr(e, "workload_id", None)) for e in h.policy.schedule(state, 3600)]
              for state in (old, kept)]
    assert passes[0] == passes[1] and passes[0]
