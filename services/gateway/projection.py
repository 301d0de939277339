"""The gateway's read model: workloads (state + history), nodes and the current tree, from the log."""

from __future__ import annotations

import logging

import msgspec

from timeshare import events as ev
from timeshare.tree import AllocationTree

from ..common.bus import decode_event
from ..common.store import Changes

log = logging.getLogger("timeshare.gateway")

STATE_OF = {
    ev.WorkloadSubmitted: "pending", ev.WorkloadStarted: "running", ev.WorkloadRequeued: "pending",
    ev.WorkloadCompleted: "completed", ev.WorkloadFailed: "failed", ev.WorkloadCancelled: "cancelled",
}


class Projection:
    def __init__(self, store, consumer: str, tree: AllocationTree, bus=None):
        self.store = store
        self.consumer = consumer
        self.tree = tree
        self.bus = bus
        self.last_seq = 0
        self.listeners: list = []  # callables(event) for waiters (tests, budget replies)

    async def load(self) -> int:
        self.last_seq = await self.store.last_seq(self.consumer)
        doc = await self.store.get("tree", "current")
        if doc is not None:
            self.tree = AllocationTree.from_shares(doc["shares"])
        return self.last_seq

    async def handle(self, msgs) -> None:
        fresh = []
        for m in msgs:
            seq = m.metadata.sequence.stream
            if seq <= self.last_seq:
                continue  # redelivered: already applied
            try:
                fresh.append((seq, decode_event(m.data)))
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                if self.bus is not None:
                    await self.bus.dead_letter(self.consumer, m, f"undecodable event: {exc}")
        if not fresh:
            return
        ids = sorted({e.workload.id if isinstance(e, ev.WorkloadSubmitted) else e.workload_id
                      for _, e in fresh if hasattr(e, "workload_id") or isinstance(e, ev.WorkloadSubmitted)})
        docs = await self.store.get_many("workload", ids) if ids else {}
        changes = Changes()
        tree = self.tree
        for seq, e in fresh:
            body = msgspec.to_builtins(e)
            if isinstance(e, ev.WorkloadSubmitted):
                s = e.workload
                docs[s.id] = {"id": s.id, "cluster": e.cluster, "project": s.project, "user": s.user,
                              "gpu_type": s.gpu_type, "gpus": s.gpus, "state": "pending", "attempt": 0,
                              "submitted_ms": e.at_ms, "started_ms": None, "ended_ms": None, "placement": [],
                              "preemptions": 0, "spec": msgspec.to_builtins(s), "last_event": "workload.submitted",
                              "last_reason": None}
                changes.append("workload", s.id, {"seq": seq, **body})
            elif hasattr(e, "workload_id"):
                d = docs.get(e.workload_id)
                if d is None:
                    log.warning("event %s for unknown workload %s", e.event_id, e.workload_id)
                    continue
                d["last_event"] = ev.event_type(e)
                if type(e) in STATE_OF:
                    d["state"] = STATE_OF[type(e)]
                if isinstance(e, ev.WorkloadStarted):
                    d["attempt"] = e.attempt
                    d["started_ms"] = d["started_ms"] or e.at_ms
                    d["placement"] = [msgspec.to_builtins(p) for p in e.placement]
                    d["protected_until_ms"] = e.protected_until_ms
                    d["allocated"] = e.allocated
                elif isinstance(e, ev.MinRuntimeReached):
                    d["protected_until_ms"] = None
                elif isinstance(e, ev.WorkloadPreempted):
                    d["preemptions"] += 1
                    d["placement"] = []
                    d["state"] = "pending" if e.resumable else "preempted"
                    d["last_reason"] = msgspec.to_builtins(e.reason)
                    if not e.resumable:
                        d["ended_ms"] = e.at_ms
                elif isinstance(e, (ev.WorkloadCompleted, ev.WorkloadFailed, ev.WorkloadCancelled)):
                    d["placement"] = []
                    d["ended_ms"] = e.at_ms
                    if isinstance(e, ev.WorkloadFailed):
                        d["last_reason"] = {"kind": "failed", "message": e.reason}
                changes.append("workload", e.workload_id, {"seq": seq, **body})
            elif isinstance(e, (ev.NodeUnhealthy, ev.NodeFailed, ev.NodeDrained, ev.NodeRepaired)):
                state = {ev.NodeUnhealthy: "cordoned", ev.NodeFailed: "down", ev.NodeDrained: "drained",
                         ev.NodeRepaired: "healthy"}[type(e)]
                changes.put("node", e.node, {"node": e.node, "state": state, "since_ms": e.at_ms,
                                             "reason": getattr(e, "reason", "")})
                changes.append("node", e.node, {"seq": seq, **body})
            elif isinstance(e, ev.BudgetChanged):
                tree = AllocationTree.from_shares(e.new)
                changes.put("tree", "current", {"shares": e.new, "seq": seq})
        for wid, d in docs.items():
            changes.put("workload", wid, d)
        last = fresh[-1][0]
        if await self.store.commit(self.consumer, last, changes):
            self.last_seq = last
            self.tree = tree
            for _, e in fresh:
                for listener in self.listeners:
                    listener(e)
