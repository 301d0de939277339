"""The scheduling contract, rule by rule, on small scenarios: the core driven by hand
(SchedulerState + BudgetPolicy) or the simulator over a scenario built in code."""

from __future__ import annotations

import pytest

from tests.builders import ScenarioBuilder, replace, simulate, spec
from timeshare import events as ev
from timeshare.state import COMPLETED, FAILED, PENDING, PREEMPTED, RUNNING
from timeshare.workload import ContractError

HOUR = 3600
MIN = 60


def one_node(*teams: str, **policy):
    builder = ScenarioBuilder().pool(nodes=1, gpus_per_node=8)
    for t in teams:
        builder.team(t, 1)
    return builder.policy(**policy).harness()


def alloc_usage(h, path: str, at) -> int:
    return h.state.ledger.usage_gpu_s(path, "H100", True, at)


def unalloc_usage(h, path: str, at) -> int:
    return h.state.ledger.usage_gpu_s(path, "H100", False, at)


# -- declaring the contract --------------------------------------------------------------------

@pytest.mark.parametrize("min_runtime, ok", [
    (8 * HOUR, True), (8 * HOUR + 1, False), (0, True),
], ids=["a minimum runtime at the cap is accepted", "one second above the cap is rejected",
        "zero (unallocated) is accepted"])
def test_min_runtime_above_the_cap_is_rejected_naming_the_field(min_runtime, ok):
    h = one_node("t")
    s = spec("w", "t", min_runtime=min_runtime, work="9h")
    if ok:
        h.submit(s)
        assert h.state.workloads["w"].state == PENDING
    else:
        with pytest.raises(ContractError) as err:
            h.submit(s)
        assert err.value.field == "min_runtime_s"
        assert "cap" in str(err.value)
        assert "w" not in h.state.workloads  # nothing changed


def test_the_cap_is_configurable():
    h = one_node("t", max_min_runtime_s="1h")
    with pytest.raises(ContractError, match="min_runtime_s"):
        h.submit(spec("w", "t", min_runtime="2h"))


@pytest.mark.parametrize("field, changes", [
    ("gpus", {"gpus": 0}), ("work_s", {"work_s": -1}), ("priority", {"priority": "HIGHEST"}),
    ("checkpoint_interval_s", {"checkpoint": 0}), ("id", {"id": ""}),
], ids=["no GPUs", "negative work", "an unknown priority", "a zero checkpoint interval", "an empty id"])
def test_other_contract_fields_are_checked_too(field, changes):
    kw = {"id": "w", **changes}
    raw = {k: kw.pop(k) for k in ("id", "work_s") if k in kw}
    with pytest.raises(ContractError) as err:
        one_node("t").submit(replace(spec("w", "t", **kw), **raw))
    assert err.value.field == field


# -- allocated vs unallocated ----------------------------------------------------------------------

@pytest.mark.parametrize("shares, min_runtime, allocated", [
    ({"t": 1}, "1h", True),
    ({"t": 1}, 0, False),
    ({"t": 0, "other": 1}, "1h", False),
], ids=["a minimum runtime and a budget: allocated", "minimum runtime 0: unallocated",
        "a leaf with no budget (share 0) runs unallocated even with a minimum runtime"])
def test_allocated_means_a_minimum_runtime_and_a_non_zero_fraction(shares, min_runtime, allocated):
    builder = ScenarioBuilder().pool(nodes=1, gpus_per_node=8)
    for path, share in shares.items():
        builder.team(path, share)
    h = builder.harness()
    h.submit(spec("w", "t", gpus=4, min_runtime=min_runtime, work="2h"))
    h.schedule(0)
    started = h.started("w")
    assert started.allocated is allocated
    assert started.protected_until_ms == (HOUR * 1000 if allocated else None)
    h.complete("w", 2 * HOUR)
    later = 3 * HOUR
    # allocated time is charged from start to end; unallocated time is never charged
    assert alloc_usage(h, "t", later) == (4 * 2 * HOUR if allocated else 0)
    assert unalloc_usage(h, "t", later) == (0 if allocated else 4 * 2 * HOUR)


# -- protection and preemption -------------------------------------------------------------------

def fair_share_case(**policy):
    """Team a fills the only node with protected work (min runtime 4 h); team b, which used
    nothing, asks for the node one hour later."""
    h = one_node("a", "b", **policy)
    h.submit(spec("a1", "a", gpus=8, min_runtime="4h", work="20h", resumable=True, checkpoint="90m"), at=0)
    h.schedule(0)
    h.submit(spec("a2", "a", gpus=8, min_runtime="1h", work="1h", submit=2 * HOUR))
    h.submit(spec("b1", "b", gpus=8, min_runtime="1h", work="2h", submit=HOUR))
    return h


