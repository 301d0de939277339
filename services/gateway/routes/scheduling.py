"""The gateway's routes tagged "scheduling": the queue in scheduling order.
"""

# no `from __future__ import annotations`: the routes' `Auth` is a local name FastAPI must see
from typing import Annotated

from fastapi import APIRouter, Query

from ...common import subjects
from .. import limits
from .common import API_VERSION, Calls


def router(gw, calls: Calls) -> APIRouter:
    r = APIRouter(tags=["scheduling"])
    cluster = gw.cluster
    Auth, ask = calls.Auth, calls.ask

    @r.get(f"/{API_VERSION}/queue")
    async def queue(who: Auth, gpu_type: Annotated[str | None, Query(max_length=limits.MAX_LABEL_CHARS)] = None,
                    limit: Annotated[int, Query(ge=0, le=100000)] = 1000) -> dict:
        """Pending work in scheduling order, each with its ordering key (phase, then (ratio, path)
        per tree level from the top, then -priority, submit time, id)."""
        return await ask(subjects.query_subject(cluster, "queue"), {"gpu_type": gpu_type, "limit": limit})

    return r
