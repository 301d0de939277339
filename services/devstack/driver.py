"""Drive a simulator scenario through the live services on a manual clock (the parity run).

This is ``timeshare.sim.engine.run``'s loop with the services doing the work. The driver only
owns time: it jumps from one moment to the next (the same moments the simulator visits:
submissions, ends of work, ends of minimum runtimes, node events, repairs) and at each one

1. sets the shared :class:`~services.common.clock.ManualClock`,
2. submits the trace's workloads of that moment over HTTP (gateway -> inbox),
3. asks the simulated executor to end the work due by now (``executor.advance``; it reports
   ``completed`` stamped at each workload's own end, in the order the work started),
4. reports the scenario's node events (``POST /v1/nodes/{n}/health``) and declares repairs
   (``POST /v1/nodes/{n}/repair``) the way an operator would,
5. sends ``control.tick`` to placement, which runs one scheduling pass at that time and
   replies once its decisions are in the log,

then reads the new log events to learn the next moments (a start implies its end and the end
of its protection; a drain the repair; a notice its deadline and the moment its checkpoint is
written, modelled as the simulator models it: ``timeshare.sim.storage``, the simulated
executor reporting ``workload.checkpointed`` when ``advance`` reaches that moment). Placement decides everything; the driver never
applies an event itself. Non-resumable preemptions (the simulator resubmits them after
``resubmit_delay``) are not replayed: a scenario for the parity run keeps preemptible work
resumable.
"""

from __future__ import annotations

import asyncio
import heapq
import time
import uuid

import httpx
import msgspec

from timeshare import events as ev
from timeshare.scheduler import BudgetPolicy
from timeshare.sim.storage import CheckpointStorage

from ..common import subjects
from ..common.bus import reply_json

#: the simulator's order within one moment (its resubmissions are not replayed here)
_COMPLETE, _WAKE, _NODE, _REPAIR, _CHECKPOINT = range(5)

#: the decisions the parity run compares
DECISIONS = (ev.WorkloadStarted, ev.WorkloadPreempted, ev.WorkloadRequeued, ev.MinRuntimeReached,
             ev.WorkloadCompleted, ev.NodeDrained, ev.NodeRepaired, ev.WorkloadPreemptionNotice,
             ev.WorkloadCheckpointed)
_STOPS = (ev.WorkloadPreempted, ev.WorkloadCompleted, ev.WorkloadFailed, ev.WorkloadCancelled)


def decision_key(e: ev.Event) -> tuple | None:
    """What must be equal between the simulator and the live services for one event."""
    if not isinstance(e, DECISIONS):
        return None
    key: tuple = (ev.event_type(e), getattr(e, "workload_id", None) or getattr(e, "node", None), e.at_ms)
    if isinstance(e, ev.WorkloadStarted):
        key += (tuple((p.node, tuple(p.gpu_ids)) for p in e.placement), e.allocated, e.protected_until_ms,
                e.progress_s, e.attempt)
    elif isinstance(e, ev.WorkloadPreempted):
        key += (e.reason.kind, e.reason.by_workload_id, e.progress_s, e.resumable, e.checkpointed, e.checkpoint_gpu_s,
                e.state_saved)
    elif isinstance(e, ev.WorkloadPreemptionNotice):
        key += (e.reason.kind, e.reason.by_workload_id, e.deadline_ms, e.preemptor_nodes)
    elif isinstance(e, ev.WorkloadRequeued):
        key += (e.progress_s,)
    return key


def decisions(events) -> list[tuple]:
    return [k for k in map(decision_key, events) if k is not None]


class DriverError(RuntimeError):
    pass


