"""Crashes and repeats change nothing: kill -9 and restart, duplicates, redeliveries, dead letters."""

from __future__ import annotations

import os
import signal
import tempfile

import msgspec
import pytest

from services.common import subjects
from services.common.cluster_config import load_cluster
from services.devstack.stack import Stack
from services.placement import view
from timeshare import events as ev

from .helpers import ask, client, log_events, of_type, replay_state, spawn_service, wait_events, wait_for

pytestmark = pytest.mark.integration


def body(i: int, project: str) -> dict:
    return {"project": project, "gpu_type": "H100", "gpus": 1 + i % 2, "work_s": 1 + i % 3,
            "min_runtime_s": i % 2, "resumable": True, "id": f"w{i:03d}"}


async def placement_digest(bus, cluster):
    try:
        return await ask(bus, subjects.query_subject(cluster, "digest"), timeout=1.0)
    except Exception:
        return None


async def test_kill_9_placement_mid_flow_standby_takes_over_with_the_same_state(make_settings):
    settings = make_settings()
    config = load_cluster(settings.cluster_file, settings.cluster)
    logs = tempfile.mkdtemp(prefix="timeshare-logs-")
    stack = await Stack(settings, services=("executor", "budget", "ledger", "health", "gateway")).start()
    procs = []
    try:
        bus, cluster = stack["gateway"].bus, settings.cluster
        leader = spawn_service("placement", settings, f"{logs}/placement-a.log")
        procs.append(leader)
        first = await wait_for(lambda: placement_digest(bus, cluster), 20, what="placement to lead")
        standby = spawn_service("placement", settings, f"{logs}/placement-b.log")
        procs.append(standby)
        async with client(stack, "tok-alice") as http:
            for i in range(30):
                r = await http.post("/v1/workloads", json=body(i, "alpha/train" if i % 3 else "beta/debug"))
                assert r.status_code == 202, r.text
                if i == 14:
                    await wait_events(bus, cluster, lambda es: len(of_type(es, ev.WorkloadStarted)) >= 4)
                    os.kill(leader.pid, signal.SIGKILL)  # mid-flow, lease still held
                    leader.wait()
            # the standby takes over once the lease lapses, replays the log and goes on
            events = await wait_events(bus, cluster, lambda es: len(of_type(es, ev.WorkloadCompleted)) == 30,
                                       timeout_s=40, what="every workload to complete")
        after = await wait_for(lambda: placement_digest(bus, cluster), 5, what="the new leader")
        assert after["instance"] != first["instance"]
        submitted = [e.workload.id for e in of_type(events, ev.WorkloadSubmitted)]
        assert sorted(submitted) == [f"w{i:03d}" for i in range(30)]  # nothing lost, nothing twice
        starts = [(e.workload_id, e.attempt) for e in of_type(events, ev.WorkloadStarted)]
        assert len(starts) == len(set(starts))
        replayed = await replay_state(bus, config, cluster)
        assert after["digest"] == view.digest(replayed)
        # and a restart of the killed one comes back as a standby with the same state
        os.kill(standby.pid, signal.SIGKILL)
        standby.wait()
        again = spawn_service("placement", settings, f"{logs}/placement-c.log")
        procs.append(again)
        third = await wait_for(lambda: placement_digest(bus, cluster), 20, what="the restarted placement")
        assert third["digest"] == view.digest(replayed)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(10)
        await stack.stop()


