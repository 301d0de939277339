"""Requests the services cannot serve within bounds are refused up front, with the reason."""

from __future__ import annotations

import time

import pytest

from .helpers import client

pytestmark = pytest.mark.integration


async def test_a_report_range_too_far_or_too_long_is_refused_and_a_normal_one_served(stack):
    now_s = time.time()
    async with client(stack) as http:
        r = await http.get("/v1/report", params={"from_s": now_s - 3600, "to_s": now_s})
        assert r.status_code == 200, r.text
        assert "attainment" in r.json()
        # a far to_s once binned every hour up to it (23.7 GB) and stalled every service
        r = await http.get("/v1/report", params={"from_s": 0, "to_s": 1e12})
        assert r.status_code == 400 and "future" in r.json()["detail"]
        r = await http.get("/v1/report", params={"from_s": now_s - 3 * 365 * 86400, "to_s": now_s})
        assert r.status_code == 400 and "at most 400 days" in r.json()["detail"]
        r = await http.get("/v1/report", params={"from_s": now_s, "to_s": now_s - 60})
        assert r.status_code == 400 and "before" in r.json()["detail"]
        # and the ledger still answers afterwards
        assert (await http.get("/v1/report")).status_code == 200


async def test_placement_forgets_the_ids_of_ended_workloads_and_still_refuses_their_repeat(stack):
    from services.common import subjects
    from timeshare import events as ev

    from .helpers import log_events, of_type, wait_for

    placement, bus, cluster = stack["placement"], stack["gateway"].bus, stack.settings.cluster
    async with client(stack) as http:
        for i in range(3):
            r = await http.post("/v1/workloads", json={"project": "alpha/train", "gpu_type": "H100", "gpus": 1,
                                                       "work_s": 1, "id": f"b{i}"})
            assert r.status_code == 202

        async def all_completed():
            states = [(await http.get(f"/v1/workloads/b{i}")).json().get("state") for i in range(3)]
            return states == ["completed"] * 3

        await wait_for(all_completed, 30, what="b0..b2 completed")
    assert not [i for i in placement.applied_ids if "b0" in i or "b1" in i or "b2" in i]
    assert not set(placement.ids_of) & {"b0", "b1", "b2"}
    # the same submission again, past JetStream's dedup (another Nats-Msg-Id): refused, not applied
    first = next(e for e in of_type(await log_events(bus, cluster), ev.WorkloadSubmitted) if e.workload.id == "b0")
    await bus.js.publish(subjects.inbox_subject(cluster, "workload.submitted"), ev.encoder.encode(first),
                         headers={"Nats-Msg-Id": "b0-again"})

    async def refused():
        from .test_poison import dead_letters

        dead = await dead_letters(bus, f"placement-{cluster}")  # read as the operator
        return [m for m in dead if "b0" in m.headers["Timeshare-Reason"] and "already exists" in m.headers["Timeshare-Reason"]]

    await wait_for(refused, 15, what="the repeat to be dead-lettered")
    assert len([e for e in of_type(await log_events(bus, cluster), ev.WorkloadSubmitted) if e.workload.id == "b0"]) == 1
