"""The cached budget policy decides exactly as its reference (the same rules, every cache off):
byte-identical event streams on random small scenarios of every tree shape."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings

from tests.builders import simulate
from tests.strategies import scenarios


@settings(max_examples=int(os.environ.get("TIMESHARE_EXAMPLES", "120")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_caches_never_change_a_decision(scenario):
    cached = simulate(scenario, "budget")
    reference = simulate(scenario, "budget-reference")
    assert cached.encoded() == reference.encoded()


@settings(max_examples=int(os.environ.get("TIMESHARE_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios())
def test_naming_the_spared_candidates_changes_no_decision(scenario):
    """The live placement's flag (BudgetPolicy(explain_rejected=True)) only adds to reasons: with
    the candidates stripped, its events are the simulator's; every refusal is explained by a rule
    (never the fallback), the victims are never among the spared, the list stays short, and the
    reference mode names the same candidates."""
    from unittest import mock

    import msgspec

    from timeshare import events as ev
    from timeshare.rejected import SHOWN
    from timeshare.scheduler import BudgetPolicy
    from timeshare.sim import engine

    with mock.patch.dict(engine.CHECKS, {
            "budget-explained": lambda: BudgetPolicy(explain_rejected=True),
            "reference-explained": lambda: BudgetPolicy(reference=True, explain_rejected=True)}):
        explained = simulate(scenario, "budget-explained")
        # the candidates come from the state at the decision, not from a cache: the reference agrees
        assert simulate(scenario, "reference-explained").encoded() == explained.encoded()
    plain = simulate(scenario, "budget")
    stripped = []
    for e in explained.events:
        # (a decision under notice carries its reason on the notice and on the preemption after it)
        if isinstance(e, (ev.WorkloadPreempted, ev.WorkloadPreemptionNotice)) \
                and e.reason.kind in ("fair_share", "unallocated") and e.reason.by_workload_id is not None:
            reason = e.reason
            assert reason.considered is not msgspec.UNSET and len(reason.rejected) <= min(SHOWN, reason.considered)
            assert all(c.workload_id != e.workload_id for c in reason.rejected)
            assert all(c.reason != "not_eligible" for c in reason.rejected), reason.rejected
            e = msgspec.structs.replace(e, reason=msgspec.structs.replace(
                reason, considered=msgspec.UNSET, rejected=msgspec.UNSET))
        stripped.append(e)
    assert b"\n".join(ev.encoder.encode(e) for e in stripped) == plain.encoded()
