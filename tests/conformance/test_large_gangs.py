"""Issue 24: an entitled gang starts within ``max_min_runtime`` (plus a pass) of becoming
entitled, while a stream of small protected work would otherwise keep every node busy. Each
case is refereed from its event log (timeshare.sim.referee, "gang starved" among the rest).
"""

from __future__ import annotations

from tests.builders import ScenarioBuilder, simulate
from tests.invariants import check_no_gpu_double_booked, check_nothing_lost, check_protection
from timeshare import events as ev
from timeshare.sim.referee import check

HOUR = 3600


def refereed(scenario):
    run = simulate(scenario)
    check_no_gpu_double_booked(run.events)
    check_protection(run.events)
    check_nothing_lost(run, scenario)
    findings = check(scenario, run.events, run.result.end_s)
    assert findings == [], "\n".join(str(f) for f in findings)
    return run


def first_start_s(run, wid: str) -> float | None:
    for e in run.events:
        if isinstance(e, ev.WorkloadStarted) and e.workload_id == wid:
            return e.at_ms / 1000
    return None


def _stream(nodes: int, gap_s: int, gang_gpus: int, work: str = "3h") -> ScenarioBuilder:
    """b submits a 4-GPU job protected for 2 h every ``gap_s``, far beyond its half; a asks for
    one gang within its half after an hour."""
    builder = (ScenarioBuilder(duration=30 * HOUR).pool("H100", nodes, 8).teams(a=1, b=1)
               .policy(catch_up=0.0, max_min_runtime_s="2h"))
    for i in range(40):
        builder.workload(f"b{i}", "b", gpus=4, work=work, min_runtime="2h", resumable=True, submit=i * gap_s)
    builder.workload("gang", "a", gpus=gang_gpus, work="2h", min_runtime="1h", resumable=True, submit=HOUR)
    return builder


def test_a_gang_within_its_share_starts_within_the_longest_protection_under_a_stream_of_small_work():
    run = refereed(_stream(4, 600, 16).build())
    started = first_start_s(run, "gang")
    assert started is not None and started - HOUR <= 2 * HOUR + 60


def test_a_gang_of_half_the_pool_starts_within_the_longest_protection():
    run = refereed(_stream(8, 600, 32).build())
    started = first_start_s(run, "gang")
    assert started is not None and started - HOUR <= 2 * HOUR + 60


def test_a_gang_within_its_share_behind_a_larger_one_of_its_own_leaf_gets_the_reservation():
    # a's 32-GPU gang (the whole pool, beyond a's half) came first and borrows: it gets no
    # reservation, and neither did the 16-GPU gang behind it before issue 24
    # (b's jobs are protected all their life: a node frees only when a reservation keeps b's
    # next job off it)
    builder = _stream(4, 600, 16, work="2h")
    builder.workload("big", "a", gpus=32, work="2h", min_runtime="1h", resumable=True, submit=HOUR - 60)
    run = refereed(builder.build())
    started = first_start_s(run, "gang")
    assert started is not None and started - HOUR <= 2 * HOUR + 60
