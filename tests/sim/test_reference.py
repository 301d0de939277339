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
