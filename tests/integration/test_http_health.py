"""A service run on its own answers GET /healthz over HTTP on TIMESHARE_HEALTH_PORT."""

from __future__ import annotations

import asyncio
import signal
import tempfile
import time

import httpx
import pytest

from services.devstack.servers import free_port, spawn_service

pytestmark = pytest.mark.integration


async def get_healthz(url: str, timeout_s: float = 30.0, until=lambda body: True) -> httpx.Response:
    """The first 200 whose body satisfies ``until`` (or the last answer at the deadline)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=3) as http:
        while True:
            try:
                r = await http.get(url)
                if (r.status_code == 200 and until(r.json())) or time.monotonic() > deadline:
                    return r
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.2)


async def test_budget_and_placement_serve_healthz_over_http(make_settings):
    procs = []
    log = tempfile.mktemp(prefix="timeshare-http-health-", suffix=".log")
    try:
        ports = {}
        from services.admin.setup import setup

        await setup(make_settings(), [make_settings().cluster])  # the operator's step: services only bind
        for name in ("placement", "budget"):
            ports[name] = free_port()
            procs.append(spawn_service(name, make_settings(health_port=ports[name]), log))
        r = await get_healthz(f"http://127.0.0.1:{ports['budget']}/healthz")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["service"] == "budget" and body["ok"] is True and body["nats_connected"] is True
        assert "applied_seq" in body["consumers"][f"budget-{make_settings().cluster}"]
        # a standby (or a placement not yet leading) answers 200 with leader false; this one leads soon
        r = await get_healthz(f"http://127.0.0.1:{ports['placement']}/healthz", until=lambda b: b.get("leader"))
        assert r.status_code == 200 and r.json()["service"] == "placement" and r.json()["leader"], r.text
        async with httpx.AsyncClient(timeout=3) as http:
            assert (await http.get(f"http://127.0.0.1:{ports['budget']}/other")).status_code == 404
            assert (await http.post(f"http://127.0.0.1:{ports['budget']}/healthz")).status_code == 405
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except Exception:
                p.kill()
