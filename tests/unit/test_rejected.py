"""Each preemption names the running workloads it considered and did not take, and why, from the
scheduler's own rules (rejected.py), only when asked for (the live placement)."""

from __future__ import annotations

import msgspec

from tests.builders import ScenarioBuilder, spec
from timeshare import events as ev
from timeshare.explain import explain, rejected_sentence
from timeshare.scheduler import BudgetPolicy

HOUR = 3600


def _start(h, workload_id: str, node: str, gpus: int, protected_for_s: int | None, non_preemptible: bool = False):
    """Start a submitted workload on ``node``'s lowest free GPUs, by hand (the placement matters)."""
    state = h.state
    w = state.workloads[workload_id]
    n = state.cluster.node(node)
    ids = [g for g, holder in enumerate(n.slots) if holder is None][:gpus]
    h._apply(ev.WorkloadStarted(
        event_id=state.next_event_id(), at_ms=0, workload_id=workload_id, project=w.leaf, gpu_type="H100",
        gpus=gpus, placement=[ev.NodeGpus(node=node, gpu_ids=ids)], allocated=True,
        protected_until_ms=None if protected_for_s is None else protected_for_s * 1000,
        non_preemptible=non_preemptible, attempt=1))


def four_teams(explain_rejected: bool = True):
    """4 nodes x 8 H100, teams a, b, c, d of equal share (8 GPUs due each, catch-up off). At 0:

    * node 0: b-old (8 GPUs, protected 1 h); node 1: b-opt-out (4, non-preemptible) and b-new (4,
      protected 1 h): b runs 16 of its 8 (200%);
    * node 2: a-prot (8, protected 8 h);
    * node 3: c-small (4, protected 1 h) and 4 free GPUs: c runs half its due share.

    At 2 h d (nothing running) asks for 8 GPUs: only b-old's node can be emptied."""
    h = ScenarioBuilder().pool(nodes=4, gpus_per_node=8).teams(a=1, b=1, c=1, d=1).policy(catch_up=0).harness()
    h.policy = BudgetPolicy(explain_rejected=explain_rejected)
    h.submit(spec("b-old", "b", gpus=8, work="20h", min_runtime="1h", resumable=True),
             spec("b-opt-out", "b", gpus=4, work="20h", min_runtime="1h"),
             spec("b-new", "b", gpus=4, work="20h", min_runtime="1h", resumable=True),
             spec("a-prot", "a", gpus=8, work="20h", min_runtime="8h"),
             spec("c-small", "c", gpus=4, work="20h", min_runtime="1h"))
    _start(h, "b-old", "H100-000", 8, HOUR)
    _start(h, "b-opt-out", "H100-001", 4, None, non_preemptible=True)
    _start(h, "b-new", "H100-001", 4, HOUR)
    _start(h, "a-prot", "H100-002", 8, 8 * HOUR)
    _start(h, "c-small", "H100-003", 4, HOUR)
    h.schedule(2 * HOUR)  # protections of 1 h end (min_runtime_reached); nothing waits yet
    h.submit(spec("d-new", "d", gpus=8, work="1h", min_runtime="1h", submit=2 * HOUR))
    return h


def test_a_preemption_names_the_spared_candidates_and_the_rule_that_spared_each():
    h = four_teams()
    out = h.schedule(2 * HOUR)
    (preempted,) = [e for e in out if isinstance(e, ev.WorkloadPreempted)]
    assert preempted.workload_id == "b-old" and preempted.reason.rule == "due_share"
    reason = preempted.reason
    assert reason.considered == 4
    by_id = {c.workload_id: c for c in reason.rejected}
    # closest call first: b-new may go, but its node could not hold 8 GPUs with b-opt-out staying
    assert [c.workload_id for c in reason.rejected] == ["b-new", "c-small", "a-prot", "b-opt-out"]
    assert by_id["b-new"].reason == "node_short" and by_id["b-new"].node == "H100-001"
    assert "4 of its 8 GPUs hold work that may not go" in by_id["b-new"].message
    # c runs 4 of its 8 due: not above its due share by more than the hysteresis
    c = by_id["c-small"]
    assert (c.reason, c.subtree, c.fill, c.due_gpus) == ("not_above_due_share", "c", 0.5, 8.0)
    assert "c runs 50% of its due share (4 of 8.0 GPUs)" in c.message and "hysteresis 0.05" in c.message
    # a-prot is protected for 6 h more; its protection's end is the number
    a = by_id["a-prot"]
    assert a.reason == "protected" and a.protected_until_ms == 8 * HOUR * 1000 and "6h" in a.message
    assert by_id["b-opt-out"].reason == "non_preemptible"


