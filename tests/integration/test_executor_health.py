"""The process executor runs real local processes; health notices nodes whose heartbeats stop."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import pytest

from timeshare import events as ev

from .helpers import client, of_type, wait_events, wait_for

pytestmark = pytest.mark.integration

# One workload part: writes its environment to <dir>/<workload>.<rank>.env, then by mode:
# ok (exit 0), fail (exit 3), stubborn (records SIGTERM in <...>.term, ignores it, sleeps).
PART = r"""
import json, os, signal, sys, time
out, mode = sys.argv[1], sys.argv[2]
name = os.path.join(out, os.environ["TIMESHARE_WORKLOAD_ID"] + "." + os.environ["TIMESHARE_RANK"])
keys = ("CUDA_VISIBLE_DEVICES", "TIMESHARE_RANK", "TIMESHARE_WORLD_SIZE", "TIMESHARE_NODE",
        "TIMESHARE_WORKLOAD_ID", "TIMESHARE_ATTEMPT")
doc = {k: os.environ.get(k) for k in keys}
doc["pid"] = os.getpid()
if mode == "stubborn":
    def on_term(*_):
        with open(name + ".term", "w") as fh:
            fh.write(repr(time.time()))
    signal.signal(signal.SIGTERM, on_term)
with open(name + ".env.tmp", "w") as fh:
    json.dump(doc, fh)
os.replace(name + ".env.tmp", name + ".env")
if mode == "fail":
    sys.exit(3)
if mode == "stubborn":
    while True:
        time.sleep(0.05)
