"""Submit over HTTP -> started -> completed, through real NATS JetStream and PostgreSQL."""

from __future__ import annotations

import pytest

from timeshare import events as ev

from .helpers import client, log_events, of_type, wait_events, wait_for

pytestmark = pytest.mark.integration


async def test_submit_over_http_is_started_then_completed(stack):
    cluster = stack.settings.cluster
    async with client(stack, "tok-carol") as http:
        r = await http.post("/v1/workloads", json={"project": "alpha/train", "gpu_type": "H100", "gpus": 2,
                                                    "work_s": 1, "min_runtime_s": 1})
        assert r.status_code == 202, r.text
        wid = r.json()["workload_id"]
        events = await wait_events(stack["gateway"].bus, cluster,
                                   lambda es: of_type(es, ev.WorkloadCompleted, wid), what="completion")
        kinds = [ev.event_type(e) for e in events if getattr(e, "workload_id", None) == wid
                 or (isinstance(e, ev.WorkloadSubmitted) and e.workload.id == wid)]
        assert kinds == ["workload.submitted", "workload.started", "workload.min_runtime_reached",
                         "workload.completed"] or kinds == ["workload.submitted", "workload.started",
                                                            "workload.completed"]
        started = of_type(events, ev.WorkloadStarted, wid)[0]
        assert started.gpus == 2 and started.allocated and started.placement[0].node == "H100-000"

        async def done():
            r = await http.get(f"/v1/workloads/{wid}")
            return r.json() if r.status_code == 200 and r.json()["state"] == "completed" else None

        doc = await wait_for(done, what="the gateway to show the workload completed")
        assert doc["user"] == "carol" and [h["type"] for h in doc["history"]][0] == "workload.submitted"


async def test_bad_submissions_get_a_clear_4xx_and_change_nothing(stack):
    async with client(stack, "tok-carol") as http:
        base = {"project": "alpha/train", "gpu_type": "H100", "gpus": 1, "work_s": 10}
        cases = {
            "min runtime above the cap": ({**base, "min_runtime_s": 7200}, 400, "min_runtime_s"),
            "a parent is not a leaf": ({**base, "project": "alpha"}, 400, "submit against a leaf"),
            "an unknown project": ({**base, "project": "gamma/x"}, 400, "unknown allocation"),
            "more GPUs than a node and not a multiple": ({**base, "gpus": 6}, 400, "multiple of 4"),
            "an unknown GPU type": ({**base, "gpu_type": "B200"}, 400, "no pool of GPU type"),
            "an unknown priority": ({**base, "priority": "max"}, 400, "priority"),
            "a GPU count that is not a number": ({**base, "gpus": "many"}, 422, "$.gpus"),
            "a missing field": ({k: v for k, v in base.items() if k != "work_s"}, 422, "work_s"),
        }
        for sentence, (body, status, text) in cases.items():
            r = await http.post("/v1/workloads", json=body)
            assert r.status_code == status, (sentence, r.text)
            assert text in r.json()["detail"], (sentence, r.json())
        r = await http.post("/v1/workloads", json=base, headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
    events = await log_events(stack["gateway"].bus, stack.settings.cluster)
    assert events == []


async def test_same_idempotency_key_gives_the_same_workload(stack):
    cluster = stack.settings.cluster
    body = {"project": "beta/debug", "gpu_type": "H100", "gpus": 1, "work_s": 30}
    async with client(stack, "tok-bob") as http:
        first = await http.post("/v1/workloads", json=body, headers={"Idempotency-Key": "k1"})
        second = await http.post("/v1/workloads", json=body, headers={"Idempotency-Key": "k1"})
        assert first.status_code == second.status_code == 202
        assert first.json()["workload_id"] == second.json()["workload_id"]
        assert second.json()["replayed"] is True
        other = await http.post("/v1/workloads", json={**body, "gpus": 2}, headers={"Idempotency-Key": "k1"})
        assert other.status_code == 409
    events = await wait_events(stack["gateway"].bus, cluster, lambda es: of_type(es, ev.WorkloadStarted))
    assert len(of_type(events, ev.WorkloadSubmitted)) == 1
    assert len(of_type(events, ev.WorkloadStarted)) == 1
