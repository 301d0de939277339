"""OTLP export with the standard OpenTelemetry settings, across separate service processes: the
gateway and placement, each its own process, send their spans to a collector (here a small OTLP/HTTP
receiver in the test) and a submission's spans from both share one trace id, carried between
them by the traceparent header of the NATS message."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from .conftest import TOKENS
from .helpers import wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


class Collector:
    """An OTLP/HTTP trace receiver: POST /v1/traces with an ExportTraceServiceRequest (protobuf)."""

    def __init__(self):
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                            ExportTraceServiceResponse)

        self.spans: list[dict] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = ExportTraceServiceRequest.FromString(body)
                for rs in request.resource_spans:
                    service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            collector.spans.append({
                                "service": service, "scope": ss.scope.name, "name": s.name,
                                "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                                "parent_id": s.parent_span_id.hex(),
                                "attributes": {a.key: a.value for a in s.attributes}})
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


async def test_separate_processes_export_one_trace_per_submission_over_otlp(make_settings, tmp_path):
    collector = Collector()
    settings = make_settings(otel="none")  # the standard variable alone turns export on
    env = dict(os.environ, **settings.env(), PYTHONPATH=f"{ROOT / 'shared'}:{ROOT}",
               OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, OTEL_SERVICE_NAME="timeshare-test",
               OTEL_BSP_SCHEDULE_DELAY="200")  # export every 0.2 s instead of 5 s
    procs = {name: subprocess.Popen([sys.executable, "-m", f"services.{name}"], env=env, cwd=ROOT,
                                    stdout=open(tmp_path / f"{name}.log", "ab"), stderr=subprocess.STDOUT)
             for name in ("placement", "gateway")}
    url = f"http://{settings.http_host}:{settings.http_port}"
    token = next(t for t, who in TOKENS.items() if who["user"] == "alice")
    try:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=5) as http:
            async def gateway_up():
                try:
                    return (await http.get("/v1/whoami")).status_code == 200
                except httpx.HTTPError:
                    return False

            await wait_for(gateway_up, 30, 0.2, what="the gateway process")
            r = await http.post("/v1/workloads", json={"project": "alpha/train", "gpu_type": "H100", "gpus": 4,
                                                      "work_s": 600, "min_runtime_s": 60, "id": "exported"})
            assert r.status_code == 202, r.text

            async def exported():
                names = {(s["scope"], s["name"]) for s in collector.spans
                         if s["attributes"].get("timeshare.workload_id") is not None
                         and s["attributes"]["timeshare.workload_id"].string_value == "exported"}
                return names if {("timeshare.placement", "placement workload.submitted"),
                                 ("timeshare.placement", "placement.pass workload.started")} <= names else None

            await wait_for(exported, 30, 0.2, what="placement's spans at the collector")
            await asyncio.sleep(0.5)  # the gateway's batch, too
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        collector.close()
    spans = collector.spans
    submitted = next(s for s in spans if s["name"] == "placement workload.submitted")
    http_spans = [s for s in spans if s["name"] == "POST /v1/workloads"]
    assert http_spans, {s["name"] for s in spans}
    # the HTTP request (gateway process) and the submission (placement process): one trace
    assert submitted["trace_id"] in {s["trace_id"] for s in http_spans}
    assert submitted["parent_id"] in {s["span_id"] for s in spans if s["trace_id"] == submitted["trace_id"]}
    started = next(s for s in spans if s["name"] == "placement.pass workload.started")
    assert started["trace_id"] == submitted["trace_id"] and started["parent_id"] == submitted["span_id"]
    assert {s["service"] for s in spans} == {"timeshare-test"}  # OTEL_SERVICE_NAME


async def test_a_gateway_apart_from_placement_and_the_executor_shows_their_spans(make_settings, tmp_path):
    """No collector: each process keeps its spans (TIMESHARE_OTEL=memory) and the gateway gathers
    a workload's trace from the others over NATS."""
    settings = make_settings(otel="memory")
    env = dict(os.environ, **settings.env(), PYTHONPATH=f"{ROOT / 'shared'}:{ROOT}")
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        env.pop(name, None)
    procs = {name: subprocess.Popen([sys.executable, "-m", f"services.{name}"], env=env, cwd=ROOT,
                                    stdout=open(tmp_path / f"{name}.log", "ab"), stderr=subprocess.STDOUT)
             for name in ("placement", "executor", "gateway")}
    url = f"http://{settings.http_host}:{settings.http_port}"
    token = next(t for t, who in TOKENS.items() if who["user"] == "alice")
    try:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=5) as http:
            async def gateway_up():
                try:
                    return (await http.get("/v1/whoami")).status_code == 200
                except httpx.HTTPError:
                    return False

            await wait_for(gateway_up, 30, 0.2, what="the gateway process")
            r = await http.post("/v1/workloads", json={"project": "alpha/train", "gpu_type": "H100", "gpus": 1,
                                                      "work_s": 1, "min_runtime_s": 1, "id": "apart"})
            assert r.status_code == 202, r.text

            async def whole():
                r = await http.get("/v1/workloads/apart/trace")
                if r.status_code == 404:  # the gateway's projection has not seen it yet
                    return None
                body = r.json()
                names = {s["name"] for s in body["spans"]}
                return body if {"POST /v1/workloads", "placement workload.submitted", "placement.pass workload.started",
                                "executor workload.completed", "placement workload.completed"} <= names else None

            body = await wait_for(whole, 30, 0.3, what="spans of three processes in the gateway's answer")
    finally:
        for p in procs.values():
            p.terminate()
        for p in procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    spans = body["spans"]
    assert {s["trace_id"] for s in spans} == {body["trace_id"]}
    assert len({s["span_id"] for s in spans}) == len(spans)  # merged, none twice
    services = {s["name"]: s["service"] for s in spans}
    assert services["placement.pass workload.started"] == "timeshare.placement"
    assert services["executor workload.completed"] == "timeshare.executor"
