"""Parity with a checkpoint bandwidth that notices share (issue 20): the parity-notice trace on a
cluster whose storage is too slow for its large checkpoints (killed at their deadline) and
absorbs one notice at a time. The live placement
applies the rule "storage" (its cluster carries ``checkpoint_bandwidth_gbps`` from the cluster
file) and the simulated executor writes checkpoints as the simulator's storage model does, so
live and simulated decisions stay identical."""

from __future__ import annotations

import msgspec
import pytest

from timeshare import events as ev
from timeshare.sim.engine import run
from timeshare.sim.scenario import load_scenario

from .helpers import client
from .test_parity import DATA, _first_difference

pytestmark = pytest.mark.integration


async def test_live_services_share_the_checkpoint_bandwidth_as_the_simulator_does(make_settings):
    from services.common.clock import ManualClock
    from services.devstack.driver import ManualDriver, decisions
    from services.devstack.stack import Stack
    from services.placement.view import digest

    path = DATA / "parity-storage.toml"
    scenario = load_scenario(path)
    assert scenario.checkpoint_bandwidth_gbps == 0.3
    sim_events: list[ev.Event] = []
    result = run(scenario, "budget", on_event=sim_events.append)
    expected = decisions(sim_events)
    # what the bandwidth does: the 8-GB checkpoints are written, the 32-GB ones cannot be in their
    # 60 s and are ended at their deadline (their periodic checkpoint kept); demand within it
    noticed = [e for e in sim_events if isinstance(e, ev.WorkloadPreempted) and e.checkpointed is not msgspec.UNSET]
    assert {e.checkpointed for e in noticed} == {True, False}, noticed
    assert all(e.checkpoint_gpu_s == 60 * 4 for e in noticed if not e.checkpointed)  # held to the deadline
    assert 0 < result.metrics["checkpoint_storage"]["peak_gbps"] <= 0.3

    stack = await Stack(make_settings(cluster_file=str(path), clock="manual"), clock=ManualClock()).start()
    try:
        assert stack["placement"].config.cluster().checkpoint_bandwidth_gbps == 0.3
        async with client(stack, "tok-admin") as http:
            live_events = await ManualDriver(stack, http).run(scenario)
        live = decisions(live_events)
        assert live == expected, _first_difference(expected, live)
        assert digest(stack["placement"].state) == digest(result.state)
    finally:
        await stack.stop()
