"""The pool's indices answer as a walk of every node would (cluster.py): open nodes kept across
starts and stops, nodes by free + unallocated GPUs."""

from __future__ import annotations

import random

import pytest

from timeshare.cluster import NODE_CORDONED, NODE_HEALTHY, Cluster, PoolSpec


def _walk_open(pool, at_least, exclude):
    return [n for n in pool.nodes
            if n.state == NODE_HEALTHY and n.gpus - n.blocked >= at_least and n.index not in exclude]


def _walk_reachable(pool, at_least, exclude, free_limit):
    out = []
    for n in _walk_open(pool, at_least, exclude):
        free = n.free if free_limit < 0 or n.free <= free_limit else free_limit
        if free + n.unallocated >= at_least:
            out.append(n)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_open_and_reachable_nodes_are_what_a_walk_of_the_pool_finds(seed):
    rng = random.Random(seed)
    pool = Cluster([PoolSpec("H100", 12, 8, 4)]).pools["H100"]
    held: list[tuple] = []  # (node, ids, workload id, unallocated GPUs, blocked GPUs)
    for step in range(400):
        roll = rng.random()
        if roll < 0.45:
            node = rng.choice(pool.nodes)
            if node.free:
                gpus = rng.randint(1, node.free)
                wid = f"w{step}"
                (n, ids), = pool.assign([node], gpus, wid)
                unallocated = gpus if rng.random() < 0.4 else 0
                blocked = gpus if not unallocated and rng.random() < 0.5 else 0
                pool.add_unallocated(node, unallocated)
                pool.block(node, blocked)
                held.append((node, ids, wid, unallocated, blocked))
        elif roll < 0.85 and held:
            node, ids, wid, unallocated, blocked = held.pop(rng.randrange(len(held)))
            pool.block(node, -blocked)
            pool.add_unallocated(node, -unallocated)
            pool.release(node, ids, wid)
        else:
            node = rng.choice(pool.nodes)
            pool.set_state(node, NODE_HEALTHY if node.state != NODE_HEALTHY else NODE_CORDONED)
        at_least = rng.randint(1, 8)
        exclude = frozenset(rng.sample(range(12), rng.randint(0, 2)))
        free_limit = rng.choice([-1, 0, 2, 5])
        assert pool.open_nodes(at_least, exclude) == _walk_open(pool, at_least, exclude)
        assert pool.reachable_nodes(at_least, exclude, free_limit) == _walk_reachable(pool, at_least, exclude, free_limit)
