"""What users are shown: the queue in the scheduler's order, and why a workload waits or runs."""

from __future__ import annotations

from tests.builders import ScenarioBuilder, spec
from timeshare import events as ev
from timeshare.explain import explain, queue_order

HOUR = 3600


def busy_cluster(catch_up: float = 1.0):
    """2 nodes x 8: team a runs both nodes (one gang protected for 8 h, one for 1 h); b and c wait."""
    h = (ScenarioBuilder().pool(nodes=2, gpus_per_node=8).teams(a=1, b=1, c=1).policy(catch_up=catch_up).harness())
    h.submit(spec("a-long", "a", gpus=8, work="20h", min_runtime="8h", resumable=True),
             spec("a-short", "a", gpus=8, work="20h", min_runtime="1h", resumable=True))
    h.schedule(0)
    return h


def test_the_queue_shown_is_the_order_a_pass_takes_allocated_requests_first_by_fill():
    h = busy_cluster()
    h.submit(spec("c-free", "c", gpus=4, min_runtime=0, submit=600),
             spec("b-funded", "b", gpus=4, min_runtime="1h", submit=600),
             spec("a-more", "a", gpus=4, min_runtime="1h", submit=600))
    order = [(phase, w.id) for phase, w in queue_order(h.state, "H100", 600)]
    # b runs nothing of its due share, a runs all of the cluster: b's request comes first;
    # unallocated work after every allocated request
    assert order == [("allocated", "b-funded"), ("allocated", "a-more"), ("unallocated", "c-free")]


def test_a_pending_request_says_what_it_waits_for_with_the_protection_that_ends_first():
    h = busy_cluster()
    h.submit(spec("b-gang", "b", gpus=8, min_runtime="1h", submit=600))
    about = explain(h.state, "b-gang", 600)
    assert about["state"] == "pending" and about["position"] == 1 and about["phase"] == "allocated"
    # a-short's protection ends at 1 h: the earliest a node can be freed
    assert about["waiting_for"] == "a-short" and about["earliest_room_in_s"] == HOUR - 600
    assert "when the protection of a-short ends" in about["summary"]
    assert [level["subtree"] for level in about["levels"]] == ["b"]


def test_a_running_workload_says_whether_it_is_protected_and_for_how_long():
    h = busy_cluster()
    about = explain(h.state, "a-long", 2 * HOUR)
    assert about["state"] == "running" and about["allocated"] is True
    assert "protected for 6h" in about["summary"]
    assert "past its minimum runtime" in explain(h.state, "a-short", 2 * HOUR)["summary"]


def test_unallocated_work_waiting_on_the_headroom_says_so():
    # 10 nodes of 8, headroom 10%: 18 evals of 4 GPUs run, 8 GPUs stay free, the next eval waits
    h = ScenarioBuilder().pool(nodes=10, gpus_per_node=8).teams(a=1, b=1).policy(unallocated_headroom=0.1).harness()
    h.submit(*[spec(f"eval{i}", "b", gpus=4, min_runtime=0, work="20h") for i in range(19)])
    h.schedule(0)
    [waiting] = [w.id for w in h.state.workloads.values() if w.state == "pending"]
    about = explain(h.state, waiting, 60)
    assert about["state"] == "pending" and about["phase"] == "unallocated"
    assert "leaves 8 H100 GPUs free for funded work to start on (the headroom; 8 are free now)" in about["summary"]


def test_a_gang_that_holds_the_reservation_names_its_nodes_and_when_they_are_free():
    # a runs all four nodes, protected for 1-4 h; b's 16-GPU gang is within b's half: the two
    # nodes freed soonest are reserved for it, and a's new 8-h request may not start there
    h = ScenarioBuilder().pool(nodes=4, gpus_per_node=8).teams(a=1, b=1).policy(catch_up=0.0).harness()
    h.submit(*[spec(f"a{i}", "a", gpus=8, work="20h", min_runtime=f"{i + 1}h", resumable=True) for i in range(4)])
    h.schedule(0)
    h.submit(spec("b-gang", "b", gpus=16, min_runtime="1h", submit=600),
             spec("a-long", "a", gpus=8, min_runtime="8h", submit=600))
    about = explain(h.state, "b-gang", 600)
    assert about["reservation"]["nodes"] == ["H100-000", "H100-001"]
    assert "Reserved for it: H100-000..001, free of protected work in 1h50m" in about["summary"]
    assert "It may not start on H100-000..001: they are reserved for b-gang (b)" in explain(
        h.state, "a-long", 600)["summary"]