def test_allocated_work_is_never_preempted_before_its_minimum_runtime():
    h = fair_share_case()
    for at in (HOUR, 2 * HOUR, 4 * HOUR - 1):
        assert not any(isinstance(e, ev.WorkloadPreempted) for e in h.schedule(at)), at
        assert h.running() == {"a1"}


def test_after_its_minimum_runtime_a_more_deserving_teams_request_preempts_it_with_the_numbers():
    h = fair_share_case()
    h.schedule(HOUR)
    out = h.schedule(4 * HOUR)
    kinds = [type(e).__name__ for e in out]
    assert kinds == ["MinRuntimeReached", "WorkloadPreempted", "WorkloadRequeued", "WorkloadStarted"]
    preempted = out[1]
    reason = preempted.reason
    assert preempted.workload_id == "a1"
    assert reason.kind == "fair_share"
    assert reason.by_workload_id == "b1" and reason.by_project == "b"
    assert (reason.preemptor_subtree, reason.victim_subtree, reason.level) == ("b", "a", "")
    assert reason.hysteresis == 0.05
    # the victim's subtree runs above its due share by more than the hysteresis ...
    assert reason.victim_fill > 1 + reason.hysteresis
    # ... and above the preemptor's fill counting the request
    assert reason.preemptor_fill + reason.hysteresis < reason.victim_fill
    assert reason.preemptor_ratio < reason.victim_ratio
    assert reason.victim_running_gpus == 8
    assert out[3].workload_id == "b1"


def test_a_preempted_resumable_workload_keeps_its_submit_time_and_its_last_checkpoint():
    h = fair_share_case()
    h.schedule(HOUR)
    out = h.schedule(4 * HOUR)
    preempted, requeued = out[1], out[2]
    # 4 h ran, checkpoints every 90 min: 3 h kept, 1 h lost on 8 GPUs
    assert preempted.resumable and preempted.progress_s == 3 * HOUR
    assert preempted.lost_gpu_s == 8 * HOUR
    assert requeued.workload_id == "a1" and requeued.progress_s == 3 * HOUR
    a1 = h.state.workloads["a1"]
    assert a1.state == PENDING and a1.submit_s == 0 and a1.key == (-1, 0, "a1")
    # back in line ahead of a2, submitted later by the same team
    h.complete("b1", 6 * HOUR)
    started = [e for e in h.schedule(6 * HOUR) if isinstance(e, ev.WorkloadStarted)]
    assert started[0].workload_id == "a1"
    assert started[0].progress_s == 3 * HOUR and started[0].attempt == 2


@pytest.mark.parametrize("ran_s, interval_s, already_s, saved_s", [
    (4 * HOUR, 90 * MIN, 0, 3 * HOUR),
    (4 * HOUR, 30 * MIN, 0, 4 * HOUR),
    (29 * MIN, 30 * MIN, 0, 0),
    (4 * HOUR, None, 0, 0),
    (2 * HOUR, HOUR, 5 * HOUR, 7 * HOUR),
], ids=["between checkpoints: back to the last one", "exactly on a checkpoint: nothing lost",
        "before the first checkpoint: everything since the start is lost",
        "no checkpoint interval: the run is lost", "progress adds to what earlier runs saved"])
def test_progress_kept_is_the_last_checkpoint(ran_s, interval_s, already_s, saved_s):
    h = one_node("a")
    h.submit(spec("w", "a", gpus=2, work="20h", resumable=True,
                  checkpoint=interval_s))
    h.schedule(0)
    w = h.state.workloads["w"]
    w.progress_s = already_s  # as if earlier runs had saved this much
    # saved = progress so far + floor(ran / interval) x interval
    assert w.saved_progress_s(ran_s) == saved_s


@pytest.mark.parametrize("preemptor", ["other", "same"], ids=[
    "another team's allocated request", "the same team's allocated request"])
