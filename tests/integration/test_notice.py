"""Preemption with notice through the real stack: NATS, PostgreSQL, placement, and the process
executor running ``examples/workloads/counter.py`` as a real process (issue 20, the live target).

alpha runs the counter (4 GPUs, resumable, a periodic checkpoint every 5 steps of 1 s) next to
a protected workload of its own, so it holds all 8 GPUs of the small cluster; beta, which has
used nothing in the window, asks twice for a node. Fair share takes the counter both times (the
other workload of alpha is protected). With a notice the counter checkpoints on SIGTERM, exits
0, the executor reports it and beta starts then: the counter completes with no work lost (its
attempts' steps sum to its declared work). Without a notice it loses the steps after its last
periodic checkpoint, exactly what the log's ``lost_gpu_s`` says. Its checkpoint directory is
kept across the attempts (each resumes from it) and removed once it has completed; the counter
keeps its attempts' records in a folder of the test's (``--record-dir``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import msgspec
import pytest

from services.devstack.stack import Stack
from timeshare import events as ev

from .helpers import client, log_events, of_type, wait_events, wait_for

pytestmark = pytest.mark.integration

COUNTER = Path(__file__).resolve().parents[2] / "examples" / "workloads" / "counter.py"
WORK_S = 16
EVERY_S = 5
GPUS = 4


def records(ckpt_dir: Path) -> dict[int, dict]:
    """The counter's record of each attempt (attempt -> {start_step, step, state, started_at})."""
    out = {}
    for path in ckpt_dir.glob("attempt-*.json"):
        doc = json.loads(path.read_text())
        out[doc["attempt"]] = doc
    return dict(sorted(out.items()))


async def _run(make_settings, tmp_path, notice_s: int | None, preempt_at_steps: tuple[int, ...], then=None):
    """The counter preempted by beta once its attempt k has done ``preempt_at_steps[k]`` steps
    (a quarter of a step later, away from a step's end: the log's whole seconds and the counter's
    steps then agree); returns (log, the counter's records, seconds it took)."""
    settings = make_settings(executor="process", executor_data_dir=str(tmp_path / "executor"), kill_grace_s=2.0)
    stack = await Stack(settings).start()
    t0 = time.monotonic()
    cluster, bus = settings.cluster, stack["gateway"].bus
    ckpt_dir = tmp_path / "executor" / cluster / "checkpoints" / "counter"
    record_dir = tmp_path / "records"
    try:
        async with client(stack, "tok-alice") as alice, client(stack, "tok-bob") as bob:
            r = await alice.post("/v1/workloads", json={
                "id": "protected", "project": "alpha/train", "gpu_type": "H100", "gpus": GPUS, "work_s": 600,
                "min_runtime_s": 600})
            assert r.status_code == 202, r.text
            body = {"id": "counter", "project": "alpha/train", "gpu_type": "H100", "gpus": GPUS, "work_s": WORK_S,
                    "min_runtime_s": 2, "resumable": True, "checkpoint_interval_s": EVERY_S,
                    "command": [sys.executable, str(COUNTER), "--work-s", str(WORK_S),
                                "--checkpoint-every", str(EVERY_S), "--record-dir", str(record_dir)]}
            if notice_s is not None:
                body["checkpoint_on_notice_s"] = notice_s
            r = await alice.post("/v1/workloads", json=body)
            assert r.status_code == 202, r.text
            for k, steps in enumerate(preempt_at_steps, start=1):
                async def reached():
                    doc = records(record_dir).get(k)
                    assert not doc or ckpt_dir.is_dir()  # kept across attempts: each resumes from it
                    return doc if doc and doc["step"] - doc["start_step"] >= steps else None

                doc = await wait_for(reached, timeout_s=30, interval_s=0.01, what=f"attempt {k} at {steps} steps")
                # a quarter of a step after that step ended (the counter times steps from its start)
                at = doc["started_at"] + (doc["step"] - doc["start_step"]) + 0.25
                await asyncio.sleep(max(0.0, at - time.time()))
                r = await bob.post("/v1/workloads", json={
                    "id": f"beta-{k}", "project": "beta/debug", "gpu_type": "H100", "gpus": GPUS, "work_s": 2,
                    "min_runtime_s": 2})
                assert r.status_code == 202, r.text
                await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadStarted, f"beta-{k}"),
                                  timeout_s=20 + (notice_s or 0), what=f"beta-{k} to start")
            events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadCompleted, "counter"),
                                       timeout_s=60, what="the counter to complete")
            # ended for good: the executor removes its checkpoint directory
            await wait_for(lambda: asyncio.sleep(0, not ckpt_dir.exists()), timeout_s=10,
                           what="the completed counter's checkpoint directory removed")
            if then is not None:
                await then(stack)
    finally:
        await stack.stop()
    return events, records(record_dir), time.monotonic() - t0


