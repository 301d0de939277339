"""The submission gateway: HTTP (FastAPI), bearer tokens, OpenAPI at /openapi.json.

Thin: validate -> propose an event to placement's inbox (Nats-Msg-Id = event id) -> answer.
Reads come from the gateway's projection of the log (workloads, history, nodes) or are asked
of the service that owns the answer over NATS request/reply (queue order and tree usage from
placement, budget changes and their audit log from budget, the attainment report from the
ledger, node liveness from health).

This file makes the app (middleware, error handlers) and includes the routes: one router per
OpenAPI tag in ``routes/`` (``operations``, ``workloads``, ``scheduling``, ``budgets``, ``nodes``)
and the dashboard's (``ui.py``).
"""

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline

from ..common.supervise import describe, is_transient
from . import limits, ui
from .routes import ROUTERS
from .routes.common import ERROR_RESPONSES, Unavailable, calls_for
from .text_guard import TextGuard


def create_app(gw) -> FastAPI:
    """``gw`` is the Gateway service (settings, config, bus, store, projection, tokens, clock)."""
    # /docs and /redoc with Swagger UI and ReDoc served from fastapi-offline's files, not a CDN
    app = FastAPIOffline(title="timeshare gateway", version="1.0.0",
                  description="Submit GPU workloads against budgets of GPU time; see the queue in scheduling "
                              "order; manage the allocation tree. Authenticate with `Authorization: Bearer <token>`.",
                  responses=ERROR_RESPONSES)
    # text that is not UTF-8 (a lone surrogate) is a 400 before the app sees it (issue 22, finding 4)
    app.add_middleware(TextGuard)
    # every body is bounded before it is read (a 10 MB body of unknown fields was accepted);
    # added last: the outer one, so TextGuard reads a bounded body
    app.add_middleware(limits.BodyLimit)

    @app.exception_handler(Unavailable)
    async def unavailable(_request: Request, exc: Unavailable):
        return JSONResponse(status_code=503, headers={"Retry-After": "1"}, content={"detail": str(exc)})

    async def store_error(_request: Request, exc: Exception):
        # the store kept trying for a few seconds (PostgreSQL restarting): ask the client to
        # retry (with its Idempotency-Key) rather than answering 500
        if is_transient(exc):
            return JSONResponse(status_code=503, headers={"Retry-After": "1"},
                                content={"detail": f"the gateway's store is unavailable: {describe(exc)}"})
        return JSONResponse(status_code=500, content={"detail": f"internal error: {describe(exc)}"})

    import asyncpg

    for cls in (asyncpg.exceptions.PostgresError, asyncpg.InterfaceError, OSError):
        app.add_exception_handler(cls, store_error)

    calls = calls_for(gw)
    for routes in ROUTERS:
        app.include_router(routes.router(gw, calls))
    ui.mount(app, gw, calls.Auth, calls.ask)
    return app
