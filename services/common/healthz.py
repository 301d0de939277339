"""Health reports: every service answers ``timeshare.query.v1.<cluster>.healthz.<service>``.

A report is ``{"service", "ok", "nats_connected", "consumers": {name: status}, ...}``; a
consumer's status holds its applied sequence, its lag, its last error and whether it is
stuck (see ``projector.ConsumerStatus``). The gateway's ``GET /healthz`` gathers its own
report and every other service's, and answers 503 when one of them is not ok.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from . import subjects

log = logging.getLogger("timeshare.healthz")

SERVICES = ("placement", "budget", "ledger", "health", "executor")


def subject(cluster: str, service: str) -> str:
    return subjects.query_subject(cluster, f"healthz.{service}")


async def answer(service, name: str) -> dict:
    """The body of ``name``'s health answer (its faststream handler returns it): the service's
    ``health_report()``; a report of None (placement's standby) sends no answer at all."""
    from faststream.exceptions import SkipMessage

    try:
        body = await service.health_report()
    except Exception as exc:  # the report itself failing is a finding
        body = {"service": name, "ok": False, "error": f"health report failed: {exc}"}
    if body is None:
        raise SkipMessage()  # no reply: the leader answers for placement
    body.setdefault("service", name)
    body.setdefault("nats_connected", service.bus.nc.is_connected)
    return body


async def gather(bus, cluster: str, services=SERVICES, timeout_s: float = 1.0) -> dict[str, dict | None]:
    """Every service's report (None for a service that did not answer in time)."""

    async def one(name: str):
        try:
            msg = await bus.nc.request(subject(cluster, name), b"{}", timeout=timeout_s)
            return msgspec.json.decode(msg.data)
        except Exception:
            return None

    answers = await asyncio.gather(*(one(n) for n in services))
    return dict(zip(services, answers))


def projector_report(service: str, projectors, bus, **extra) -> dict:
    consumers = {p.consumer: p.report() for p in projectors}
    ok = bus.nc.is_connected and not any(c["stuck"] for c in consumers.values())
    return {"service": service, "ok": ok, "nats_connected": bus.nc.is_connected, "consumers": consumers, **extra}