async def _forged_checkpoints_are_refused(stack) -> None:
    """A checkpoint report of an attempt that is over, or of work under no notice, is
    dead-lettered with its reason and the log does not move."""
    from .test_poison import dead_letters

    cluster, executor = stack.settings.cluster, stack["executor"]
    before = len(await log_events(executor.bus, cluster))
    for wid, attempt in (("counter", 1), ("protected", 1)):
        await executor.bus.propose(ev.WorkloadCheckpointed(
            event_id=f"ckpt.{wid}.{attempt}.forged", at_ms=int(time.time() * 1000), cluster=cluster, workload_id=wid,
            attempt=attempt))

    async def refused():
        reasons = [m.headers.get("Timeshare-Reason", "") for m in await dead_letters(executor.bus, f"placement-{cluster}")]
        return reasons if len(reasons) >= 2 else None

    reasons = await wait_for(refused, timeout_s=10, what="the forged reports dead-lettered")
    assert any("stale report for counter" in r for r in reasons), reasons
    assert any("protected is not writing a checkpoint under notice" in r for r in reasons), reasons
    assert len(await log_events(executor.bus, cluster)) == before
    # and the log with its notices, checkpoints and awaiting starts is one a new leader accepts
    # record by record (placement's check), rebuilding the leader's state
    from services.placement.log import check_replayable
    from services.placement.view import digest
    from timeshare.state import SchedulerState

    config = stack["placement"].config
    state = SchedulerState(config.tree(), config.cluster(), config.policy, name=cluster)
    for e in await log_events(executor.bus, cluster):
        assert check_replayable(state, e) is None, (e, check_replayable(state, e))
        state.apply(e)
    assert digest(state) == digest(stack["placement"].state)


async def test_a_counter_preempted_twice_with_notice_completes_with_no_work_lost(make_settings, tmp_path):
    events, attempts, took_s = await _run(make_settings, tmp_path, notice_s=20, preempt_at_steps=(4, 4),
                                          then=_forged_checkpoints_are_refused)
    notices = of_type(events, ev.WorkloadPreemptionNotice, "counter")
    checkpoints = of_type(events, ev.WorkloadCheckpointed, "counter")
    preempted = of_type(events, ev.WorkloadPreempted, "counter")
    assert [n.attempt for n in notices] == [1, 2] and [c.attempt for c in checkpoints] == [1, 2]
    assert [n.reason.kind for n in notices] == ["fair_share", "fair_share"]
    assert [n.reason.by_workload_id for n in notices] == ["beta-1", "beta-2"]
    assert all(p.checkpointed is True and p.lost_gpu_s == 0 for p in preempted), preempted
    # each preemptor started when the counter reported its checkpoint, long before the deadline
    seq = {e.event_id: i for i, e in enumerate(events)}
    for k, (n, c, p) in enumerate(zip(notices, checkpoints, preempted), start=1):
        started = of_type(events, ev.WorkloadStarted, f"beta-{k}")[0]
        assert seq[n.event_id] < seq[c.event_id] < seq[p.event_id] < seq[started.event_id]
        assert n.deadline_ms == n.at_ms + 20_000
        assert started.at_ms < n.deadline_ms - 10_000, (started.at_ms - n.at_ms)
    # the counter's own account: three attempts, each resuming where the last one stopped
    assert list(attempts) == [1, 2, 3], attempts
    assert [a["state"] for a in attempts.values()] == ["checkpointed", "checkpointed", "done"]
    for k in (1, 2):
        assert attempts[k + 1]["start_step"] == attempts[k]["step"]
    worked = sum(a["step"] - a["start_step"] for a in attempts.values())
    assert worked == WORK_S, attempts  # 0 seconds of lost work
    assert of_type(events, ev.WorkloadCompleted, "counter")[0].attempt == 3
    assert took_s < 90
    print(f"with notice: attempts {[(a['start_step'], a['step']) for a in attempts.values()]}, worked {worked} "
          f"of {WORK_S} steps; handed over {[c.at_ms - n.at_ms for n, c in zip(notices, checkpoints)]} ms after "
          f"the notice; checkpoint_gpu_s {[p.checkpoint_gpu_s for p in preempted]}; {took_s:.1f} s")


