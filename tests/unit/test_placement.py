"""Gang placement per GPU type and victim search: best fit on one node, whole free nodes for
larger gangs (one rack if possible), cheapest victims, never a protected workload, never a GPU
given twice."""

from __future__ import annotations

import pytest

from tests.builders import ScenarioBuilder, spec
from timeshare import events as ev
from timeshare.cluster import Cluster, PlacementError, Pool, PoolSpec
from timeshare.placement import find_victims

HOUR = 3600


def pool_with_free(free: list[int], gpus_per_node: int = 8, rack_size: int | None = None) -> Pool:
    """A pool whose node i has ``free[i]`` free GPUs (the rest held by placeholders)."""
    pool = Pool(PoolSpec("H100", len(free), gpus_per_node, rack_size))
    for node, f in zip(pool.nodes, free):
        if f < gpus_per_node:
            pool.assign([node], gpus_per_node - f, f"hold-{node.index}")
    return pool


# -- where a request goes -------------------------------------------------------------------------

@pytest.mark.parametrize("free, gpus, node", [
    ([8, 3, 5, 4], 4, 3),
    ([8, 3, 5, 4], 3, 1),
    ([8, 3, 5, 4], 5, 2),
    ([8, 3, 5, 4], 6, 0),
    ([2, 6, 6, 8], 6, 1),
    ([8, 8], 1, 0),
], ids=["the node with the fewest free GPUs that still fit", "an exact fit", "a larger exact fit",
        "only an empty node fits", "equal fits: the lowest index", "an empty pool: the first node"])
def test_a_request_up_to_one_node_goes_on_one_node_best_fit(free, gpus, node):
    nodes = pool_with_free(free).find_free(gpus)
    assert [n.index for n in nodes] == [node]


def test_a_request_that_fits_no_single_node_waits_even_if_the_pool_has_enough_free_gpus():
    assert pool_with_free([4, 4, 4]).find_free(6) is None


@pytest.mark.parametrize("free, rack_size, gpus, chosen", [
    ([8, 8, 8, 8, 8, 8, 0, 0], 4, 16, [4, 5]),
    ([8, 8, 0, 0, 8, 8, 8, 0], 4, 24, [4, 5, 6]),
    ([8, 8, 0, 0, 8, 8, 0, 0], 4, 24, [0, 1, 4]),
    ([8, 4, 8, 8], None, 16, [0, 2]),
], ids=["one rack, the one with the fewest free nodes that holds the gang",
        "one rack when a rack can hold it", "spans as few racks as possible when none can",
        "whole free nodes only: a partly used node is skipped"])
def test_a_larger_request_takes_whole_free_nodes_preferring_one_rack(free, rack_size, gpus, chosen):
    nodes = pool_with_free(free, rack_size=rack_size).find_free(gpus)
    assert [n.index for n in nodes] == chosen
    assert all(n.free == n.gpus for n in nodes)


@pytest.mark.parametrize("gpus, ok", [
    (1, True), (8, True), (16, True), (12, False), (9, False), (0, False), (40, False),
], ids=["one GPU", "one whole node", "two whole nodes", "one and a half nodes", "one node and one GPU",
        "no GPUs", "more than the pool"])
def test_a_count_above_the_node_size_must_be_a_multiple_of_it(gpus, ok):
    pool = Pool(PoolSpec("H100", 4, 8))
    if ok:
        pool.check_request(gpus)
    else:
        with pytest.raises(PlacementError):
            pool.check_request(gpus)


def test_submitting_a_request_that_can_never_fit_is_rejected_before_it_queues():
    h = ScenarioBuilder().pool(nodes=4, gpus_per_node=8).team("t", 1).harness()
    with pytest.raises(PlacementError, match="multiple of 8"):
        h.submit(spec("w", "t", gpus=12))
    with pytest.raises(PlacementError, match="no pool"):
        h.submit(spec("w", "t", gpus=1, gpu_type="B200"))


def test_node_names_follow_gpu_type_and_index():
    cluster = Cluster([PoolSpec("H100", 2, 8), PoolSpec("B200", 1, 4)])
    assert sorted(cluster.nodes_by_name) == ["B200-000", "H100-000", "H100-001"]
    with pytest.raises(PlacementError):
        cluster.node("H100-002")


