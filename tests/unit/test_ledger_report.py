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


def test_a_budget_change_moves_waiting_and_running_work_between_the_funded_counts_from_its_moment():
    # The ledger's hourly rows follow budget changes: a team added to the tree is owed its funded
    # work from the change on, and a team whose budget goes stops being owed from then. Before,
    # the rows kept the first tree's fractions: the added team's first submission raised KeyError
    # (logged and skipped, so its work was never owed and its demand never ended).
    from services.ledger.hourly import HourlyUsage
    from timeshare import events as ev
    from timeshare.tree import AllocationTree
    from timeshare.workload import WorkloadSpec

    ms = 1000
    h = HourlyUsage(AllocationTree.from_shares({"a": 1, "b": 1}), {"H100": 8}, {"H100-000": ("H100", 8)}, 3600)

    def submitted(wid: str, team: str, at_s: int, gpus: int) -> ev.WorkloadSubmitted:
        spec = WorkloadSpec(id=wid, submit_s=at_s, project=team, gpu_type="H100", gpus=gpus, work_s=HOUR,
                            min_runtime_s=600)
        return ev.WorkloadSubmitted(event_id=f"s-{wid}", at_ms=at_s * ms, workload=spec)

    def started(wid: str, team: str, at_s: int, gpus: int, first_gpu: int) -> ev.WorkloadStarted:
        return ev.WorkloadStarted(event_id=f"r-{wid}", at_ms=at_s * ms, workload_id=wid, project=team,
                                  gpu_type="H100", gpus=gpus, allocated=True, protected_until_ms=None,
                                  placement=[ev.NodeGpus(node="H100-000", gpu_ids=list(range(first_gpu,
                                                                                           first_gpu + gpus)))])

    def changed(at_s: int, **shares) -> ev.BudgetChanged:
        return ev.BudgetChanged(event_id=f"b-{at_s}", at_ms=at_s * ms, by="manager", reason="test",
                                changed={path: ev.ShareChange(old=old, new=new) for path, (old, new) in shares.items()})

    for e in (
        submitted("b1", "b", 0, 4), started("b1", "b", 0, 4, 0),
        changed(600, c=(None, 2.0)),                      # c added at 10 min
        submitted("c1", "c", 900, 4), started("c1", "c", 1200, 4, 4),
        changed(1800, b=(1.0, None)),                     # b removed at 30 min, b1 still running
        ev.WorkloadCompleted(event_id="d-c1", at_ms=2400 * ms, workload_id="c1"),
        ev.WorkloadCompleted(event_id="d-b1", at_ms=3000 * ms, workload_id="b1"),
    ):
        h.observe(e)
    mc = h.mc
    mc.demand_funded.close(3000)
    mc.delivered_funded.close(3000)
    owed = {k: sum(bins.values()) for k, bins in mc.demand_funded.bins.items()}
    got = {k: sum(bins.values()) for k, bins in mc.delivered_funded.bins.items()}
    # c: asked for 4 GPUs from 900 s to 2400 s, ran them from 1200 s
    assert owed[("c", "H100")] == 4 * 1500
    assert got[("c", "H100")] == 4 * 1200
    # b: funded until its budget went at 1800 s, though it ran until 3000 s
    assert owed[("b", "H100")] == 4 * 1800
    assert got[("b", "H100")] == 4 * 1800
    # every count is back to zero once the work ended: nothing is taken away twice or never
    assert all(r == 0 for r in mc.demand_funded.rate.values())
    assert all(r == 0 for r in mc.delivered_funded.rate.values())
    assert not mc.specs  # (the ledger forgets ended work)
