"""Liveness over random small scenarios of every tree shape (depth 1-4, node sizes, GPU types,
gangs, node faults), besides the safety properties of test_properties.py:

P1 (served): after every pass, no leaf within its due share at every level waits with a
single-node allocated request at the head of its queue while a healthy node's free GPUs plus
the unallocated work on it would fit that request (work under notice is promised to its
preemptor, and work whose checkpoint the storage cannot write now waits: neither counts).
P2 (no chains, no ping-pong): every fair-share preemption follows its rule by its own numbers
(tests/invariants.py), and nothing is preempted back and forth.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import simulate
from tests.invariants import (check_fair_share_preemptions_follow_their_rule, check_no_gpu_double_booked,
                              check_nothing_lost, check_protection)
from tests.strategies import contended_scenarios, scenarios
from timeshare.cluster import NODE_HEALTHY
from timeshare.fairshare import FairShareView
from timeshare.rules import room_by_depth
from timeshare.scheduler import BudgetPolicy
from timeshare.sim import engine
from timeshare.state import PENDING, SchedulerState

SETTINGS = settings(max_examples=int(os.environ.get("TIMESHARE_EXAMPLES", "80")), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def unserved(state: SchedulerState, now_s) -> list[str]:
    """Head-of-queue allocated requests that P1 says should not be waiting after a full pass.

    Only pools whose pass at ``now_s`` looked at every allocated request: by rule "quick pass"
    (scheduler._requests) a pass with no node changed looks only at new work, and a request
    whose due share grew with the window meanwhile is looked at again within FULL_PASS_EVERY_S
    (the simulator wakes a quiet stretch for it)."""
    out = []
    for gpu_type, pool in state.cluster.pools.items():
        if state.full_pass_s.get(gpu_type) != now_s:
            continue
        gpn = pool.gpus_per_node
        if any(w.state == PENDING and w.gpu_type == gpu_type and w.queue_class == "a" and w.gpus > gpn
               for w in state.workloads.values()):
            continue  # a pending gang may hold a reservation that keeps others off its nodes
        view = FairShareView(state.tree, state.ledger, gpu_type, pool.total_gpus, now_s, state.config.catch_up)
        fair = state.config.unallocated_preemption == "fair"
        for leaf in state.tree.leaves:
            q = state.queues.get((gpu_type, leaf, "a"))
            if q is None or not q.count or state.tree.nodes[leaf].fraction <= 0:
                continue
            key, gpus = q.ordered()[0]
            if gpus > gpn or gpus > room_by_depth(view, state.tree, leaf, fair)[0]:
                continue
            if any(n.state == NODE_HEALTHY and n.free + _takeable_unallocated(state, n) >= gpus for n in pool.nodes):
                out.append(f"{key[2]} ({leaf}, {gpus} GPUs) at {now_s}")
    return out


def _takeable_unallocated(state: SchedulerState, node) -> int:
    """GPUs of unallocated work on ``node`` a request may take now: not those under notice (promised
    to their preemptor) nor those whose checkpoint the storage cannot write now (rule "storage")."""
    return sum(k for wid, k in node.holders.items()
               if not state.workloads[wid].allocated and state.may_take(state.workloads[wid]))


class _CheckedBudget(BudgetPolicy):
    def schedule(self, state, now_s):
        out = super().schedule(state, now_s)
        assert not unserved(state, now_s), unserved(state, now_s)
        return out


@SETTINGS
@given(scenario=scenarios())
def test_p1_a_leaf_within_its_due_share_is_served_in_the_pass(scenario, monkeypatch_policies):
    run = simulate(scenario, "budget-checked")
    check_no_gpu_double_booked(run.events)
    check_protection(run.events)
    check_nothing_lost(run, scenario)


@SETTINGS
@given(scenario=st.one_of(scenarios(), contended_scenarios()))
def test_p2_fair_share_preemptions_follow_their_rule_and_never_ping_pong(scenario):
    run = simulate(scenario, "budget")
    check_fair_share_preemptions_follow_their_rule(run.events)
    check_protection(run.events)


import pytest  # noqa: E402  (fixtures below the tests they serve, for reading order)


@pytest.fixture(scope="module")
def monkeypatch_policies():
    engine.CHECKS["budget-checked"] = _CheckedBudget
    yield
    del engine.CHECKS["budget-checked"]