async def test_kill_9_ledger_and_budget_lose_nothing(make_settings):
    settings = make_settings()
    logs = tempfile.mkdtemp(prefix="timeshare-logs-")
    stack = await Stack(settings, services=("placement", "executor", "health", "gateway")).start()
    procs = {n: spawn_service(n, settings, f"{logs}/{n}.log") for n in ("ledger", "budget")}
    try:
        bus, cluster = stack["gateway"].bus, settings.cluster

        async def usage():
            try:
                return await ask(bus, subjects.query_subject(cluster, "ledger.usage"), timeout=1.0)
            except Exception:
                return None

        async def budget_up():
            try:
                return await ask(bus, subjects.query_subject(cluster, "budget.history"), timeout=1.0)
            except Exception:
                return None

        await wait_for(usage, 20, what="the ledger")
        await wait_for(budget_up, 20, what="budget")
        async with client(stack, "tok-admin") as http:
            r = await http.put("/v1/allocations", json={"shares": {"beta": 2}, "reason": "before the crash"})
            assert r.status_code == 200, r.text
            for i in range(10):
                await http.post("/v1/workloads", json={**body(i, "alpha/train"), "work_s": 600})
            for name, p in procs.items():
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
            for i in range(10, 12):
                await http.post("/v1/workloads", json={**body(i, "beta/debug"), "work_s": 600})
            procs = {n: spawn_service(n, settings, f"{logs}/{n}-2.log") for n in ("ledger", "budget")}
            await wait_for(usage, 20, what="the ledger to come back")

            history = await wait_for(budget_up, 20, what="budget to come back")
            assert [h["reason"] for h in history["changes"]] == ["before the crash"]
            r = await http.put("/v1/allocations", json={"shares": {"beta": 3}, "reason": "after the crash"})
            assert r.status_code == 200, r.text
            await wait_events(bus, cluster, lambda es: len(of_type(es, ev.WorkloadStarted)) >= 4)

        async def ledger_agrees():
            # both read live: preemptions may still move GPUs between the teams
            tree = (await ask(bus, subjects.query_subject(cluster, "tree")))["nodes"]
            u = await usage()
            running = {p: u["usage"][p]["H100"]["running_gpus"] for p in ("alpha/train", "beta/debug")}
            want = {p: tree[p]["usage"]["H100"]["running_gpus"] for p in ("alpha/train", "beta/debug")}
            return running == want and sum(running.values()) > 0

        await wait_for(ledger_agrees, 10, what="the ledger's running GPUs to match placement's")
        history = (await ask(bus, subjects.query_subject(cluster, "budget.history")))["changes"]
        assert [h["reason"] for h in history] == ["before the crash", "after the crash"]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(10)
        await stack.stop()


async def test_duplicate_submission_and_redelivered_events_change_nothing(stack):
    bus, cluster = stack["gateway"].bus, stack.settings.cluster
    async with client(stack, "tok-carol") as http:
        r = await http.post("/v1/workloads", json={**body(1, "alpha/train"), "work_s": 600})
        assert r.status_code == 202
    events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadStarted))
    submitted = of_type(events, ev.WorkloadSubmitted)[0]
    # the same event again, past JetStream's dedup (another Nats-Msg-Id): placement skips it
    await bus.js.publish(subjects.inbox_subject(cluster, "workload.submitted"), ev.encoder.encode(submitted),
                         headers={"Nats-Msg-Id": "a-different-id"})
    # a different event reusing the workload id is refused with a reason
    clash = msgspec.structs.replace(submitted, event_id="sub.other")
    await bus.js.publish(subjects.inbox_subject(cluster, "workload.submitted"), ev.encoder.encode(clash))
    # garbage is dead-lettered and placement goes on
    await bus.js.publish(subjects.inbox_subject(cluster, "workload.submitted"), b"{not json")
    async with client(stack, "tok-carol") as http:
        r = await http.post("/v1/workloads", json={**body(2, "alpha/train"), "work_s": 600})
        assert r.status_code == 202, r.text
    events = await wait_events(bus, cluster, lambda es: len(of_type(es, ev.WorkloadStarted)) == 2)
    assert len(of_type(events, ev.WorkloadSubmitted)) == 2
    from .test_poison import dead_letters

    dead = await dead_letters(bus, f"placement-{cluster}")  # read as the operator
    reasons = [m.headers["Timeshare-Reason"] for m in dead]
    assert any("already exists" in r for r in reasons) and any("undecodable" in r for r in reasons)
    # redeliver the whole log to the gateway's, budget's and ledger's projections: nothing changes
    msgs = []
    await bus.replay(subjects.LOG_STREAM, subjects.log_filter(cluster), msgs.append)
    gw = stack["gateway"]
    before = (await gw.store.get("workload", "w001"), await gw.store.journal("workload", "w001"))
    await gw.projector.handle(msgs)
    await stack["ledger"].projector.handle(msgs)
    await stack["budget"].projector.handle(msgs)
    assert (await gw.store.get("workload", "w001"), await gw.store.journal("workload", "w001")) == before
    ledger_events = await stack["ledger"].store.journal("events", cluster)
    assert len(ledger_events) == len([e for e in await log_events(bus, cluster)
                                      if not isinstance(e, ev.MinRuntimeReached)])