def test_the_explain_sentence_is_made_of_the_same_reasons():
    h = four_teams()
    out = h.schedule(2 * HOUR)
    (preempted,) = [e for e in out if isinstance(e, ev.WorkloadPreempted)]
    sentence = rejected_sentence(preempted.reason)
    assert sentence.startswith("4 other running workloads were considered and spared; the closest: ")
    for c in preempted.reason.rejected[:3]:
        assert f"{c.workload_id} ({c.project}, {c.gpus} GPUs on {c.node}): {c.message}" in sentence
    summary = explain(h.state, "b-old", 2 * HOUR, preempted.reason)["summary"]
    assert sentence in summary
    # a reason as the gateway keeps it (JSON) says the same
    assert rejected_sentence(msgspec.to_builtins(preempted.reason)) == sentence


def test_without_the_flag_the_reason_and_its_encoding_are_as_before():
    on = [e for e in four_teams(True).schedule(2 * HOUR)]
    off = [e for e in four_teams(False).schedule(2 * HOUR)]
    (reason_off,) = [e.reason for e in off if isinstance(e, ev.WorkloadPreempted)]
    assert reason_off.rejected is msgspec.UNSET and reason_off.considered is msgspec.UNSET
    assert b"rejected" not in ev.encoder.encode(reason_off) and b"considered" not in ev.encoder.encode(reason_off)
    assert rejected_sentence(reason_off) == ""
    # the same decisions either way; only the reasons say more
    strip = [msgspec.structs.replace(e, reason=msgspec.structs.replace(e.reason, considered=msgspec.UNSET,
                                                                      rejected=msgspec.UNSET))
             if isinstance(e, ev.WorkloadPreempted) else e for e in on]
    assert [ev.encoder.encode(e) for e in strip] == [ev.encoder.encode(e) for e in off]


def test_an_eligible_candidate_on_another_node_is_spared_for_costing_more_progress():
    # b runs two 8-GPU workloads past their minimum runtime; the younger one loses less
    h = ScenarioBuilder().pool(nodes=2, gpus_per_node=8).teams(a=1, b=1).policy(catch_up=0).harness()
    h.policy = BudgetPolicy(explain_rejected=True)
    h.submit(spec("b-1", "b", gpus=8, work="20h", min_runtime="1h"))
    _start(h, "b-1", "H100-000", 8, HOUR)
    h.submit(spec("b-2", "b", gpus=8, work="20h", min_runtime="1h", submit=HOUR))
    h.schedule(HOUR)  # b-2 starts on the free node
    h.submit(spec("a-new", "a", gpus=8, work="1h", min_runtime="1h", submit=3 * HOUR))
    out = h.schedule(3 * HOUR)
    (preempted,) = [e for e in out if isinstance(e, ev.WorkloadPreempted)]
    assert preempted.workload_id == "b-2"
    (spared,) = preempted.reason.rejected
    assert spared.workload_id == "b-1" and spared.reason == "ranked_lower"
    # 8 GPUs x 3 h against 8 GPUs x 2 h of progress lost (nothing resumable)
    assert (spared.lost_gpu_s, spared.chosen_lost_gpu_s) == (8 * 3 * HOUR, 8 * 2 * HOUR)
    assert "H100-001 ranked first: its victims lose 57600 GPU-s of progress, those on H100-000 (with it) 86400" \
        in spared.message
