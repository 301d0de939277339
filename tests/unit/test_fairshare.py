"""Hierarchical fair share: siblings ranked by how much of their share they used over the
window (lower = more deserving), depth-first; inside a leaf, priority then submit time then id.

The long cases run the simulator over a scenario built in code."""

from __future__ import annotations

import random

import pytest

from tests.builders import ScenarioBuilder, simulate, spec
from timeshare import events as ev
from timeshare.fairshare import FairShareView, workload_sort_key
from timeshare.tree import AllocationTree
from timeshare.window import UsageLedger

DAY = 86400
HOUR = 3600


def view_with_usage(shares: dict, usage: dict[str, int], pool_gpus: int = 80, hours: int = 10,
                    running: dict[str, int] | None = None) -> FairShareView:
    """A view after each leaf ran ``usage[leaf]`` GPUs for ``hours`` (then stopped, unless
    ``running`` says how many still run)."""
    tree = AllocationTree.from_shares(shares)
    ledger = UsageLedger(7 * DAY)
    for leaf, gpus in usage.items():
        if gpus:
            ledger.add_running(leaf, "H100", True, gpus, 0)
    for leaf, gpus in usage.items():
        keep = (running or {}).get(leaf, 0)
        if gpus - keep:
            ledger.add_running(leaf, "H100", True, -(gpus - keep), hours * HOUR)
    return FairShareView(tree, ledger, "H100", pool_gpus, hours * HOUR)


# -- the ratio and the depth-first order ---------------------------------------------------

def test_the_ratio_is_allocated_usage_over_fraction_times_capacity_times_the_recorded_window():
    view = view_with_usage({"a": 1, "b": 3}, {"a": 10, "b": 60})
    # a: 10 GPUs x 10 h over (1/4 x 80 GPUs x 10 h) = 0.5; b: 60 / 60 = 1.0
    assert view.ratios["a"] == pytest.approx(0.5)
    assert view.ratios["b"] == pytest.approx(1.0)


def test_due_shares_of_siblings_add_up_to_their_parent_and_the_pool():
    view = view_with_usage({"p": 1, "p/x": 1, "p/y": 2, "q": 1}, {"p/x": 5, "p/y": 30, "q": 20})
    assert view.due_gpus["p/x"] + view.due_gpus["p/y"] == pytest.approx(view.due_gpus["p"])
    assert view.due_gpus["p"] + view.due_gpus["q"] == pytest.approx(80)


@pytest.mark.parametrize("shares, usage, order", [
    ({"a": 1, "b": 1}, {"a": 30, "b": 10}, ["b", "a"]),
    ({"a": 3, "b": 1}, {"a": 30, "b": 20}, ["a", "b"]),
    ({"p": 1, "p/x": 1, "p/y": 1, "q": 1}, {"p/x": 0, "p/y": 40, "q": 20}, ["q", "p/x", "p/y"]),
    ({"p": 1, "p/x": 1, "p/y": 1, "q": 1}, {"p/x": 0, "p/y": 10, "q": 30}, ["p/x", "p/y", "q"]),
], ids=[
    "equal shares: the team that used less goes first",
    "usage is measured against the share: a larger share that used more may still be more deserving",
    "depth-first: a leaf that used nothing still waits behind a less used sibling subtree",
    "depth-first: every leaf of the more deserving subtree precedes the other subtree",
])
def test_leaf_order_is_depth_first_most_deserving_first(shares, usage, order):
    assert view_with_usage(shares, usage).leaf_order() == order


def test_a_zero_fraction_leaf_is_never_due_allocated_time():
    view = view_with_usage({"a": 1, "free": 0}, {"a": 10})
    assert view.due_gpus["free"] == 0
    assert view.fill("free") == float("inf")
    assert view.leaf_order() == ["a", "free"]


def test_the_ordering_key_shown_to_users_has_one_entry_per_level():
    view = view_with_usage({"p": 1, "p/x": 1, "p/y": 1, "q": 1}, {"p/x": 10, "q": 10}, running={"p/x": 4})
    key = view.ordering_key("p/x")
    assert [k["subtree"] for k in key] == ["p", "p/x"]
    assert key[1]["running_gpus"] == 4
    assert key[1]["ratio"] == pytest.approx(view.ratios["p/x"], abs=1e-6)
    assert key[1]["fill"] == pytest.approx(4 / view.due_gpus["p/x"], abs=1e-6)


def test_inside_a_leaf_the_sort_key_is_priority_then_submit_time_then_id():
    keys = [workload_sort_key(1, 10, "b"), workload_sort_key(3, 50, "z"), workload_sort_key(1, 10, "a"),
            workload_sort_key(0, 0, "a"), workload_sort_key(1, 5, "c")]
    assert sorted(keys) == [(-3, 50, "z"), (-1, 5, "c"), (-1, 10, "a"), (-1, 10, "b"), (0, 0, "a")]


