"""Placement forgets work that ended long ago (before each snapshot); the gateway's store stays the
record of every workload: it refuses a forgotten id (409), and answers status and explain."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from services.common.cluster_config import load_cluster
from services.devstack.stack import Stack
from services.placement import view
from timeshare import events as ev
from timeshare.workload import WorkloadSpec

from .helpers import all_completed, client, log_events, of_type, replay_state, wait_for

pytestmark = pytest.mark.integration


def body(i: int) -> dict:
    return {"project": "alpha/train" if i % 2 else "beta/debug", "gpu_type": "H100", "gpus": 1,
            "work_s": 1, "min_runtime_s": 0, "resumable": True, "id": f"f{i:02d}"}


async def test_a_forgotten_id_is_refused_by_the_gateway_and_a_replay_takes_one_reused_behind_its_back(make_settings):
    # forget what ended more than 0.5 s of event time ago, at each snapshot (every 4 events);
    # the log kept whole so that a full replay can be compared
    settings = make_settings(snapshot_every=4, forget_ended_after_s=0.5, purge_log="off")
    config = load_cluster(settings.cluster_file, settings.cluster)
    stack = await Stack(settings).start()
    try:
        bus = stack["gateway"].bus
        async with client(stack) as http:
            first = {**body(0), "id": "again"}
            assert (await http.post("/v1/workloads", json=first)).status_code == 202
            await wait_for(lambda: all_completed(http, ["again"]), 30, what="'again' completed")
            placement = stack["placement"]
            submitted = []

            async def forgotten() -> bool:
                if "again" not in placement.state.workloads:
                    return True
                # more events move the log's time on and bring the next snapshot
                i = len(submitted) + 1
                assert (await http.post("/v1/workloads", json=body(i))).status_code == 202
                submitted.append(f"f{i:02d}")
                await asyncio.sleep(0.3)
                return False

            await wait_for(forgotten, 30, interval_s=0.1, what="placement to forget 'again'")
            assert placement.stats.get("forgotten", 0) >= 1

            # the id is not free: the gateway's store, the durable record of every workload, refuses it
            r = await http.post("/v1/workloads", json=first)
            assert r.status_code == 409 and "already exists" in r.text, r.text
            # status and explain are answered from that store
            r = await http.get("/v1/workloads/again")
            assert r.status_code == 200 and r.json()["state"] == "completed"
            r = await http.get("/v1/workloads/again/explain")
            assert r.status_code == 200, r.text
            assert r.json()["state"] == "completed" and r.json()["summary"] == "Completed."
            await wait_for(lambda: all_completed(http, submitted), 30, what="the rest completed")

            # a new leader starts from the snapshot, which no longer holds it; a full replay
            # keeps it (ended): both hold the same live state
            await stack.stop_service("placement")
            second = await stack.start_service("placement")
            assert second.loaded_snapshot_seq > 0 and "again" not in second.state.workloads
            full = await replay_state(bus, config, settings.cluster)
            assert full.workloads["again"].state == "completed"
            assert view.digest(second.state) == view.digest(full)

            # behind the gateway's back (a proposal with another event id, so JetStream's dedup
            # does not drop it) placement takes the forgotten id as new work: it no longer knows it
            spec = WorkloadSpec(id="again", submit_s=0, project="beta/debug", gpu_type="H100", gpus=1, work_s=1,
                                resumable=True, user="carol")
            await bus.propose(ev.WorkloadSubmitted(event_id="sub.again.reused", at_ms=0, cluster=settings.cluster,
                                                   workload=spec))
            await wait_for(lambda: _twice(bus, settings.cluster), 10, what="the reused id in the log")
            # a leader that replays the whole log (snapshots off) holds the first 'again' as
            # ended when the second comes: it takes it (the log is what was applied), no untrusted record
            await stack.stop_service("placement")
            stack.settings = replace(stack.settings, snapshot_every=0)
            third = await stack.start_service("placement")
            assert third.untrusted is None and third.loaded_snapshot_seq == 0
            assert third.state.workloads["again"].ended_s is None
            assert "sub.again.reused" in {e.event_id for e in await log_events(bus, settings.cluster)}
    finally:
        await stack.stop()


async def _twice(bus, cluster: str) -> bool:
    events = await log_events(bus, cluster)
    return len([e for e in of_type(events, ev.WorkloadSubmitted) if e.workload.id == "again"]) == 2
