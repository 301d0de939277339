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


def test_an_hour_covered_in_part_owes_that_part_of_the_share():
    # one team with half of 8 GPUs asks for 8 for the first 10 minutes and gets its 4: it got
    # all it was owed (4 GPUs x 10 min), not a sixth of an hour's worth
    from timeshare.sim.metrics import MetricsCollector
    from timeshare.tree import AllocationTree

    tree = AllocationTree.from_shares({"a": 1, "b": 1})
    mc = MetricsCollector(tree, {"H100": 8}, 3600)
    mc.start(0.0, {"H100-000": ("H100", 8)})
    mc.demand_funded.change(("a", "H100"), 0.0, 8)
    mc.delivered_funded.change(("a", "H100"), 0.0, 4)
    mc.demand_funded.change(("a", "H100"), 600.0, -8)
    mc.delivered_funded.change(("a", "H100"), 600.0, -4)
    teams, _ = mc.attainment_of(mc.delivered_funded, mc.demand_funded, span_s=(0.0, 600.0))
    assert teams["a"]["attainment"] == 1.0
    assert teams["a"]["owed_gpu_hours"] == round(4 * 600 / 3600, 3)
    # counted as whole hours, the same run looked like half of what was owed
    whole, _ = mc.attainment_of(mc.delivered_funded, mc.demand_funded)
    assert whole["a"]["attainment"] == 0.5