def test_giving_a_gpu_twice_is_refused():
    h = ScenarioBuilder().pool(nodes=1, gpus_per_node=8).team("t", 1).harness()
    h.submit(spec("a", "t", gpus=4), spec("b", "t", gpus=4))
    state = h.state
    node = state.cluster.node("H100-000")
    first = state.started(state.workloads["a"], [node], 0)
    state.apply(first)
    clash = ev.WorkloadStarted(event_id="x", at_ms=0, workload_id="b", project="t", gpu_type="H100", gpus=4,
                               placement=first.placement, allocated=False, protected_until_ms=None)
    with pytest.raises(AssertionError, match="held by a"):
        state.apply(clash)


# -- victims, through the budget policy -----------------------------------------------------------

def place(h, s, node: str, at=0):
    """Start ``s`` on ``node`` (as if an earlier pass had put it there)."""
    h.submit(s, at=at)
    e = h.state.started(h.state.workloads[s.id], [h.state.cluster.node(node)], at)
    h.state.apply(e)
    h.events.append(e)


def preempted_by(out) -> list[tuple[str, str]]:
    return [(e.workload_id, e.reason.kind) for e in out if isinstance(e, ev.WorkloadPreempted)]


def three_teams(nodes: int = 2):
    return ScenarioBuilder().pool(nodes=nodes, gpus_per_node=8).teams(a=1, b=1, c=1).harness()


def test_victims_unallocated_work_goes_first():
    h = three_teams()
    place(h, spec("b-alloc", "b", gpus=8, min_runtime="1h", work="20h"), "H100-000")
    place(h, spec("c-free", "c", gpus=8, min_runtime=0, work="20h"), "H100-001")
    h.schedule(HOUR)
    h.submit(spec("a-req", "a", gpus=8, min_runtime="1h", submit=2 * HOUR))
    assert preempted_by(h.schedule(2 * HOUR)) == [("c-free", "unallocated")]


def test_victims_losing_the_same_then_the_least_deserving_team():
    h = three_teams(nodes=3)
    # both checkpoint every hour: at 3 h neither loses anything, so the subtree further above
    # its due share goes (c runs two gangs; b's one is all b is due and b may not lose it)
    place(h, spec("c-old", "c", gpus=8, min_runtime="1h", work="20h", resumable=True, checkpoint="1h"),
          "H100-000", at=0)
    place(h, spec("b-new", "b", gpus=8, min_runtime="1h", work="20h", resumable=True, checkpoint="1h"),
          "H100-001", at=HOUR)
    place(h, spec("c-two", "c", gpus=8, min_runtime="1h", work="20h", resumable=True, checkpoint="1h"),
          "H100-002", at=HOUR)
    h.schedule(2 * HOUR)
    h.submit(spec("a-req", "a", gpus=8, min_runtime="1h", submit=3 * HOUR))
    out = h.schedule(3 * HOUR)
    assert preempted_by(out) == [("c-old", "fair_share")]
    reason = next(e.reason for e in out if isinstance(e, ev.WorkloadPreempted))
    assert reason.victim_subtree == "c" and reason.victim_ratio > 1


def test_a_request_that_would_leave_every_victim_team_below_it_waits():
    # the choice the one rule makes (docs/design/preemption-rules.md): two whole-node gangs of
    # b and c are all their teams run; taking either would leave its team at 0, below a
    h = three_teams()
    place(h, spec("b1", "b", gpus=8, min_runtime="1h", work="20h"), "H100-000")
    place(h, spec("c1", "c", gpus=8, min_runtime="1h", work="20h"), "H100-001")
    h.submit(spec("a-req", "a", gpus=1, min_runtime="1h", submit=3 * HOUR))
    assert preempted_by(h.schedule(3 * HOUR)) == []


def test_victims_then_the_least_progress_lost():
    h = three_teams()
    # same team, same size; b-late checkpointed 10 minutes ago, b-early 50 minutes ago
    place(h, spec("b-early", "b", gpus=8, min_runtime="1h", work="20h", resumable=True, checkpoint="1h"),
          "H100-000", at=0)
    place(h, spec("b-late", "b", gpus=8, min_runtime="1h", work="20h", resumable=True, checkpoint="1h"),
          "H100-001", at=40 * 60)
    h.schedule(2 * HOUR)
    h.submit(spec("a-req", "a", gpus=8, min_runtime="1h", submit=2 * HOUR + 50 * 60))
    out = h.schedule(2 * HOUR + 50 * 60)
    assert preempted_by(out) == [("b-late", "fair_share")]
    [p] = [e for e in out if isinstance(e, ev.WorkloadPreempted)]
    assert p.lost_gpu_s == 8 * 10 * 60


