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


async def all_completed(http, wids) -> bool:
    """Every workload of ``wids`` shows ``completed`` through the gateway."""
    for wid in wids:
        r = await http.get(f"/v1/workloads/{wid}")
        if r.status_code != 200 or r.json()["state"] != "completed":
            return False
    return True


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


def spawn_service(name: str, settings, log_path: str):
    """Start ``python -m services.<name>`` with these settings (a real, separate process)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, **settings.env(), PYTHONPATH=f"{root / 'shared'}:{root}")
    return subprocess.Popen([sys.executable, "-m", f"services.{name}"], env=env, cwd=root,
                            stdout=open(log_path, "ab"), stderr=subprocess.STDOUT)


async def ask(bus, subject: str, body: dict | None = None, timeout: float = 5.0):
    msg = await bus.nc.request(subject, msgspec.json.encode(body or {}), timeout=timeout)
    return msgspec.json.decode(msg.data)


async def replay_state(bus, config, cluster: str):
    """A fresh SchedulerState from the log (what a restarted placement must hold)."""
    from timeshare.state import SchedulerState

    state = SchedulerState(config.tree(), config.cluster(), config.policy, name=cluster)
    for e in await log_events(bus, cluster):
        state.apply(e)
    return state
