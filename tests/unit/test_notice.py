"""Preemption with notice, in the core: a victim that declared checkpoint_on_notice_s is told
first, keeps its GPUs (held for its preemptor, no one else's) until it checkpoints or its
deadline passes, and only then is preempted; its preemptor starts on the freed GPUs."""

from __future__ import annotations

import pytest

from timeshare import events as ev
from timeshare.state import AWAITING, RUNNING, SchedulerState

from tests.builders import ScenarioBuilder, secs, spec


def _one_node(**policy) -> ScenarioBuilder:
    return ScenarioBuilder().pool(nodes=1, gpus_per_node=8).teams(a=1, b=1).policy(**policy)


def _victim(**kw):
    """Unallocated, resumable training on team a that checkpoints every 30 min and asks for 60 s."""
    base = dict(gpus=8, work="10h", resumable=True, checkpoint="30m", notice="60s", checkpoint_gb=64.0)
    base.update(kw)
    return spec("v", "a", **base)


def _preemptor(**kw):
    base = dict(gpus=8, work="2h", min_runtime="1h", submit="1h")
    base.update(kw)
    return spec("p", "b", **base)


def _noticed(h, at="1h"):
    h.submit(_victim(), at=0)
    h.schedule(0)
    h.submit(_preemptor())
    out = h.schedule(at)
    return out


def test_a_decision_against_a_victim_with_a_notice_tells_it_and_leaves_its_gpus_with_it():
    h = _one_node().harness()
    out = _noticed(h)
    notices = [e for e in out if isinstance(e, ev.WorkloadPreemptionNotice)]
    assert [n.workload_id for n in notices] == ["v"]
    assert notices[0].deadline_ms == secs("1h") * 1000 + 60_000
    assert notices[0].reason.by_workload_id == "p" and notices[0].preemptor_nodes == ["H100-000"]
    assert not [e for e in out if isinstance(e, (ev.WorkloadPreempted, ev.WorkloadStarted))]
    assert h.state.workloads["v"].state == RUNNING
    assert h.state.workloads["p"].state == AWAITING
    assert h.state.next_wake_s() == secs("1h") + 60


def test_a_victim_that_checkpoints_keeps_all_its_progress_and_its_preemptor_starts_then():
    h = _one_node().harness()
    _noticed(h)
    h.checkpointed("v", secs("1h") + 40)
    out = h.schedule(secs("1h") + 40)
    pre = [e for e in out if isinstance(e, ev.WorkloadPreempted)]
    assert len(pre) == 1 and pre[0].checkpointed is True and pre[0].lost_gpu_s == 0
    assert pre[0].progress_s == secs("1h")  # everything up to the notice
    assert pre[0].checkpoint_gpu_s == 8 * 40  # its GPUs while it wrote
    assert pre[0].state_saved is msgspec_unset()
    started = [e for e in out if isinstance(e, ev.WorkloadStarted)]
    assert [s.workload_id for s in started] == ["p"] and started[0].at_ms == (secs("1h") + 40) * 1000
    assert h.state.workloads["v"].state == "pending"  # requeued with its progress


def test_a_victim_that_does_not_checkpoint_is_killed_at_its_deadline_keeping_its_last_periodic_checkpoint():
    h = _one_node().harness()
    h.submit(_victim(), at=0)
    h.schedule(0)
    h.submit(_preemptor(submit="1h10m"))
    h.schedule("1h10m")
    assert h.schedule(secs("1h10m") + 59) == []  # before the deadline nothing moves
    out = h.schedule(secs("1h10m") + 60)
    pre = [e for e in out if isinstance(e, ev.WorkloadPreempted)][0]
    assert pre.checkpointed is False
    assert pre.progress_s == secs("1h")  # the 30-min checkpoints before the notice
    assert pre.lost_gpu_s == 8 * secs("10m")
    assert pre.checkpoint_gpu_s == 8 * 60
    assert [e.workload_id for e in out if isinstance(e, ev.WorkloadStarted)] == ["p"]


def test_gpus_held_for_a_preemptor_go_to_no_other_request():
    # the victim holds 4 GPUs; 4 are free; p needs all 8: the 4 free ones are held for it
    h = _one_node().harness()
    h.submit(_victim(gpus=4), at=0)
    h.schedule(0)
    h.submit(spec("filler", "a", gpus=4, work="30m", submit=0, resumable=True), at=0)
    h.schedule(0)
    h.complete("filler", "30m")
    h.submit(_preemptor())
    h.schedule("1h")
    assert h.state.workloads["p"].state == AWAITING
    node = h.state.cluster.node("H100-000")
    assert node.free == 0 and node.held == 4
    h.submit(spec("debug", "b", gpus=1, work="5m", min_runtime="5m", kind="debug", submit=secs("1h") + 1))
    out = h.schedule(secs("1h") + 1)
    assert not [e for e in out if isinstance(e, ev.WorkloadStarted)]
    out = h.schedule(secs("1h") + 60)
    assert [e.workload_id for e in out if isinstance(e, ev.WorkloadStarted)][0] == "p"
    assert node.held == 0


