"""The gateway's routes tagged "operations": ``/healthz`` (the dashboard adds ``/v1/whoami`` and
``/v1/metrics``, ui.py).
"""

# no `from __future__ import annotations`: the routes' `Auth` is a local name FastAPI must see
from typing import Annotated

from fastapi import APIRouter, Header, Response

from ...common import healthz as health_reports
from .common import Calls


def router(gw, calls: Calls) -> APIRouter:
    r = APIRouter(tags=["operations"])
    cluster = gw.cluster

    @r.get("/healthz",
             responses={503: {"description": "not ok: the report names the service or projection at fault",
                              "content": {"application/json": {"schema": {"type": "object"}}}}})
    async def healthz(response: Response,
                      authorization: Annotated[str | None, Header(description="Bearer <token>: the whole report")] = None) -> dict:
        """Every service's report: each consumer's applied sequence, lag and last error; 503 when
        a service does not answer, is off NATS, or has a projection stuck. Without a valid bearer
        token only ``ok`` (and the status code): the report names consumers, errors and the
        leader (issue 22, finding 6)."""
        own = health_reports.projector_report("gateway", [gw.projector], gw.bus)
        others = await health_reports.gather(gw.bus, cluster)
        missing = sorted(n for n, r in others.items() if r is None)
        services = {"gateway": own, **{n: r or {"service": n, "ok": False, "error": "no answer"}
                                       for n, r in others.items()}}
        ok = all(r["ok"] for r in services.values())
        response.status_code = 200 if ok else 503
        token = authorization.split(None, 1)[1].strip() if authorization and " " in authorization.strip() else ""
        if not (authorization or "").lower().startswith("bearer ") or gw.tokens.lookup(token) is None:
            return {"ok": ok, "detail": "the full report needs a bearer token"}
        return {"ok": ok, "cluster": cluster, "projection_seq": gw.projector.applied_seq, "missing": missing,
                "services": services}

    return r