async def test_without_a_notice_the_counter_loses_what_its_periodic_checkpoint_did_not_cover(
        make_settings, tmp_path):
    events, attempts, _ = await _run(make_settings, tmp_path, notice_s=None, preempt_at_steps=(8, 7))
    assert not of_type(events, ev.WorkloadPreemptionNotice) and not of_type(events, ev.WorkloadCheckpointed)
    # no notice declared: its submission and preemptions encode as before notices existed
    for e in of_type(events, ev.WorkloadSubmitted, "counter") + of_type(events, ev.WorkloadPreempted, "counter"):
        raw = msgspec.json.encode(e)
        assert b"notice" not in raw and b"checkpoint_gb" not in raw and b"checkpointed" not in raw, raw
    preempted = of_type(events, ev.WorkloadPreempted, "counter")
    assert len(preempted) == 2 and all(p.checkpointed is msgspec.UNSET for p in preempted)
    assert list(attempts) == [1, 2, 3] and [a["state"] for a in attempts.values()][-1] == "done"
    # each attempt resumed from the last periodic checkpoint: 8 -> 5, then 5 + 7 = 12 -> 10
    assert [a["start_step"] for a in attempts.values()] == [0, 5, 10]
    lost_steps = [attempts[k]["step"] - attempts[k + 1]["start_step"] for k in (1, 2)]
    assert lost_steps == [3, 2]
    # the log says the same: lost GPU-seconds = lost steps x GPUs, progress kept = the checkpoint
    assert [p.lost_gpu_s for p in preempted] == [s * GPUS for s in lost_steps]
    assert [p.progress_s for p in preempted] == [5, 10]
    worked = sum(a["step"] - a["start_step"] for a in attempts.values())
    assert worked - WORK_S == sum(lost_steps) > 0
    print(f"without notice: attempts {[(a['start_step'], a['step']) for a in attempts.values()]}, worked {worked} "
          f"of {WORK_S} steps; lost_gpu_s {[p.lost_gpu_s for p in preempted]}")


async def test_the_simulated_executor_checkpoints_in_its_declared_notice_time(make_settings):
    """The devstack's executor: a noticed workload writes its checkpoint after its declared
    ``checkpoint_on_notice_s`` x ``time_scale`` (here 4 s x 0.5), and its preemptor starts then."""
    stack = await Stack(make_settings(time_scale=0.5, otel="memory")).start()
    try:
        cluster, bus = stack.settings.cluster, stack["gateway"].bus
        async with client(stack, "tok-alice") as alice, client(stack, "tok-bob") as bob:
            for wid, notice in (("noticed", 4), ("protected", None)):
                body = {"id": wid, "project": "alpha/train", "gpu_type": "H100", "gpus": GPUS, "work_s": 600,
                        "min_runtime_s": 1 if notice else 600, "resumable": True, "checkpoint_interval_s": 60}
                if notice:
                    body["checkpoint_on_notice_s"] = notice
                assert (await alice.post("/v1/workloads", json=body)).status_code == 202
            await wait_events(bus, cluster, lambda es: len(of_type(es, ev.WorkloadStarted)) == 2)
            await asyncio.sleep(1.2)  # past the noticed one's minimum runtime
            r = await bob.post("/v1/workloads", json={"id": "newcomer", "project": "beta/debug", "gpu_type": "H100",
                                                       "gpus": GPUS, "work_s": 60, "min_runtime_s": 60})
            assert r.status_code == 202, r.text
            events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadStarted, "newcomer"),
                                       timeout_s=15, what="the newcomer to start")
        async with client(stack, "tok-admin") as admin:
            metrics = (await admin.get("/v1/metrics")).json()["metrics"]
    finally:
        await stack.stop()
    (notice,) = of_type(events, ev.WorkloadPreemptionNotice, "noticed")
    (checkpoint,) = of_type(events, ev.WorkloadCheckpointed, "noticed")
    (preempted,) = of_type(events, ev.WorkloadPreempted, "noticed")
    # placement's metrics count the notice, the preemption that followed it, and its checkpoint time

    def points(name: str) -> list[dict]:
        return [p for p in metrics[name]["points"] if p["attributes"].get("cluster") == cluster]

    assert [(p["attributes"]["reason"], p["value"]) for p in points("timeshare.notices")] == [("fair_share", 1)]
    assert [(p["attributes"]["notice"], p["value"]) for p in points("timeshare.preemptions")] == [("checkpointed", 1)]
    assert [p["value"] for p in points("timeshare.checkpoint.gpu_time")] == [preempted.checkpoint_gpu_s] \
        and preempted.checkpoint_gpu_s >= GPUS * 2
    assert notice.deadline_ms == notice.at_ms + 4000
    assert 1800 <= checkpoint.at_ms - notice.at_ms <= 3000, checkpoint.at_ms - notice.at_ms
    assert preempted.checkpointed is True and preempted.lost_gpu_s == 0
    assert of_type(events, ev.WorkloadStarted, "newcomer")[0].at_ms < notice.deadline_ms


