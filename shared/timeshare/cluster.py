"""Pools of GPU nodes: who holds which GPU, which nodes take work, and where a gang fits.

A request of at most one node's GPUs goes on one node (best fit: the node with the fewest free
GPUs that still fit it, then the lowest index). A larger request takes whole free nodes; its
GPU count must be a multiple of the node size. Whole-node gangs prefer a single rack: the
rack with the fewest free nodes that still holds the gang (best fit again, to keep large holes
for large gangs); otherwise the racks with the most free nodes first, to span as few as
possible.
"""

from __future__ import annotations

from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Final

NODE_HEALTHY: Final = "healthy"
NODE_CORDONED: Final = "cordoned"   # unhealthy: no new work, draining
NODE_DRAINED: Final = "drained"     # empty, waiting for repair
NODE_DOWN: Final = "down"           # failed: its work was killed, waiting for repair


@dataclass(frozen=True)
class PoolSpec:
    gpu_type: str
    nodes: int
    gpus_per_node: int
    rack_size: int | None = None

    def __post_init__(self) -> None:
        if self.nodes <= 0 or self.gpus_per_node <= 0:
            raise ValueError(f"pool {self.gpu_type}: nodes and gpus_per_node must be positive")
        if self.rack_size is not None and self.rack_size <= 0:
            raise ValueError(f"pool {self.gpu_type}: rack_size must be positive")


class PlacementError(ValueError):
    """A request that can never fit the pool as configured."""


class Node:
    __slots__ = ("name", "index", "rack", "gpus", "slots", "free", "state", "pool", "holders", "blocked", "unallocated",
                 "reach", "held", "unallocated_by", "group")

    def __init__(self, pool: "Pool", index: int, rack: int, gpus: int):
        self.pool = pool
        self.name = f"{pool.gpu_type}-{index:03d}"
        self.index = index
        self.rack = rack
        self.gpus = gpus
        self.slots: list[str | None] = [None] * gpus  # workload id per GPU
        self.free = gpus
        self.state = NODE_HEALTHY
        self.holders: dict[str, int] = {}  # workload id -> GPUs it holds here
        self.blocked = 0  # GPUs held by work no request may preempt now (protected)
        #: GPUs held by unallocated work (kept by SchedulerState through Pool.add_unallocated):
        #: a request that may preempt only unallocated work can use this node only if free +
        #: unallocated suffices
        self.unallocated = 0
        #: free + unallocated, the key of the node in Pool.reach
        self.reach = gpus
        #: GPUs of unallocated work here per leaf, and (reach, those (leaf, GPUs) pairs): the
        #: node's key in Pool.groups (a request that may take only some leaves' unallocated work
        #: skips whole groups of nodes that cannot serve it)
        self.unallocated_by: dict[str, int] = {}
        self.group: tuple[int, frozenset[tuple[str, int]]] = (gpus, frozenset())
        #: GPUs with no holder kept for a preemptor waiting for victims under notice
        #: (Pool.hold): not in ``free``, counted in ``blocked``, so no other request takes them
        self.held = 0

    def workload_ids(self) -> list[str]:
        return sorted(self.holders)


#: stale entries a free-GPU bucket's heap may hold beyond four per member before it is rebuilt
BUCKET_HEAP_SLACK = 64


