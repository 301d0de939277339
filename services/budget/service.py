"""Budget: owns the allocation tree. Changes arrive as commands (NATS request/reply).

A caller may change the shares of the children of any node they manage; admins may change
any. A valid change becomes a ``budget.changed`` event (who, why, and each share it changes
with the one it replaces) proposed to placement, which refuses it when the shares it replaces
are no longer the log's (events.budget_conflict); the service answers once the event is in the
log (its own projection saw it), so the reply means "in force"; a change placement refused is a
409 with placement's reason (its dead letter, which the service follows). The projection (current
shares + history, with the applied stream sequence in the same transaction) is the audit log
behind ``GET /v1/allocations/history``.
Commands are handled one at a time, so two managers never overwrite each other's change.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
import nats

from timeshare import events as ev
from timeshare.tree import AllocationTree, TreeError, check_change, check_removal

from ..common import healthz, payload, subjects
from ..common.auth import Caller
from ..common.bus import Bus
from ..common.cluster_config import ClusterConfig
from ..common.settings import Settings
from ..common.projector import Projector
from ..common.store import Changes, make_store

log = logging.getLogger("timeshare.budget")


class Unanswered(Exception):
    pass


class _Refused(msgspec.Struct):
    """Placement's answer to a proposed change it did not append (its dead letter)."""
    reason: str


class _EventId(msgspec.Struct):
    """The one field of a dead-lettered event the budget service reads."""
    event_id: str = ""


#: changes per page of the history (GET /v1/allocations/history?limit=), and the most one page holds
HISTORY_PAGE = 100
HISTORY_PAGE_MAX = 1000