async def test_a_process_that_ignores_its_notice_is_killed_at_the_deadline_and_placement_wakes_for_it(
        make_settings, tmp_path):
    """SIGTERM at the notice, ignored; SIGKILL at the deadline; placement runs a pass at that
    deadline by itself (its pass interval here is 5 s) and preempts it without a checkpoint."""
    from .test_executor_health import alive, command

    stack = await Stack(make_settings(executor="process", executor_data_dir=str(tmp_path / "executor"),
                                      kill_grace_s=30.0)).start()
    try:
        cluster, bus = stack.settings.cluster, stack["gateway"].bus
        assert stack.settings.pass_interval_s >= 5
        async with client(stack, "tok-alice") as alice, client(stack, "tok-bob") as bob:
            for wid, notice in (("stubborn", 2), ("protected", None)):
                body = {"id": wid, "project": "alpha/train", "gpu_type": "H100", "gpus": GPUS, "work_s": 600,
                        "min_runtime_s": 1 if notice else 600, "resumable": True, "checkpoint_interval_s": 60}
                if notice:  # the other one runs without a process: nothing to stop at the end
                    body.update(checkpoint_on_notice_s=notice, command=command(tmp_path, "stubborn"))
                assert (await alice.post("/v1/workloads", json=body)).status_code == 202
            env_file = tmp_path / "stubborn.0.env"
            await wait_for(lambda: asyncio.sleep(0, env_file.exists()), timeout_s=15, what="the process to run")
            env = json.loads(env_file.read_text())
            await asyncio.sleep(1.2)  # past its minimum runtime
            r = await bob.post("/v1/workloads", json={"id": "newcomer", "project": "beta/debug", "gpu_type": "H100",
                                                       "gpus": GPUS, "work_s": 60, "min_runtime_s": 60})
            assert r.status_code == 202, r.text
            events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadStarted, "newcomer"),
                                       timeout_s=20, what="the newcomer to start")
        (notice,) = of_type(events, ev.WorkloadPreemptionNotice, "stubborn")
        (preempted,) = of_type(events, ev.WorkloadPreempted, "stubborn")
        assert (tmp_path / "stubborn.0.term").exists()  # SIGTERM came with the notice
        termed_ms = float((tmp_path / "stubborn.0.term").read_text()) * 1000
        assert termed_ms - notice.at_ms < 1000
        assert not alive(env["pid"])  # killed (a 30-s stop grace would still be running)
        assert not of_type(events, ev.WorkloadCheckpointed)
        assert preempted.checkpointed is False and preempted.progress_s == 0 and preempted.lost_gpu_s > 0
        # the pass at the deadline, not the next periodic one
        assert notice.deadline_ms <= preempted.at_ms < notice.deadline_ms + 1000, preempted.at_ms - notice.deadline_ms
    finally:
        await stack.stop()


