"""Health reports: every service answers ``timeshare.query.v1.<cluster>.healthz.<service>``.

A report is ``{"service", "ok", "nats_connected", "consumers": {name: status}, ...}``; a
consumer's status holds its applied sequence, its lag, its last error and whether it is
stuck (see ``projector.ConsumerStatus``). The gateway's ``GET /healthz`` gathers its own
report and every other service's, and answers 503 when one of them is not ok.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

import msgspec

from . import subjects

log = logging.getLogger("timeshare.healthz")

SERVICES = ("placement", "budget", "ledger", "health", "executor")


def subject(cluster: str, service: str) -> str:
    return subjects.query_subject(cluster, f"healthz.{service}")


async def serve(bus, cluster: str, service: str, report: Callable[[], Awaitable[dict | None]]):
    """Answer health queries for ``service`` with ``await report()`` (None: stay silent)."""

    async def on_query(msg) -> None:
        try:
            body = await report()
        except Exception as exc:  # the report itself failing is a finding
            body = {"service": service, "ok": False, "error": f"health report failed: {exc}"}
        if body is not None:
            body.setdefault("service", service)
            body.setdefault("nats_connected", bus.nc.is_connected)
            await msg.respond(msgspec.json.encode(body))

    return await bus.nc.subscribe(subject(cluster, service), cb=on_query)


async def gather(bus, cluster: str, services=SERVICES, timeout_s: float = 1.0) -> dict[str, dict | None]:
    """Every service's report (None for a service that did not answer in time)."""

    async def one(name: str):
        try:
            msg = await bus.nc.request(subject(cluster, name), b"", timeout=timeout_s)
            return msgspec.json.decode(msg.data)
        except Exception:
            return None

    answers = await asyncio.gather(*(one(n) for n in services))
    return dict(zip(services, answers))


def projector_report(service: str, projectors, bus, **extra) -> dict:
    consumers = {p.consumer: p.report() for p in projectors}
    ok = bus.nc.is_connected and not any(c["stuck"] for c in consumers.values())
    return {"service": service, "ok": ok, "nats_connected": bus.nc.is_connected, "consumers": consumers, **extra}