async def test_service_restarts_after_its_durable_was_moved_back(make_settings):
    """An in-memory store restarts behind its durable, which is recreated at a start sequence;
    the next start must keep that durable (JetStream refuses to change a deliver policy)."""
    from nats.js import api

    from services.common.bus import Bus

    settings = make_settings(database_url="memory")
    bus = await Bus.connect(settings, settings.cluster)
    try:
        await bus.ensure_infra()
        durable = f"health-{settings.cluster}"
        cfg = (await bus.js.consumer_info(subjects.LOG_STREAM, durable)).config
        await bus.js.delete_consumer(subjects.LOG_STREAM, durable)
        cfg.deliver_policy, cfg.opt_start_seq = api.DeliverPolicy.BY_START_SEQUENCE, 1
        await bus.js.add_consumer(subjects.LOG_STREAM, cfg)  # what Bus._align_durable does
        await bus.ensure_infra()  # used to fail: "deliver policy can not be updated"
        info = await bus.js.consumer_info(subjects.LOG_STREAM, durable)
        assert info.config.deliver_policy == api.DeliverPolicy.BY_START_SEQUENCE
        stack = await Stack(settings, services=("health",)).start()
        await stack.stop()
    finally:
        await bus.close()


async def test_a_new_leader_sees_again_what_a_killed_leader_fetched_but_never_acked(make_settings):
    # the inbox durable acks "all up to": without a rewind, the new leader's first ack would
    # cover the killed leader's unacked batch before ack_wait brought it back (a report lost,
    # its workload running forever in placement's view)
    from services.common.bus import Bus

    settings = make_settings()
    bus = await Bus.connect(settings, settings.cluster, name="test-rewind")
    try:
        await bus.ensure_infra()
        durable = f"placement-{settings.cluster}"
        subject = subjects.inbox_subject(settings.cluster, "workload.completed")
        for i in range(3):
            await bus.js.publish(subject, f"old-{i}".encode())
        killed = await bus.js.pull_subscribe_bind(durable, subjects.INBOX_STREAM)
        fetched = await killed.fetch(3, timeout=5)
        assert [m.data for m in fetched] == [b"old-0", b"old-1", b"old-2"]  # never acked: "killed"
        await killed.unsubscribe()
        await bus.js.publish(subject, b"new")

        await bus.rewind_to_ack_floor(subjects.INBOX_STREAM, durable)
        leader = await bus.js.pull_subscribe_bind(durable, subjects.INBOX_STREAM)
        got = await leader.fetch(10, timeout=2)  # well within ack_wait (5 s)
        assert [m.data for m in got] == [b"old-0", b"old-1", b"old-2", b"new"]
        for m in got:  # AckExplicit: each one, confirmed by the server
            await m.ack_sync()
        info = await bus.js.consumer_info(subjects.INBOX_STREAM, durable)
        assert info.num_ack_pending == 0 and info.num_pending == 0
        await leader.unsubscribe()
    finally:
        await bus.close()
