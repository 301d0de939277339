"""Whole scenarios: the built-in ai2-like month (budget vs baseline, the issue's "Done means"
bounds) and the contended Philly scenario on the head of its trace (every policy).

The ai2-like runs take a minute or two each; each policy runs once per session."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.builders import simulate
from tests.invariants import check_no_gpu_double_booked, check_nothing_lost, check_protection
from timeshare.cluster import PoolSpec
from timeshare.sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
AI2_LIKE = ROOT / "examples" / "ai2-like" / "scenario.toml"
PHILLY = ROOT / "tests" / "data" / "philly" / "scenario.toml"

pytestmark = pytest.mark.slow


# -- the built-in scenario ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def ai2_like():
    scenario = load_scenario(AI2_LIKE)
    return {policy: simulate(scenario, policy).metrics for policy in ("budget", "baseline")}


def test_builtin_debug_work_starts_within_minutes_under_budgets(ai2_like):
    budget = ai2_like["budget"]["queue_wait_s"]["by_kind"]["debug"]
    baseline = ai2_like["baseline"]["queue_wait_s"]["by_kind"]["debug"]
    # the bound: debug p90 wait <= 5 min (Ai2 measured 30 s after, 2 h before)
    assert budget["p90"] <= 300
    # ... and at most a tenth of the old scheduler's in the same run
    assert budget["p90"] <= baseline["p90"] / 10
    assert budget["count"] == baseline["count"] > 1000  # the same debug workloads, enough of them


def test_builtin_occupancy_stays_high_under_both_policies(ai2_like):
    for policy, metrics in ai2_like.items():
        # the bound: occupancy >= 97% under both (Ai2: 98% before and after)
        assert metrics["occupancy"] >= 0.97, policy


@pytest.fixture(scope="module")
def old_scheduler():
    """The old scheduler as it ran before notices (the drains it needed humans for came from its
    opt-out of preemption, not from notices; given notices too, on this month it happens to
    have no opted-out work on the faulty nodes at the faults: docs/records/2026-12-02-notice.md)."""
    scenario = load_scenario(AI2_LIKE, {"policy.preemption_notice": "false"})
    return simulate(scenario, "baseline").metrics


def test_builtin_drains_needing_a_human_fall_by_at_least_70_percent(ai2_like, old_scheduler):
    budget = ai2_like["budget"]["drains"]
    baseline = old_scheduler["drains"]
    # the same node faults under both policies
    assert budget["total"] == baseline["total"] > 0
    # the old scheduler needs humans for drains blocked by non-preemptible work ...
    assert baseline["needing_human"] > 0
    # ... the budget policy at least 70% fewer (Ai2: -74%)
    assert budget["needing_human"] <= 0.3 * baseline["needing_human"]


def test_builtin_budget_attainment_meets_the_target(ai2_like):
    # attainment counts funded work only (min runtime > 0 on a budget), asked for and delivered:
    # what the budgets promise; unallocated time is free capacity promised to no one.
    # Measured before the rename (as attainment_funded): fleet 0.988, worst team 0.970, 15 of 15 >= 0.95
    attainment = ai2_like["budget"]["attainment"]
    # the bound: GPU-hours delivered vs owed >= 98% fleet-wide (Ai2: 98%)
    assert attainment["fleet"] >= 0.98
    # ... and every team >= 95% (Ai2: 13 of 15, worst 90%; we aim higher)
    assert attainment["min_team"] >= 0.95
    assert attainment["teams_at_or_above_95"] == attainment["teams"] == 15


# -- the contended Philly scenario, on the first 2000 jobs of its trace -------------------------

@pytest.fixture(scope="module")
def philly():
    return load_scenario(PHILLY)


@pytest.mark.parametrize("policy", ["budget", "baseline", "fifo"])
def test_philly_head_runs_to_completion_under_every_policy(philly, policy):
    # at the contended scenario's capacity (88 nodes) the first 2000 jobs (21 days of
    # submissions) do not contend: everything starts at once and completes
    run = simulate(philly, policy)
    assert len(philly.workloads) == 2000
    check_no_gpu_double_booked(run.events)
    check_nothing_lost(run, philly)
    assert run.metrics["workloads"]["completed"] == 2000
    assert run.metrics["queue_wait_s"]["overall"]["p90"] == 0
    assert run.metrics["attainment"]["fleet"] == pytest.approx(1.0)


@pytest.fixture(scope="module")
def philly_squeezed(philly):
    """The same jobs on 11 nodes (an eighth of the contended capacity) for 30 days: teams contend."""
    scenario = dataclasses.replace(philly, pools=[PoolSpec("V100", 11, 8)], duration_s=30 * 86400)
    return scenario, {policy: simulate(scenario, policy) for policy in ("budget", "baseline", "fifo")}


def test_philly_squeezed_keeps_every_invariant(philly_squeezed):
    scenario, runs = philly_squeezed
    for policy, run in runs.items():
        check_no_gpu_double_booked(run.events)
        check_nothing_lost(run, scenario)
        assert run.metrics["workloads"]["pending_at_end"] > 500, policy  # it really is contended
    check_protection(runs["budget"].events)


def test_philly_squeezed_budgets_deliver_what_teams_are_owed_better_than_the_old_schedulers(philly_squeezed):
    _, runs = philly_squeezed
    fleet = {p: r.metrics["attainment"]["fleet"] for p, r in runs.items()}
    occupancy = {p: r.metrics["occupancy"] for p, r in runs.items()}
    # measured: budget 0.94, baseline 0.57, fifo 0.51 fleet attainment
    assert fleet["budget"] >= 0.9
    assert fleet["budget"] >= fleet["baseline"] + 0.2
    assert fleet["budget"] >= fleet["fifo"] + 0.2
    # measured: budget 0.958, baseline 0.958, fifo 0.72 occupancy (head-of-line blocking idles GPUs)
    assert occupancy["budget"] >= 0.95
    assert occupancy["fifo"] < occupancy["budget"]