def test_a_cancelled_preemptor_gives_back_what_was_held_and_its_victim_still_ends_at_the_deadline():
    h = _one_node().harness()
    h.submit(_victim(gpus=4), at=0)
    h.schedule(0)
    h.submit(_preemptor())
    h.schedule("1h")
    node = h.state.cluster.node("H100-000")
    assert node.held == 4
    h.cancel("p", secs("1h") + 5)
    assert node.held == 0 and node.free == 4 and not h.state.awaiting
    out = h.schedule(secs("1h") + 60)
    assert [e.workload_id for e in out if isinstance(e, ev.WorkloadPreempted)] == ["v"]
    # v, requeued, starts again at once on the GPUs nobody took
    assert [e.workload_id for e in out if isinstance(e, ev.WorkloadStarted)] == ["v"]
    assert (node.free, node.held, node.blocked) == (4, 0, 0)


def test_a_victim_that_completes_under_notice_releases_its_gpus_to_its_preemptor():
    h = _one_node().harness()
    h.submit(_victim(work="1h30s"), at=0)
    h.schedule(0)
    h.submit(_preemptor())
    h.schedule("1h")
    h.complete("v", secs("1h") + 30)
    node = h.state.cluster.node("H100-000")
    assert node.held == 8 and node.free == 0
    out = h.schedule(secs("1h") + 30)
    assert [e.workload_id for e in out if isinstance(e, ev.WorkloadStarted)] == ["p"]
    assert node.held == 0 and node.blocked == 8  # p is protected


def test_without_notices_in_the_policy_the_victim_ends_at_once():
    h = _one_node(preemption_notice=False).harness()
    out = _noticed(h)
    assert not [e for e in out if isinstance(e, ev.WorkloadPreemptionNotice)]
    pre = [e for e in out if isinstance(e, ev.WorkloadPreempted)][0]
    assert pre.checkpoint_gpu_s is msgspec_unset() and pre.checkpointed is msgspec_unset()
    assert [e.workload_id for e in out if isinstance(e, ev.WorkloadStarted)] == ["p"]


@pytest.mark.parametrize("suspends, requeued, state_saved", [
    (True, True, True),
    (False, False, None),  # no notice: a session that does not suspend keeps today's behaviour
])
def test_a_session_that_suspends_on_notice_is_requeued_with_its_state(suspends, requeued, state_saved):
    h = _one_node().harness()
    h.submit(spec("s", "a", gpus=8, work="12h", kind="interactive", notice="30s", suspends=suspends), at=0)
    h.schedule(0)
    h.submit(_preemptor())
    out = h.schedule("1h")
    if suspends:
        h.checkpointed("s", secs("1h") + 20)
        out = h.schedule(secs("1h") + 20)
    pre = [e for e in out if isinstance(e, ev.WorkloadPreempted)][0]
    assert pre.resumable is requeued
    assert (pre.state_saved if state_saved is not None else None) == state_saved
    if suspends:
        assert pre.progress_s == secs("1h")
        assert h.state.workloads["s"].state == "pending"


def test_the_storage_admits_no_more_notices_than_it_can_absorb_within_their_notice():
    # two victims each need 64 GB / 60 s ~ 1.07 GB/s; the storage has 1.5 GB/s: one at a time
    b = ScenarioBuilder().pool(nodes=2, gpus_per_node=8).teams(a=1, b=1).checkpoint_bandwidth(1.5)
    h = b.harness()
    h.submit(_victim(), spec("v2", "a", gpus=8, work="10h", resumable=True, checkpoint="30m", notice="60s",
                             checkpoint_gb=64.0), at=0)
    h.schedule(0)
    h.submit(_preemptor(), spec("p2", "b", gpus=8, work="2h", min_runtime="1h", submit="1h"))
    out = h.schedule("1h")
    assert len([e for e in out if isinstance(e, ev.WorkloadPreemptionNotice)]) == 1
    h.checkpointed(next(iter(h.state.notices)), secs("1h") + 60)
    out = h.schedule(secs("1h") + 60)
    assert len([e for e in out if isinstance(e, ev.WorkloadPreempted)]) == 1
    assert len([e for e in out if isinstance(e, ev.WorkloadPreemptionNotice)]) == 1  # the second, now


def test_the_state_rebuilt_from_the_log_is_the_state_that_made_it():
    b = _one_node()
    h = b.harness()
    h.submit(_victim(gpus=4), at=0)
    h.schedule(0)
    h.submit(_preemptor())
    h.schedule("1h")
    replay = SchedulerState(b.tree(), b.cluster(), b.config())
    for e in h.events:
        replay.apply(e)
    for s in (h.state, replay):
        node = s.cluster.node("H100-000")
        assert (node.free, node.held, node.blocked) == (0, 4, 8)
        assert sorted(s.notices) == ["v"] and sorted(s.awaiting) == ["p"]
    assert replay.next_wake_s() == h.state.next_wake_s()


