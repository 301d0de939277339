"""A projection neither stalls on a record nor loses one: a record it cannot store goes to the
dead-letter stream with its reason and the projection moves on (it used to stall for good,
across restarts); a batch a killed projection fetched but never stored reaches its successor."""

from __future__ import annotations

import secrets

import pytest

from services.common import subjects
from timeshare import events as ev
from timeshare.workload import WorkloadSpec

from .helpers import client, log_events, of_type, wait_for

pytestmark = pytest.mark.integration


def submission(cluster: str, wid: str, **spec) -> ev.WorkloadSubmitted:
    fields = dict(id=wid, submit_s=0, project="alpha/train", gpu_type="H100", gpus=1, work_s=1,
                  min_runtime_s=0, resumable=True, user="carol")
    fields.update(spec)
    return ev.WorkloadSubmitted(event_id=f"sub.{wid[:40]}", at_ms=0, cluster=cluster, workload=WorkloadSpec(**fields))


async def dead_letters(bus, consumer: str) -> list:
    """The dead letters of ``consumer``, read as the operator (whose stream the DLQ is to read:
    a service's NATS user only writes there)."""
    from services.common.bus import Bus

    out: list = []
    reader = await Bus.connect(bus.settings, bus.cluster, name="test-dlq-reader")
    try:
        await reader.replay(subjects.DLQ_STREAM, subjects.dlq_subject(consumer), out.append)
    finally:
        await reader.close()
    return out


async def test_a_poisoned_record_is_dead_lettered_with_its_reason_and_the_projections_move_on(stack):
    gw, ledger = stack["gateway"], stack["ledger"]
    bus, cluster = gw.bus, stack.settings.cluster
    # two records placement accepts but PostgreSQL refuses: a NUL in a text field (jsonb has no
    # \u0000), and an id too large for the primary key's index row (random, so it does not compress)
    nul = submission(cluster, "w-nul", kind="train\x00ing")
    huge_id = "w-" + secrets.token_hex(4000)
    huge = submission(cluster, huge_id)
    for e in (nul, huge):
        await bus.propose(e)
    async with client(stack) as http:
        r = await http.post("/v1/workloads", json={"project": "alpha/train", "gpu_type": "H100", "gpus": 1,
                                                   "work_s": 1, "id": "w-after"})
        assert r.status_code == 202, r.text
        # the projections stored what came after the poison
        await wait_for(lambda: _state(http, "w-after", "completed"), 30, what="w-after completed in the gateway")
        # the front door refuses the same NUL outright
        r = await http.post("/v1/workloads", json={"project": "alpha/train", "gpu_type": "H100", "gpus": 1,
                                                   "work_s": 1, "kind": "a\u0000b"})
        assert r.status_code == 400 and "kind" in r.json()["detail"]
        assert (await http.get("/v1/workloads/w-nul")).status_code == 404
    events = await log_events(bus, cluster)
    assert {e.workload.id for e in of_type(events, ev.WorkloadSubmitted)} >= {"w-nul", huge_id, "w-after"}
    last_seq = (await bus.js.stream_info(subjects.LOG_STREAM)).state.last_seq
    await wait_for(lambda: _at(ledger, last_seq), 15, what="the ledger to reach the end of the log")
    await wait_for(lambda: _at(gw, last_seq), 15, what="the gateway to reach the end of the log")

    gw_dead = await dead_letters(bus, f"gateway-{cluster}")
    reasons = {m.headers["Timeshare-Reason"] for m in gw_dead}
    assert any("sub.w-nul" in r and "Unicode" in r for r in reasons), reasons
    assert any(huge.event_id in r and "index row" in r for r in reasons), reasons
    for m in gw_dead:  # the original record, with where it came from
        e = ev.decoder.decode(m.data)
        assert e.event_id in (nul.event_id, huge.event_id)
        assert int(m.headers["Timeshare-Stream-Seq"]) <= last_seq
    # the ledger stores the huge id (no index on it) but not the NUL
    ledger_reasons = [m.headers["Timeshare-Reason"] for m in await dead_letters(bus, f"ledger-{cluster}")]
    assert len(ledger_reasons) == 1 and "sub.w-nul" in ledger_reasons[0]
    stored = {d["workload"]["id"] for d in await ledger.store.journal("events", cluster)
              if d.get("type") == "workload.submitted"}
    assert huge_id in stored and "w-after" in stored and "w-nul" not in stored
    # both report it and are healthy
    assert gw.projector.report()["dead_letters"] == 2 and gw.projector.healthy()
    assert ledger.projector.report()["dead_letters"] == 1


async def _state(http, wid: str, state: str):
    r = await http.get(f"/v1/workloads/{wid}")
    return r.status_code == 200 and r.json()["state"] == state


async def _at(service, seq: int):
    return service.projector.applied_seq >= seq



async def test_a_batch_a_killed_projection_fetched_but_never_stored_reaches_its_successor(stack):
    from services.common.bus import Bus

    cluster = stack.settings.cluster
    await stack.stop_service("gateway")
    # the gateway, which proposes submissions, is down: propose them with the operator's connection
    bus = await Bus.connect(stack.settings, cluster, name="test-proposer")
    for wid in ("w-k1", "w-k2"):
        await bus.propose(submission(cluster, wid))
    await wait_for(lambda: _in_log(bus, cluster, {"w-k1", "w-k2"}), 15, what="w-k1, w-k2 in the log")
    # a gateway that fetched them and died before storing them (no ack, no commit)
    killed = await Bus.connect(stack.settings, cluster, name="killed-gateway")
    sub = await killed.js.pull_subscribe_bind(f"gateway-{cluster}", subjects.LOG_STREAM)
    fetched = await sub.fetch(100, timeout=5)
    assert {ev.decoder.decode(m.data).workload.id for m in fetched
            if m.subject.endswith("workload.submitted")} >= {"w-k1", "w-k2"}
    await killed.nc.close()
    await bus.propose(submission(cluster, "w-k3"))
    gw = await stack.start_service("gateway")
    for wid in ("w-k1", "w-k2", "w-k3"):  # well before the 30 s ack_wait would bring them back
        await wait_for(lambda: _stored(gw, wid), 15, what=f"{wid} in the restarted gateway")
    await bus.close()


async def _in_log(bus, cluster, ids):
    return ids <= {e.workload.id for e in of_type(await log_events(bus, cluster), ev.WorkloadSubmitted)}


async def _stored(gw, wid):
    return await gw.store.get("workload", wid) is not None