def test_unallocated_work_is_preempted_by_any_allocated_request_at_any_time(preemptor):
    h = one_node("a", "b")
    h.submit(spec("free", "a", gpus=8, min_runtime=0, work="10h", resumable=True, checkpoint="1h"))
    h.schedule(0)
    assert not h.started("free").allocated
    team = "b" if preemptor == "other" else "a"
    h.submit(spec("funded", team, gpus=4, min_runtime="1h", work="1h", submit=60))
    out = h.schedule(60)  # one minute in: unallocated time is never protected
    preempted = [e for e in out if isinstance(e, ev.WorkloadPreempted)]
    assert [e.workload_id for e in preempted] == ["free"]
    assert preempted[0].reason.kind == "unallocated"
    assert preempted[0].reason.by_workload_id == "funded"
    assert h.running() == {"funded"}
    # the unallocated minute is not charged; the allocated request is, from its start
    assert alloc_usage(h, "a", 2 * HOUR) == (0 if team == "b" else 4 * (2 * HOUR - 60))


@pytest.mark.parametrize("mode, team, gpus, preempted", [
    ("any", "a", 8, True), ("fair", "a", 8, False), ("fair", "a", 1, True), ("fair", "b-self", 8, True),
], ids=["any (the default): beyond its due share, an allocated request still takes unallocated time",
        "fair: beyond its due share it does not take another team's unallocated share",
        "fair: ... unless it stays within its due share plus the hysteresis (1 GPU: 9 of 8)",
        "fair: its own team's unallocated work it always may"])
def test_unallocated_preemption_setting(mode, team, gpus, preempted):
    # two teams due 8 GPUs each (no catch-up, so due = share); a runs 8 funded GPUs, the
    # other node runs 8 GPUs of unallocated work: b's (its whole share) or a's own
    h = (ScenarioBuilder().pool(nodes=2, gpus_per_node=8).teams(a=1, b=1)
         .policy(catch_up=0.0, unallocated_preemption=mode).harness())
    owner = "a" if team == "b-self" else "b"
    h.submit(spec("a-funded", "a", gpus=8, min_runtime="1h", work="20h"),
             spec("free", owner, gpus=8, min_runtime=0, work="20h", resumable=True, checkpoint="1h"))
    h.schedule(0)
    assert h.running() == {"a-funded", "free"}
    h.submit(spec("more", "a", gpus=gpus, min_runtime="1h", work="1h", submit=2 * HOUR))
    out = h.schedule(2 * HOUR)
    assert [e.workload_id for e in out if isinstance(e, ev.WorkloadPreempted)] == (["free"] if preempted else [])
    assert ("more" in h.running()) == preempted


@pytest.mark.parametrize("a_gpus, a_checkpoint, b_gpus, b_checkpoint, victim", [
    (8, "1h", 4, "1h", "a-free"), (4, None, 8, "30m", "b-free")], ids=[
    "its own team's work loses less (10 min x 8 GPUs vs 40 min x 4): its own unallocated work goes",
    "the other team's loses less (10 min x 8 GPUs since its checkpoint vs 70 min x 4): the other's goes"])
def test_an_allocated_request_takes_the_unallocated_work_that_loses_least(a_gpus, a_checkpoint, b_gpus, b_checkpoint,
                                                                           victim):
    # P3: unallocated work of a on one node and of b on the other; then a asks for 8 funded
    # GPUs: the victim is the one that loses the least progress (GPU-seconds since its checkpoint)
    h = (ScenarioBuilder().pool(nodes=2, gpus_per_node=8).teams(a=1, b=1).policy(catch_up=0.0).harness())
    h.submit(spec("a-free", "a", gpus=a_gpus, min_runtime=0, work="20h", resumable=True, checkpoint=a_checkpoint))
    h.schedule(0)
    h.submit(spec("b-free", "b", gpus=b_gpus, min_runtime=0, work="20h", resumable=True, checkpoint=b_checkpoint,
                  submit=30 * MIN))
    h.schedule(30 * MIN)
    assert h.running() == {"a-free", "b-free"}
    h.submit(spec("funded", "a", gpus=8, min_runtime="1h", work="1h", submit=HOUR + 10 * MIN))
    out = h.schedule(HOUR + 10 * MIN)
    assert [e.workload_id for e in out if isinstance(e, ev.WorkloadPreempted)
            and e.reason.by_workload_id == "funded"] == [victim]


def test_unallocated_preemption_setting_is_validated():
    with pytest.raises(ValueError, match="unallocated_preemption"):
        ScenarioBuilder().pool().teams(a=1).policy(unallocated_preemption="never").harness()


@pytest.mark.parametrize("who, request_min_runtime", [
    ("a", "1h"), ("b", 0), ("b-used-more", "1h"),
], ids=["the same team's pending work never preempts its own running work",
        "an unallocated request never preempts allocated work",
        "a team that used more than the runner is not more deserving"])
