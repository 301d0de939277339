"""The devstack's synthetic traffic offers the load it is asked for, whatever the workloads ask:
a fixed submission rate offered the demo cluster 5.8x its GPUs and its queue never stopped
growing (docs/records/2026-12-01-dashboard.md, "Demo churn")."""

from __future__ import annotations

import types

import pytest

from services.common.cluster_config import load_cluster
from services.common.settings import DEFAULT_CLUSTER_FILE
from services.devstack.__main__ import paced_gaps_s, request_of


def offered(workloads, gaps, gpus: int, speed: float) -> float:
    return sum(w.gpus * request_of(w, speed)["work_s"] for w in workloads) / sum(gaps) / gpus


def spec(submit_s: int, gpus: int, work_s: int):
    return types.SimpleNamespace(submit_s=submit_s, gpus=gpus, work_s=work_s, min_runtime_s=0, project="a",
                                 gpu_type="H100", resumable=True, priority="normal", kind="eval",
                                 checkpoint_interval_s=None)


@pytest.mark.parametrize("load", [0.5, 0.9, 1.5])
def test_the_demo_flow_offers_the_asked_load_of_the_clusters_gpus(load):
    config = load_cluster(DEFAULT_CLUSTER_FILE)
    workloads = sorted(config.scenario.workloads, key=lambda w: (w.submit_s, w.id))
    gpus = sum(p.nodes * p.gpus_per_node for p in config.pools)
    gaps = paced_gaps_s(workloads, gpus, 60.0, load)
    assert offered(workloads, gaps, gpus, 60.0) == pytest.approx(load)


def test_the_scenarios_bursts_and_lulls_are_kept_in_proportion():
    # a burst of three, a lull, one more: 8 GPUs x 100 s each, 16 GPUs at load 1
    workloads = [spec(0, 8, 100), spec(0, 8, 100), spec(10, 8, 100), spec(70, 8, 100)]
    gaps = paced_gaps_s(workloads, 16, 1.0, 1.0)
    assert sum(gaps) == pytest.approx(4 * 800 / 16)
    assert gaps[0] == 0 and gaps[2] == pytest.approx(6 * gaps[1])
    assert gaps[3] == pytest.approx((gaps[0] + gaps[1] + gaps[2]) / 3)  # back to the first: an average gap


def test_the_demo_submits_the_notice_a_workload_declares_scaled_like_its_other_durations():
    from timeshare.workload import WorkloadSpec

    noticed = WorkloadSpec(id="t", submit_s=0, project="a/b", gpu_type="H100", gpus=8, work_s=36000,
                           min_runtime_s=3600, resumable=True, checkpoint_interval_s=1800,
                           checkpoint_on_notice_s=120, checkpoint_gb=64.0)
    body = request_of(noticed, 60)
    assert (body["checkpoint_on_notice_s"], body["checkpoint_gb"]) == (2, 64.0) and "suspends_on_notice" not in body
    plain = WorkloadSpec(id="p", submit_s=0, project="a/b", gpu_type="H100", gpus=1, work_s=600)
    assert not {"checkpoint_on_notice_s", "checkpoint_gb", "suspends_on_notice"} & set(request_of(plain, 60))


def test_the_demo_flows_training_and_evaluation_declare_notices_and_debug_none():
    """As the built-in scenario (examples/ai2-like): training and evaluation checkpoint on notice
    within 60-120 s, sized by their GPUs; interactive sessions suspend within 30 s; debug jobs have
    none; each reaches the gateway's body."""
    config = load_cluster(DEFAULT_CLUSTER_FILE)
    by_kind: dict[str, list] = {}
    for w in config.scenario.workloads:
        by_kind.setdefault(w.kind, []).append(w)
    assert set(by_kind) == {"debug", "training", "eval", "interactive"}
    for kind, gb_per_gpu in (("training", 8), ("eval", 2)):
        for w in by_kind[kind]:
            assert 60 <= w.checkpoint_on_notice_s <= 120, (kind, w)
            assert w.checkpoint_gb == pytest.approx(gb_per_gpu * w.gpus), (kind, w)
            body = request_of(w, 60)
            assert body["checkpoint_on_notice_s"] == max(1, int(w.checkpoint_on_notice_s / 60))
            assert body["checkpoint_gb"] == w.checkpoint_gb and "suspends_on_notice" not in body
    # larger gangs take longer to checkpoint
    training = sorted(by_kind["training"], key=lambda w: w.gpus)
    assert training[0].checkpoint_on_notice_s == 60 and training[-1].checkpoint_on_notice_s == 120
    for w in by_kind["interactive"]:
        assert w.checkpoint_on_notice_s == 30 and w.checkpoint_gb == pytest.approx(10 * w.gpus), w
        body = request_of(w, 60)
        assert body["suspends_on_notice"] is True and body["checkpoint_on_notice_s"] == 1  # 30 s / speed 60
    for w in by_kind["debug"]:
        assert not {"checkpoint_on_notice_s", "checkpoint_gb", "suspends_on_notice"} & set(request_of(w, 60))
    assert config.policy.preemption_notice  # and the demo's policy gives them