async def test_an_executor_restarted_from_the_snapshot_still_writes_the_checkpoint_of_work_under_notice(
        make_settings):
    """Placement's snapshot holds the notice; an executor started from it (the log before it no
    longer read) resumes the checkpoint being written and reports it before the deadline."""
    stack = await Stack(make_settings(time_scale=0.5, snapshot_every=1, purge_log="off")).start()
    try:
        cluster, bus = stack.settings.cluster, stack["gateway"].bus
        async with client(stack, "tok-alice") as alice, client(stack, "tok-bob") as bob:
            for wid, notice in (("noticed", 6), ("protected", None)):
                body = {"id": wid, "project": "alpha/train", "gpu_type": "H100", "gpus": GPUS, "work_s": 600,
                        "min_runtime_s": 1 if notice else 600, "resumable": True, "checkpoint_interval_s": 60}
                if notice:
                    body["checkpoint_on_notice_s"] = notice
                assert (await alice.post("/v1/workloads", json=body)).status_code == 202
            await wait_events(bus, cluster, lambda es: len(of_type(es, ev.WorkloadStarted)) == 2)
            await asyncio.sleep(1.2)
            await stack.stop_service("executor")
            r = await bob.post("/v1/workloads", json={"id": "newcomer", "project": "beta/debug", "gpu_type": "H100",
                                                       "gpus": GPUS, "work_s": 60, "min_runtime_s": 60})
            assert r.status_code == 202, r.text
            events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadPreemptionNotice), timeout_s=10,
                                       what="the notice")
            placement = stack["placement"]
            holding = placement.last_log_seq  # the log holds the notice up to here
            await wait_for(lambda: asyncio.sleep(0, placement.snapshot_seq >= holding), timeout_s=10,
                           what="a snapshot holding the notice")
            executor = await stack.start_service("executor")
            assert executor.running["noticed"].under_notice  # from the snapshot, not the log
            events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadStarted, "newcomer"),
                                       timeout_s=15, what="the newcomer to start")
    finally:
        await stack.stop()
    (notice,) = of_type(events, ev.WorkloadPreemptionNotice, "noticed")
    (checkpoint,) = of_type(events, ev.WorkloadCheckpointed, "noticed")
    (preempted,) = of_type(events, ev.WorkloadPreempted, "noticed")
    assert checkpoint.at_ms - notice.at_ms == 3000  # 6 s x 0.5, as the storage model started it
    assert preempted.checkpointed is True and preempted.at_ms < notice.deadline_ms


async def test_a_drain_gives_the_counter_its_notice_and_it_resumes_elsewhere_with_nothing_lost(
        make_settings, tmp_path):
    """A node reported unhealthy drains as its work reaches its minimum runtime; the counter on it
    gets its notice (reason ``drain``), checkpoints, and resumes on the other node."""
    settings = make_settings(executor="process", executor_data_dir=str(tmp_path / "executor"), kill_grace_s=2.0)
    stack = await Stack(settings).start()
    cluster, bus = settings.cluster, stack["gateway"].bus
    record_dir = tmp_path / "records"
    work_s = 8
    try:
        async with client(stack, "tok-alice") as alice, client(stack, "tok-health") as agent:
            r = await alice.post("/v1/workloads", json={
                "id": "counter", "project": "alpha/train", "gpu_type": "H100", "gpus": GPUS, "work_s": work_s,
                "min_runtime_s": 2, "resumable": True, "checkpoint_interval_s": EVERY_S, "checkpoint_on_notice_s": 20,
                "command": [sys.executable, str(COUNTER), "--work-s", str(work_s), "--checkpoint-every", str(EVERY_S),
                            "--record-dir", str(record_dir)]})
            assert r.status_code == 202, r.text
            events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadStarted, "counter"))
            node = of_type(events, ev.WorkloadStarted, "counter")[0].placement[0].node
            await wait_for(lambda: asyncio.sleep(0, (records(record_dir).get(1) or {}).get("step", 0) >= 3),
                           timeout_s=15, interval_s=0.02, what="the counter past its minimum runtime")
            r = await agent.post(f"/v1/nodes/{node}/health", json={"ok": False, "reason": "XID 79"})
            assert r.status_code in (200, 202), r.text
            events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadCompleted, "counter"),
                                       timeout_s=40, what="the counter to complete")
    finally:
        await stack.stop()
    (notice,) = of_type(events, ev.WorkloadPreemptionNotice, "counter")
    (preempted,) = of_type(events, ev.WorkloadPreempted, "counter")
    assert notice.reason.kind == "drain" and notice.reason.by_workload_id is None
    assert preempted.checkpointed is True and preempted.lost_gpu_s == 0
    assert of_type(events, ev.NodeDrained)[0].node == node
    second = of_type(events, ev.WorkloadStarted, "counter")[1]
    assert second.placement[0].node != node
    attempts = records(record_dir)
    assert [a["state"] for a in attempts.values()] == ["checkpointed", "done"]
    assert sum(a["step"] - a["start_step"] for a in attempts.values()) == work_s