def test_work_past_its_minimum_runtime_is_not_preempted_by_just_anyone(who, request_min_runtime):
    h = ScenarioBuilder().pool(nodes=2, gpus_per_node=8).teams(a=1, b=1).harness()
    h.submit(spec("a1", "a", gpus=8, min_runtime="1h", work="20h"))
    team = "a" if who == "a" else "b"
    if who == "b-used-more":
        h.submit(spec("b0", "b", gpus=8, min_runtime="1h", work="20h"))
    else:
        h.submit(spec("a0", "a", gpus=8, min_runtime="1h", work="20h"))
    h.schedule(0)
    assert len(h.running()) == 2
    h.submit(spec("req", team, gpus=8, min_runtime=request_min_runtime, work="1h", submit=2 * HOUR))
    assert not any(isinstance(e, ev.WorkloadPreempted) for e in h.schedule(2 * HOUR))
    assert "req" not in h.running()


def test_unallocated_work_is_never_charged_even_when_it_runs_for_days():
    h = one_node("a")
    h.submit(spec("free", "a", gpus=8, min_runtime=0, work="3d"))
    h.schedule(0)
    h.complete("free", 3 * 86400)
    assert alloc_usage(h, "a", 3 * 86400) == 0
    assert alloc_usage(h, "", 3 * 86400) == 0


# -- non-resumable work, through the simulator -----------------------------------------------------

def test_a_preempted_non_resumable_workload_ends_and_is_resubmitted_from_zero_after_the_delay():
    scenario = (ScenarioBuilder(duration="1d").pool(nodes=1, gpus_per_node=8).teams(a=1, b=1)
                .policy(resubmit_delay_s="10m")
                .workload("a1", "a", gpus=8, min_runtime="1h", work="10h", resumable=False)
                .workload("b1", "b", gpus=8, min_runtime="1h", work="2h", submit="30m")
                .build())
    run = simulate(scenario)
    [preempted] = run.of_type(ev.WorkloadPreempted, "a1")
    assert preempted.at_ms == HOUR * 1000 and not preempted.resumable
    assert preempted.reason.kind == "fair_share"
    assert preempted.lost_gpu_s == 8 * HOUR
    assert not run.of_type(ev.WorkloadRequeued, "a1")
    assert run.state.workloads["a1"].state == PREEMPTED
    [resubmitted] = [e for e in run.of_type(ev.WorkloadSubmitted) if e.resubmit_of == "a1"]
    assert resubmitted.workload.id == "a1~1"
    assert resubmitted.at_ms == (HOUR + 10 * MIN) * 1000
    assert resubmitted.workload.submit_s == HOUR + 10 * MIN
    assert run.of_type(ev.WorkloadStarted, "a1~1")[0].progress_s == 0
    assert run.state.workloads["a1~1"].state == COMPLETED
    # the lost hour on 8 GPUs is waste
    assert run.metrics["wasted_gpu_hours"] == pytest.approx(8.0)


# -- health: drains ride the contract -------------------------------------------------------------

def test_an_unhealthy_node_is_cordoned_and_gets_no_new_work():
    h = ScenarioBuilder().pool(nodes=2, gpus_per_node=8).team("a", 1).harness()
    h.unhealthy("H100-000", 0)
    h.submit(spec("w1", "a", gpus=8, min_runtime="1h"), spec("w2", "a", gpus=8, min_runtime="1h"))
    h.schedule(0)
    assert h.running() == {"w1"}
    assert [p.node for p in h.started("w1").placement] == ["H100-001"]


def test_a_drain_stops_preemptible_work_at_once_and_protected_work_at_its_minimum_runtime():
    h = ScenarioBuilder().pool(nodes=2, gpus_per_node=8).team("a", 1).harness()
    h.submit(spec("prot", "a", gpus=4, min_runtime="2h", work="10h", resumable=True, checkpoint="1h"),
             spec("free", "a", gpus=4, min_runtime=0, work="10h", resumable=True, checkpoint="1h"),
             spec("big", "a", gpus=8, min_runtime="1h", work="10h"))
    h.schedule(0)
    [sick] = {p.node for w in ("prot", "free") for p in h.started(w).placement}  # best fit: one node
    h.unhealthy(sick, HOUR)
    out = h.schedule(HOUR)
    drained = [e for e in out if isinstance(e, ev.WorkloadPreempted)]
    assert [(e.workload_id, e.reason.kind) for e in drained] == [("free", "drain")]
    assert not any(isinstance(e, ev.NodeDrained) for e in out)
    assert "prot" in h.running()
    assert not any(isinstance(e, ev.WorkloadPreempted) for e in h.schedule(2 * HOUR - 1))
    out = h.schedule(2 * HOUR)
    assert [(e.workload_id, e.reason.kind) for e in out if isinstance(e, ev.WorkloadPreempted)] == [("prot", "drain")]
    assert [e.node for e in out if isinstance(e, ev.NodeDrained)] == [sick]
    # both were requeued and wait: the only healthy node is busy
    assert h.state.workloads["prot"].state == PENDING
    assert h.state.workloads["free"].state == PENDING


