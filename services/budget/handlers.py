"""Budget's request/reply handlers on a faststream router (msgspec-typed requests).

``budget.set``: change shares (answered once the change is in the log, or with an error and
an HTTP-like status); ``budget.remove``: retire a node that holds no work; ``budget.history``:
the audit log; ``healthz.budget``: its health report. The command bodies are the strict
structs of ``services/common/commands.py`` (unknown fields refused, 400 naming them).
"""

from __future__ import annotations

import msgspec

from ..common import healthz, payload, subjects
from ..common.auth import Caller
from ..common.broker import Message, NatsRouter
from ..common.commands import BudgetRemove, BudgetSet
from .service import HISTORY_PAGE


class HistoryQuery(Message, kw_only=True):
    """A page of the audit log: the newest ``limit`` changes before ``before_seq`` (None: the newest)."""
    limit: int = HISTORY_PAGE
    before_seq: int | None = None


def _caller(body) -> Caller:
    return Caller.from_dict(msgspec.to_builtins(body))


def router(service, cluster: str) -> NatsRouter:
    """``service`` is a started-or-starting ``Budget`` (or None to describe the handlers only)."""
    r = NatsRouter()

    @r.subscriber(subjects.cmd_subject(cluster, "budget.set"), title="budget.set",
                  description="change shares; reply: changed + fractions once in the log, or error + status")
    async def budget_set(cmd: BudgetSet) -> dict:
        return payload.answer(await service.change(_caller(cmd.caller), cmd.shares, cmd.reason, cmd.request_id))

    @r.subscriber(subjects.cmd_subject(cluster, "budget.remove"), title="budget.remove",
                  description="retire a node and its subtree once no pending or running work is charged below "
                              "it; reply: the path removed (its subtree goes with it), or error + status (403, 404, 409 naming the busy leaves)")
    async def budget_remove(cmd: BudgetRemove) -> dict:
        return payload.answer(await service.remove(_caller(cmd.caller), cmd.path, cmd.reason, cmd.request_id))

    @r.subscriber(subjects.query_subject(cluster, "budget.history"), title="budget.history",
                  description="the newest budget changes (who, why, each share's old and new value; a page of "
                              "`limit` before `before_seq`) and the current shares")
    async def budget_history(q: HistoryQuery) -> dict:
        return payload.answer(await service.history(q.limit, q.before_seq))

    @r.subscriber(healthz.subject(cluster, "budget"), title="healthz.budget")
    async def health() -> dict:
        return await healthz.answer(service, "budget")

    return r
