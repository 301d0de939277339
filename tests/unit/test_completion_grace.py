"""SchedulerState.completion_grace_s (the live placement's "completions first"): work whose
minimum runtime covers all its remaining work is protected that much past its declared end;
other work, and the simulator (grace 0), exactly as before."""

from __future__ import annotations

from tests.builders import ScenarioBuilder, spec
from timeshare import events as ev


def _started(grace_s):
    h = ScenarioBuilder().pool(nodes=1, gpus_per_node=8).teams(a=1, b=1).harness()
    h.state.completion_grace_s = grace_s
    h.submit(spec("covered", "a", gpus=2, work="60s", min_runtime="60s"),
             spec("longer", "a", gpus=2, work="120s", min_runtime="60s"),
             spec("free", "b", gpus=2, work="60s", min_runtime=0), at=0)
    h.schedule(0)
    return {e.workload_id: e.protected_until_ms for e in h.of_type(ev.WorkloadStarted)}


def test_work_protected_to_its_end_is_protected_for_the_grace_after_it():
    assert _started(1) == {"covered": 61_000, "longer": 60_000, "free": None}


def test_without_a_grace_protection_is_the_minimum_runtime():
    assert _started(0) == {"covered": 60_000, "longer": 60_000, "free": None}


def test_a_resumed_workload_is_covered_by_what_is_left_of_its_work():
    h = ScenarioBuilder().pool(nodes=1, gpus_per_node=8).teams(a=1, b=1).harness()
    h.state.completion_grace_s = 1
    h.submit(spec("resumed", "a", gpus=8, work="100s", min_runtime="60s", resumable=True,
                  checkpoint="10s"), at=0)
    h.schedule(0)
    assert h.started("resumed").protected_until_ms == 60_000  # 100 s of work left
    w = h.state.workloads["resumed"]
    for e in h.state.preempted(w, 70, ev.PreemptionReason(kind="fair_share", message="test")):
        h._apply(e)  # 70 s saved (resumable): 30 s left, under the 60 s minimum runtime
    h.schedule(70)
    assert h.started("resumed").protected_until_ms == 70_000 + 60_000 + 1_000
