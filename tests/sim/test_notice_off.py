"""Without a notice, everything stays as it was: the built-in scenario's event log, byte for
byte, is the one the scheduler wrote before notices existed, whether the policy gives no
notices (``preemption_notice = false``) or the workloads declare none.

The hashes below are of the encoded event logs (one JSON event per line) that main at
db22599 (the agreed schema, before any notice behaviour) wrote for the first days of
examples/ai2-like/scenario.toml, with that commit's scenario (no notices declared). To
reproduce: ``git archive db22599 shared examples | tar -x -C /tmp/old`` and run
``log_hash`` below there with ``PYTHONPATH=/tmp/old/shared``.

A later change of the scheduler's own decisions moves a hash: the budget policy's moved once,
when a pass that gave allocated work beyond a due share GPUs became followed by another at the
same instant (``scheduler._Pass.grew_beyond``). The notice code was checked against db22599's
hash up to the commit before that change (28ecdff); the hash since is that change's log.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest
from msgspec import UNSET

from timeshare import events as ev
from timeshare.sim.engine import run
from timeshare.sim.scenario import Scenario, load_scenario

AI2_LIKE = Path(__file__).resolve().parents[2] / "examples" / "ai2-like" / "scenario.toml"

#: (policy, days) -> (events, sha256) written before notices existed (budget: db22599's was
#: 21812 events, 03dab04b...a0a7d77, until the follow-up pass above)
BEFORE = {
    ("budget", "3d"): (21713, "d5a9f44659be086ccc7425f404e4a0f650749afe52704a380870fefc5a7e9f9e"),
    ("baseline", "2d"): (13973, "54493ad0de81fcc30d6cfbb0108251e781150fe156d566d4b00d0126cf75e3fd"),
}


def _undeclared(spec):
    return msgspec.structs.replace(spec, checkpoint_on_notice_s=UNSET, checkpoint_gb=UNSET, suspends_on_notice=UNSET)


def log_hash(scenario: Scenario, policy: str, strip_submissions: bool = False) -> tuple[int, str]:
    """(events, sha256 of the encoded log); ``strip_submissions``: each submission's notice
    fields taken out of the log first (they are what the workloads declared, not a decision)."""
    h = hashlib.sha256()
    n = 0

    def on(e: ev.Event) -> None:
        nonlocal n
        if strip_submissions and isinstance(e, ev.WorkloadSubmitted):
            e = msgspec.structs.replace(e, workload=_undeclared(e.workload))
        h.update(ev.encoder.encode(e))
        h.update(b"\n")
        n += 1

    run(scenario, policy, on_event=on, wall_clock=lambda: 0.0)
    return n, h.hexdigest()


@pytest.mark.parametrize("policy, days", sorted(BEFORE))
def test_with_notices_off_in_the_policy_the_log_is_the_one_written_before_notices(policy, days):
    scenario = load_scenario(AI2_LIKE, {"duration": days, "policy.preemption_notice": "false"})
    assert any(w.notice_s for w in scenario.workloads)  # the workloads do declare notices
    assert log_hash(scenario, policy, strip_submissions=True) == BEFORE[(policy, days)]


@pytest.mark.parametrize("policy, days", sorted(BEFORE))
def test_when_no_workload_declares_a_notice_the_log_is_the_one_written_before_notices(policy, days):
    scenario = load_scenario(AI2_LIKE, {"duration": days})
    scenario.workloads = [_undeclared(w) for w in scenario.workloads]
    assert scenario.policy.preemption_notice
    assert log_hash(scenario, policy) == BEFORE[(policy, days)]


def test_with_notices_the_same_days_differ():
    """The comparison can fail: with the notices the scenario declares, the log changes."""
    scenario = load_scenario(AI2_LIKE, {"duration": "3d"})
    assert log_hash(scenario, "budget", strip_submissions=True) != BEFORE[("budget", "3d")]
