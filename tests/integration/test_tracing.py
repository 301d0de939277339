"""One trace per workload, across services: the decision span of a preemption holds the numbers
that `explain` prints and the log's event carries (TIMESHARE_OTEL=memory)."""

from __future__ import annotations

import os

import msgspec
import pytest

from services.common import subjects
from timeshare import events as ev
from timeshare.explain import rejected_sentence

from .helpers import client, of_type, wait_events, wait_for
from .test_cli import timeshare

pytestmark = pytest.mark.integration


async def _trace(http, workload_id: str, *names: str, event_id: str | None = None) -> dict:
    """The workload's trace once it holds spans of every name in ``names`` (and the span of the
    event ``event_id``: a span is ended, so kept, once the log holds its event)."""
    async def ready():
        body = (await http.get(f"/v1/workloads/{workload_id}/trace")).json()
        have = {s["name"] for s in body["spans"]}
        if event_id is not None and not any(s["attributes"].get("timeshare.event_id") == event_id
                                            for s in body["spans"]):
            return None
        return body if all(n in have for n in names) else None

    return await wait_for(ready, 10, what=f"spans {names} in the trace of {workload_id}")


async def _log_headers(bus, cluster: str) -> list[tuple[ev.Event, dict]]:
    out: list = []
    await bus.replay(subjects.LOG_STREAM, subjects.log_filter(cluster),
                     lambda m: out.append((ev.decoder.decode(m.data), dict(m.headers or {}))))
    return out