def test_through_the_simulator_a_drained_node_is_repaired_after_the_repair_time_and_returns():
    scenario = (ScenarioBuilder(duration="2d").pool(nodes=1, gpus_per_node=8).team("a", 1)
                .workload("prot", "a", gpus=8, min_runtime="3h", work="5h", resumable=True, checkpoint="1h")
                .workload("later", "a", gpus=8, min_runtime="1h", work="1h", submit="2h")
                .node_event("1h", "H100-000", "unhealthy", repair="6h")
                .build())
    run = simulate(scenario)
    [unhealthy] = run.of_type(ev.NodeUnhealthy)
    assert unhealthy.at_ms == HOUR * 1000 and not unhealthy.needs_human  # 2 h left to protect < 8 h cap
    [drained] = run.of_type(ev.NodeDrained)
    assert drained.at_ms == 3 * HOUR * 1000  # when prot reached its minimum runtime
    [repaired] = run.of_type(ev.NodeRepaired)
    assert repaired.at_ms == (3 + 6) * HOUR * 1000
    starts = [(e.workload_id, e.at_ms // 1000) for e in run.of_type(ev.WorkloadStarted)]
    assert starts[0] == ("prot", 0)
    # nothing starts while the node is out of service, everything after it returns
    assert all(t == 0 or t >= 9 * HOUR for _, t in starts)
    assert {w for w, _ in starts} == {"prot", "later"}
    assert run.state.workloads["prot"].state == COMPLETED
    assert run.metrics["drains"] == {"total": 1, "needing_human": 0}


def test_a_failed_node_kills_its_work_at_once_even_protected_resumables_are_requeued():
    h = ScenarioBuilder().pool(nodes=2, gpus_per_node=8).team("a", 1).harness()
    h.submit(spec("res", "a", gpus=4, min_runtime="8h", work="10h", resumable=True, checkpoint="1h"),
             spec("once", "a", gpus=4, min_runtime="8h", work="10h"),
             spec("elsewhere", "a", gpus=8, min_runtime="8h", work="10h"))
    h.schedule(0)
    [sick] = {p.node for w in ("res", "once") for p in h.started(w).placement}  # best fit: one node
    out = h.fail_node(sick, 90 * MIN)
    summary = [(type(e).__name__, getattr(e, "workload_id", None)) for e in out]
    assert summary == [("NodeFailed", None), ("WorkloadFailed", "once"),
                       ("WorkloadPreempted", "res"), ("WorkloadRequeued", "res")]
    assert out[2].reason.kind == "node_failed" and out[2].progress_s == HOUR
    assert h.state.workloads["once"].state == FAILED
    assert h.state.workloads["res"].state == PENDING
    assert h.state.workloads["elsewhere"].state == RUNNING
    assert h.state.cluster.node(sick).state == "down"
    h.schedule(90 * MIN)
    assert "res" not in h.running()  # the down node takes no work


@pytest.mark.parametrize("allocated, protected_until_s, non_preemptible, expected_s", [
    pytest.param(False, None, False, 100, id="unallocated work may be freed now"),
    pytest.param(True, 160, False, 160, id="allocated work within its minimum runtime: when its protection ends"),
    pytest.param(True, 100, False, 100, id="a protection that ends now frees it now"),
    pytest.param(True, None, False, 100, id="allocated work past its minimum runtime may be freed now"),
    pytest.param(True, None, True, float("inf"), id="work that opted out of preemption: never"),
])
def test_the_earliest_a_running_workloads_gpus_can_be_freed(allocated, protected_until_s, non_preemptible,
                                                             expected_s):
    from timeshare.rules import free_at_s

    assert free_at_s(allocated, protected_until_s, 100, non_preemptible) == expected_s
