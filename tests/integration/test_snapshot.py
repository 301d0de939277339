"""Placement snapshots its state; a new leader loads the snapshot and replays only what follows."""

from __future__ import annotations

import pytest

from services.common.cluster_config import load_cluster
from services.devstack.stack import Stack
from services.placement import view

from .helpers import all_completed, client, log_events, replay_state, wait_for

pytestmark = pytest.mark.integration


def body(i: int) -> dict:
    return {"project": "alpha/train" if i % 2 else "beta/debug", "gpu_type": "H100", "gpus": 1 + i % 2,
            "work_s": 1, "min_runtime_s": i % 2, "resumable": True, "id": f"s{i:02d}"}


async def test_a_new_leader_loads_the_snapshot_replays_only_the_rest_and_holds_the_same_state(make_settings):
    # the log kept whole: the reference state below is a replay of all of it (test_purge purges)
    settings = make_settings(snapshot_every=20, purge_log="off")
    config = load_cluster(settings.cluster_file, settings.cluster)
    stack = await Stack(settings).start()
    try:
        async with client(stack) as http:
            for i in range(12):
                assert (await http.post("/v1/workloads", json=body(i))).status_code == 202
            await wait_for(lambda: all_completed(http, [f"s{i:02d}" for i in range(12)]), 60, what="12 completed")
            first = stack["placement"]
            await wait_for(lambda: _true(first.snapshot_seq > 0), 10, what="a snapshot")
            snapshot_seq = first.snapshot_seq
            for i in range(12, 14):  # after the snapshot
                assert (await http.post("/v1/workloads", json=body(i))).status_code == 202
            await wait_for(lambda: all_completed(http, ["s12", "s13"]), 30, what="s12, s13 completed")

            await stack.stop_service("placement")
            second = await stack.start_service("placement")
            bus = stack["gateway"].bus
            events = await log_events(bus, settings.cluster)
            # it started from a snapshot and replayed only the log after it
            assert second.loaded_snapshot_seq >= snapshot_seq > 0
            assert second.replayed < len(events), (second.replayed, len(events))
            full = await replay_state(bus, config, settings.cluster)
            assert view.digest(second.state) == view.digest(full)
            assert second.snapshot_seq >= snapshot_seq
            # and it goes on scheduling, with decision ids of its own
            assert (await http.post("/v1/workloads", json=body(14))).status_code == 202
            await wait_for(lambda: all_completed(http, ["s14"]), 30, what="s14 completed")
            ids = [e.event_id for e in await log_events(bus, settings.cluster)]
            assert len(ids) == len(set(ids))
    finally:
        await stack.stop()


async def _true(v: bool) -> bool:
    return v
