"""Health's handlers on a faststream router (msgspec-typed messages).

Heartbeats (``timeshare.hb.v1.<cluster>``, no reply); commands ``health.report`` (a node's
check result) and ``health.repaired`` (a human declares a repair); query ``health.nodes``;
``healthz.health``: its health report. The bodies are the strict structs of
``services/common/commands.py`` (unknown fields refused: a command is answered 400 naming the
field, a malformed heartbeat is dropped).
"""

from __future__ import annotations


from ..common import healthz, subjects
from ..common.broker import NatsRouter
from ..common.commands import HealthReport, Heartbeat, Repaired


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
                  description="a human declares a drained or down node repaired, or takes back a cordon (uncordon)")
    async def repaired(cmd: Repaired) -> dict:
        return await service.declare_repaired(cmd.node, uncordon=cmd.uncordon)

    @r.subscriber(subjects.query_subject(cluster, "health.nodes"), title="health.nodes",
                  description="every node's state and last heartbeat")
    async def nodes() -> dict:
        return {"nodes": service.nodes}

    @r.subscriber(healthz.subject(cluster, "health"), title="healthz.health")
    async def health() -> dict:
        return await healthz.answer(service, "health")

    return r
