"""Health's handlers on a faststream router (msgspec-typed messages).

Heartbeats (``timeshare.hb.v1.<cluster>``, no reply); commands ``health.report`` (a node's
check result) and ``health.repaired`` (a human declares a repair); query ``health.nodes``;
``healthz.health``: its health report.
"""

from __future__ import annotations


from ..common import healthz, subjects
from ..common.broker import Message, NatsRouter


class Heartbeat(Message, kw_only=True):
    node: str


class HealthReport(Message, kw_only=True):
    """A node's health check: ``ok`` false reports it unhealthy (cordon, drain, repair)."""
    node: str
    ok: bool = True
    reason: str | None = None
    needs_human: bool = False
    by: str | None = None


class Repaired(Message, kw_only=True):
    node: str
    by: str | None = None


def router(service, cluster: str) -> NatsRouter:
    r = NatsRouter()

    @r.subscriber(subjects.heartbeat_subject(cluster), title="heartbeat",
                  description="a node agent is alive (no reply); silence for TIMESHARE_HEARTBEAT_TIMEOUT_S "
                              "reports the node unhealthy")
    async def heartbeat(hb: Heartbeat) -> None:
        service.heartbeat(hb.node)

    @r.subscriber(subjects.cmd_subject(cluster, "health.report"), title="health.report",
                  description="a node's health check result; ok=false reports it unhealthy")
    async def report(rep: HealthReport) -> dict:
        return await service.health_check(rep.node, rep.ok, rep.reason, rep.needs_human)

    @r.subscriber(subjects.cmd_subject(cluster, "health.repaired"), title="health.repaired",
                  description="a human declares a drained or down node repaired")
    async def repaired(cmd: Repaired) -> dict:
        return await service.declare_repaired(cmd.node)

    @r.subscriber(subjects.query_subject(cluster, "health.nodes"), title="health.nodes",
                  description="every node's state and last heartbeat")
    async def nodes() -> dict:
        return {"nodes": service.nodes}

    @r.subscriber(healthz.subject(cluster, "health"), title="healthz.health")
    async def health() -> dict:
        return await healthz.answer(service, "health")

    return r