def msgspec_unset():
    from msgspec import UNSET
    return UNSET


def _generated(**cls_extra):
    from timeshare.cluster import Cluster, PoolSpec
    from timeshare.config import PolicyConfig
    from timeshare.sim.generator import generate
    from timeshare.tree import AllocationTree

    table = {"offered_load": 1.0, "classes": [{"kind": "training", "load_share": 1, "gpus": [8, 64], "work": ["1h", "2h"],
                                               "min_runtime": "1h", "resumable": True, **cls_extra}]}
    return generate(table, AllocationTree.from_shares({"a": 1}), Cluster([PoolSpec("H100", 16, 8)]), PolicyConfig(),
                    86400, 1)


def test_the_generator_declares_notices_by_gpu_count_and_draws_the_same_workloads():
    plain = _generated()
    noticed = _generated(checkpoint_on_notice=["60s", "120s"], checkpoint_gb_per_gpu=8)
    assert [(w.id, w.submit_s, w.gpus, w.work_s) for w in plain] == [(w.id, w.submit_s, w.gpus, w.work_s) for w in noticed]
    assert {(w.gpus, w.notice_s, w.checkpoint_size_gb) for w in noticed} == {(8, 60, 64.0), (64, 120, 512.0)}
    assert all(w.checkpoint_on_notice_s is msgspec_unset() for w in plain)


def test_the_generator_refuses_a_notice_above_the_policys_cap():
    from timeshare.sim.generator import GeneratorError

    with pytest.raises(GeneratorError) as err:
        _generated(checkpoint_on_notice="6m")
    assert err.value.field == "classes[0].checkpoint_on_notice" and "max_notice" in err.value.message


def test_a_victim_cancelled_under_notice_leaves_its_gpus_held_for_its_preemptor():
    h = _one_node().harness()
    h.submit(_victim(gpus=4), at=0)
    h.schedule(0)
    h.submit(_preemptor())
    h.schedule("1h")
    h.cancel("v", secs("1h") + 10)
    node = h.state.cluster.node("H100-000")
    assert (node.free, node.held) == (0, 8) and not h.state.notices
    h.submit(spec("other", "a", gpus=2, work="1h", submit=secs("1h") + 10))
    out = h.schedule(secs("1h") + 10)
    assert [e.workload_id for e in out if isinstance(e, ev.WorkloadStarted)] == ["p"]
    assert (node.free, node.held) == (0, 0)


@pytest.mark.parametrize("fault", ["unhealthy", "failed"])
def test_a_preemptor_whose_node_leaves_service_goes_back_to_its_queue(fault):
    b = ScenarioBuilder().pool(nodes=2, gpus_per_node=8).teams(a=1, b=1)
    h = b.harness()
    h.submit(_victim(), spec("v2", "a", gpus=8, work="10h", resumable=True), at=0)
    h.schedule(0)
    h.submit(_preemptor())
    out = h.schedule("1h")
    # v, with a notice, costs less than v2's hour of progress: it is the victim
    (notice,) = [e for e in out if isinstance(e, ev.WorkloadPreemptionNotice)]
    assert notice.workload_id == "v"
    node = notice.preemptor_nodes[0]
    if fault == "unhealthy":
        h.unhealthy(node, secs("1h") + 5)
    else:
        h.fail_node(node, secs("1h") + 5)
    p = h.state.workloads["p"]
    assert p.state == "pending" and p.plan is None and not h.state.awaiting
    assert all(n.held == 0 for n in h.state.cluster.pools["H100"].nodes)
    if fault == "unhealthy":
        # its victim was told: it still ends at its deadline (the drain leaves it alone meanwhile)
        assert h.state.workloads["v"].notice is not None
        out = h.schedule(secs("1h") + 60)
        assert "v" in [e.workload_id for e in out if isinstance(e, ev.WorkloadPreempted)]


@pytest.mark.parametrize("kind, victim", [
    ("other", "with-notice"),   # its checkpoint (1 GPU x 120 s) and wait cost less than 10 min lost
    ("debug", "without"),       # a debug request prefers the victim that frees its GPU at once
])
def test_victim_choice_counts_the_checkpoint_and_the_wait(kind, victim):
    h = ScenarioBuilder().pool(nodes=1, gpus_per_node=2).teams(a=1, b=1).harness()
    h.submit(spec("with-notice", "a", gpus=1, work="10h", resumable=True, checkpoint="30m", notice="120s"),
             spec("without", "a", gpus=1, work="10h", resumable=True, checkpoint="30m"), at=0)
    h.schedule(0)
    h.submit(spec("req", "b", gpus=1, work="5m", min_runtime="5m", kind=kind, submit="10m"))
    out = h.schedule("10m")
    taken = [e.workload_id for e in out if isinstance(e, (ev.WorkloadPreempted, ev.WorkloadPreemptionNotice))]
    assert taken == [victim]
