"""The pool's indices answer as a walk of every node would (cluster.py): open nodes kept across
starts and stops, nodes by free + unallocated GPUs, and by the leaves whose unallocated work
they hold (Pool.groups)."""

from __future__ import annotations

import random

import pytest

from timeshare import cluster
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


def _walk_reachable_from(pool, at_least, leaves, exclude, free_limit, held):
    """As _walk_reachable, counting only the unallocated GPUs of ``leaves`` (from the holders'
    own record, not the pool's)."""
    out = []
    for n in _walk_open(pool, at_least, exclude):
        free = n.free if free_limit < 0 or n.free <= free_limit else free_limit
        mine = sum(unallocated for node, _, _, unallocated, _, leaf in held if node is n and leaf in leaves)
        if free + mine >= at_least:
            out.append(n)
    return out


def _walk_find_free(pool, gpus):
    """Best fit by a walk: the healthy node with the fewest free GPUs that suffice, the lowest
    index among them."""
    fits = [n for n in pool.nodes if n.state == NODE_HEALTHY and n.free >= gpus]
    return [min(fits, key=lambda n: (n.free, n.index))] if fits else None


@pytest.mark.parametrize("seed", range(8))
def test_open_and_reachable_nodes_are_what_a_walk_of_the_pool_finds(seed, monkeypatch):
    rng = random.Random(seed)
    if seed % 2:  # the free buckets' heaps rebuilt often (cluster.Pool._into_bucket)
        monkeypatch.setattr(cluster, "BUCKET_HEAP_SLACK", 0)
    pool = Cluster([PoolSpec("H100", 12, 8, 4)]).pools["H100"]
    held: list[tuple] = []  # (node, ids, workload id, unallocated GPUs, blocked GPUs, leaf)
    leaves = ["a", "b", "c", "d"]
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
                leaf = rng.choice(leaves)
                pool.add_unallocated(node, unallocated, leaf)
                pool.block(node, blocked)
                held.append((node, ids, wid, unallocated, blocked, leaf))
        elif roll < 0.85 and held:
            node, ids, wid, unallocated, blocked, leaf = held.pop(rng.randrange(len(held)))
            pool.block(node, -blocked)
            pool.add_unallocated(node, -unallocated, leaf)
            pool.release(node, ids, wid)
        else:
            node = rng.choice(pool.nodes)
            pool.set_state(node, NODE_HEALTHY if node.state != NODE_HEALTHY else NODE_CORDONED)
        at_least = rng.randint(1, 8)
        exclude = frozenset(rng.sample(range(12), rng.randint(0, 2)))
        free_limit = rng.choice([-1, 0, 2, 5])
        assert pool.open_nodes(at_least, exclude) == _walk_open(pool, at_least, exclude)
        for gpus in range(1, 9):
            assert pool.find_free(gpus) == _walk_find_free(pool, gpus), gpus
        assert pool.reachable_nodes(at_least, exclude, free_limit) == _walk_reachable(pool, at_least, exclude, free_limit)
        allowed = {leaf: (leaf, leaf) for leaf in rng.sample(leaves, rng.randint(0, len(leaves)))}
        assert pool.reachable_from(at_least, allowed, exclude, free_limit) == \
            _walk_reachable_from(pool, at_least, allowed, exclude, free_limit, held)
        # every node in the one group its free + unallocated GPUs and its leaves name
        assert sorted(i for members in pool.groups.values() for i in members) == list(range(len(pool.nodes)))
        for key, members in pool.groups.items():
            assert members and all(pool.nodes[i].group == key for i in members)
        for n in pool.nodes:
            by: dict[str, int] = {}
            for node, _, _, unallocated, _, leaf in held:
                if node is n and unallocated:
                    by[leaf] = by.get(leaf, 0) + unallocated
            assert n.group == (n.free + n.unallocated, frozenset(by.items()))
