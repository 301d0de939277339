"""Placement's queries on a faststream router (msgspec-typed requests).

Only the leader answers (a standby's handler raises ``SkipMessage``: no reply at all, so a
request gets the leader's answer, or none when nobody leads). ``queue``, ``tree``, ``nodes``,
``workload``, ``explain``, ``digest``, ``work`` (work per leaf, for budget); ``healthz.placement``.
``trace`` is answered by every instance that keeps spans, leader or standby (its spans of a
workload; the gateway gathers them).
"""

from __future__ import annotations

from faststream.exceptions import SkipMessage

from timeshare.explain import explain as explain_workload

from ..common import healthz, payload, subjects, telemetry
from ..common.broker import Message, NatsRouter, TraceQuery
from . import view


class QueueQuery(Message, kw_only=True):
    gpu_type: str | None = None
    limit: int = 1000


class WorkloadQuery(Message, kw_only=True):
    id: str


def router(service, cluster: str) -> NatsRouter:
    r = NatsRouter()

    def leader_state():
        if not service.leader.is_set() or service.state is None:
            raise SkipMessage()  # the leader answers; a standby stays silent
        return service.state, service._now_ms() / 1000

    def guarded(fn):
        # a query that fails must not hurt the scheduler: it is answered with the error
        # (a tree of 10,000 projects answers with megabytes: payload.answer compresses it)
        async def run(*args):
            try:
                return payload.answer(fn(*args))
            except SkipMessage:
                raise
            except Exception as exc:
                return {"error": str(exc)}
        return run

    q = subjects.query_subject

    @r.subscriber(q(cluster, "queue"), title="queue", description="pending work in scheduling order, with ordering keys")
    async def queue(args: QueueQuery) -> dict:
        def body():
            state, now_s = leader_state()
            return view.queue_view(state, now_s, args.gpu_type, args.limit)
        return await guarded(body)()

    @r.subscriber(q(cluster, "tree"), title="tree", description="the tree with fractions, usage and ratios")
    async def tree() -> dict:
        def body():
            state, now_s = leader_state()
            return view.tree_view(state, now_s)
        return await guarded(body)()

    @r.subscriber(q(cluster, "nodes"), title="nodes", description="nodes, states, free GPUs")
    async def nodes() -> dict:
        def body():
            state, _ = leader_state()
            return view.nodes_view(state)
        return await guarded(body)()

    @r.subscriber(q(cluster, "workload"), title="workload", description="one workload's scheduler state")
    async def workload(args: WorkloadQuery) -> dict:
        def body():
            state, _ = leader_state()
            return {"workload": view.workload_view(state, args.id)}
        return await guarded(body)()

    @r.subscriber(q(cluster, "explain"), title="explain",
                  description="why a workload waits, runs or was preempted (the core's explanation)")
    async def explain(args: WorkloadQuery) -> dict:
        def body():
            state, now_s = leader_state()
            if args.id not in state.workloads:
                return {"error": f"unknown workload {args.id!r}", "status": 404}
            return {"explanation": explain_workload(state, args.id, now_s)}
        return await guarded(body)()

    @r.subscriber(q(cluster, "digest"), title="digest", description="a fingerprint of the scheduler state")
    async def digest() -> dict:
        def body():
            state, _ = leader_state()
            return {"digest": view.digest(state), "last_log_seq": service.last_log_seq,
                    "instance": service.instance, "stats": service.stats}
        return await guarded(body)()

    @r.subscriber(q(cluster, "work"), title="work",
                  description="pending or running workloads per leaf (budget asks before a tree change or removal)")
    async def work() -> dict:
        def body():
            leader_state()
            return {"work_by_leaf": service._work_by_leaf()}
        return await guarded(body)()

    @r.subscriber(healthz.subject(cluster, "placement"), title="healthz.placement",
                  description="the leader's health report (a standby does not answer)")
    async def health() -> dict:
        return await healthz.answer(service, "placement")

    @r.subscriber(telemetry.trace_subject(cluster), title="placement.trace",
                  description="this process's spans of a workload's trace (every process that keeps spans answers, "
                              "leader or standby; the gateway gathers the answers for 0.3 s)")
    async def trace(ask: TraceQuery) -> dict:
        return telemetry.trace_answer(cluster, ask.workload_id, ask.trace_id)

    return r