# -- inside a leaf, through the scheduler ----------------------------------------------------

def test_inside_a_leaf_work_starts_by_priority_then_submit_time_then_id():
    h = ScenarioBuilder().pool(nodes=1, gpus_per_node=8).team("t", 1).harness()
    h.submit(spec("blocker", "t", gpus=8, min_runtime="1h", work="10h"), at=0)
    h.schedule(0)
    waiting = [
        spec("low-early", "t", gpus=8, submit=1, min_runtime="1h", priority="low"),
        spec("b-normal", "t", gpus=8, submit=10, min_runtime="1h"),
        spec("a-normal-late", "t", gpus=8, submit=20, min_runtime="1h"),
        spec("c-normal", "t", gpus=8, submit=10, min_runtime="1h"),
        spec("urgent-latest", "t", gpus=8, submit=30, min_runtime="1h", priority="urgent"),
        spec("high", "t", gpus=8, submit=25, min_runtime="1h", priority="high"),
    ]
    for s in waiting:
        h.submit(s)
    order = []
    running = "blocker"
    for step in range(len(waiting)):
        at = 100 + step
        h.complete(running, at)
        started = [e.workload_id for e in h.schedule(at) if isinstance(e, ev.WorkloadStarted)]
        assert len(started) == 1
        running = started[0]
        order.append(running)
    assert order == ["urgent-latest", "high", "b-normal", "c-normal", "a-normal-late", "low-early"]


def test_priority_does_not_compete_across_teams():
    h = ScenarioBuilder().pool(nodes=1, gpus_per_node=8).teams(a=1, b=1).harness()
    # a has used the node for an hour; b has used nothing
    h.submit(spec("a-old", "a", gpus=8, min_runtime="1h"), at=0)
    h.schedule(0)
    h.submit(spec("a-urgent", "a", gpus=8, min_runtime="1h", priority="urgent", submit=60),
             spec("b-low", "b", gpus=8, min_runtime="1h", priority="low", submit=120))
    h.schedule(120)
    h.complete("a-old", 3600)
    started = [e.workload_id for e in h.schedule(3600) if isinstance(e, ev.WorkloadStarted)]
    assert started == ["b-low"]


# -- over simulated days -----------------------------------------------------------------------

def saturating(builder: ScenarioBuilder, team: str, start_s: int, end_s: int, per_hour: int, rng) -> None:
    """1-node requests of 1-4 h with a 1 h minimum runtime, resumable, far more than the pool."""
    n = 0
    t = start_s
    while t < end_s:
        for _ in range(per_hour):
            builder.workload(f"{team}-{n}", team, gpus=rng.choice([1, 2, 4, 8]), work=rng.randint(HOUR, 4 * HOUR),
                             submit=t, min_runtime="1h", resumable=True, checkpoint="30m")
            n += 1
        t += HOUR


def test_three_saturating_teams_50_30_20_receive_50_30_20_of_allocated_time_over_14_days():
    builder = ScenarioBuilder(duration="14d").pool(nodes=10, gpus_per_node=8).teams(a=50, b=30, c=20)
    rng = random.Random(1)
    for team in "abc":
        # about 94 GPUs asked for per team on an 80-GPU pool: each team alone could fill it
        saturating(builder, team, 0, 14 * DAY, per_hour=10, rng=rng)
    run = simulate(builder.build())
    teams = run.metrics["teams"]
    assert run.metrics["unallocated_share"] == 0  # all of it is allocated time
    assert run.metrics["workloads"]["pending_at_end"] > 0  # demand really exceeded capacity throughout
    total = sum(t["delivered_gpu_hours"] for t in teams.values())
    assert total >= 0.95 * 80 * 14 * 24  # the pool was kept busy
    for team, share in (("a", 0.50), ("b", 0.30), ("c", 0.20)):
        # within +-2 points of the share
        assert teams[team]["delivered_gpu_hours"] / total == pytest.approx(share, abs=0.02), team


def test_a_team_idle_for_three_days_may_exceed_its_share_and_is_still_scheduled_first():
    builder = ScenarioBuilder(duration=3 * DAY + 12 * HOUR).pool(nodes=4, gpus_per_node=8).teams(busy=1, idle=1)
    rng = random.Random(2)
    saturating(builder, "busy", 0, 4 * DAY, per_hour=10, rng=rng)
    saturating(builder, "idle", 3 * DAY, 4 * DAY, per_hour=10, rng=rng)
    run = simulate(builder.build())
    state = run.state
    # from day 3, the returning team ran more than its half of the pool for hours
    gpu_s = {"busy": 0.0, "idle": 0.0}
    since: dict[str, tuple[float, int, str]] = {}
    window = (3 * DAY, 3 * DAY + 12 * HOUR)
    for e in run.events:
        t = e.at_ms / 1000
        if isinstance(e, ev.WorkloadStarted):
            since[e.workload_id] = (t, e.gpus, e.project)
        elif isinstance(e, (ev.WorkloadCompleted, ev.WorkloadPreempted)) and e.workload_id in since:
            t0, gpus, team = since.pop(e.workload_id)
            gpu_s[team] += gpus * max(0.0, min(t, window[1]) - max(t0, window[0]))
    for t0, gpus, team in since.values():
        gpu_s[team] += gpus * max(0.0, window[1] - max(t0, window[0]))
    assert gpu_s["idle"] > 0.6 * (gpu_s["idle"] + gpu_s["busy"])
    # ... and right now it still runs above its share yet is first in line
    view = FairShareView(state.tree, state.ledger, "H100", 32, run.result.end_s)
    assert view.running_gpus["idle"] > 16
    assert view.leaf_order()[0] == "idle"
    assert view.ratios["idle"] < view.ratios["busy"]
    assert view.fill("idle") < view.fill("busy")


