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