async def test_victims_trace_holds_the_preemption_span_with_the_numbers_explain_prints(make_settings):
    from services.devstack.stack import Stack

    stack = await Stack(make_settings(otel="memory")).start()
    try:
        cluster, bus = stack.settings.cluster, stack["gateway"].bus
        async with client(stack, "tok-alice") as alice, client(stack, "tok-bob") as bob:
            # a short workload goes the whole way: HTTP -> submitted -> pass -> started ->
            # executor -> completed, in one trace
            r = await alice.post("/v1/workloads", json={"project": "alpha/train", "gpu_type": "H100", "gpus": 1,
                                                         "work_s": 1, "min_runtime_s": 1, "id": "quick"})
            assert r.status_code == 202, r.text
            events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadCompleted, "quick"),
                                       timeout_s=15)
            quick = await _trace(alice, "quick", "POST /v1/workloads", "placement workload.submitted",
                                 "placement.pass workload.started", "executor workload.completed",
                                 "placement workload.completed",
                                 event_id=of_type(events, ev.WorkloadCompleted, "quick")[0].event_id)
            assert quick["trace_id"] and {s["trace_id"] for s in quick["spans"]} == {quick["trace_id"]}
            # (spans of a batch the log refused, appended=false, are left out: a leader deposed
            # under load; its successor decided again)
            by_name = {s["name"]: s for s in quick["spans"] if s["attributes"].get("timeshare.appended") is not False}
            ids = {s["span_id"] for s in quick["spans"]}
            # each step is a child of the one before it, across the services
            assert by_name["placement workload.submitted"]["parent_id"] in ids
            assert by_name["placement.pass workload.started"]["parent_id"] == \
                by_name["placement workload.submitted"]["span_id"]
            assert by_name["executor workload.completed"]["parent_id"] == \
                by_name["placement.pass workload.started"]["span_id"]
            assert by_name["placement workload.completed"]["parent_id"] == \
                by_name["executor workload.completed"]["span_id"]
            # the gateway's PostgreSQL query (is the id taken?) inside the request, from asyncpg's
            # instrumentation (a query outside any trace, a projection's commit, is not recorded)
            queries = [s for s in quick["spans"] if s["attributes"].get("db.system") == "postgresql"]
            assert queries and all(s["service"] == "opentelemetry.instrumentation.asyncpg" for s in queries)
            assert all(_ancestors(quick["spans"], q)[-1]["name"] == "POST /v1/workloads" for q in queries)
            assert any(q["attributes"].get("db.statement", "").startswith("SELECT") for q in queries)

            # a request that asks a service over NATS is one trace too: the caller's traceparent
            # -> the gateway's HTTP span -> (traceparent in the NATS request) -> placement's
            # faststream handler span (its telemetry middleware) -> its reply
            trace_id = os.urandom(16).hex()
            r = await alice.get("/v1/workloads/quick/explain",
                                headers={"traceparent": f"00-{trace_id}-{os.urandom(8).hex()}-01"})
            assert r.status_code == 200
            explain_spans = await wait_for(lambda: _spans_with(trace_id, " process"), 5,
                                           what="the explain handler's span")
            handler = next(s for s in explain_spans if s["name"].endswith(".explain process"))
            assert handler["service"] == "opentelemetry.instrumentation.faststream" and handler["attributes"]["messaging.system"] == "nats"
            assert _ancestors(explain_spans, handler)[-1]["name"] == "GET /v1/workloads/{workload_id}/explain"
            assert any(s["attributes"].get("db.system") == "postgresql" for s in explain_spans)

            # alpha fills the cluster with resumable work protected for 2 s; beta has used
            # nothing and preempts one of them once the protection ends
            for i in range(2):
                r = await alice.post("/v1/workloads", json={"project": "alpha/train", "gpu_type": "H100", "gpus": 4,
                                                             "work_s": 600, "min_runtime_s": 2, "resumable": True,
                                                             "id": f"hog-{i}"})
                assert r.status_code == 202, r.text
            await wait_events(bus, cluster, lambda es: len(of_type(es, ev.WorkloadStarted)) == 3)
            r = await bob.post("/v1/workloads", json={"project": "beta/debug", "gpu_type": "H100", "gpus": 4,
                                                       "work_s": 600, "min_runtime_s": 60, "id": "newcomer"})
            assert r.status_code == 202
            events = await wait_events(bus, cluster, lambda es: of_type(es, ev.WorkloadStarted, "newcomer"),
                                       timeout_s=15, what="the newcomer to start")
            (preempted,) = of_type(events, ev.WorkloadPreempted)
            victim = preempted.workload_id
            trace = await _trace(alice, victim, "POST /v1/workloads", "placement.pass workload.started",
                                 "placement.pass workload.preempted", "placement.pass workload.requeued",
                                 event_id=preempted.event_id)
            explanation = await wait_for(
                lambda: _explained(alice, victim), 10, what="the gateway to hold the victim's last preemption")

        spans = trace["spans"]
        assert {s["trace_id"] for s in spans} == {trace["trace_id"]}
        assert all(s["attributes"].get("timeshare.workload_id") in (None, victim) for s in spans)
        # the span of the decision the log holds (a leader deposed under load may have made one
        # that the log refused, in a span marked appended=false; the next leader decided again)
        decision = next(s for s in spans if s["name"] == "placement.pass workload.preempted"
                        and s["attributes"]["timeshare.event_id"] == preempted.event_id)
        assert decision["attributes"]["timeshare.appended"] is True and decision["status"] != "ERROR"
        attrs = decision["attributes"]
        reason = explanation["last_preemption"]
        assert reason["kind"] == "fair_share" and reason["by_workload_id"] == "newcomer"
        # every number explain shows of the preemption is on the decision span, equal
        compared = 0
        for field, value in reason.items():
            if field == "rejected":
                continue  # span events, below
            if value is None:
                assert f"timeshare.preemption.{field}" not in attrs
                continue
            assert attrs[f"timeshare.preemption.{field}"] == value, field
            compared += 1
        for field in ("level", "preemptor_subtree", "victim_subtree", "preemptor_ratio", "victim_ratio",
                      "preemptor_fill", "victim_fill", "victim_running_gpus", "victim_due_gpus", "hysteresis",
                      "rule", "victim_protected_until_ms", "by_workload_id"):
            assert reason.get(field) is not None, field  # a fair-share preemption carries them all
        assert compared >= 13
        # ... and they are the log's: the event as placement appended it
        assert attrs["timeshare.preemption.victim_ratio"] == preempted.reason.victim_ratio
        assert attrs["timeshare.preemption.hysteresis"] == preempted.reason.hysteresis
        # the candidates it spared and why: the decision span's `rejected` events are explain's,
        # field by field, and the log's; explain's sentence is made of them. The other hog was
        # the one other running workload: still protected (when it started a pass later than the
        # victim) or free to go, but the victim's node ranked first
        rejected = reason["rejected"]
        spared = [{k.removeprefix("timeshare.rejected."): v for k, v in e["attributes"].items()}
                  for e in decision["events"] if e["name"] == "rejected"]
        assert spared == rejected == list(msgspec.to_builtins(preempted.reason.rejected))
        assert reason["considered"] == attrs["timeshare.preemption.considered"] == 1
        other = "hog-1" if victim == "hog-0" else "hog-0"
        assert [c["workload_id"] for c in rejected] == [other]
        assert rejected[0]["reason"] in ("protected", "ranked_lower")
        assert rejected[0]["message"]
        sentence = rejected_sentence(reason)
        assert sentence.startswith("1 other running workload was considered and spared; the closest: "
                                   f"{other} (alpha/train, 4 GPUs on ")
        assert rejected[0]["message"] in sentence and sentence in explanation["summary"]
        # the log message of the preemption carries the victim's trace (W3C traceparent)
        logged = await _log_headers(bus, cluster)
        headers = next(h for e, h in logged if isinstance(e, ev.WorkloadPreempted))
        assert headers["traceparent"].split("-")[1] == trace["trace_id"]
        assert headers["traceparent"].split("-")[2] == decision["span_id"]
        # the ledger counted the same preemption, and so did placement's metrics
        async with client(stack, "tok-admin") as admin:
            report = (await admin.get("/v1/report")).json()
            metrics = (await admin.get("/v1/metrics")).json()["metrics"]
        assert report["preemptions_by_reason"].get("fair_share") == 1

        def points(name: str) -> list[dict]:
            return [p for p in metrics[name]["points"] if p["attributes"].get("cluster") == cluster]

        assert [(p["attributes"]["reason"], p["attributes"]["rule"], p["value"])
                for p in points("timeshare.preemptions")] == [("fair_share", "due_share", 1)]
        assert {p["attributes"]["phase"]: p["value"] for p in points("timeshare.queue.length")} == {"allocated": 1}
        assert [p["value"] for p in points("timeshare.occupancy")] == [1.0]  # 8 of 8 GPUs busy
        busy = {p["attributes"]["allocated"]: p["value"] for p in points("timeshare.gpus.busy")}
        assert busy == {True: 8, False: 0}
        # four starts: quick, both hogs, the newcomer; each wait shorter than the test
        waits = points("timeshare.queue.wait")
        assert sum(p["count"] for p in waits) == 4 and all(p["max"] < 30 for p in waits)
        ratios = {p["attributes"]["node"] for p in points("timeshare.usage_ratio")}
        assert {"alpha", "alpha/train", "beta", "beta/debug"} <= ratios

        # the same from the CLI: explain names the trace, `trace` prints the decision's numbers
        assert explanation["trace_id"] == trace["trace_id"]
        r = await timeshare(stack, "tok-alice", "explain", victim)
        assert r.returncode == 0 and f"trace {trace['trace_id']}" in r.stdout, r.stdout + r.stderr
        assert sentence in r.stdout
        r = await timeshare(stack, "tok-alice", "trace", victim)
        assert r.returncode == 0, r.stderr
        line = next(x for x in r.stdout.splitlines() if "placement.pass workload.preempted" in x
                    and "NOT IN THE LOG" not in x)
        assert f"victim_ratio={reason['victim_ratio']}" in line and f"hysteresis={reason['hysteresis']}" in line
        assert "rule=due_share" in line and "by_workload_id=newcomer" in line
        assert f"spared {other} ({rejected[0]['reason']}): {rejected[0]['message']}" in r.stdout
        assert r.stdout.splitlines()[1].split()[-1] == "/v1/workloads"  # the HTTP request first
    finally:
        await stack.stop()


