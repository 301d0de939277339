"""The ledger's request/reply handlers on a faststream router (msgspec-typed requests).

``ledger.report``: owed / delivered / attainment over [from_s, to_s); ``ledger.series``: a tree
node's owed / delivered per hour (or per bucket of hours) over a range; ``ledger.usage``: the
rolling-window usage per tree node and GPU type; ``healthz.ledger``: its health report.
"""

from __future__ import annotations


from ..common import healthz, payload, subjects
from ..common.broker import Message, NatsRouter
from ..common.supervise import describe, is_transient


class ReportQuery(Message, kw_only=True):
    """A time range in epoch seconds; ``None`` = from the start of the journal / until now."""
    from_s: float | None = None
    to_s: float | None = None


class SeriesQuery(ReportQuery, kw_only=True):
    """A tree node ("" = every team) and a range; ``bucket_h``: hours per point (None: the
    fewest that keep the series within the ledger's point limit)."""
    node: str = ""
    bucket_h: int | None = None


def router(service, cluster: str) -> NatsRouter:
    r = NatsRouter()

    @r.subscriber(subjects.query_subject(cluster, "ledger.report"), title="ledger.report",
                  description="GPU-hours owed / delivered and attainment per team over [from_s, to_s)")
    async def report(q: ReportQuery) -> dict:
        try:
            return await service.report(q.from_s, q.to_s)
        except Exception as exc:
            # a store away is the service's problem (503, try again), anything else the request's
            return {"error": f"report failed: {describe(exc)}", "status": 503 if is_transient(exc) else 400}

    @r.subscriber(subjects.query_subject(cluster, "ledger.series"), title="ledger.series",
                  description="GPU-hours owed / delivered of a tree node per hour (or bucket of hours) over [from_s, to_s)")
    async def series(q: SeriesQuery) -> dict:
        try:
            return await service.series(q.node, q.from_s, q.to_s, q.bucket_h)
        except Exception as exc:
            return {"error": f"series failed: {describe(exc)}", "status": 503 if is_transient(exc) else 400}

    @r.subscriber(subjects.query_subject(cluster, "ledger.usage"), title="ledger.usage",
                  description="rolling-window usage (allocated / unallocated GPU-seconds) per tree node and GPU type")
    async def usage() -> dict:
        return payload.answer(service.usage_snapshot())

    @r.subscriber(healthz.subject(cluster, "ledger"), title="healthz.ledger")
    async def health() -> dict:
        return await healthz.answer(service, "ledger")

    return r
