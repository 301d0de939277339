"""``GET /healthz`` over HTTP for one service, on ``TIMESHARE_HEALTH_PORT`` (0 = off).

The same report the service answers over NATS (``healthz.<service>``): 200 when ok, 503 when
not (off NATS, a projection stuck, the report failing). For a load balancer or an
orchestrator's liveness probe that does not speak NATS; the gateway's ``/healthz`` still
gathers every service's report. Placement's standby answers 200 ``{"leader": false}`` (it is
healthy; it just does not lead). A few lines of asyncio rather than a web framework: one
path, one method, and a service that should not pull in an HTTP stack to say it is alive.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

log = logging.getLogger("timeshare.http_health")

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


async def serve(service, name: str, host: str, port: int) -> asyncio.AbstractServer:
    """Serve ``service.health_report()`` at ``GET /healthz`` on ``host:port``."""

    async def body() -> tuple[int, dict]:
        try:
            report = await service.health_report()
        except Exception as exc:  # the report failing is a finding
            return 503, {"service": name, "ok": False, "error": f"health report failed: {exc}"}
        if report is None:  # placement's standby
            return 200, {"service": name, "ok": True, "leader": False,
                         "nats_connected": service.bus.nc.is_connected}
        report.setdefault("service", name)
        report.setdefault("nats_connected", service.bus.nc.is_connected)
        return (200 if report.get("ok") else 503), report

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            method, path, *_ = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            if path.split("?", 1)[0] != "/healthz":
                status, doc = 404, {"error": "only GET /healthz is served here"}
            elif method not in ("GET", "HEAD"):
                status, doc = 405, {"error": "only GET /healthz is served here"}
            else:
                status, doc = await body()
            payload = msgspec.json.encode(doc)
            head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
            writer.write(head + (b"" if method == "HEAD" else payload))
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass  # a client that sent no request line, or went away
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port)
    log.info("%s: GET /healthz on http://%s:%d", name, host, port)
    return server
