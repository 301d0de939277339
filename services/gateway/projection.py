"""The gateway's read model: workloads (state + history), nodes and the current tree, from the log."""

from __future__ import annotations

import logging

import msgspec

from timeshare import events as ev
from timeshare.tree import AllocationTree

from ..common.store import Changes

log = logging.getLogger("timeshare.gateway")

STATE_OF = {
    ev.WorkloadSubmitted: "pending", ev.WorkloadStarted: "running", ev.WorkloadRequeued: "pending",
    ev.WorkloadCompleted: "completed", ev.WorkloadFailed: "failed", ev.WorkloadCancelled: "cancelled",
}


class Projection:
    """The fold of the gateway's read model; ``services.common.projector.Projector`` runs it."""

    def __init__(self, consumer: str, tree: AllocationTree):
        self.consumer = consumer
        self.tree = tree
        self.listeners: list = []  # callables(event) for waiters (tests, budget replies)
        #: pending workloads per user (the gateway's per-user limit), kept with the projection
        self.pending_by_user: dict[str, int] = {}

    async def load(self, store) -> None:
        doc = await store.get("tree", "current")
        if doc is not None:
            self.tree = AllocationTree.from_shares(doc["shares"])
        # once per start: the count follows the fold from here on
        self.pending_by_user = {}
        for _, d in await store.scan("workload"):
            if d.get("state") == "pending":
                self.pending_by_user[d["user"]] = self.pending_by_user.get(d["user"], 0) + 1

    async def begin(self, store, events: list[tuple[int, ev.Event]]) -> dict:
        ids = sorted({e.workload.id if isinstance(e, ev.WorkloadSubmitted) else e.workload_id
                      for _, e in events if hasattr(e, "workload_id") or isinstance(e, ev.WorkloadSubmitted)})
        docs = await store.get_many("workload", ids) if ids else {}
        return {"tree": self.tree, "docs": docs, "pending": {}}

    def fold(self, work: dict, seq: int, e: ev.Event, changes: Changes) -> dict:
        docs = work["docs"]
        wid = e.workload.id if isinstance(e, ev.WorkloadSubmitted) else getattr(e, "workload_id", None)
        before = docs[wid]["state"] if wid in docs else None
        self._fold(work, seq, e, changes)
        d = docs.get(wid) if wid is not None else None
        if d is not None and (before == "pending") != (d["state"] == "pending"):
            delta = work["pending"]
            delta[d["user"]] = delta.get(d["user"], 0) + (1 if d["state"] == "pending" else -1)
        return work

    def _fold(self, work: dict, seq: int, e: ev.Event, changes: Changes) -> dict:
        docs = work["docs"]
        body = msgspec.to_builtins(e)
        if isinstance(e, ev.WorkloadSubmitted):
            s = e.workload
            docs[s.id] = {"id": s.id, "cluster": e.cluster, "project": s.project, "user": s.user,
                          "gpu_type": s.gpu_type, "gpus": s.gpus, "state": "pending", "attempt": 0,
                          "submitted_ms": e.at_ms, "started_ms": None, "ended_ms": None, "placement": [],
                          "preemptions": 0, "spec": msgspec.to_builtins(s), "last_event": "workload.submitted",
                          "last_reason": None}
            changes.put("workload", s.id, docs[s.id])
            changes.append("workload", s.id, {"seq": seq, **body})
        elif hasattr(e, "workload_id"):
            d = docs.get(e.workload_id)
            if d is None:
                log.warning("event %s for unknown workload %s", e.event_id, e.workload_id)
                return work
            d["last_event"] = ev.event_type(e)
            if type(e) in STATE_OF:
                d["state"] = STATE_OF[type(e)]
            if isinstance(e, ev.WorkloadPreemptionNotice):
                # still running (its GPUs stay with it) until it checkpoints or the deadline
                d["notice"] = {"at_ms": e.at_ms, "deadline_ms": e.deadline_ms, "attempt": e.attempt,
                               "by_workload_id": e.reason.by_workload_id, "by_project": e.reason.by_project,
                               "kind": e.reason.kind, "message": e.reason.message, "checkpointed_ms": None}
            elif isinstance(e, ev.WorkloadCheckpointed):
                if d.get("notice"):
                    d["notice"]["checkpointed_ms"] = e.at_ms
            elif isinstance(e, ev.WorkloadStarted):
                d["attempt"] = e.attempt
                d["started_ms"] = d["started_ms"] or e.at_ms
                d["placement"] = [msgspec.to_builtins(p) for p in e.placement]
                d["protected_until_ms"] = e.protected_until_ms
                d["allocated"] = e.allocated
            elif isinstance(e, ev.MinRuntimeReached):
                d["protected_until_ms"] = None
            elif isinstance(e, ev.WorkloadPreempted):
                d.pop("notice", None)
                d["preemptions"] += 1
                d["placement"] = []
                d["state"] = "pending" if e.resumable else "preempted"
                d["last_reason"] = msgspec.to_builtins(e.reason)
                if not e.resumable:
                    d["ended_ms"] = e.at_ms
            elif isinstance(e, (ev.WorkloadCompleted, ev.WorkloadFailed, ev.WorkloadCancelled)):
                d.pop("notice", None)
                d["placement"] = []
                d["ended_ms"] = e.at_ms
                if isinstance(e, ev.WorkloadFailed):
                    d["last_reason"] = {"kind": "failed", "message": e.reason}
            changes.put("workload", e.workload_id, d)
            changes.append("workload", e.workload_id, {"seq": seq, **body})
        elif isinstance(e, (ev.NodeUnhealthy, ev.NodeFailed, ev.NodeDrained, ev.NodeRepaired)):
            state = {ev.NodeUnhealthy: "cordoned", ev.NodeFailed: "down", ev.NodeDrained: "drained",
                     ev.NodeRepaired: "healthy"}[type(e)]
            changes.put("node", e.node, {"node": e.node, "state": state, "since_ms": e.at_ms,
                                         "reason": getattr(e, "reason", "")})
            changes.append("node", e.node, {"seq": seq, **body})
        elif isinstance(e, ev.BudgetChanged):
            work["tree"] = ev.tree_after(e, work["tree"])
            changes.put("tree", "current", {"shares": work["tree"].shares(), "seq": seq})
        return work

    def committed(self, work: dict, events: list[tuple[int, ev.Event]]) -> None:
        self.tree = work["tree"]
        for user, delta in work.get("pending", {}).items():
            self.pending_by_user[user] = max(0, self.pending_by_user.get(user, 0) + delta)
        for _, e in events:
            for listener in self.listeners:
                listener(e)