def test_unallocated_work_no_preemption_can_make_room_for_says_so_and_no_time():
    # a's 8-GPU allocated job fills H100-000 (past its minimum runtime at 2 h); b's own
    # unallocated eval holds half of H100-001. An unallocated 8-GPU request of b may take
    # neither (allocated work, and its own team's): the pass starts nothing, and explain must
    # not say GPUs are free or preemptible now
    h = ScenarioBuilder().pool(nodes=2, gpus_per_node=8).teams(a=1, b=1).harness()
    h.submit(spec("a-train", "a", gpus=8, work="20h", min_runtime="1h", resumable=True),
             spec("b-eval", "b", gpus=4, work="20h", min_runtime=0))
    h.schedule(0)
    h.submit(spec("b-big", "b", gpus=8, work="1h", min_runtime=0, submit=2 * HOUR))
    decided = h.schedule(2 * HOUR)
    assert not [e for e in decided if isinstance(e, (ev.WorkloadStarted, ev.WorkloadPreempted))]
    about = explain(h.state, "b-big", 2 * HOUR)
    assert about["phase"] == "unallocated"
    assert about["earliest_room_in_s"] is None and about["waiting_for"] is None
    assert "free or held by work that may be preempted now" not in about["summary"]
    assert "No preemption can make room for it now" in about["summary"]


def test_unallocated_work_of_a_richer_team_is_room_for_an_unallocated_request():
    # the same, but the eval is a's (a runs 12 GPUs, b none): b's unallocated request may take
    # it, and the pass does at once, as explain said
    h = ScenarioBuilder().pool(nodes=2, gpus_per_node=8).teams(a=1, b=1).harness()
    h.submit(spec("a-train", "a", gpus=8, work="20h", min_runtime="1h", resumable=True),
             spec("a-eval", "a", gpus=4, work="20h", min_runtime=0))
    h.schedule(0)
    h.submit(spec("b-big", "b", gpus=8, work="1h", min_runtime=0, submit=2 * HOUR))
    about = explain(h.state, "b-big", 2 * HOUR)
    assert about["earliest_room_in_s"] == 0
    assert "free or held by work that may be preempted now" in about["summary"]
    h.schedule(2 * HOUR)
    assert h.state.workloads["b-big"].state == "running" and h.state.workloads["a-eval"].state != "running"


def test_a_victim_under_notice_says_when_it_was_notified_and_by_when_its_gpus_are_free():
    # one node of 8: a's resumable training asks for a 90 s notice; b's request takes it at 14:02
    h = ScenarioBuilder().pool(nodes=1, gpus_per_node=8).teams(a=1, b=1).harness()
    h.submit(spec("train", "a", gpus=8, work="10h", resumable=True, checkpoint="30m", notice="90s"), at=0)
    h.schedule(0)
    at_s = 14 * HOUR + 2 * 60
    h.submit(spec("funded", "b", gpus=8, work="2h", min_runtime="1h", submit=at_s))
    h.schedule(at_s)
    victim = explain(h.state, "train", at_s + 30)
    assert victim["state"] == "running" and victim["notice"]["by"] == "funded"
    assert victim["summary"].startswith("Preempted with notice: notified at 14:02:00, checkpointing, GPUs free "
                                        "for funded by 14:03:30 at the latest (in 1m; killed then"), victim["summary"]
    preemptor = explain(h.state, "funded", at_s + 30)
    assert preemptor["state"] == "awaiting" and preemptor["waiting_for_notice"] == ["train"]
    assert "Waiting for the GPUs of train under notice on H100-000" in preemptor["summary"]
    assert "by 14:03:30 at the latest" in preemptor["summary"]
    h.checkpointed("train", at_s + 40)
    assert "checkpointed at 14:02:40; its GPUs go for funded in the next pass" in explain(h.state, "train", at_s + 40)[
        "summary"]
