"""Budget's request/reply handlers on a faststream router (msgspec-typed requests).

``budget.set``: change shares (answered once the change is in the log, or with an error and
an HTTP-like status); ``budget.history``: the audit log; ``healthz.budget``: its health report.
"""

from __future__ import annotations


from ..common import healthz, subjects
from ..common.auth import Caller
from ..common.broker import Message, NatsRouter


class CallerMsg(Message, kw_only=True):
    user: str
    manages: list[str] = []
    admin: bool = False


class BudgetSet(Message, kw_only=True):
    """Change the shares of tree nodes; ``request_id`` becomes the event id (a retry dedups)."""
    caller: CallerMsg
    shares: dict[str, float] = {}
    reason: str = ""
    request_id: str


def router(service, cluster: str) -> NatsRouter:
    """``service`` is a started-or-starting ``Budget`` (or None to describe the handlers only)."""
    r = NatsRouter()

    @r.subscriber(subjects.cmd_subject(cluster, "budget.set"), title="budget.set",
                  description="change shares; reply: changed + fractions once in the log, or error + status")
    async def budget_set(cmd: BudgetSet) -> dict:
        caller = Caller(cmd.caller.user, tuple(cmd.caller.manages), cmd.caller.admin)
        return await service.change(caller, cmd.shares, cmd.reason, cmd.request_id)

    @r.subscriber(subjects.query_subject(cluster, "budget.history"), title="budget.history",
                  description="every budget change (who, old, new, why) and the current shares")
    async def budget_history() -> dict:
        return await service.history()

    @r.subscriber(healthz.subject(cluster, "budget"), title="healthz.budget")
    async def health() -> dict:
        return await healthz.answer(service, "budget")

    return r