class Pool:
    """The nodes of one GPU type, with free-GPU buckets for O(gpus_per_node) best fit."""

    def __init__(self, spec: PoolSpec):
        self.spec = spec
        self.gpu_type = spec.gpu_type
        self.gpus_per_node = spec.gpus_per_node
        rack_size = spec.rack_size or spec.nodes
        self.nodes = [Node(self, i, i // rack_size, spec.gpus_per_node) for i in range(spec.nodes)]
        self.total_gpus = spec.nodes * spec.gpus_per_node
        # buckets[f] = indices of schedulable nodes with exactly f free GPUs
        self.buckets: list[set[int]] = [set() for _ in range(spec.gpus_per_node + 1)]
        self.buckets[spec.gpus_per_node].update(range(spec.nodes))
        #: per bucket, a min-heap of its indices for find_free's lowest index (min of a set reads
        #: it all: hundreds of nodes at 16,384 GPUs); an index that left the bucket stays in the
        #: heap until it reaches the top (_lowest_in_bucket), and a heap much larger than its
        #: bucket is rebuilt
        self._bucket_heaps: list[list[int]] = [[] for _ in range(spec.gpus_per_node + 1)]
        self._bucket_heaps[spec.gpus_per_node] = list(range(spec.nodes))  # (sorted: a heap)
        self.free_gpus = self.total_gpus  # on schedulable nodes
        # open[c] = indices of schedulable nodes where c GPUs are not blocked by protected
        # work: the most a preemption could free there (victim search looks only at these)
        self.open: list[set[int]] = [set() for _ in range(spec.gpus_per_node + 1)]
        self.open[spec.gpus_per_node].update(range(spec.nodes))
        # change stamps: a victim search that failed need only look again at nodes that
        # changed since (see scheduler's memo)
        self.change_seq = 0
        # node index -> its change stamp, least recently changed first: lets changed_since
        # read only the nodes that changed instead of scanning the whole pool every pass
        self._recent: dict[int, int] = {}
        #: node index -> its change stamp (as in _recent): walks read _recent's keys only,
        #: which makes no (index, stamp) pair per node
        self._stamp: list[int] = [0] * spec.nodes
        self.cordoned = 0  # nodes in NODE_CORDONED: a pass looks for drains only when some are
        self._limits_seq = -1  # change_seq when _fit_limit and _open_limit were computed
        # open_nodes answers by (at_least, exclude) while the open sets are as they were
        # (_open_version is _open_seq): victim searches ask the same question for many leaves,
        # and starts and stops (most changes) move free GPUs, not the open sets; rebuilding
        # the answer on every change cost a walk of the whole pool each time
        self._open_version = 0
        self._open_seq = -1
        self._open_cache: dict[tuple[int, frozenset[int]], list[Node]] = {}
        self._fit_limit = self._open_limit = 0
        # reach[r] = indices of nodes (in any state) with free + unallocated == r: a request that
        # may take only unallocated work reads the nodes that could serve it instead of the pool
        self.reach: list[set[int]] = [set() for _ in range(spec.gpus_per_node + 1)]
        self.reach[spec.gpus_per_node].update(range(spec.nodes))
        # groups[(r, held)] = indices of nodes (in any state) with free + unallocated == r whose
        # unallocated work is exactly ``held``, (leaf, GPUs) pairs (never empty: an emptied group
        # goes). Free GPUs are r less those held, so the key alone says what a node of the group
        # could free for a request that may take only some leaves' unallocated work: a victim
        # search reads the groups (120-135 at 2,048 nodes, 30-40 at 128: nodes share few mixes)
        # and the nodes of the groups that could serve it, not every node with unallocated work
        # (issue 21: that walk made a search at 16,384 GPUs cost 16 times one at 1,024)
        self.groups: dict[tuple[int, frozenset[tuple[str, int]]], set[int]] = {
            (spec.gpus_per_node, frozenset()): set(range(spec.nodes))}

    def __setstate__(self, state: dict) -> None:
        """Unpickle, also a snapshot taken before an index existed (the live placement loads
        its snapshot into the code that runs now): what is missing is rebuilt from the nodes."""
        self.__dict__.update(state)
        if "reach" not in state:
            self.reach = [set() for _ in range(self.gpus_per_node + 1)]
            for node in self.nodes:
                node.reach = node.free + node.unallocated
                self.reach[node.reach].add(node.index)
        if "_open_version" not in state:
            self._open_version = 0
            self._open_seq = -1
        if "_bucket_heaps" not in state:
            self._bucket_heaps = [sorted(bucket) for bucket in self.buckets]  # (sorted: heaps)
        for node in self.nodes:
            if not hasattr(node, "held"):  # a snapshot from before notices
                node.held = 0
        if "groups" not in state:
            # a snapshot from before the groups: which leaf holds which unallocated GPUs is the
            # workloads' to say (SchedulerState.__setstate__ calls regroup)
            self.regroup({})

    def regroup(self, unallocated_leaf: dict[str, str]) -> None:
        """Rebuild ``groups`` and each node's ``unallocated_by`` from its holders
        (``unallocated_leaf``: the leaf of every running unallocated workload, by id)."""
        self.groups = {}
        for node in self.nodes:
            by: dict[str, int] = {}
            for wid, gpus in node.holders.items():
                leaf = unallocated_leaf.get(wid)
                if leaf is not None:
                    by[leaf] = by.get(leaf, 0) + gpus
            node.unallocated_by = by
            node.group = (node.free + node.unallocated, frozenset(by.items()))
            self.groups.setdefault(node.group, set()).add(node.index)

    # -- validation -------------------------------------------------------------------------
    def check_request(self, gpus: int) -> None:
        gpn = self.gpus_per_node
        if gpus <= 0:
            raise PlacementError(f"gpus must be at least 1, got {gpus}")
        if gpus > gpn and gpus % gpn:
            raise PlacementError(
                f"{gpus} GPUs is more than one {self.gpu_type} node ({gpn}) and not a multiple of it; "
                f"ask for at most {gpn} or a multiple of {gpn}"
            )
        if gpus > self.total_gpus:
            raise PlacementError(f"{gpus} GPUs is more than the whole {self.gpu_type} pool ({self.total_gpus})")

    # -- free space -------------------------------------------------------------------------
    def schedulable(self, node: Node) -> bool:
        return node.state == NODE_HEALTHY

    def touch(self, node: Node) -> None:
        self.change_seq += 1
        recent = self._recent
        recent.pop(node.index, None)  # re-inserted last: the order stays by change stamp
        recent[node.index] = self.change_seq
        self._stamp[node.index] = self.change_seq

    def changed_since(self, seq: int) -> list[Node]:
        """Nodes changed after stamp ``seq``, by index."""
        idx: list[int] = []
        stamps = self._stamp
        for i in reversed(self._recent):
            if stamps[i] <= seq:
                break
            idx.append(i)
        idx.sort()
        return [self.nodes[i] for i in idx]

    def open_changed_since(self, seq: int, at_least: int, exclude: frozenset[int] = frozenset()) -> list[Node]:
        """``open_among(changed_since(seq), at_least, exclude)`` in one walk (a failed victim
        search asks this on every retry, and most nodes that changed are not open enough)."""
        idx: list[int] = []
        nodes = self.nodes
        stamps = self._stamp
        for i in reversed(self._recent):
            if stamps[i] <= seq:
                break
            n = nodes[i]
            if n.state == NODE_HEALTHY and n.gpus - n.blocked >= at_least and i not in exclude:
                idx.append(i)
        idx.sort()
        return [nodes[i] for i in idx]

    def _reach(self, node: Node, held: frozenset[tuple[str, int]] | None = None) -> None:
        """Move ``node`` to its bucket of ``reach`` and its group (``held``: the (leaf, GPUs) of
        the unallocated work it now holds, None: unchanged)."""
        r = node.free + node.unallocated
        if r != node.reach:
            self.reach[node.reach].discard(node.index)
            self.reach[r].add(node.index)
            node.reach = r
        old = node.group
        key = (r, old[1] if held is None else held)
        if key != old:
            groups = self.groups
            members = groups[old]
            members.discard(node.index)
            if not members:
                del groups[old]
            into = groups.get(key)
            if into is None:
                into = groups[key] = set()
            into.add(node.index)
            node.group = key

    def add_unallocated(self, node: Node, delta_gpus: int, leaf: str = "") -> None:
        """Unallocated work of ``leaf`` on ``node`` grew (or shrank, if negative) by ``delta_gpus``."""
        if not delta_gpus:
            return
        node.unallocated += delta_gpus
        by = node.unallocated_by
        now = by.get(leaf, 0) + delta_gpus
        if now:
            by[leaf] = now
        else:
            del by[leaf]
        self._reach(node, frozenset(by.items()))

    def reachable_from(self, at_least: int, leaves: dict[str, tuple[str, str]], exclude: frozenset[int] = frozenset(),
                       free_limit: int = -1) -> list[Node]:
        """``reachable_nodes(at_least, exclude, free_limit)`` counting only the unallocated work of
        ``leaves``, by index: the nodes where a request that may take only that work could find
        enough (free GPUs, at most ``free_limit`` of them, -1: all, plus that work; find_victims
        checks each victim, this only leaves out nodes that cannot serve). Reads the groups,
        then the nodes of the groups whose key says they could serve."""
        nodes = self.nodes
        idx: list[int] = []
        for (reach, held), members in self.groups.items():
            if reach < at_least:
                continue
            free = reach
            mine = 0
            for leaf, gpus in held:
                free -= gpus
                if leaf in leaves:
                    mine += gpus
            usable = (free if free_limit < 0 or free <= free_limit else free_limit) + mine
            if usable < at_least:
                continue
            for i in members:
                n = nodes[i]
                if n.state == NODE_HEALTHY and n.gpus - n.blocked >= at_least and i not in exclude:
                    idx.append(i)
        idx.sort()
        return [nodes[i] for i in idx]

    def reachable_nodes(self, at_least: int, exclude: frozenset[int] = frozenset(), free_limit: int = -1) -> list[Node]:
        """``open_nodes(at_least, exclude)`` where free GPUs (at most ``free_limit`` of them, -1:
        all) and GPUs of unallocated work make ``at_least``, by index: the nodes a request that
        may take only unallocated work could use. Reads the nodes ``reach`` names when they are
        fewer than the open ones (a full pool), else filters the open nodes."""
        candidates = 0
        for r in range(at_least, self.gpus_per_node + 1):
            candidates += len(self.reach[r])
        nodes = self.nodes
        if 2 * candidates >= len(nodes):
            out: list[Node] = []
            for n in self.open_nodes(at_least, exclude):
                free = n.free if free_limit < 0 or n.free <= free_limit else free_limit
                if free + n.unallocated >= at_least:
                    out.append(n)
            return out
        idx: list[int] = []
        for r in range(at_least, self.gpus_per_node + 1):
            for i in self.reach[r]:
                n = nodes[i]
                free = n.free if free_limit < 0 or n.free <= free_limit else free_limit
                if n.state == NODE_HEALTHY and n.gpus - n.blocked >= at_least and free + n.unallocated >= at_least \
                        and i not in exclude:
                    idx.append(i)
        idx.sort()
        return [nodes[i] for i in idx]

    def _rebucket(self, node: Node, old_free: int) -> None:
        self.touch(node)
        self._reach(node)
        if node.state != NODE_HEALTHY:
            return
        self.buckets[old_free].discard(node.index)
        self._into_bucket(node.free, node.index)
        self.free_gpus += node.free - old_free

    def set_state(self, node: Node, state: str) -> None:
        self.touch(node)
        self._open_version += 1
        if node.state == NODE_HEALTHY and state != NODE_HEALTHY:
            self.buckets[node.free].discard(node.index)
            self.open[node.gpus - node.blocked].discard(node.index)
            self.free_gpus -= node.free
        elif node.state != NODE_HEALTHY and state == NODE_HEALTHY:
            self._into_bucket(node.free, node.index)
            self.open[node.gpus - node.blocked].add(node.index)
            self.free_gpus += node.free
        self.cordoned += (state == NODE_CORDONED) - (node.state == NODE_CORDONED)
        node.state = state

    def block(self, node: Node, delta_gpus: int) -> None:
        """Protected work on ``node`` grew (or shrank, if negative) by ``delta_gpus``."""
        self.touch(node)
        if node.state == NODE_HEALTHY and delta_gpus:
            self._open_version += 1
            self.open[node.gpus - node.blocked].discard(node.index)
            self.open[node.gpus - node.blocked - delta_gpus].add(node.index)
        node.blocked += delta_gpus

    def hold(self, node: Node, delta_gpus: int) -> None:
        """Keep ``delta_gpus`` free GPUs of ``node`` for a preemptor waiting for its victims under
        notice (negative: give them back). Held GPUs leave ``free`` (no best fit finds them) and
        count as ``blocked`` (no victim search or gang counts them): the preemptor's alone."""
        if not delta_gpus:
            return
        old = node.free
        node.free -= delta_gpus
        node.held += delta_gpus
        if node.free < 0 or node.held < 0:
            raise AssertionError(f"{node.name}: hold of {delta_gpus} GPUs leaves free {node.free}, held {node.held}")
        self._rebucket(node, old)
        self.block(node, delta_gpus)

    def max_open_on_a_node(self) -> int:
        for c in range(self.gpus_per_node, 0, -1):
            if self.open[c]:
                return c
        return 0

    def open_nodes(self, at_least: int, exclude: frozenset[int] = frozenset()) -> list[Node]:
        """Schedulable nodes where a preemption could free ``at_least`` GPUs, by index (a list
        shared by callers until a node changes: read it, do not change it)."""
        if self._open_seq != self._open_version:
            self._open_cache.clear()
            self._open_seq = self._open_version
        key = (at_least, exclude)
        cached = self._open_cache.get(key)
        if cached is not None:
            return cached
        idx: list[int] = []
        for c in range(at_least, self.gpus_per_node + 1):
            idx.extend(self.open[c])
        if exclude:
            idx = [i for i in idx if i not in exclude]
        idx.sort()
        if len(self._open_cache) >= 64:  # many reservations' exclusions between two changes
            self._open_cache.clear()
        out = self._open_cache[key] = [self.nodes[i] for i in idx]
        return out

    def open_among(self, nodes: list[Node], at_least: int, exclude: frozenset[int] = frozenset()) -> list[Node]:
        """Those of ``nodes`` (by index) that :meth:`open_nodes` would list: checks only these
        nodes instead of collecting the whole pool (a node is in ``open[c]`` exactly when it is
        healthy and ``c`` of its GPUs are not blocked)."""
        return [n for n in nodes
                if n.state == NODE_HEALTHY and n.gpus - n.blocked >= at_least and n.index not in exclude]

    def fit_limit(self) -> int:
        """Largest request that fits on free GPUs right now."""
        if self._limits_seq != self.change_seq:
            self._refresh_limits()
        return self._fit_limit

    def open_limit(self) -> int:
        """Largest request a preemption could possibly make room for (protected work stays)."""
        if self._limits_seq != self.change_seq:
            self._refresh_limits()
        return self._open_limit

    def _refresh_limits(self) -> None:
        # a pass asks for both limits after every request it looks at, while nodes change far
        # less often: every change bumps change_seq, so the limits are kept until it moves
        gpn = self.gpus_per_node
        whole = len(self.buckets[gpn])
        self._fit_limit = whole * gpn if whole > 1 else self.max_free_on_a_node()
        whole = len(self.open[gpn])
        self._open_limit = whole * gpn if whole > 1 else self.max_open_on_a_node()
        self._limits_seq = self.change_seq

    def whole_free_nodes(self) -> int:
        return len(self.buckets[self.gpus_per_node])

    def max_free_on_a_node(self) -> int:
        for f in range(self.gpus_per_node, 0, -1):
            if self.buckets[f]:
                return f
        return 0

    def fits_now(self, gpus: int) -> bool:
        gpn = self.gpus_per_node
        if gpus <= gpn:
            return self.max_free_on_a_node() >= gpus
        return self.whole_free_nodes() * gpn >= gpus

    def _into_bucket(self, free: int, index: int) -> None:
        bucket = self.buckets[free]
        if index in bucket:
            return
        bucket.add(index)
        heap = self._bucket_heaps[free]
        if len(heap) > 4 * len(bucket) + BUCKET_HEAP_SLACK:
            heap[:] = sorted(bucket)  # (sorted: a heap) the indices that left, dropped at once
        else:
            heappush(heap, index)

    def _lowest_in_bucket(self, free: int) -> int:
        """min(buckets[free]) of a non-empty bucket, from its heap."""
        bucket = self.buckets[free]
        heap = self._bucket_heaps[free]
        while heap[0] not in bucket:
            heappop(heap)
        return heap[0]

    def find_free(self, gpus: int, exclude: frozenset[int] = frozenset()) -> list[Node] | None:
        """Nodes to place ``gpus`` on using free GPUs only (never ``exclude``), or None."""
        gpn = self.gpus_per_node
        if gpus <= gpn:
            for f in range(gpus, gpn + 1):
                bucket = self.buckets[f]
                if bucket:
                    if not exclude:
                        return [self.nodes[self._lowest_in_bucket(f)]]
                    allowed = [i for i in bucket if i not in exclude]
                    if allowed:
                        return [self.nodes[min(allowed)]]
            return None
        whole = self.buckets[gpn]
        if exclude:
            return self.pick_whole_nodes(sorted([i for i in whole if i not in exclude]), gpus // gpn)
        return self.pick_whole_nodes(sorted(whole), gpus // gpn)

    def pick_whole_nodes(self, candidates: list[int], count: int) -> list[Node] | None:
        """``count`` of the candidate node indices, one rack if possible (see module doc)."""
        if len(candidates) < count:
            return None
        by_rack: dict[int, list[int]] = {}
        for i in candidates:
            by_rack.setdefault(self.nodes[i].rack, []).append(i)
        fitting = [r for r in sorted(by_rack) if len(by_rack[r]) >= count]
        if fitting:
            rack = min(fitting, key=lambda r: (len(by_rack[r]), r))
            return [self.nodes[i] for i in by_rack[rack][:count]]
        chosen: list[int] = []
        for rack in sorted(by_rack, key=lambda r: (-len(by_rack[r]), r)):
            chosen.extend(by_rack[rack][: count - len(chosen)])
            if len(chosen) == count:
                break
        return [self.nodes[i] for i in sorted(chosen)]

    # -- holding GPUs ----------------------------------------------------------------------
    def assign(self, nodes: list[Node], gpus: int, workload_id: str) -> list[tuple[Node, list[int]]]:
        """Give ``gpus`` GPUs on ``nodes`` to a workload; returns (node, GPU ids) pairs."""
        out: list[tuple[Node, list[int]]] = []
        per_node = gpus if len(nodes) == 1 else self.gpus_per_node
        for node in nodes:
            if node.free < per_node:
                raise AssertionError(f"{node.name} has {node.free} free GPUs, {per_node} needed")
            ids: list[int] = []
            slots = node.slots
            for g in range(node.gpus):
                if slots[g] is None:
                    slots[g] = workload_id
                    ids.append(g)
                    if len(ids) == per_node:
                        break
            node.holders[workload_id] = node.holders.get(workload_id, 0) + per_node
            old = node.free
            node.free -= per_node
            self._rebucket(node, old)
            out.append((node, ids))
        return out

    def release(self, node: Node, gpu_ids: list[int], workload_id: str) -> None:
        slots = node.slots
        for g in gpu_ids:
            if slots[g] != workload_id:
                raise AssertionError(f"{node.name} GPU {g} is not held by {workload_id}")
            slots[g] = None
        left = node.holders.pop(workload_id) - len(gpu_ids)
        if left:
            node.holders[workload_id] = left
        old = node.free
        node.free += len(gpu_ids)
        self._rebucket(node, old)


class Cluster:
    """All pools, addressable by GPU type and node name."""

    def __init__(self, specs: list[PoolSpec], checkpoint_bandwidth_gbps: float | None = None):
        if checkpoint_bandwidth_gbps is not None and not checkpoint_bandwidth_gbps > 0:
            raise ValueError(f"checkpoint_bandwidth_gbps must be positive, got {checkpoint_bandwidth_gbps!r}")
        #: the bandwidth (GB/s, gigabytes per second like checkpoint_gb) that checkpoints written
        #: on notice share (None: unlimited); rule "storage" (SchedulerState.storage_admits)
        self.checkpoint_bandwidth_gbps = checkpoint_bandwidth_gbps
        types = [s.gpu_type for s in specs]
        if len(set(types)) != len(types):
            raise ValueError("each GPU type may have one pool only")
        self.pools = {s.gpu_type: Pool(s) for s in sorted(specs, key=lambda s: s.gpu_type)}
        self.nodes_by_name = {n.name: n for p in self.pools.values() for n in p.nodes}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("checkpoint_bandwidth_gbps", None)  # a snapshot from before notices

    def pool(self, gpu_type: str) -> Pool:
        try:
            return self.pools[gpu_type]
        except KeyError:
            raise PlacementError(f"no pool of GPU type {gpu_type!r} (have: {', '.join(self.pools)})") from None

    def node(self, name: str) -> Node:
        try:
            return self.nodes_by_name[name]
        except KeyError:
            raise PlacementError(f"unknown node {name!r}") from None