"""


def command(tmp_path, mode: str) -> list[str]:
    return [sys.executable, "-c", PART, str(tmp_path), mode]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_process_executor_sets_gpu_env_and_reports_exit_codes(make_settings, tmp_path):
    from services.devstack.stack import Stack

    stack = await Stack(make_settings(executor="process", kill_grace_s=1.0)).start()
    try:
        cluster, bus = stack.settings.cluster, stack["gateway"].bus
        async with client(stack, "tok-alice") as alice:
            for wid, gpus, mode in (("gang", 8, "ok"), ("broken", 2, "fail")):
                r = await alice.post("/v1/workloads", json={"id": wid, "project": "alpha/train", "gpu_type": "H100",
                                                            "gpus": gpus, "work_s": 60, "command": command(tmp_path, mode)})
                assert r.status_code == 202, r.text
            events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadCompleted, "gang")
                                       and of_type(es, ev.WorkloadFailed, "broken"), timeout_s=20,
                                       what="the gang to complete and the broken one to fail")
        # the gang of 8 ran as two processes, one per node, each with its node's GPU ids
        started = of_type(events, ev.WorkloadStarted, "gang")[0]
        assert len(started.placement) == 2
        for rank, part in enumerate(started.placement):
            env = json.loads((tmp_path / f"gang.{rank}.env").read_text())
            assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, part.gpu_ids)) == "0,1,2,3"
            assert env["TIMESHARE_RANK"] == str(rank) and env["TIMESHARE_WORLD_SIZE"] == "2"
            assert env["TIMESHARE_NODE"] == part.node and env["TIMESHARE_ATTEMPT"] == "1"
        done = of_type(events, ev.WorkloadCompleted, "gang")[0]
        assert done.exit_code == 0 and done.attempt == 1
        b_started = of_type(events, ev.WorkloadStarted, "broken")[0]
        env = json.loads((tmp_path / "broken.0.env").read_text())
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, b_started.placement[0].gpu_ids))
        assert env["TIMESHARE_WORLD_SIZE"] == "1"
        failed = of_type(events, ev.WorkloadFailed, "broken")[0]
        assert failed.exit_code == 3 and failed.reason == "exit code 3" and failed.attempt == 1
    finally:
        await stack.stop()


async def test_preempted_process_gets_sigterm_then_sigkill_after_the_grace(make_settings, tmp_path):
    from services.devstack.stack import Stack

    grace = 1.0
    stack = await Stack(make_settings(executor="process", kill_grace_s=grace)).start()
    try:
        cluster, bus = stack.settings.cluster, stack["gateway"].bus
        async with client(stack, "tok-alice") as alice, client(stack, "tok-bob") as bob:
            # alpha fills both nodes with unallocated work (min runtime 0) that ignores SIGTERM
            for wid in ("stubborn-0", "stubborn-1"):
                r = await alice.post("/v1/workloads", json={"id": wid, "project": "alpha/train", "gpu_type": "H100",
                                                            "gpus": 4, "work_s": 600,
                                                            "command": command(tmp_path, "stubborn")})
                assert r.status_code == 202, r.text
            pids = {}
            for wid in ("stubborn-0", "stubborn-1"):
                path = tmp_path / f"{wid}.0.env"
                await wait_for(lambda: asyncio.sleep(0, path.exists()), timeout_s=15, what=f"{wid} to run")
                pids[wid] = json.loads(path.read_text())["pid"]
            # beta's allocated request takes the GPUs of unallocated work at once
            r = await bob.post("/v1/workloads", json={"id": "newcomer", "project": "beta/debug", "gpu_type": "H100",
                                                      "gpus": 4, "work_s": 600, "min_runtime_s": 60,
                                                      "command": command(tmp_path, "ok")})
            assert r.status_code == 202
            events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadPreempted), timeout_s=10,
                                       what="a preemption")
        victim = of_type(events, ev.WorkloadPreempted)[0]
        assert victim.reason.kind == "unallocated" and victim.reason.by_workload_id == "newcomer"
        survivor = ({"stubborn-0", "stubborn-1"} - {victim.workload_id}).pop()
        term = tmp_path / f"{victim.workload_id}.0.term"
        await wait_for(lambda: asyncio.sleep(0, term.exists()), timeout_s=5, what="SIGTERM to reach the victim")
        termed_at = float(term.read_text())
        await wait_for(lambda: asyncio.sleep(0, not alive(pids[victim.workload_id])), timeout_s=grace + 5,
                       interval_s=0.02, what="SIGKILL after the grace period")
        killed_after = time.time() - termed_at
        assert grace * 0.8 <= killed_after <= grace + 3, killed_after  # it ignored SIGTERM: killed at the grace
        assert alive(pids[survivor]) and not (tmp_path / f"{survivor}.0.term").exists()
        await wait_for(lambda: asyncio.sleep(0, (tmp_path / "newcomer.0.env").exists()), what="the newcomer to run")
        # the newcomer got the victim's GPUs, but its process started only once the victim's had
        # exited: two processes never share a GPU during the grace period
        assert (tmp_path / "newcomer.0.env").stat().st_mtime >= termed_at + grace * 0.8
        # the killed process is not reported: its attempt ended with the preemption
        events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadCompleted, "newcomer"),
                                   what="the newcomer to complete")
        assert not of_type(events, ev.WorkloadFailed, victim.workload_id)
        assert not of_type(events, ev.WorkloadCompleted, victim.workload_id)
    finally:
        await stack.stop()
    assert not alive(pids[survivor])  # stopping the executor stops its processes too


async def test_node_whose_heartbeats_stop_is_marked_unhealthy_and_drained(make_settings):
    from services.devstack.stack import Stack

    stack = await Stack(make_settings(heartbeat_timeout_s=0.6)).start()
    beating = asyncio.Event()
    try:
        cluster, bus = stack.settings.cluster, stack["gateway"].bus
        async with client(stack, "tok-health") as agent, client(stack, "tok-admin") as admin, \
                client(stack, "tok-carol") as carol:
            r = await carol.post("/v1/nodes/H100-000/heartbeat")
            assert r.status_code == 403  # only node agents (and admins) vouch for nodes
            assert (await agent.post("/v1/nodes/H100-009/heartbeat")).status_code == 404

            async def keep_beating():
                while not beating.is_set():
                    await agent.post("/v1/nodes/H100-000/heartbeat")
                    await asyncio.sleep(0.1)

            task = asyncio.create_task(keep_beating())
            assert (await agent.post("/v1/nodes/H100-001/heartbeat")).status_code == 202  # once, then silence
            t0 = time.monotonic()
            events = await wait_events(bus, cluster, lambda es: [e for e in es if isinstance(e, ev.NodeDrained)],
                                       timeout_s=10, what="the silent node to be marked unhealthy and drained")
            waited = time.monotonic() - t0
            unhealthy = [e for e in events if isinstance(e, ev.NodeUnhealthy)]
            assert [e.node for e in unhealthy] == ["H100-001"] and "no heartbeat" in unhealthy[0].reason
            assert waited >= 0.6
            nodes = {n["name"]: n for n in (await admin.get("/v1/nodes")).json()["nodes"]}
            assert nodes["H100-001"]["state"] == "drained" and nodes["H100-000"]["state"] == "healthy"
            assert nodes["H100-000"]["last_heartbeat_ms"] is not None
            # no repair command: an admin declares it repaired; it serves again
            health = stack["health"]
            flagged: list[str] = []
            report_unhealthy = health.report_unhealthy

            async def spied(node, *args):
                flagged.append(node)
                return await report_unhealthy(node, *args)

            rounds: list[int] = []

            class Watched(dict):  # the watch reads the heartbeats once per round (health/service.py)
                def items(self):
                    rounds.append(1)
                    return super().items()

            health.report_unhealthy = spied
            health.last_heartbeat = Watched(health.last_heartbeat)
            assert (await admin.post("/v1/nodes/H100-001/repair")).status_code == 200
            await wait_events(bus, cluster, lambda es: of_type(es, ev.NodeRepaired), what="the repair")
            await wait_for(_async(lambda: health.nodes["H100-001"]["state"] == "healthy"), 10,
                           what="health to apply the repair")
            # a repaired node is not flagged again before it beats: the watch goes round for longer
            # than the heartbeat timeout (a round every timeout / 4) and flags nothing
            seen = len(rounds)
            await wait_for(_async(lambda: len(rounds) >= seen + 6), 10, what="the heartbeat watch to go round")
            assert flagged == []
            beating.set()
            await task
        events = await wait_events(bus, cluster, lambda es: of_type(es, ev.NodeRepaired))
        assert len([e for e in events if isinstance(e, ev.NodeUnhealthy)]) == 1
    finally:
        beating.set()
        await stack.stop()


def _async(predicate):
    async def check():
        return predicate()

    return check
