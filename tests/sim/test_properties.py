"""Invariants over random small scenarios, for every policy: no GPU given twice, no protected
workload preempted before its minimum runtime (node failure aside), unallocated time never
charged, nothing lost, and the same inputs give byte-identical event streams."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import ScenarioBuilder, simulate
from tests.invariants import (check_no_gpu_double_booked, check_nothing_lost, check_protection,
                              check_unallocated_never_charged)

HOUR = 3600
POLICIES = ["budget", "baseline", "fifo"]
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def scenarios(draw):
    builder = ScenarioBuilder(duration=draw(st.integers(6 * HOUR, 2 * 86400)), seed=0)
    builder.policy(lookback_window_s="30d", max_min_runtime_s="2h",
                   resubmit_delay_s=draw(st.sampled_from([0, 60, 600])))
    pools = []
    for gpu_type in ["H100", "A100"][: draw(st.integers(1, 2))]:
        nodes, gpn = draw(st.integers(2, 6)), draw(st.sampled_from([2, 4, 8]))
        builder.pool(gpu_type, nodes, gpn, draw(st.sampled_from([None, 2, 3])))
        pools.append((gpu_type, nodes, gpn))
    # a 2-level tree of 2-4 leaves (a share of 0 now and then: no budget)
    programs = draw(st.integers(1, 2))
    leaves = []
    for p in range(programs):
        builder.team(f"p{p}", draw(st.integers(1, 5)))
        for t in range(draw(st.integers(1, 2)) if programs == 2 else draw(st.integers(2, 4))):
            builder.team(f"p{p}/t{t}", draw(st.sampled_from([0, 1, 2, 3, 5])))
            leaves.append(f"p{p}/t{t}")
    for i in range(draw(st.integers(5, 40))):
        gpu_type, nodes, gpn = draw(st.sampled_from(pools))
        gpus = draw(st.one_of(st.integers(1, gpn), st.integers(1, nodes).map(lambda k, g=gpn: k * g)))
        work = draw(st.integers(60, 6 * HOUR))
        builder.workload(
            f"w{i}", draw(st.sampled_from(leaves)), gpu_type=gpu_type, gpus=gpus, work=work,
            submit=draw(st.integers(0, 8 * HOUR)), min_runtime=draw(st.sampled_from([0, 0, 600, HOUR, 2 * HOUR])),
            resumable=draw(st.booleans()), checkpoint=draw(st.sampled_from([None, 300, 1800])),
            priority=draw(st.sampled_from(["low", "normal", "high", "urgent"])))
    for _ in range(draw(st.integers(0, 2))):
        gpu_type, nodes, _ = draw(st.sampled_from(pools))
        builder.node_event(draw(st.integers(0, 10 * HOUR)), f"{gpu_type}-{draw(st.integers(0, nodes - 1)):03d}",
                           draw(st.sampled_from(["unhealthy", "failed"])), repair=draw(st.integers(600, 6 * HOUR)))
    return builder.build()


@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(scenario=scenarios())
def test_invariants_hold_on_random_small_scenarios(policy, scenario):
    run = simulate(scenario, policy)
    check_no_gpu_double_booked(run.events)
    check_unallocated_never_charged(run)
    check_nothing_lost(run, scenario)
    if policy == "budget":
        check_protection(run.events)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_the_same_inputs_give_byte_identical_event_streams(policy, scenario):
    assert simulate(scenario, policy).encoded() == simulate(scenario, policy).encoded()
