"""Bounded log: placement purges what its snapshots and every durable projection cover; every
reader still comes up right after the purge (a new leader, the executor, the projections), and
a projection that was away keeps everything it has not read."""

from __future__ import annotations

import logging

import pytest

from services.common import subjects
from services.devstack.stack import Stack
from services.placement import view
from timeshare import events as ev

from .helpers import all_completed, client, log_events, of_type, wait_for

pytestmark = pytest.mark.integration


def body(i: int, work_s: int = 1) -> dict:
    return {"project": "alpha/train" if i % 2 else "beta/debug", "gpu_type": "H100", "gpus": 1,
            "work_s": work_s, "min_runtime_s": i % 2, "resumable": True, "id": f"p{i:02d}"}


async def _true(v) -> bool:
    return bool(v)


async def first_log_seq(bus, cluster: str) -> int:
    msg = await bus.js.get_msg(subjects.LOG_STREAM, seq=1, subject=subjects.log_filter(cluster), next=True)
    return msg.seq


async def submit_all(http, ids, work_s: int = 1) -> None:
    for i in ids:
        r = await http.post("/v1/workloads", json=body(i, work_s))
        assert r.status_code == 202, r.text


async def test_after_a_purge_a_new_leader_the_executor_and_the_projections_come_up_right(make_settings, caplog):
    caplog.set_level(logging.WARNING, logger="timeshare.placement")  # the whole test: said once in it
    settings = make_settings(snapshot_every=15)
    assert settings.purges_log  # PostgreSQL stores: "auto" purges
    cluster = settings.cluster
    stack = await Stack(settings).start()
    try:
        bus = stack["gateway"].bus
        async with client(stack) as http:
            await submit_all(http, range(3))
            await wait_for(lambda: all_completed(http, ["p00", "p01", "p02"]), 30, what="p00..p02 completed")
            last = (await bus.js.stream_info(subjects.LOG_STREAM)).state.last_seq
            await wait_for(lambda: _true(stack["ledger"].last_seq >= last), 20, what="the ledger at the end")
            # the ledger goes away: its durable holds what it has not read
            await stack.stop_service("ledger")
            ledger_floor = (await bus.js.consumer_info(subjects.LOG_STREAM, f"ledger-{cluster}")).ack_floor.stream_seq
            assert ledger_floor > 1
            await submit_all(http, range(3, 16))
            await wait_for(lambda: all_completed(http, [f"p{i:02d}" for i in range(3, 16)]), 60,
                           what="p03..p15 completed")
            first = stack["placement"]
            # purged as far as the away ledger allows, no further
            await wait_for(lambda: _true(first.snapshot_seq and first.purged_below == ledger_floor + 1), 20,
                           what="a purge held at the away ledger's ack floor")
            # the operator sees who holds the log: in placement's health, and once in its log
            # when a second purge finds the ledger where the first left it
            durable = f"ledger-{cluster}"
            assert first.purge_held_by == {durable: ledger_floor + 1}
            r = await http.get("/healthz")
            assert r.json()["services"]["placement"]["purge"]["held_by"] == {durable: ledger_floor + 1}
            await first._purge_log(first.snapshot_seq)
            await first._purge_log(first.snapshot_seq)
            said = [rec.getMessage() for rec in caplog.records if durable in rec.getMessage()]
            assert len(said) == 1 and f"has read nothing since seq {ledger_floor + 1}" in said[0], said
            # the ledger comes back from its stored position and misses nothing
            ledger = await stack.start_service("ledger")
            last = (await bus.js.stream_info(subjects.LOG_STREAM)).state.last_seq
            await wait_for(lambda: _true(ledger.last_seq >= last), 20, what="the ledger to catch up")
            journal = await ledger.store.journal("events", cluster)
            submitted = sorted(d["workload"]["id"] for d in journal if "workload" in d)
            assert submitted == [f"p{i:02d}" for i in range(16)], submitted

            # more work: now every durable is at the end, the purge follows the snapshots
            await submit_all(http, range(16, 26))
            await wait_for(lambda: all_completed(http, [f"p{i:02d}" for i in range(16, 26)]), 60,
                           what="p16..p25 completed")
            await wait_for(lambda: _true(first.purged_below > ledger_floor + 1), 20, what="a purge past the first")
            purged_below = first.purged_below
            assert await first_log_seq(bus, cluster) >= purged_below
            kept = await log_events(bus, cluster)
            assert not [e for e in of_type(kept, ev.WorkloadSubmitted) if e.workload.id == "p00"]  # really gone

            # a new leader: from the snapshot, the same state as the one it replaces
            digest = view.digest(first.state)
            await stack.stop_service("placement")
            second = await stack.start_service("placement")
            assert second.loaded_snapshot_seq >= purged_below - 1 > 0
            assert view.digest(second.state) == digest

            # the executor restarts with work running: it adopts it from the snapshot or the log
            await submit_all(http, range(26, 29), work_s=3)
            await wait_for(lambda: _true(len(stack["executor"].running) == 3), 15, what="p26..p28 running")
            await stack.stop_service("executor")
            executor = await stack.start_service("executor")
            assert set(executor.running) >= {"p26", "p27", "p28"} or executor.reported
            await wait_for(lambda: all_completed(http, ["p26", "p27", "p28"]), 60, what="p26..p28 completed")

            # projections restarted after the purge come up from their stored positions
            for name in ("gateway", "budget", "health", "ledger"):
                await stack.stop_service(name)
                await stack.start_service(name)
        async with client(stack) as http:
            assert await all_completed(http, [f"p{i:02d}" for i in range(29)])
            r = await http.get("/healthz")
            assert r.status_code == 200, r.text
        events = await log_events(stack["gateway"].bus, cluster)  # the first gateway's bus is closed
        ids = [e.event_id for e in events]
        assert len(ids) == len(set(ids))
    finally:
        await stack.stop()


async def test_in_memory_stores_keep_the_whole_log(make_settings):
    settings = make_settings(database_url="memory", snapshot_every=5)
    assert not settings.purges_log
    assert make_settings(database_url="memory", purge_log="on").purges_log
    with pytest.raises(ValueError, match="TIMESHARE_PURGE_LOG"):
        _ = make_settings(purge_log="sometimes").purges_log
