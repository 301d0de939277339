"""The gateway's routes tagged "nodes": nodes and their health, heartbeats, repairs and uncordons
(the dashboard adds ``/v1/cluster``, ui.py).
"""

# no `from __future__ import annotations`: the routes' `Auth` is a local name FastAPI must see
from typing import Annotated

import msgspec
from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from ...common import subjects
from ...common.supervise import describe
from .. import limits
from ..limits import check_id
from .common import API_VERSION, Calls, Unavailable


class HealthReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ok: bool
    reason: Annotated[str, Field(max_length=limits.MAX_REASON_CHARS)] = ""
    needs_human: bool = False


def router(gw, calls: Calls) -> APIRouter:
    r = APIRouter(tags=["nodes"])
    cluster = gw.cluster
    Auth, ask = calls.Auth, calls.ask

    @r.get(f"/{API_VERSION}/nodes")
    async def nodes(who: Auth) -> dict:
        out = await ask(subjects.query_subject(cluster, "nodes"))
        try:
            live = await ask(subjects.query_subject(cluster, "health.nodes"), timeout=1.0)
        except (Unavailable, HTTPException):
            live = {"nodes": {}}
        for n in out["nodes"]:
            n["last_heartbeat_ms"] = live["nodes"].get(n["name"], {}).get("last_heartbeat_ms")
        return out

    @r.post(f"/{API_VERSION}/nodes/{{node}}/heartbeat", status_code=202)
    async def heartbeat(node: str, who: Auth) -> dict:
        """A node agent is alive (health marks a node unhealthy when its heartbeats stop)."""
        check_id("node", node)
        if not who.admin and "health" not in who.manages:
            raise HTTPException(403, "heartbeats need an admin or health-agent token")
        if node not in gw.cluster_model.nodes_by_name:
            raise HTTPException(404, f"unknown node {node!r}")
        try:
            await gw.bus.nc.publish(subjects.heartbeat_subject(cluster), msgspec.json.encode({"node": node}))
        except Exception as exc:  # off NATS: nothing is buffered (gateway/publish.py)
            raise Unavailable(f"heartbeat not sent: {describe(exc)}") from None
        return {"node": node}

    @r.post(f"/{API_VERSION}/nodes/{{node}}/health")
    async def health_report(node: str, report: HealthReport, who: Auth) -> dict:
        check_id("node", node)
        limits.check_text("reason", report.reason)
        if not who.admin and "health" not in who.manages:
            raise HTTPException(403, "health reports need an admin or health-agent token")
        return await ask(subjects.cmd_subject(cluster, "health.report"),
                         {"node": node, "ok": report.ok, "reason": report.reason, "needs_human": report.needs_human,
                          "by": who.user})

    @r.post(f"/{API_VERSION}/nodes/{{node}}/repair")
    async def repaired(node: str, who: Auth) -> dict:
        """Declare a drained or failed node repaired (a human did it)."""
        check_id("node", node)
        if not who.admin:
            raise HTTPException(403, "only admins declare nodes repaired")
        return await ask(subjects.cmd_subject(cluster, "health.repaired"), {"node": node, "by": who.user})

    @r.post(f"/{API_VERSION}/nodes/{{node}}/uncordon")
    async def uncordon(node: str, who: Auth) -> dict:
        """Take back a cordon (a mistaken one): a cordoned or drained node takes work again at once."""
        check_id("node", node)
        if not who.admin:
            raise HTTPException(403, "only admins uncordon nodes")
        return await ask(subjects.cmd_subject(cluster, "health.repaired"),
                         {"node": node, "by": who.user, "uncordon": True})

    return r