def test_protected_work_is_never_a_victim_even_for_an_idle_team():
    h = three_teams(nodes=3)
    place(h, spec("b1", "b", gpus=8, min_runtime="8h", work="20h"), "H100-000")
    place(h, spec("c1", "c", gpus=8, min_runtime="8h", work="20h"), "H100-001")
    place(h, spec("c2", "c", gpus=8, min_runtime="8h", work="20h"), "H100-002")
    h.submit(spec("a-req", "a", gpus=1, min_runtime="1h", submit=HOUR))
    assert preempted_by(h.schedule(HOUR)) == []
    assert preempted_by(h.schedule(8 * HOUR - 1)) == []
    assert [w for w, _ in preempted_by(h.schedule(8 * HOUR))] in (["c1"], ["c2"])


def gang_case():
    """Rack 0 = nodes 0-1, rack 1 = nodes 2-3; node 0 also holds protected work."""
    h = ScenarioBuilder().pool(nodes=4, gpus_per_node=8, rack_size=2).teams(a=1, b=1).harness()
    place(h, spec("prot", "b", gpus=4, min_runtime="8h", work="20h"), "H100-000")
    place(h, spec("u0", "b", gpus=4, min_runtime=0, work="20h"), "H100-000")
    place(h, spec("u1", "b", gpus=8, min_runtime=0, work="20h"), "H100-001")
    place(h, spec("u2", "b", gpus=8, min_runtime=0, work="20h"), "H100-002")
    place(h, spec("u3", "b", gpus=8, min_runtime=0, work="20h"), "H100-003")
    return h.state, h.state.cluster.pool("H100")


def test_a_gang_victim_search_frees_whole_nodes_and_never_touches_protected_work():
    state, pool = gang_case()
    cost = {"u1": (1, "u1"), "u2": (0, "u2"), "u3": (0, "u3"), "u0": (0, "u0")}
    nodes, victims = find_victims(state, pool, 16, lambda w: not w.allocated, lambda w: cost[w.id])
    assert [n.index for n in nodes] == [2, 3]
    assert [v.id for v in victims] == ["u2", "u3"]
    # node 0's protected work can never be freed, so three whole nodes is the most
    assert find_victims(state, pool, 24, lambda w: not w.allocated, lambda w: cost[w.id]) is not None
    assert find_victims(state, pool, 32, lambda w: not w.allocated, lambda w: cost[w.id]) is None


def test_a_gang_victim_search_prefers_one_rack_among_free_nodes():
    h = ScenarioBuilder().pool(nodes=4, gpus_per_node=8, rack_size=2).teams(a=1).harness()
    place(h, spec("busy", "a", gpus=8), "H100-001")
    state = h.state
    nodes, victims = find_victims(state, state.cluster.pool("H100"), 16, lambda w: True, lambda w: (0, w.id))
    assert ([n.index for n in nodes], victims) == ([2, 3], [])


def test_a_gang_victim_search_prefers_one_rack_among_equally_cheap_victims():
    state, pool = gang_case()
    nodes, victims = find_victims(state, pool, 16, lambda w: not w.allocated, lambda w: (0, w.id))
    assert [n.index for n in nodes] == [2, 3]


def test_single_node_victim_search_picks_the_node_whose_worst_victim_is_cheapest():
    h = ScenarioBuilder().pool(nodes=2, gpus_per_node=8).teams(a=1).harness()
    place(h, spec("x-cheap", "a", gpus=4), "H100-000")
    place(h, spec("y-dear", "a", gpus=4), "H100-000")
    place(h, spec("z-mid", "a", gpus=8), "H100-001")
    costs = {"x-cheap": (0, "x-cheap"), "y-dear": (9, "y-dear"), "z-mid": (5, "z-mid")}
    state = h.state
    nodes, victims = find_victims(state, state.cluster.pool("H100"), 4, lambda w: True, lambda w: costs[w.id])
    assert ([n.index for n in nodes], [v.id for v in victims]) == ([0], ["x-cheap"])
    nodes, victims = find_victims(state, state.cluster.pool("H100"), 8, lambda w: True, lambda w: costs[w.id])
    assert ([n.index for n in nodes], [v.id for v in victims]) == ([1], ["z-mid"])
