"""The gateway's routes tagged "budgets": the allocation tree, its changes and their audit log, the
attainment report.
"""

# no `from __future__ import annotations`: the routes' `Auth` is a local name FastAPI must see
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from timeshare.tree import MAX_PATH_CHARS, MAX_SHARE

from ...common import subjects
from .. import limits
from .common import API_VERSION, Calls


# the range of a share is checked by the budget service (400 naming the path, like a new
# node's name); here only what JSON cannot carry safely further (NaN, inf) is refused
Share = float
TreePath = Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS)]
Reason = Annotated[str, Field(min_length=1, max_length=limits.MAX_REASON_CHARS)]


class BudgetChangeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shares: dict[TreePath, Share] = Field(description="path -> new share among its siblings (new paths are "
                                                      f"added); 0 = no budget, at most {MAX_SHARE:g}",
                                          min_length=1, max_length=1000)
    reason: Reason = Field(description="why (kept in the audit log)")


class BudgetRemoveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: TreePath = Field(description="the node to retire: it and everything below it must hold no "
                                       "pending or running work")
    reason: Reason = Field(description="why (kept in the audit log)")


def router(gw, calls: Calls) -> APIRouter:
    r = APIRouter(tags=["budgets"])
    cluster = gw.cluster
    Auth, IdemKey, ask, command, request_id_for = calls.Auth, calls.IdemKey, calls.ask, calls.command, calls.request_id_for

    @r.get(f"/{API_VERSION}/allocations")
    async def allocations(who: Auth) -> dict:
        """The allocation tree: shares, fractions, rolling-window usage and usage ratio per GPU type."""
        return await ask(subjects.query_subject(cluster, "tree"))

    @r.put(f"/{API_VERSION}/allocations")
    async def change_allocations(req: BudgetChangeRequest, who: Auth, idempotency_key: IdemKey = None) -> dict:
        """Change shares. Managers change the children of nodes they manage; admins anything.
        A new node's name is lower case letters, digits, '.', '_' or '-'; a leaf holding work
        cannot become a parent (its work would leave the queue); shares are finite, 0..MAX_SHARE.
        A change placement refuses (another change came first: read the tree and send it again)
        is a 409 with placement's reason."""
        limits.check_text("reason", req.reason)
        for path, share in req.shares.items():
            limits.check_text("shares (a path)", path, MAX_PATH_CHARS)
            limits.check_finite(f"shares.{path}", share)
        return await command(subjects.cmd_subject(cluster, "budget.set"),
                             {"caller": who.to_dict(), "shares": req.shares, "reason": req.reason,
                              "request_id": request_id_for(who, idempotency_key)}, timeout=10)

    @r.post(f"/{API_VERSION}/allocations/remove")
    async def remove_allocation(req: BudgetRemoveRequest, who: Auth, idempotency_key: IdemKey = None) -> dict:
        """Retire a node (and its subtree) that holds no pending or running work. Its manager's
        manager (whoever may change its share) or an admin."""
        limits.check_text("reason", req.reason)
        return await command(subjects.cmd_subject(cluster, "budget.remove"),
                             {"caller": who.to_dict(), "path": req.path, "reason": req.reason,
                              "request_id": request_id_for(who, idempotency_key)}, timeout=10)

    @r.get(f"/{API_VERSION}/allocations/history")
    async def allocation_history(who: Auth, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                                 before_seq: Annotated[int | None, Query(ge=1)] = None) -> dict:
        """The budget changes (the audit log), newest ``limit`` first in a page, oldest of them
        first: who, why, each changed share's old and new value; ``older_before_seq`` asks for
        the page before."""
        return await ask(subjects.query_subject(cluster, "budget.history"),
                         {"limit": limit, "before_seq": before_seq})

    @r.get(f"/{API_VERSION}/report")
    async def report(who: Auth, from_s: Annotated[float | None, Query(allow_inf_nan=False)] = None,
                     to_s: Annotated[float | None, Query(allow_inf_nan=False)] = None) -> dict:
        """GPU-hours owed / delivered and attainment per team over [from_s, to_s)."""
        return await ask(subjects.query_subject(cluster, "ledger.report"), {"from_s": from_s, "to_s": to_s},
                         timeout=30)

    @r.get(f"/{API_VERSION}/report/series")
    async def report_series(who: Auth, node: Annotated[str, Query(max_length=limits.MAX_LABEL_CHARS)] = "",
                            from_s: Annotated[float | None, Query(allow_inf_nan=False)] = None,
                            to_s: Annotated[float | None, Query(allow_inf_nan=False)] = None,
                            bucket_h: Annotated[int | None, Query(ge=1)] = None) -> dict:
        """GPU-hours owed and delivered (funded work) of tree node ``node`` ("" = every team) per
        hour, or per ``bucket_h`` hours, over [from_s, to_s): the report's numbers over time
        (its buckets add up to ``/v1/report`` over the same range). 404 for an unknown node,
        400 for a range the report refuses or more than 500 points."""
        return await ask(subjects.query_subject(cluster, "ledger.series"),
                         {"node": node, "from_s": from_s, "to_s": to_s, "bucket_h": bucket_h}, timeout=30)

    return r
