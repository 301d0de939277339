"""Helpers of the integration tests: HTTP client, waiting for log events."""

from __future__ import annotations

import asyncio
import time

import httpx
import msgspec

from services.common import subjects
from timeshare import events as ev


def client(stack, token: str = "tok-carol") -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=stack["gateway"].url, headers={"Authorization": f"Bearer {token}"}, timeout=10)


async def log_events(bus, cluster: str) -> list[ev.Event]:
    out: list[ev.Event] = []
    await bus.replay(subjects.LOG_STREAM, subjects.log_filter(cluster), lambda m: out.append(ev.decoder.decode(m.data)))
    return out


async def wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        result = await predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


async def wait_events(bus, cluster: str, predicate, timeout_s: float = 10.0, what: str = "events"):
    async def check():
        events = await log_events(bus, cluster)
        return events if predicate(events) else None

    return await wait_for(check, timeout_s, 0.1, what)


def of_type(events, cls, workload_id: str | None = None):
    return [e for e in events if isinstance(e, cls) and (workload_id is None or getattr(e, "workload_id", None) == workload_id)]