def _funded_team_beside_an_unallocated_team(mode: str):
    """a asks for twice its half of a 32-GPU pool in funded training; b for twice its half in
    unallocated evaluation only (min runtime 0), as a team with no funded work ready would."""
    builder = (ScenarioBuilder(duration="3d").pool(nodes=4, gpus_per_node=8).teams(a=1, b=1)
               .policy(unallocated_preemption=mode))
    for i in range(3 * 24):
        t = i * HOUR  # a new 8-GPU request of 4 h from each team every hour: 32 GPUs asked for
        builder.workload(f"a{i}", "a", gpus=8, work="4h", min_runtime="1h", submit=t, resumable=True,
                         checkpoint="30m", kind="training")
        builder.workload(f"b{i}", "b", gpus=8, work="4h", min_runtime=0, submit=t, resumable=True,
                         checkpoint="30m", kind="eval")
    return simulate(builder.build()).metrics


def test_fair_unallocated_preemption_keeps_the_share_of_a_team_that_runs_on_unallocated_time():
    any_, fair = (_funded_team_beside_an_unallocated_team(m) for m in ("any", "fair"))
    # "any" (the contract's default): a's funded work beyond its share takes b's unallocated
    # GPUs whenever it asks, so b receives well under the half it would be owed if its unallocated
    # work counted (all-work attainment: owed = its share, capped by what it asked for)
    assert any_["teams"]["b"]["attainment_all_work"] < 0.8
    # "fair": a's work beyond its share waits for free GPUs in fair-share order, so b keeps
    # (nearly) its half hour by hour
    assert fair["teams"]["b"]["attainment_all_work"] >= 0.9
    # b has no funded work, so it is owed nothing on the funded (target) count
    assert fair["teams"]["b"]["attainment"] is None and fair["teams"]["b"]["owed_gpu_hours"] == 0
    # and a still gets its own half: its funded work within its share preempts as before
    assert fair["teams"]["a"]["attainment"] >= 0.9
    for m in (any_, fair):
        assert m["occupancy"] >= 0.95  # nobody leaves GPUs idle for this


# -- the same numbers by node index (what a scheduling pass reads) --------------------------

def test_pick_by_index_ranks_as_the_key_tuples_do_and_the_dicts_follow_charges():
    rng = random.Random(3)
    shares = {"p": 2, "p/x": 1, "p/y": 1, "p/z": 1, "q": 1, "q/u": 1, "q/v": 0, "r": 1}
    leaves = ["p/x", "p/y", "p/z", "q/u", "q/v", "r"]
    tree = AllocationTree.from_shares(shares)
    for _ in range(50):
        # ties are likely (equal usage, whole GPUs): the path decides them, as in key()
        view = view_with_usage(shares, {leaf: rng.choice([0, 4, 8]) for leaf in leaves},
                               running={leaf: rng.choice([0, 4]) for leaf in leaves})
        active = {leaf: rng.random() < 0.6 for leaf in leaves}
        counts = [0] * len(tree.node_paths)
        for leaf in leaves:
            if active[leaf]:
                for i in tree.path_index[leaf]:
                    counts[i] += 1
        for total, key in ((False, view.key), (True, view.total_key)):
            expected = None
            siblings = tree.roots
            while siblings:  # the most deserving active subtree by key tuple, level by level
                live = [p for p in siblings if any(active[leaf] for leaf in leaves if leaf == p
                                                   or leaf.startswith(p + "/"))]
                if not live:
                    break
                expected = min(live, key=key)
                siblings = tree.nodes[expected].children
            picked = view.pick_at(counts, total)
            assert (tree.node_paths[picked] if picked >= 0 else None) == expected
        leaf = rng.choice(leaves)
        before = view.running_gpus[leaf]
        view.charge(leaf, 2)
        assert view.running_gpus[leaf] == before + 2
        assert view.fill(leaf) == view.fill_at(tree.index[leaf])
        some = [leaf for leaf in leaves if active[leaf]]
        assert view.leaf_order(some) == [leaf for leaf in view.leaf_order() if leaf in some]
