"""The budget policy's promise on small clusters of every shape, each case keyed by the sentence
it checks and run through the simulator (the same code the live placement service runs).

P1 (served): a leaf below its due share whose next allocated request fits within that share
starts it in the same pass, on free GPUs or on GPUs held by work the contract lets it preempt.
P2 (no chains, no ping-pong): a preempted gang does not take GPUs back, nor from a third team
within its share; equal teams settle. P3 (cheapest victims): unallocated work first, then the
least progress lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest

from tests.builders import ScenarioBuilder, secs, simulate
from tests.invariants import (check_fair_share_preemptions_follow_their_rule, check_no_gpu_double_booked,
                              check_nothing_lost, check_protection)
from timeshare import events as ev

HOUR = 3600
DAY = 86400


# -- reading a run ---------------------------------------------------------------------------

def first_start_s(run, wid: str) -> float | None:
    for e in run.events:
        if isinstance(e, ev.WorkloadStarted) and e.workload_id == wid:
            return e.at_ms / 1000
    return None


def preemptions(run, since_s: float = 0, until_s: float = float("inf")) -> list[ev.WorkloadPreempted]:
    return [e for e in run.events if isinstance(e, ev.WorkloadPreempted) and since_s <= e.at_ms / 1000 < until_s
            and e.reason.kind in ("fair_share", "unallocated")]


def checked(scenario):
    run = simulate(scenario)
    check_no_gpu_double_booked(run.events)
    check_protection(run.events)
    check_nothing_lost(run, scenario)
    check_fair_share_preemptions_follow_their_rule(run.events)
    return run


# -- the cases: a small team's debug work under saturated training ----------------------

def training_under(builder: ScenarioBuilder, teams: list[str], gpus: int, per_team: int = 6, work="1000h") -> None:
    for team in teams:
        for i in range(per_team):
            builder.workload(f"{team.rsplit('/', 1)[-1]}-{i}", team, gpus=gpus, work=work, min_runtime="1h",
                             resumable=True, checkpoint="10m", kind="training")


def debug_work(builder: ScenarioBuilder, team: str, sizes: list[int], at) -> list[str]:
    ids = []
    for g in sizes:
        builder.workload(f"dbg{g}", team, gpus=g, work="10m", min_runtime="15m", submit=at, kind="debug")
        ids.append(f"dbg{g}")
    return ids


def assert_debug_served_at_once(run, ids: list[str], at_s: float, trainers: tuple[str, ...]) -> None:
    for wid in ids:
        assert first_start_s(run, wid) == at_s, f"{wid} did not start in the pass it arrived"
    by = [e.reason.by_workload_id for e in preemptions(run, at_s, at_s + 4 * HOUR)]
    # at most one preemption per debug workload ...
    assert all(by.count(wid) <= 1 for wid in ids), by
    # ... and no chain: no training gang preempts anything for four hours after
    assert not [b for b in by if b.startswith(trainers)], by


@dataclass
class Shape:
    """A tree with two busy training teams and a small team, its paths and its node size."""
    shares: dict[str, int]
    big: tuple[str, str]
    small: str
    gpus_per_node: int = 8
    #: default 1 and 4 GPUs: within the small team's due share (10% of 32 GPUs, doubled by
    #: catch-up while it was idle: 6.4 GPUs); a request beyond it waits (see
    #: test_a_request_beyond_its_due_share_preempts_nothing)
    debug_sizes: list[int] | None = None


def nested(depth: int) -> Shape:
    """A single chain of ``depth - 1`` parents above big1, big2 and small (depth 1: flat)."""
    prefix = "/".join(f"l{i}" for i in range(depth - 1))
    shares = {"/".join(f"l{i}" for i in range(k + 1)): 1 for k in range(depth - 1)}
    p = prefix + "/" if prefix else ""
    shares.update({p + "big1": 45, p + "big2": 45, p + "small": 10})
    return Shape(shares, (p + "big1", p + "big2"), p + "small")


def run_shape(shape: Shape, debug_at="2h", sizes: list[int] | None = None):
    sizes = sizes or shape.debug_sizes
    gpn = shape.gpus_per_node
    builder = ScenarioBuilder(duration=secs(debug_at) + 5 * HOUR).pool("H100", 32 // gpn, gpn)
    for path, share in shape.shares.items():
        builder.team(path, share)
    training_under(builder, list(shape.big), gpus=gpn, per_team=32 // gpn)
    ids = debug_work(builder, shape.small, sizes or [1, 4], debug_at)
    return checked(builder.build()), ids


SHAPES: dict[str, Callable[[], Shape]] = {
    "case 1: a small team beside two training teams under one root (org=1) is served at once":
        lambda: nested(2),
    "case 2: the same on a flat tree, and the preempted gangs start no chain": lambda: nested(1),
    "depth 3: the small team two levels below the root": lambda: nested(3),
    "depth 4: the small team three levels below the root": lambda: nested(4),
    # (an 8-GPU debug workload too would put the program above its due share, and the other
    # program has used as much of its share: it waits for a program's GPUs, see the next test)
    "a small team under a busy program takes from its own program's busy team": lambda: Shape(
        {"progA": 1, "progA/big1": 8, "progA/small": 2, "progB": 1, "progB/big2": 1},
        ("progA/big1", "progB/big2"), "progA/small", debug_sizes=[1, 4]),
    "4-GPU nodes: debug of 1 and 4 GPUs (a whole node)": lambda: Shape(nested(2).shares, nested(2).big, nested(2).small, 4),
}


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_a_small_teams_debug_work_starts_in_the_pass_it_arrives(shape):
    s = SHAPES[shape]()
    run, ids = run_shape(s)
    assert_debug_served_at_once(run, ids, 2 * HOUR, ("big1", "big2"))


def test_a_request_beyond_its_due_share_preempts_nothing():
    # The choice the one rule makes (docs/design/preemption-rules.md): a 10% team idle all
    # along is due 6.4 of 32 GPUs (its share doubled by catch-up); a whole-node 8-GPU debug
    # job is beyond that, so it takes no one's allocated work: whoever lost the node would run
    # below the requester. It waits for free or unallocated GPUs (here: none for 5 hours).
    run, ids = run_shape(nested(2), sizes=[8])
    assert first_start_s(run, "dbg8") is None
    assert preemptions(run) == []


def test_case_1_on_day_8_of_steady_use():
    # the week's history is full: the two training teams used everything for 8 days
    run, ids = run_shape(nested(2), debug_at="8d")
    assert_debug_served_at_once(run, ids, 8 * DAY, ("big1", "big2"))


@pytest.mark.parametrize("nodes_per_gang", [1, 2, 3, 4])
def test_gangs_of_one_to_four_nodes_do_not_keep_a_small_teams_debug_work_out(nodes_per_gang):
    builder = (ScenarioBuilder(duration=8 * HOUR).pool("H100", 12, 8)
               .teams(**{"org": 1, "org/big1": 45, "org/big2": 45, "org/small": 10}))
    training_under(builder, ["org/big1", "org/big2"], gpus=8 * nodes_per_gang, per_team=12 // nodes_per_gang)
    ids = debug_work(builder, "org/small", [1, 8], "2h")
    run = checked(builder.build())
    assert_debug_served_at_once(run, ids, 2 * HOUR, ("big1", "big2"))


def test_two_gpu_types_where_only_one_is_busy():
    builder = (ScenarioBuilder(duration=6 * HOUR).pool("H100", 4, 8).pool("A100", 2, 8)
               .teams(**{"org": 1, "org/big1": 45, "org/big2": 45, "org/small": 10}))
    training_under(builder, ["org/big1", "org/big2"], gpus=8, per_team=4)
    builder.workload("idle-type", "org/small", gpu_type="A100", gpus=8, work="10m", min_runtime="15m", submit="2h")
    builder.workload("busy-type", "org/small", gpu_type="H100", gpus=4, work="10m", min_runtime="15m", submit="2h")
    run = checked(builder.build())
    assert first_start_s(run, "idle-type") == 2 * HOUR
    assert first_start_s(run, "busy-type") == 2 * HOUR
    # the idle type needed no preemption, the busy one exactly one
    assert [e.reason.by_workload_id for e in preemptions(run)] == ["busy-type"]


# -- settling: equal teams, a returning team, a gang as large as a share ------------------------

def test_two_equal_teams_that_saturate_settle_and_stop_preempting_each_other():
    builder = ScenarioBuilder(duration=4 * DAY).pool("H100", 4, 8).teams(a=1, b=1).policy(lookback_window_s="1d")
    for i in range(8):
        builder.workload(f"a{i}", "a", gpus=8, work="1000h", min_runtime="1h", resumable=True, checkpoint="30m")
        builder.workload(f"b{i}", "b", gpus=8, work="1000h", min_runtime="1h", resumable=True, checkpoint="30m",
                         submit="2h")
    run = checked(builder.build())
    # b is served when it arrives (a ran the whole cluster) ...
    assert first_start_s(run, "b0") == 2 * HOUR
    # ... and the two teams then settle: nothing is preempted in the last two days
    assert preemptions(run, 2 * DAY) == []
    # and no gang was taken more than a few times over the whole run (no ping-pong)
    count: dict[str, int] = {}
    for e in preemptions(run):
        count[e.workload_id] = count.get(e.workload_id, 0) + 1
    assert max(count.values()) <= 3, count


def test_a_team_back_from_three_idle_days_is_served_at_once():
    builder = ScenarioBuilder(duration=6 * DAY).pool("H100", 3, 8).teams(a=1, b=1, c=1)
    for team in ("a", "b"):
        for i in range(3):
            builder.workload(f"{team}{i}", team, gpus=8, work="1000h", min_runtime="1h", resumable=True,
                             checkpoint="30m")
    builder.workload("c-early", "c", gpus=8, work="2d", min_runtime="1h", resumable=True, checkpoint="30m")
    builder.workload("c-back", "c", gpus=8, work="4h", min_runtime="1h", resumable=True, checkpoint="30m",
                     submit="5d")
    run = checked(builder.build())
    assert first_start_s(run, "c-back") == 5 * DAY
    assert [e.reason.by_workload_id for e in preemptions(run, 5 * DAY)] == ["c-back"]


def test_a_gang_as_large_as_its_teams_share_starts_and_reopens_no_chain():
    builder = ScenarioBuilder(duration=10 * HOUR).pool("H100", 6, 8).teams(a=1, b=1, c=1)
    for team in ("a", "b"):
        for i in range(4):
            builder.workload(f"{team}{i}", team, gpus=8, work="1000h", min_runtime="1h", resumable=True,
                             checkpoint="30m")
    builder.workload("c-gang", "c", gpus=16, work="8h", min_runtime="1h", resumable=True, checkpoint="30m",
                     submit="2h")
    run = checked(builder.build())
    assert first_start_s(run, "c-gang") == 2 * HOUR
    at_once = preemptions(run, 2 * HOUR, 2 * HOUR + 1)
    # it took two 8-GPU gangs, and both of the teams it took them from run at least their due
    # share afterwards or no lower than c (checked by the rule's numbers in checked())
    assert [e.reason.by_workload_id for e in at_once] == ["c-gang", "c-gang"]
    # no chain: nothing else is preempted while the victims' protection would have renewed,
    # except at most one rebalancing between the two teams that lost GPUs (a left below b)
    later = preemptions(run, 2 * HOUR + 1, 10 * HOUR)
    assert len(later) <= 1 and all(e.reason.victim_subtree in ("a", "b") for e in later), later


# -- the contract ------------------------------------------------------------------------------

def test_unallocated_work_yields_at_once():
    builder = ScenarioBuilder(duration=4 * HOUR).pool("H100", 2, 8).teams(a=1, b=1)
    for i in range(4):
        builder.workload(f"eval{i}", "b", gpus=4, work="20h", min_runtime=0, resumable=True, checkpoint="15m")
    builder.workload("funded", "a", gpus=8, work="1h", min_runtime="1h", submit="1h")
    run = checked(builder.build())
    assert first_start_s(run, "funded") == HOUR
    assert [(e.reason.kind, e.reason.by_workload_id) for e in preemptions(run)] == [("unallocated", "funded")] * 2


@pytest.mark.parametrize("headroom", [0.0, 0.1])
def test_funded_work_starts_on_the_headroom_unallocated_work_leaves(headroom):
    # 10 nodes of 8: b floods the pool with 4-GPU unallocated work; with a headroom of 10% (8
    # GPUs) the last node stays free, and a's 8-GPU debug job starts there without preempting
    builder = ScenarioBuilder(duration=4 * HOUR).pool("H100", 10, 8).teams(a=1, b=1) \
        .policy(unallocated_headroom=headroom)
    for i in range(30):
        builder.workload(f"eval{i}", "b", gpus=4, work="20h", min_runtime=0, resumable=True, checkpoint="15m")
    builder.workload("dbg", "a", gpus=8, work="10m", min_runtime="10m", submit="1h", kind="debug")
    run = checked(builder.build())
    assert first_start_s(run, "dbg") == HOUR
    running_evals = {e.workload_id for e in run.events if isinstance(e, ev.WorkloadStarted)
                     and e.workload_id.startswith("eval") and e.at_ms == 0}
    if headroom:
        assert len(running_evals) == 18  # 72 of 80 GPUs: 8 stay free
        assert preemptions(run) == []
        # the debug job's GPUs, freed when it ends, go back to the headroom, not to the queue
        assert not [e for e in run.events if isinstance(e, ev.WorkloadStarted) and e.at_ms > 0
                    and e.workload_id.startswith("eval")]
    else:
        assert len(running_evals) == 20
        assert [(e.reason.kind, e.reason.by_workload_id) for e in preemptions(run)] == [("unallocated", "dbg")] * 2


def test_protected_work_drains_at_its_minimum_runtime_without_a_human():
    builder = (ScenarioBuilder(duration=6 * HOUR).pool("H100", 2, 8).teams(a=1)
               .node_event("30m", "H100-000", "unhealthy", repair="2h"))
    builder.workload("long", "a", gpus=8, work="20h", min_runtime="1h", resumable=True, checkpoint="30m")
    run = checked(builder.build())
    drain = [e for e in run.events if isinstance(e, ev.WorkloadPreempted) and e.reason.kind == "drain"]
    assert [(e.workload_id, e.at_ms / 1000) for e in drain] == [("long", HOUR)]
    assert [e.at_ms / 1000 for e in run.events if isinstance(e, ev.NodeDrained)] == [HOUR]
    assert run.metrics["drains"]["needing_human"] == 0


def test_a_one_gpu_request_takes_a_one_gpu_victim_not_an_eight_gpu_gang():
    # P3: big runs an 8-GPU gang on one node and eight 1-GPU workloads on the other, all past
    # their minimum runtime, all 20 minutes past their last checkpoint
    builder = ScenarioBuilder(duration=4 * HOUR).pool("H100", 2, 8).teams(big=9, small=1)
    builder.workload("gang", "big", gpus=8, work="20h", min_runtime="1h", resumable=True, checkpoint="30m")
    for i in range(8):
        builder.workload(f"one{i}", "big", gpus=1, work="20h", min_runtime="1h", resumable=True, checkpoint="30m")
    builder.workload("dbg", "small", gpus=1, work="10m", min_runtime="10m", submit="1h50m")
    run = checked(builder.build())
    [p] = preemptions(run)
    assert p.reason.by_workload_id == "dbg" and p.workload_id.startswith("one")
    assert p.lost_gpu_s == 20 * 60  # one GPU, 20 minutes since its checkpoint


def test_a_gang_reservation_never_holds_nodes_the_gang_may_not_take():
    # 8 nodes: "gang" runs 3 and waits with a 16-GPU gang within its due share; "big" runs 5,
    # two of them past their minimum runtime. The gang may not take big's GPUs (big would end
    # below it), so it must not reserve those two nodes: a small team's debug job takes one
    builder = (ScenarioBuilder(duration=6 * HOUR).pool("H100", 8, 8).teams(gang=10, big=10, small=1)
               .policy(catch_up=0.0))
    for i in range(3):
        builder.workload(f"gang{i}", "gang", gpus=8, work="100h", min_runtime="8h", resumable=True, checkpoint="30m")
    for i in range(5):
        builder.workload(f"big{i}", "big", gpus=8, work="100h", min_runtime="1h" if i < 2 else "8h", resumable=True,
                         checkpoint="30m")
    builder.workload("gang-16", "gang", gpus=16, work="10h", min_runtime="1h", resumable=True, submit="1h")
    builder.workload("dbg", "small", gpus=1, work="10m", min_runtime="15m", submit="2h")
    run = checked(builder.build())
    assert first_start_s(run, "dbg") == 2 * HOUR
    assert [(e.workload_id[:3], e.reason.by_workload_id) for e in preemptions(run, 2 * HOUR, 2 * HOUR + 1)] \
        == [("big", "dbg")]
