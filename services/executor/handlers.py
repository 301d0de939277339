"""The executor's handlers on a faststream router (msgspec-typed messages).

``executor.advance`` (manual clock only: drivers, parity runs): apply the log up to
``log_seq``, then end the simulated work due by ``now_ms``; ``healthz.executor``; ``trace`` (this process's
spans of a workload, when it keeps spans; the gateway gathers every process's answer).
"""

from __future__ import annotations

import asyncio


from ..common import healthz, subjects, telemetry
from ..common.broker import Message, NatsRouter, TraceQuery


class Advance(Message, kw_only=True):
    now_ms: int
    log_seq: int = 0


def router(service, cluster: str) -> NatsRouter:
    r = NatsRouter()

    @r.subscriber(subjects.cmd_subject(cluster, "executor.advance"), title="executor.advance",
                  description="manual clock: apply the log up to log_seq, then end simulated work due by now_ms "
                              "(reply: completed ids)")
    async def advance(cmd: Advance) -> dict:
        try:
            done = await service.advance(cmd.now_ms, cmd.log_seq)
        except asyncio.TimeoutError:
            return {"error": f"the executor has not seen log seq {cmd.log_seq} (it is at {service.last_seq})",
                    "status": 504}
        return {"completed": done, "log_seq": service.last_seq}

    @r.subscriber(healthz.subject(cluster, "executor"), title="healthz.executor")
    async def health() -> dict:
        return await healthz.answer(service, "executor")

    @r.subscriber(telemetry.trace_subject(cluster), title="executor.trace",
                  description="this process's spans of a workload's trace (every process that keeps spans answers, "
                              "no queue group; the gateway gathers the answers for 0.3 s)")
    async def trace(ask: TraceQuery) -> dict:
        return telemetry.trace_answer(cluster, ask.workload_id, ask.trace_id)

    return r
