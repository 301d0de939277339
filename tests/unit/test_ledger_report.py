"""The ledger's live attainment report and the simulator's metrics are one definition: over the
same events they give the same funded (target) and all-work figures."""

from __future__ import annotations

from services.ledger.report import attainment_report
from tests.builders import ScenarioBuilder, simulate

HOUR = 3600


def test_the_live_report_equals_the_simulators_attainment_over_the_same_events():
    builder = ScenarioBuilder(duration=8 * HOUR).pool("H100", 2, 8).teams(a=1, b=1)
    builder.workload("a-funded", "a", gpus=8, work="6h", min_runtime="1h", resumable=True, checkpoint="30m")
    builder.workload("a-free", "a", gpus=8, work="6h", min_runtime=0, resumable=True, checkpoint="30m")
    builder.workload("b-funded", "b", gpus=8, work="3h", min_runtime="1h", submit="2h", resumable=True)
    builder.workload("b-free", "b", gpus=4, work="5h", min_runtime=0, submit="1h", resumable=True)
    scenario = builder.build()
    run = simulate(scenario)
    nodes = {n.name: ("H100", n.gpus) for n in run.state.cluster.pool("H100").nodes}
    report = attainment_report(run.events, run.state.tree, {"H100": 16}, nodes, scenario.policy.max_min_runtime_s,
                               None, scenario.duration_s)
    assert report["attainment"] == run.metrics["attainment"]
    assert report["attainment_all_work"] == run.metrics["attainment_all_work"]
    for team in ("a", "b"):
        assert report["teams"][team]["attainment"] == run.metrics["teams"][team]["attainment"]
    # unallocated time is owed to no one: a team's funded figure ignores its unallocated work
    assert report["teams"]["a"]["owed_gpu_hours"] < run.metrics["teams"]["a"]["owed_all_work_gpu_hours"]