class ManualDriver:
    """Controls time for an in-process :class:`~services.devstack.stack.Stack` on a manual clock."""

    def __init__(self, stack, http: httpx.AsyncClient, timeout_s: float = 10.0):
        if not stack.clock.manual:
            raise DriverError("the stack must run on a manual clock (Settings(clock='manual'))")
        self.stack = stack
        self.http = http
        self.cluster = stack.settings.cluster
        #: the driver's own NATS connection, as the operator: ticks and executor.advance are
        #: control messages no service may send (connected on the first run)
        self.bus = None
        self.timeout_s = timeout_s
        self.log_seq = 0  # the log has been read up to here
        self.node_seq = 0  # ... and its last node.* event is at this sequence (what health follows)
        self.events: list[ev.Event] = []  # the whole log, in order

    # -- the services' manual-clock controls ---------------------------------------------
    async def tick(self, at_ms: int) -> dict:
        """One scheduling pass at ``at_ms``; returns once its decisions are in the log."""
        reply = self.bus.nc.new_inbox()
        fut: asyncio.Future = asyncio.get_running_loop().create_future()

        async def on_reply(msg):
            if not fut.done():
                fut.set_result(msgspec.json.decode(msg.data))

        sub = await self.bus.nc.subscribe(reply, cb=on_reply, max_msgs=1)
        try:
            await self.bus.js.publish(subjects.inbox_subject(self.cluster, subjects.TICK),
                                      reply_json({"at_ms": at_ms}),
                                      headers={"Timeshare-Reply": reply, "Nats-Msg-Id": f"tick-{uuid.uuid4().hex}"})
            return await asyncio.wait_for(fut, self.timeout_s)
        finally:
            try:
                await sub.unsubscribe()
            except Exception:
                pass

    async def advance(self, now_ms: int) -> list[str]:
        msg = await self.bus.nc.request(subjects.cmd_subject(self.cluster, "executor.advance"),
                                        reply_json({"now_ms": now_ms, "log_seq": self.log_seq}),
                                        timeout=self.timeout_s)
        body = msgspec.json.decode(msg.data)
        if "error" in body:
            raise DriverError(body["error"])
        return body["completed"]

    async def read_log(self, up_to_seq: int) -> list[ev.Event]:
        """The log's events after the last read, up to ``up_to_seq`` (placement's tick reply)."""
        new: list[ev.Event] = []

        def on_msg(m) -> None:
            e = ev.decoder.decode(m.data)
            new.append(e)
            if ev.event_type(e).startswith("node."):
                self.node_seq = m.metadata.sequence.stream

        if up_to_seq > self.log_seq:
            last = await self.bus.replay(subjects.LOG_STREAM, subjects.log_filter(self.cluster), on_msg,
                                         start_seq=self.log_seq + 1)
            if last < up_to_seq:
                raise DriverError(f"the log ends at seq {last}, placement said {up_to_seq}")
            self.log_seq = last
        self.events += new
        return new

    async def _health_caught_up(self) -> None:
        health = self.stack.services.get("health")
        if health is None:
            return
        deadline = time.monotonic() + self.timeout_s
        while health.last_seq < self.node_seq:
            if time.monotonic() > deadline:
                raise DriverError(f"health did not reach log seq {self.node_seq} (at {health.last_seq})")
            await asyncio.sleep(0.01)

    async def _post(self, path: str, body: dict, expect: int = 200) -> dict:
        r = await self.http.post(path, json=body)
        if r.status_code != expect:
            raise DriverError(f"POST {path}: {r.status_code} {r.text}")
        return r.json()

    # -- the loop -------------------------------------------------------------------------
    async def run(self, scenario) -> list[ev.Event]:
        """Drive ``scenario`` to the end (the simulator's end condition); returns the whole log."""
        from ..common.bus import Bus

        if self.bus is None:
            self.bus = await Bus.connect(self.stack.settings, self.cluster, name="driver", role="operator")
        try:
            return await self._run(scenario)
        finally:
            await self.bus.close()
            self.bus = None

    async def _run(self, scenario) -> list[ev.Event]:
        heap: list[tuple] = []
        seq = 0

        def push(t_ms: int, kind: int, payload) -> None:
            nonlocal seq
            seq += 1
            heapq.heappush(heap, (t_ms, kind, seq, payload))

        for ne in scenario.node_events:
            push(ne.at_s * 1000, _NODE, ne)
        specs = {w.id: w for w in scenario.workloads}
        trace = scenario.workloads
        i = 0
        repair_s: dict[str, int] = {}
        pending = running = 0
        end_ms = scenario.duration_s * 1000
        clock = self.stack.clock
        drift_wake_ms = BudgetPolicy.drift_wake_s * 1000 if scenario.policy.catch_up > 0 else None
        # checkpoints written on notice, as the simulator models them (its moments are visited
        # alike: a pass at each); the simulated executor reports them when advanced past them
        storage = CheckpointStorage(scenario.checkpoint_bandwidth_gbps)

        def storage_changed() -> None:
            nxt = storage.next_finish()
            if nxt is not None:
                push(nxt[0], _CHECKPOINT, storage.version)

        while True:
            next_submit = trace[i].submit_s * 1000 if i < len(trace) else None
            next_heap = heap[0][0] if heap else None
            if next_submit is None and (next_heap is None or (not running and not pending and
                                                              all(k in (_NODE, _REPAIR) for _, k, _, _ in heap))):
                break
            now = min(t for t in (next_submit, next_heap) if t is not None)
            if now > end_ms:
                break
            clock.set_ms(now)
            while i < len(trace) and trace[i].submit_s * 1000 == now:
                await self._submit(trace[i])
                i += 1
            advanced = False
            while heap and heap[0][0] == now:
                _, kind, _, payload = heapq.heappop(heap)
                if kind == _COMPLETE and not advanced:
                    await self.advance(now)
                    advanced = True
                elif kind == _CHECKPOINT and payload == storage.version:
                    finished = False
                    for wid in sorted(storage.writers):
                        if storage.finished(wid, now):
                            storage.remove(wid, now)
                            finished = True
                    if finished and not advanced:
                        await self.advance(now)  # the executor reports the checkpoints written by now
                        advanced = True
                    storage_changed()
                elif kind == _NODE:
                    await self._health_caught_up()
                    if payload.kind != "unhealthy":
                        raise DriverError(f"node event kind {payload.kind!r}: the health service reports "
                                          "unhealthy nodes only")
                    out = await self._post(f"/v1/nodes/{payload.node}/health",
                                           {"ok": False, "reason": payload.reason or "scenario health check failed"})
                    if "event_id" in out:  # the node was healthy (else the simulator skips it too)
                        repair_s[payload.node] = payload.repair_s
                elif kind == _REPAIR:
                    await self._health_caught_up()
                    await self._post(f"/v1/nodes/{payload}/repair", {})
            reply = await self.tick(now)
            pending, running = reply["pending"], reply["running"]
            # the simulator's wake-ups (timeshare.sim.engine): a pass held back by "no cascade"
            # asks for another, and under catch-up a quiet stretch with work pending gets a
            # pass every drift_wake_s (due shares drift with the window)
            if reply.get("retry_at_ms") is not None:
                push(reply["retry_at_ms"], _WAKE, None)
            if drift_wake_ms is not None and pending:
                quiet_until = min(heap[0][0] if heap else end_ms,
                                  trace[i].submit_s * 1000 if i < len(trace) else end_ms)
                if quiet_until > now + drift_wake_ms:
                    push(now + drift_wake_ms, _WAKE, None)
            for e in await self.read_log(reply["log_seq"]):
                if type(e) is ev.WorkloadStarted:
                    push(e.at_ms + (specs[e.workload_id].work_s - e.progress_s) * 1000, _COMPLETE, e.workload_id)
                    if e.protected_until_ms is not None:
                        push(e.protected_until_ms, _WAKE, None)
                elif type(e) is ev.WorkloadPreempted and not e.resumable:
                    raise DriverError(f"{e.workload_id} is not resumable and was preempted: the simulator would "
                                      "resubmit it; keep preemptible work resumable in a parity scenario")
                elif type(e) is ev.NodeDrained:
                    push(e.at_ms + repair_s.get(e.node, 0) * 1000, _REPAIR, e.node)
                if type(e) is ev.WorkloadPreemptionNotice:
                    spec = specs[e.workload_id]
                    push(e.deadline_ms, _WAKE, None)
                    storage.add(e.workload_id, e.attempt or 0, spec.checkpoint_size_gb, spec.notice_s, e.at_ms)
                    storage_changed()
                elif storage.writers and isinstance(e, _STOPS) and e.workload_id in storage.writers:
                    storage.remove(e.workload_id, e.at_ms)
                    storage_changed()
        return self.events

    async def _submit(self, spec) -> None:
        body = {"id": spec.id, "project": spec.project, "gpu_type": spec.gpu_type, "gpus": spec.gpus,
                "work_s": spec.work_s, "min_runtime_s": spec.min_runtime_s, "resumable": spec.resumable,
                "priority": spec.priority, "kind": spec.kind, "checkpoint_interval_s": spec.checkpoint_interval_s}
        # the notice part of the contract, only when declared (a body without it is as before)
        for name in ("checkpoint_on_notice_s", "checkpoint_gb", "suspends_on_notice"):
            value = getattr(spec, name)
            if value is not msgspec.UNSET:
                body[name] = value
        await self._post("/v1/workloads", body, expect=202)