def _ancestors(spans: list[dict], span: dict) -> list[dict]:
    """``span``'s parent, its parent's parent, ... up to the trace's root among ``spans``."""
    by_id = {s["span_id"]: s for s in spans}
    out = []
    while span["parent_id"] in by_id:
        span = by_id[span["parent_id"]]
        out.append(span)
    return out


async def _spans_with(trace_id: str, name_part: str) -> list[dict] | None:
    from services.common import telemetry

    spans = telemetry.span_store().spans_of(trace_id)
    return spans if any(name_part in s["name"] for s in spans) else None


async def _explained(http, workload_id: str):
    body = (await http.get(f"/v1/workloads/{workload_id}/explain")).json()
    return body if body.get("last_preemption") else None


async def test_trace_of_an_unknown_workload_is_404_and_whoami_names_the_tokens_caller(stack):
    async with client(stack) as carol:
        r = await carol.get("/v1/workloads/nope/trace")
        assert r.status_code == 404 and "nope" in r.json()["detail"]
        r = await carol.get("/v1/whoami")
        # the caller as the gateway knows it, the leaves carol may submit to included
        assert r.json() == {"user": "carol", "manages": [], "admin": False, "member_of": ["alpha/train", "beta/debug"]}
        r = await carol.get("/v1/whoami", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
