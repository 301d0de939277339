"""The state forgets work that ended for good, and decides exactly as if it had not.

``SchedulerState.forget_ended(before_s)`` drops completed, failed, cancelled and preempted-not-
requeued work that ended before ``before_s`` (placement calls it before each snapshot, so a
new leader's start-up does not grow with history). No decision may read such work: the same
scenarios run once keeping everything and once forgetting every few events give byte-identical
event streams."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.builders import ScenarioBuilder, simulate, spec
from tests.strategies import contended_scenarios, scenarios
from timeshare import events as ev
from timeshare.sim import engine
from timeshare.sim.scenario import load_scenario
from timeshare.state import SchedulerState
from timeshare.units import ms_to_s

HOUR = 3600
PARITY = Path(__file__).resolve().parents[1] / "integration" / "data" / "parity.toml"


def ended_and_live():
    """2 nodes x 8 GPUs, teams a and b; work that ends in each way at known times, and live work."""
    h = ScenarioBuilder().pool(nodes=2, gpus_per_node=8).teams(a=1, b=1).harness()
    h.submit(spec("done-early", "a", gpus=2), spec("done-late", "a", gpus=2), spec("fails", "a", gpus=2),
             spec("stopped", "b", gpus=2), spec("stopped-resumable", "b", gpus=2, resumable=True),
             spec("runs", "b", gpus=2))
    h.schedule(0)
    assert h.running() == {"done-early", "done-late", "fails", "stopped", "stopped-resumable", "runs"}
    h.complete("done-early", 600)
    h._apply(ev.WorkloadFailed(event_id="f1", at_ms=700_000, cluster=h.state.name, workload_id="fails",
                               reason="exit code 1", exit_code=1))
    reason = ev.PreemptionReason(kind="test", message="stopped by the test")
    for wid in ("stopped", "stopped-resumable"):  # the non-resumable one ends; the other is requeued
        for e in h.state.preempted(h.state.workloads[wid], 800, reason):
            h._apply(e)
    h.submit(spec("cancelled", "a", gpus=16, submit=900))  # waits: the cluster is full
    h._apply(h.state.cancelled("cancelled", 900))
    h.complete("done-late", 2 * HOUR)
    h.submit(spec("waits", "a", gpus=16, submit=2 * HOUR))
    return h


FORGETS = {
    "nothing ended before the first end": (600, []),
    "an end at before_s itself is kept (strictly before)": (700, ["done-early"]),
    "completed, failed, preempted and not requeued, cancelled: all before 1 h":
        (HOUR, ["cancelled", "done-early", "fails", "stopped"]),
    "everything that ended, later": (3 * HOUR, ["cancelled", "done-early", "done-late", "fails", "stopped"]),
}


@pytest.mark.parametrize("case", list(FORGETS))
def test_forget_ended_drops_only_work_that_ended_before_the_given_time(case):
    before_s, expected = FORGETS[case]
    h = ended_and_live()
    kept_live = {"runs", "stopped-resumable", "waits"}
    assert h.state.forget_ended(before_s) == expected
    assert set(h.state.workloads) == {"done-early", "done-late", "fails", "stopped", "stopped-resumable", "runs",
                                      "cancelled", "waits"} - set(expected)
    assert kept_live <= set(h.state.workloads)  # running, requeued (resumable) and pending work stays
    assert h.state.forget_ended(before_s) == []  # nothing left to forget at that time


def test_a_forgotten_id_is_free_again_in_the_state_an_ended_one_still_held_is_not():
    h = ended_and_live()
    with pytest.raises(ValueError, match="already exists"):
        h.state.validate_submission(spec("done-early", "a"))
    h.state.forget_ended(HOUR)
    h.state.validate_submission(spec("done-early", "a"))  # the gateway's store refuses it (409), not the state
    with pytest.raises(ValueError, match="already exists"):
        h.state.validate_submission(spec("done-late", "a"))


def test_work_submitted_and_cancelled_between_two_passes_is_forgotten_without_breaking_the_next_pass():
    h = ScenarioBuilder().pool(nodes=1, gpus_per_node=8).teams(a=1).harness()
    h.schedule(0)
    h.submit(spec("gone", "a", submit=10))
    h._apply(h.state.cancelled("gone", 20))
    assert h.state.forget_ended(30) == ["gone"]
    assert h.state.fresh_pending["H100"] == []
    h.submit(spec("next", "a", submit=40))
    assert [e.workload_id for e in h.schedule(40) if isinstance(e, ev.WorkloadStarted)] == ["next"]


# -- the same decisions with and without forgetting ------------------------------------------
class _Held(dict):
    """``workloads`` of a forgetting state. The simulator's own loop (not the core) looks up a
    workload by id when a timer it set fires (the completion of work preempted since, the
    resubmission of preempted work); those lookups find forgotten work here. Any other lookup
    of forgotten work (a decision reading it) raises KeyError, as in the services."""

    def __init__(self) -> None:
        super().__init__()
        self.forgotten: dict = {}

    def __missing__(self, wid):
        caller = sys._getframe(1).f_code.co_filename
        if wid in self.forgotten and caller.endswith(os.path.join("sim", "engine.py")):
            return self.forgotten[wid]
        raise KeyError(wid)


def forgetting_state(every_events: int, retention_s: int, counter: list[int]):
    class ForgettingState(SchedulerState):
        """Forgets work that ended more than ``retention_s`` ago every ``every_events`` events,
        in the middle of passes too (placement forgets only between batches: a harder test)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.workloads = _Held()
            self.applied = 0

        def apply(self, e):
            super().apply(e)
            self.applied += 1
            if self.applied % every_events == 0:
                ended = {wid: w for wid, w in self.workloads.items() if w.ended_s is not None}
                for wid in self.forget_ended(ms_to_s(e.at_ms) - retention_s):
                    self.workloads.forgotten[wid] = ended[wid]
                    counter[0] += 1

    return ForgettingState


def simulate_forgetting(monkeypatch, scenario, every_events: int, retention_s: int) -> tuple[bytes, int]:
    counter = [0]
    with monkeypatch.context() as m:
        m.setattr(engine, "SchedulerState", forgetting_state(every_events, retention_s, counter))
        run = simulate(scenario, "budget")
    return run.encoded(), counter[0]


@pytest.mark.parametrize("every_events,retention_s", [(1, 0), (7, 60), (13, 600)])
def test_the_parity_scenario_decides_the_same_while_forgetting(monkeypatch, every_events, retention_s):
    scenario = load_scenario(PARITY)
    kept = simulate(scenario, "budget").encoded()
    forgetting, forgotten = simulate_forgetting(monkeypatch, scenario, every_events, retention_s)
    assert forgotten > 0
    assert forgetting == kept


_EXAMPLES = int(os.environ.get("TIMESHARE_EXAMPLES", "60"))


@settings(max_examples=_EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(scenario=scenarios())
def test_random_scenarios_decide_the_same_while_forgetting(monkeypatch, scenario):
    kept = simulate(scenario, "budget").encoded()
    assert simulate_forgetting(monkeypatch, scenario, 3, 0)[0] == kept


@settings(max_examples=max(10, _EXAMPLES // 3), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(scenario=contended_scenarios())
def test_contended_scenarios_decide_the_same_while_forgetting(monkeypatch, scenario):
    kept = simulate(scenario, "budget").encoded()
    assert simulate_forgetting(monkeypatch, scenario, 5, 0)[0] == kept