async def test_a_counter_under_notice_when_the_executor_restarts_is_started_to_checkpoint_and_hands_over_at_once(
        make_settings, tmp_path):
    """The executor stops while the counter runs (its stop sends SIGTERM: the counter, which
    declared a notice, saves its step and exits 0); the notice comes while it is down. The
    restarted executor starts the counter again under notice (``TIMESHARE_UNDER_NOTICE=1``): it
    resumes from its directory, saves that step and exits 0, the executor reports the checkpoint
    and beta starts seconds later, not at the deadline 40 s on; the next attempt resumes from
    the step the first process saved, nothing lost."""
    notice_s = 40
    settings = make_settings(executor="process", executor_data_dir=str(tmp_path / "executor"), kill_grace_s=5.0)
    stack = await Stack(settings).start()
    cluster, bus = settings.cluster, stack["gateway"].bus
    ckpt_dir = tmp_path / "executor" / cluster / "checkpoints" / "counter"
    record_dir = tmp_path / "records"
    try:
        async with client(stack, "tok-alice") as alice, client(stack, "tok-bob") as bob:
            r = await alice.post("/v1/workloads", json={
                "id": "protected", "project": "alpha/train", "gpu_type": "H100", "gpus": GPUS, "work_s": 600,
                "min_runtime_s": 600})
            assert r.status_code == 202, r.text
            r = await alice.post("/v1/workloads", json={
                "id": "counter", "project": "alpha/train", "gpu_type": "H100", "gpus": GPUS, "work_s": 40,
                "min_runtime_s": 1, "resumable": True, "checkpoint_interval_s": EVERY_S,
                "checkpoint_on_notice_s": notice_s,
                "command": [sys.executable, str(COUNTER), "--work-s", "40", "--checkpoint-every", str(EVERY_S),
                            "--record-dir", str(record_dir)]})
            assert r.status_code == 202, r.text
            await wait_for(lambda: asyncio.sleep(0, (records(record_dir).get(1) or {}).get("step", 0) >= 3),
                           timeout_s=20, interval_s=0.02, what="the counter at 3 steps")
            await stack.stop_service("executor")
            first = records(record_dir)[1]
            saved = json.loads((ckpt_dir / "counter.json").read_text())["step"]
            assert first["state"] == "checkpointed" and saved == first["step"] >= 3  # not a periodic one

            r = await bob.post("/v1/workloads", json={"id": "beta-1", "project": "beta/debug", "gpu_type": "H100",
                                                       "gpus": GPUS, "work_s": 2, "min_runtime_s": 2})
            assert r.status_code == 202, r.text
            events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadPreemptionNotice, "counter"),
                                       timeout_s=15, what="the notice while the executor is down")
            await stack.start_service("executor")
            events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadStarted, "beta-1"),
                                       timeout_s=notice_s + 10, what="beta-1 to start")
            (notice,) = of_type(events, ev.WorkloadPreemptionNotice, "counter")
            (checkpoint,) = of_type(events, ev.WorkloadCheckpointed, "counter")
            (preempted,) = of_type(events, ev.WorkloadPreempted, "counter")
            started = of_type(events, ev.WorkloadStarted, "beta-1")[0]
            assert checkpoint.attempt == 1 and preempted.checkpointed is True and preempted.lost_gpu_s == 0
            assert started.at_ms < notice.deadline_ms - notice_s * 1000 // 2, started.at_ms - notice.at_ms
            # the process started under notice resumed from the saved step and wrote it again
            again = records(record_dir)[1]
            assert again["pid"] != first["pid"] and again["state"] == "checkpointed"
            assert again["start_step"] == again["step"] == saved
            # the next attempt resumes from it: nothing of the first process's work is lost
            second = await wait_for(lambda: asyncio.sleep(0, records(record_dir).get(2)), timeout_s=30,
                                    what="the counter's second attempt")
            assert second["start_step"] == saved
    finally:
        await stack.stop()