class Budget:
    def __init__(self, settings: Settings, config: ClusterConfig, clock, bus: Bus | None = None, store=None):
        self.settings = settings
        self.config = config
        self.cluster = config.name
        self.clock = clock
        self.bus = bus
        self.own_bus = bus is None
        self.store = store or make_store(settings.database_url, "budget")
        self.consumer = f"budget-{self.cluster}"
        self.tree = config.tree()
        self.projector: Projector | None = None
        self.lock = asyncio.Lock()
        self.waiters: dict[str, asyncio.Future] = {}
        self.stop_event = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.broker = None
        self.refusals = None  # the subscription to placement's dead letters (start)

    async def start(self, broker=None) -> "Budget":
        """``broker``: the faststream broker with this service's handlers (``main.py`` builds it);
        without one, the handlers of ``handlers.py`` on a broker of its own."""
        if self.bus is None:
            self.bus = await Bus.connect(self.settings, self.cluster, name="budget")
        await self.bus.ensure_infra()
        await self.store.open()
        await self.load(self.store)
        self.projector = await Projector(self, self.bus, self.store, self.stop_event,
                                         stuck_after_s=self.settings.stuck_after_s).start()
        # a change placement refuses (made from shares the log no longer holds, or one that
        # would hide work) is dead-lettered with the reason, never appended: the caller waiting
        # for it hears that reason at once instead of "unconfirmed" ten seconds later
        self.refusals = await self.bus.nc.subscribe(subjects.dlq_subject(f"placement-{self.cluster}"),
                                                    cb=self._on_dead_letter)
        # commands and queries are answered once the tree is loaded and followed
        self.broker = broker or default_broker(self)
        await self.broker.start()
        return self

    async def health_report(self) -> dict:
        return healthz.projector_report("budget", [self.projector], self.bus)

    async def stop(self) -> None:
        self.stop_event.set()
        if self.refusals is not None:
            try:
                await self.refusals.unsubscribe()
            except Exception:  # noqa: BLE001 (a closed connection has no subscription left)
                pass
        if self.projector is not None:
            await self.projector.close()
        if self.broker is not None:
            await self.broker.stop()
        for t in self.tasks:
            try:
                await asyncio.wait_for(t, 3)
            except (asyncio.TimeoutError, Exception):
                t.cancel()
        await self.store.close()
        if self.own_bus:
            await self.bus.close()

    # -- projection ---------------------------------------------------------------------------
    async def load(self, store) -> None:
        doc = await store.get("tree", "current")
        self.tree = AllocationTree.from_shares(doc["shares"]) if doc is not None else self.config.tree()

    async def begin(self, store, events) -> dict:
        return {"tree": self.tree, "seen": []}

    def fold(self, work: dict, seq: int, e: ev.Event, changes: Changes) -> dict:
        if isinstance(e, ev.BudgetChanged):
            work["tree"] = ev.tree_after(e, work["tree"])
            changes.put("tree", "current", {"shares": work["tree"].shares()})
            # what changed, as the event carries it (one written before then: its two whole maps'
            # difference): a 10,000-leaf tree changed many times would otherwise outgrow the
            # history's answer (and the store) with copies of itself
            changed = e.changed if e.new is None else ev.share_changes(e.old or {}, e.new)
            changes.append("history", self.cluster, {"seq": seq, "event_id": e.event_id, "at_ms": e.at_ms,
                                                     "by": e.by, "reason": e.reason,
                                                     "changed": msgspec.to_builtins(changed)})
            work["seen"].append(e.event_id)
        return work

    def committed(self, work: dict, events) -> None:
        self.tree = work["tree"]
        for eid in work["seen"]:
            fut = self.waiters.pop(eid, None)
            if fut is not None and not fut.done():
                fut.set_result(True)

    async def _on_dead_letter(self, msg) -> None:
        """A proposal of this service's that placement refused: its waiter gets the reason
        (any other dead letter, or one that does not decode, is not the budget service's)."""
        if not self.waiters:
            return
        try:
            event_id = msgspec.json.decode(msg.data, type=_EventId).event_id
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        fut = self.waiters.get(event_id)
        if fut is not None and not fut.done():
            fut.set_result(_Refused(reason=(msg.headers or {}).get("Timeshare-Reason", "no reason given")))

    @property
    def last_seq(self) -> int:
        return self.projector.applied_seq if self.projector is not None else 0

    # -- commands -----------------------------------------------------------------------------
    async def change(self, caller: Caller, shares: dict[str, float], reason: str, request_id: str) -> dict:
        """Validate and apply a change; returns the reply body (with ``status`` on refusal)."""
        if not shares:
            return {"error": "no shares given", "status": 400}
        if not reason.strip():
            return {"error": "reason: say why (it goes into the audit log)", "status": 400}
        async with self.lock:
            done = await self._applied(request_id)
            if done is not None:  # a retry (same Idempotency-Key): the first answer again
                # (the paths it named whose share it changed: a share set to what it was is not
                # in the history)
                changed = changed_of(done)
                return {"event_id": request_id, "replayed": True,
                        "changed": {p: changed[p] for p in sorted(shares) if p in changed},
                        "fractions": {p: round(n.fraction, 6) for p, n in sorted(self.tree.nodes.items())}}
            refused = sorted(p for p in shares if not caller.may_change_share_of(p))
            if refused:
                managed = ", ".join(caller.manages) or "nothing"
                return {"error": f"{caller.user} manages {managed}; may not change {', '.join(refused)} "
                                 "(a manager changes the shares of children of nodes they manage)", "status": 403}
            try:
                work = await self._work_by_leaf() if any(p not in self.tree.nodes for p in shares) else {}
                new_tree = check_change(self.tree, shares, work)
            except (TreeError, TypeError, ValueError) as exc:
                return {"error": f"invalid allocation: {exc}", "status": 400}
            except Unanswered as exc:
                return {"error": str(exc), "status": 503}
            reply = await self._propose(caller, reason, request_id, new_tree)
            if "error" in reply or reply.get("state") == "unconfirmed":
                return reply
            # (the node's share: the whole map built for each path cost 2 s for 1,000 new leaves)
            changed = {p: {"old": reply["old"].get(p), "new": new_tree.nodes[p].share} for p in sorted(shares)}
            return {"event_id": reply["event_id"], "changed": changed,
                    "fractions": {p: round(n.fraction, 6) for p, n in sorted(self.tree.nodes.items())}}

    async def remove(self, caller: Caller, path: str, reason: str, request_id: str) -> dict:
        """Retire ``path`` (and its subtree) once no pending or running work is charged below it."""
        if not reason.strip():
            return {"error": "reason: say why (it goes into the audit log)", "status": 400}
        async with self.lock:
            done = await self._applied(request_id)
            if done is not None:  # a retry (same Idempotency-Key): the first answer again
                return {"event_id": request_id, "replayed": True,
                        "removed": sorted(p for p, c in changed_of(done).items() if c["new"] is None)}
            if not caller.may_change_share_of(path):
                return {"error": f"{caller.user} manages {', '.join(caller.manages) or 'nothing'}; may not remove "
                                 f"{path} (a manager retires children of nodes they manage)", "status": 403}
            if path not in self.tree.nodes:
                return {"error": f"path: unknown allocation {path!r}", "status": 404}
            try:
                new_tree = check_removal(self.tree, path, await self._work_by_leaf())
            except TreeError as exc:
                return {"error": f"path: {exc}", "status": 409}
            except Unanswered as exc:
                return {"error": str(exc), "status": 503}
            reply = await self._propose(caller, reason, request_id, new_tree)
            if "error" in reply or reply.get("state") == "unconfirmed":
                return reply
            # the path removed, everything below it with it (as the event and the history say it)
            return {"event_id": reply["event_id"], "removed": sorted(p for p, c in reply["changed"].items()
                                                                     if c.new is None)}

    async def _work_by_leaf(self) -> dict[str, int]:
        """Pending or running workloads per leaf, from placement (which holds them)."""
        try:
            msg = await self.bus.nc.request(subjects.query_subject(self.cluster, "work"), b"{}", timeout=5)
            return payload.decode(msg)["work_by_leaf"]
        except Exception:
            raise Unanswered("placement did not say which leaves hold work (is it running?); nothing changed") \
                from None

    async def _propose(self, caller: Caller, reason: str, request_id: str, new_tree: AllocationTree) -> dict:
        old = self.tree.shares()
        # only what changes, each share with the one it was made from: placement refuses it when
        # another change came first (events.budget_conflict)
        event = ev.BudgetChanged(event_id=request_id, at_ms=self.clock.now_ms(), cluster=self.cluster,
                                 by=caller.user, reason=reason, changed=ev.share_changes(old, new_tree.shares()))
        fut = asyncio.get_running_loop().create_future()
        self.waiters[event.event_id] = fut
        try:
            await self.bus.propose(event)
            answer = await asyncio.wait_for(fut, 10)
        except nats.errors.MaxPayloadError:
            # not sent: say so, rather than "it may be applied" ten seconds later
            size = len(ev.encoder.encode(event))
            return {"error": f"the change is {size:,} bytes, over the message limit of the bus "
                             f"({self.bus.nc.max_payload:,} bytes); nothing changed: change fewer shares at a time",
                    "status": 413}
        except asyncio.TimeoutError:
            # not 503: it may still be applied (issue 22, finding 2); the same request id again
            # is the same change, applied at most once
            return {"state": "unconfirmed", "event_id": event.event_id, "request_id": request_id,
                    "detail": "the change was sent but is not in the log yet (is placement running?); "
                              "send it again with the same Idempotency-Key to know"}
        finally:
            self.waiters.pop(event.event_id, None)
        if isinstance(answer, _Refused):
            return {"error": f"placement refused the change: {answer.reason}; nothing changed", "status": 409}
        return {"event_id": event.event_id, "old": old, "changed": event.changed}

    async def _applied(self, request_id: str) -> dict | None:
        """The history entry of a change already applied under this request id, if any."""
        if not request_id.startswith("budget."):
            return None
        for entry in reversed(await self.store.journal("history", self.cluster)):
            if entry.get("event_id") == request_id:
                return entry
        return None

    async def history(self, limit: int = HISTORY_PAGE, before_seq: int | None = None) -> dict:
        """The newest ``limit`` changes (before ``before_seq``, a change's ``seq``), oldest first,
        each with what it changed; ``older_before_seq``: where the next page back starts (None:
        no older change)."""
        if not 1 <= limit <= HISTORY_PAGE_MAX:
            return {"error": f"limit: between 1 and {HISTORY_PAGE_MAX}, not {limit}", "status": 400}
        page, older = await self.store.journal_page("history", self.cluster, limit, before_seq)
        return {"cluster": self.cluster,
                "changes": [{k: v for k, v in h.items() if k not in ("old", "new")} | {"changed": changed_of(h)}
                            for h in page],
                "older_before_seq": page[0]["seq"] if older else None,
                "current": self.tree.shares()}


def changed_of(entry: dict) -> dict[str, dict]:
    """A history entry's changes (entries written before the history kept only what changed
    hold both whole maps)."""
    if "changed" in entry:
        return entry["changed"]
    return msgspec.to_builtins(ev.share_changes(entry.get("old") or {}, entry.get("new") or {}))


def default_broker(service: Budget):
    from ..common.broker import make_broker
    from .handlers import router

    return make_broker(service.settings, "budget", router(service, service.cluster))
