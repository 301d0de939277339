"""The comparison policies. Baseline (the old scheduler): global priority, opt-out of
preemption up to a team cap, drains that wait for non-preemptible work. FIFO (reference):
strict submit order, head-of-line blocking, best fit, no preemption."""

from __future__ import annotations

import pytest

from tests.builders import ScenarioBuilder, simulate, spec
from timeshare import events as ev

HOUR = 3600


def two_nodes(policy: str):
    return ScenarioBuilder().pool(nodes=2, gpus_per_node=8).teams(a=1, b=1).harness(policy)


def started(out) -> dict[str, ev.WorkloadStarted]:
    return {e.workload_id: e for e in out if isinstance(e, ev.WorkloadStarted)}


# -- baseline ------------------------------------------------------------------------------------

def test_baseline_min_runtime_opts_out_of_preemption_up_to_the_team_cap():
    h = two_nodes("baseline")
    # cap = 1/2 x 16 GPUs = 8 non-preemptible GPUs for team a
    h.submit(spec("a1", "a", gpus=4, min_runtime="1h", work="5h"), spec("a2", "a", gpus=4, min_runtime="1h", work="5h"),
             spec("a3", "a", gpus=4, min_runtime="1h", work="5h", submit=1), spec("a4", "a", gpus=4, min_runtime=0, work="5h", submit=2))
    out = started(h.schedule(10))
    assert {w: e.non_preemptible for w, e in out.items()} == {"a1": True, "a2": True, "a3": False, "a4": False}
    assert out["a1"].protected_until_ms is None  # opting out has no timer: it lasts to the end


@pytest.mark.parametrize("victim_priority, victim_min_runtime, request_priority, preempted", [
    ("low", 0, "high", True),
    ("normal", 0, "normal", False),
    ("high", 0, "normal", False),
    ("low", "1h", "urgent", False),
], ids=["higher priority preempts lower-priority preemptible work", "equal priority does not preempt",
        "lower priority does not preempt", "non-preemptible (opted out within the cap) is never preempted"])
def test_baseline_higher_priority_preempts_lower_priority_preemptible_work(
        victim_priority, victim_min_runtime, request_priority, preempted):
    h = ScenarioBuilder().pool(nodes=1, gpus_per_node=8).teams(a=1, b=1).harness("baseline")
    h.submit(spec("v", "a", gpus=8 if victim_min_runtime == 0 else 4, min_runtime=victim_min_runtime,
                  priority=victim_priority, work="10h", resumable=True, checkpoint="1h"))
    # (team a's cap is 1/2 x 8 = 4 GPUs: an opted-out victim holds 4, the request needs all 8)
    h.schedule(0)
    h.submit(spec("req", "b", gpus=4 if victim_min_runtime == 0 else 8, min_runtime=0, priority=request_priority,
                  submit=HOUR))
    out = h.schedule(HOUR)
    got = [(e.workload_id, e.reason.kind) for e in out if isinstance(e, ev.WorkloadPreempted)]
    assert got == ([("v", "priority")] if preempted else [])
    assert ("req" in h.running()) is preempted


def drain_case(policy: str, work: str):
    return simulate(
        ScenarioBuilder(duration="3d").pool(nodes=2, gpus_per_node=8).teams(a=1, b=1)
        .workload("long", "a", gpus=8, min_runtime="2h", work=work)
        .node_event("1h", "H100-000", "unhealthy", repair="6h")
        .build(), policy)


@pytest.mark.parametrize("policy, work, drained_at_h, needs_human", [
    ("baseline", "20h", 20, True),
    ("baseline", "5h", 5, False),
    ("budget", "20h", 2, False),
], ids=["baseline: non-preemptible work blocks the drain past the cap, a human is needed",
        "baseline: work ending within the cap is waited for",
        "budget: the same work drains at its minimum runtime"])
def test_a_drain_waits_for_non_preemptible_work(policy, work, drained_at_h, needs_human):
    run = drain_case(policy, work)
    [unhealthy] = run.of_type(ev.NodeUnhealthy)
    assert unhealthy.needs_human is needs_human
    [drained] = run.of_type(ev.NodeDrained)
    assert drained.at_ms == drained_at_h * HOUR * 1000
    assert run.metrics["drains"] == {"total": 1, "needing_human": int(needs_human)}


def test_baseline_orders_pending_work_by_global_priority_across_teams():
    h = ScenarioBuilder().pool(nodes=1, gpus_per_node=8).teams(a=1, b=1).harness("baseline")
    # within team a's cap (half of 8 GPUs), so it opted out of preemption and nobody can take it
    h.submit(spec("first", "a", gpus=4, min_runtime="1h", work="1h"))
    h.schedule(0)
    h.submit(spec("a-normal", "a", gpus=8, submit=10), spec("b-urgent", "b", gpus=8, priority="urgent", submit=20))
    h.schedule(20)
    h.complete("first", HOUR)
    assert list(started(h.schedule(HOUR))) == ["b-urgent"]


# -- fifo ------------------------------------------------------------------------------------------

def test_fifo_starts_in_strict_submit_order_with_head_of_line_blocking():
    run = simulate(
        ScenarioBuilder(duration="1d").pool(nodes=1, gpus_per_node=8).team("a", 1)
        .workload("w1", "a", gpus=6, work="1h", submit=0)
        .workload("w2", "a", gpus=8, work="1h", submit=1)
        .workload("w3", "a", gpus=1, work="1h", submit=2, priority="urgent")  # fits now, but waits its turn
        .build(), "fifo")
    starts = [(e.workload_id, e.at_ms // 1000) for e in run.of_type(ev.WorkloadStarted)]
    assert starts == [("w1", 0), ("w2", HOUR), ("w3", 2 * HOUR)]


def test_fifo_never_preempts_not_even_unallocated_work_for_an_allocated_request():
    run = simulate(
        ScenarioBuilder(duration="2d").pool(nodes=1, gpus_per_node=8).teams(a=1, b=1)
        .workload("free", "a", gpus=8, min_runtime=0, work="10h")
        .workload("funded", "b", gpus=8, min_runtime="1h", work="1h", submit=60)
        .node_event("2h", "H100-000", "unhealthy", repair="1h")
        .build(), "fifo")
    assert run.of_type(ev.WorkloadPreempted) == []
    # the drain waited for the work to end
    [drained] = run.of_type(ev.NodeDrained)
    assert drained.at_ms == 10 * HOUR * 1000
    assert [e.workload_id for e in run.of_type(ev.WorkloadStarted)] == ["free", "funded"]


def test_fifo_places_best_fit():
    h = ScenarioBuilder().pool(nodes=2, gpus_per_node=8).team("a", 1).harness("fifo")
    h.submit(spec("w1", "a", gpus=5, work="5h"), spec("w2", "a", gpus=2, work="5h", submit=1),
             spec("w3", "a", gpus=3, work="5h", submit=2))
    out = started(h.schedule(2))
    assert {w: [p.node for p in e.placement] for w, e in out.items()} == {
        "w1": ["H100-000"], "w2": ["H100-000"], "w3": ["H100-001"]}
