"""Placement's inbox loop and the shell's rules for proposed events.

Loop: fetch proposed events from the inbox -> validate each against the state (``_accept``) ->
apply it -> run the core's scheduling pass (``BudgetPolicy.schedule``) -> append the accepted
inputs and the pass's decisions to the log (log.py) -> ack the inbox.

Inputs refused (dead-lettered with the reason): undecodable messages; decisions only
placement makes (started, preempted, ...); a submission that breaks the contract or reuses a
workload id; an executor report for a workload that is not running that attempt (stale); a
cancel of a finished workload; health changes for unknown nodes or nodes not in that state.
A mixin of ``Placement`` (service.py), whose ``__init__`` declares the state it reads and sets.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
import nats.errors

from timeshare import events as ev
from timeshare.cluster import NODE_HEALTHY, PlacementError
from timeshare.drains import drain_needs_human
from timeshare.state import ENDED, RUNNING
from timeshare.tree import TreeError
from timeshare.units import ms_to_s
from timeshare.workload import ContractError

from ..common import subjects, telemetry
from ..common.bus import decode_event, reply_json
from ..common.ids import attempt_of
from .log import notice_problem

log = logging.getLogger("timeshare.placement")

PROPOSABLE = (ev.WorkloadSubmitted, ev.WorkloadCompleted, ev.WorkloadFailed, ev.WorkloadCancelled,
              ev.WorkloadCheckpointed, ev.NodeUnhealthy, ev.NodeFailed, ev.NodeRepaired, ev.BudgetChanged)



#: why an id may be unknown to placement although it was submitted once (forget_ended)
FORGOTTEN_HINT = " (never submitted, or ended more than TIMESHARE_FORGET_ENDED_AFTER_S ago and forgotten)"


class Rejected(Exception):
    pass



_raw_object = msgspec.json.Decoder(dict)


def unknown_fields(raw: bytes, e: ev.Event) -> str | None:
    """The first top-level field of a proposed event that its type does not have (None: none).

    Events are not declared with ``forbid_unknown_fields`` (a log written by a newer version must
    stay readable); a *proposal* is checked here instead, so ``{"admin": true, ...}`` or a typo
    is refused rather than silently dropped. (A submission's workload is a WorkloadSpec, which
    forbids unknown fields itself.)"""
    known = type(e).__struct_fields__
    for key in _raw_object.decode(raw):
        if key != "type" and key not in known:
            return key
    return None


class Tick(msgspec.Struct, frozen=True):
    at_ms: int



class InboxLoop:
    # -- the loop ---------------------------------------------------------------------------
    def _now_ms(self) -> int:
        return max(self.clock.now_ms(), self.state.last_event_ms)

    def _fetch_timeout(self) -> float:
        if self.clock.manual:
            return 0.2
        timeout = min(0.5, self.settings.pass_interval_s)
        nxt = self._next_wake_s()
        if nxt is not None:
            timeout = min(timeout, max(0.01, nxt - self.clock.now_ms() / 1000))
        return timeout

    def _next_wake_s(self) -> float | None:
        """When the state next needs a pass by itself: a protection that ends, or the deadline of
        a notice (the victim that has not reported its checkpoint is preempted then and its
        GPUs go to the preemptor)."""
        return self.state.next_wake_s()

    async def _loop(self) -> None:
        durable = f"placement-{self.cluster}"
        sub = await self.bus.js.pull_subscribe_bind(durable, subjects.INBOX_STREAM)
        epoch = self.bus.reconnects
        try:
            while not self.stop_event.is_set():
                try:
                    msgs = await sub.fetch(1000, timeout=self._fetch_timeout())
                except (nats.errors.TimeoutError, asyncio.TimeoutError):  # nothing proposed
                    msgs = []
                if self.bus.reconnects != epoch:
                    # a batch in flight when the connection dropped is lost; the next "ack all
                    # up to" would ack it unseen: deliver again everything above the ack floor
                    # (applied ids are skipped)
                    log.warning("placement %s: NATS reconnected; rewinding the inbox to its ack floor", self.instance)
                    await sub.unsubscribe()
                    await self.bus.rewind_to_ack_floor(subjects.INBOX_STREAM, durable)
                    sub = await self.bus.js.pull_subscribe_bind(durable, subjects.INBOX_STREAM)
                    epoch = self.bus.reconnects
                    continue
                await self._process(msgs)
        finally:
            try:
                await sub.unsubscribe()
            except Exception:
                pass

    async def _process(self, msgs: list) -> None:
        state = self.state
        out: list[ev.Event] = []
        dead: list[tuple[object, str]] = []
        replies: list[tuple[str, dict]] = []
        accepted = 0
        self._end_spans(appended=False)  # left by a batch that failed before its append
        with self.tracer.start_as_current_span("placement.batch") as span:
            for m in msgs:
                if m.subject.endswith("." + subjects.TICK):
                    try:
                        tick = msgspec.json.decode(m.data, type=Tick)
                    except msgspec.DecodeError as exc:
                        dead.append((m, f"undecodable tick: {exc}"))
                        continue
                    out += self._pass(max(tick.at_ms, state.last_event_ms))
                    reply = (m.headers or {}).get("Timeshare-Reply")
                    if reply:
                        nxt = state.next_protection_expiry_s()
                        # a pass that held a preemption back (rule "no cascade") asks for another
                        retry = state.retry_at_s
                        state.retry_at_s = None
                        notice = state.next_notice_deadline_s()
                        replies.append((reply, {"at_ms": tick.at_ms, "pending": state.pending_count,
                                                "running": len(state.running),
                                                "next_protection_expiry_ms": state.ms(nxt) if nxt is not None else None,
                                                "retry_at_ms": state.ms(retry) if retry is not None else None,
                                                # a driver ticks at a notice's deadline (the victim is
                                                # preempted then unless it reported its checkpoint)
                                                "next_notice_deadline_ms":
                                                    state.ms(notice) if notice is not None else None}))
                    continue
                try:
                    e = decode_event(m.data)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    dead.append((m, f"undecodable event: {exc}"))
                    continue
                unknown = unknown_fields(m.data, e)
                if unknown:
                    dead.append((m, f"{ev.event_type(e)} {e.event_id}: unknown field {unknown!r} (a typo, or "
                                    "a field this version does not know: refused rather than ignored)"))
                    self.stats["rejected"] += 1
                    continue
                if e.event_id in self.applied_ids:
                    self.stats["duplicates"] += 1
                    continue
                try:
                    accepted_events = self._accept(e)
                except Rejected as exc:
                    dead.append((m, str(exc)))
                    self.stats["rejected"] += 1
                    continue
                for a in accepted_events:
                    self._trace_input(a, m)
                    state.apply(a)
                    self._remember(a)
                out += accepted_events
                accepted += 1
            self.stats["inputs"] += accepted
            if not self.clock.manual:
                now_wall = time.monotonic()
                # a checkpoint reported is an accepted input: the pass below hands its GPUs over
                nxt = self._next_wake_s()
                due = nxt is not None and nxt * 1000 <= self.clock.now_ms()
                if accepted or due or now_wall - self.last_pass_wall >= self.settings.pass_interval_s:
                    out += self._pass(self._now_ms())
            span.set_attribute("timeshare.inputs", accepted)
            span.set_attribute("timeshare.events", len(out))
            if out:
                await self._append(out)
                self._maybe_snapshot(len(out))
            self.event_ctx.clear()
        for m, reason in dead:
            await self.bus.dead_letter(f"placement-{self.cluster}", m, reason)
        if msgs:
            # each message its own ack (the inbox durable is AckExplicit): a deposed leader that
            # has not yet noticed it lost the lease acks only what it appended itself, never
            # what the new leader fetched and had fenced out (an AckAll did: a submission lost)
            for m in msgs:
                await m.ack()
        for reply, body in replies:
            body["log_seq"] = self.last_log_seq  # the log holds the pass's decisions up to here
            await self.bus.nc.publish(reply, reply_json(body))

    def _remember(self, e: ev.Event) -> None:
        """Keep the id of an applied proposed event while its workload lives; forget them all
        when it ends. ``applied_ids`` skips a proposal seen again after JetStream's dedup window;
        once the workload has ended the state's rules refuse a repeat anyway (a reused id, a
        stale report, a cancel of an ended workload: dead-lettered with the reason), so its ids
        need not be kept for ever. Placement's own decisions are never proposed: not kept."""
        wid = e.workload.id if isinstance(e, ev.WorkloadSubmitted) else getattr(e, "workload_id", None)
        if isinstance(e, PROPOSABLE):
            self.applied_ids.add(e.event_id)
            if wid is not None:
                self.ids_of.setdefault(wid, []).append(e.event_id)
        ended = isinstance(e, (ev.WorkloadCompleted, ev.WorkloadFailed, ev.WorkloadCancelled)) or (
            isinstance(e, ev.WorkloadPreempted) and not e.resumable)
        if ended and wid is not None:
            for i in self.ids_of.pop(wid, ()):
                self.applied_ids.discard(i)
            self.trace_ctx.pop(wid, None)

    def _pass(self, now_ms: int) -> list[ev.Event]:
        now_s = ms_to_s(now_ms)
        with self.tracer.start_as_current_span("placement.pass") as span:
            start_ns = time.time_ns()
            decisions = self.policy.schedule(self.state, now_s)
            if telemetry.enabled():
                self._trace_decisions(decisions, span, start_ns)
            self.decided.extend(decisions)  # counted in the metrics once the log holds them
            for e in decisions:
                self._remember(e)
                if isinstance(e, (ev.WorkloadPreempted, ev.WorkloadPreemptionNotice)):
                    # the reasons as data, on the trace: why this workload was preempted
                    span.add_event("preempted" if isinstance(e, ev.WorkloadPreempted) else "notified",
                                   {"workload_id": e.workload_id, "reason": e.reason.kind,
                                    "message": e.reason.message})
            span.set_attribute("timeshare.decisions", len(decisions))
        self.stats["passes"] += 1
        self.stats["decisions"] += len(decisions)
        self.last_pass_wall = time.monotonic()
        return decisions

    # -- the shell's rules for proposed events -------------------------------------------
    def _accept(self, e: ev.Event) -> list[ev.Event]:
        state = self.state
        if not isinstance(e, PROPOSABLE):
            raise Rejected(f"{ev.event_type(e)} is decided by placement only; it cannot be proposed")
        if e.cluster != self.cluster:
            raise Rejected(f"event for cluster {e.cluster!r} sent to cluster {self.cluster!r}")
        at_ms = max(e.at_ms, state.last_event_ms)
        if at_ms != e.at_ms:
            e = msgspec.structs.replace(e, at_ms=at_ms)
        now_s = at_ms / 1000
        match e:
            case ev.WorkloadSubmitted():
                try:
                    state.validate_submission(e.workload)
                except (ContractError, TreeError, PlacementError, ValueError) as exc:
                    raise Rejected(f"submission {e.workload.id}: {exc}") from None
                return [e]
            case ev.WorkloadCompleted() | ev.WorkloadFailed():
                w = state.workloads.get(e.workload_id)
                if w is None:
                    raise Rejected(f"unknown workload {e.workload_id!r}{FORGOTTEN_HINT}")
                attempt = e.attempt if e.attempt is not None else attempt_of(e.event_id)  # older ids say it
                if w.state != RUNNING or (attempt is not None and attempt != w.attempt):
                    raise Rejected(f"stale report for {e.workload_id}: it is {w.state} in attempt {w.attempt}, "
                                   f"the report is about attempt {attempt}")
                return [e]
            case ev.WorkloadCheckpointed():
                problem = notice_problem(state, e)
                if problem is not None:
                    raise Rejected(problem + (FORGOTTEN_HINT if e.workload_id not in state.workloads else ""))
                return [e]
            case ev.WorkloadCancelled():
                w = state.workloads.get(e.workload_id)
                if w is None:
                    raise Rejected(f"unknown workload {e.workload_id!r}{FORGOTTEN_HINT}")
                if w.state in ENDED:
                    raise Rejected(f"{e.workload_id} already ended ({w.state})")
                return [e]
            case ev.NodeUnhealthy():
                node = self._node(e.node)
                if node.state != NODE_HEALTHY:
                    raise Rejected(f"node {e.node} is already {node.state}")
                # the core's rule, as the simulator applies it (timeshare.drains)
                needs_human = drain_needs_human(state, node, now_s, self.policy.drain_blocked_until_s)
                return [msgspec.structs.replace(e, needs_human=e.needs_human or needs_human)]
            case ev.NodeFailed():
                node = self._node(e.node)
                if node.state in ("down",):
                    raise Rejected(f"node {e.node} is already down")
                derived = state.node_failed(e.node, now_s, e.reason)
                return [msgspec.structs.replace(derived[0], event_id=e.event_id), *derived[1:]]
            case ev.NodeRepaired():
                node = self._node(e.node)
                # a cordoned node: a cordon taken back (`timeshare nodes uncordon`) before it drained
                if node.state not in ("cordoned", "drained", "down"):
                    raise Rejected(f"node {e.node} is {node.state}; only cordoned, drained or down nodes are repaired")
                return [e]
            case ev.BudgetChanged():
                conflict = ev.budget_conflict(e, state.tree)
                if conflict is not None:
                    raise Rejected(f"budget change: {conflict}")
                try:
                    tree = ev.tree_after(e, state.tree)
                except TreeError as exc:
                    raise Rejected(f"budget change: {exc}") from None
                # work is charged to a leaf and queued under it: a change that removes a leaf
                # holding work, or makes it a parent, would hide that work from every pass
                hidden = sorted(leaf for leaf in self._work_by_leaf()
                                if leaf not in tree.nodes or not tree.nodes[leaf].is_leaf)
                if hidden:
                    raise Rejected(f"budget change: {', '.join(hidden[:5])} hold(s) pending or running work and "
                                   "would no longer be a leaf")
                return [e]
        raise Rejected(f"unexpected event {ev.event_type(e)}")

    def _work_by_leaf(self) -> dict[str, int]:
        """Pending or running workloads per leaf (what a budget change must not hide)."""
        out: dict[str, int] = {}
        for w in self.state.workloads.values():
            if w.state not in ENDED:
                out[w.leaf] = out.get(w.leaf, 0) + 1
        return dict(sorted(out.items()))

    def _node(self, name: str):
        try:
            return self.state.cluster.node(name)
        except PlacementError as exc:
            raise Rejected(str(exc)) from None
