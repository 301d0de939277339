"""Health: heartbeats and health reports in, node.unhealthy / node.repaired proposed out.

* A node that has sent heartbeats (``timeshare.hb.v1.<cluster>``, or POST
  /v1/nodes/{n}/heartbeat) and then none for ``heartbeat_timeout_s`` is reported unhealthy.
* A failed health check (command ``health.report`` with ok=false) reports it unhealthy at once.
* Placement cordons it and drains it through the core as its work reaches minimum runtime;
  when the log says ``node.drained`` (or ``node.failed``) this service runs the repair command
  (``TIMESHARE_REPAIR_COMMAND``, env TIMESHARE_NODE) and proposes ``node.repaired`` when it
  exits 0. Without a repair command, or when it fails, a human declares the repair
  (command ``health.repaired``).

Node states come from the log (projection with the stream sequence in the same transaction);
event ids count incidents per node, so a retry of the same report dedups.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import msgspec

from timeshare import events as ev

from ..common import healthz, subjects
from ..common.bus import Bus
from ..common.cluster_config import ClusterConfig
from ..common.settings import Settings
from ..common.projector import Projector
from ..common.store import Changes, make_store
from ..common.supervise import spawn

log = logging.getLogger("timeshare.health")


class Health:
    def __init__(self, settings: Settings, config: ClusterConfig, clock, bus: Bus | None = None, store=None):
        self.settings = settings
        self.cluster = config.name
        self.clock = clock
        self.bus = bus
        self.own_bus = bus is None
        self.store = store or make_store(settings.database_url, "health")
        self.consumer = f"health-{self.cluster}"
        self.node_names = sorted(config.cluster().nodes_by_name)
        self.nodes: dict[str, dict] = {n: {"state": "healthy", "incidents": 0} for n in self.node_names}
        self.last_heartbeat: dict[str, float] = {}
        self.repairs: dict[str, asyncio.Task] = {}
        self.projector: Projector | None = None
        self.stop_event = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.broker = None
        self.live = asyncio.Event()

    async def start(self, broker=None) -> "Health":
        """``broker``: the faststream broker with this service's handlers (``main.py`` builds it);
        without one, the handlers of ``handlers.py`` on a broker of its own."""
        if self.bus is None:
            self.bus = await Bus.connect(self.settings, self.cluster, name="health")
        await self.bus.ensure_infra()
        await self.store.open()
        await self.load(self.store)
        self.projector = await Projector(self, self.bus, self.store, self.stop_event,
                                         stuck_after_s=self.settings.stuck_after_s).start()
        self.tasks.append(spawn("health heartbeat watch", self._watch, self.stop_event))
        self.broker = broker or default_broker(self)
        await self.broker.start()
        # drained nodes whose repair never finished (we were restarted): try again
        for name, doc in sorted(self.nodes.items()):
            if doc["state"] in ("drained", "down"):
                self._start_repair(name)
        return self

    async def health_report(self) -> dict:
        return healthz.projector_report("health", [self.projector], self.bus,
                                        repairs_running=sorted(self.repairs))

    async def stop(self) -> None:
        self.stop_event.set()
        if self.projector is not None:
            await self.projector.close()
        if self.broker is not None:
            await self.broker.stop()
        for t in [*self.tasks, *self.repairs.values()]:
            t.cancel()
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        await self.store.close()
        if self.own_bus:
            await self.bus.close()

    # -- projection of node states ------------------------------------------------------
    async def load(self, store) -> None:
        for name, doc in await store.scan("node"):
            self.nodes[name] = {**self.nodes.get(name, {}), **doc}

    async def begin(self, store, events) -> dict:
        return {}  # the node documents this batch changed (copies of self.nodes's)

    def fold(self, work: dict, seq: int, e: ev.Event, changes: Changes) -> dict:
        if not isinstance(e, (ev.NodeUnhealthy, ev.NodeFailed, ev.NodeDrained, ev.NodeRepaired)):
            return work
        doc = work.get(e.node) or dict(self.nodes.get(e.node) or {"state": "healthy", "incidents": 0})
        match e:
            case ev.NodeUnhealthy():
                doc.update(state="cordoned", reason=e.reason, needs_human=e.needs_human, since_ms=e.at_ms)
            case ev.NodeFailed():
                doc.update(state="down", reason=e.reason, since_ms=e.at_ms)
            case ev.NodeDrained():
                doc.update(state="drained", since_ms=e.at_ms)
            case ev.NodeRepaired():
                doc.update(state="healthy", incidents=doc["incidents"] + 1, since_ms=e.at_ms, reason="")
        work[e.node] = doc
        changes.put("node", e.node, doc)
        changes.append("node", e.node, {"seq": seq, **msgspec.to_builtins(e)})
        return work

    def committed(self, work: dict, events) -> None:
        for node, doc in work.items():
            # keep what only lives in memory (the last heartbeat's time)
            self.nodes[node] = {**self.nodes.get(node, {}), **doc}
        for _, e in events:
            if isinstance(e, (ev.NodeDrained, ev.NodeFailed)):
                self._start_repair(e.node)
            elif isinstance(e, ev.NodeRepaired):
                self.last_heartbeat.pop(e.node, None)

    @property
    def last_seq(self) -> int:
        return self.projector.applied_seq if self.projector is not None else 0

    # -- heartbeats and reports -------------------------------------------------------------
    def heartbeat(self, node: str) -> None:
        if node in self.nodes:
            self.last_heartbeat[node] = time.monotonic()
            self.nodes[node]["last_heartbeat_ms"] = self.clock.now_ms()

    async def _watch(self) -> None:
        timeout = self.settings.heartbeat_timeout_s
        if timeout <= 0:
            await self.stop_event.wait()  # watching is off
            return
        while not self.stop_event.is_set():
            await asyncio.sleep(max(0.05, timeout / 4))
            now = time.monotonic()
            for node, seen in sorted(self.last_heartbeat.items()):
                if now - seen > timeout and self.nodes[node]["state"] == "healthy":
                    await self.report_unhealthy(node, f"no heartbeat for {now - seen:.0f}s", False)

    async def report_unhealthy(self, node: str, reason: str, needs_human: bool) -> str:
        doc = self.nodes[node]
        e = ev.NodeUnhealthy(event_id=f"unhealthy.{node}.{doc['incidents']}", at_ms=self.clock.now_ms(),
                             cluster=self.cluster, node=node, reason=reason, needs_human=needs_human)
        await self.bus.propose(e)
        return e.event_id

    async def health_check(self, node: str, ok: bool, reason: str | None, needs_human: bool) -> dict:
        """A node's health check result (command ``health.report``): the reply body."""
        if node not in self.nodes:
            return {"error": f"unknown node {node!r}", "status": 404}
        if ok:
            self.last_heartbeat[node] = time.monotonic()
            return {"node": node, "state": self.nodes[node]["state"]}
        if self.nodes[node]["state"] != "healthy":
            return {"node": node, "state": self.nodes[node]["state"], "note": "already out of service"}
        eid = await self.report_unhealthy(node, reason or "health check failed", needs_human)
        return {"node": node, "state": "cordoning", "event_id": eid}

    # -- repairs -------------------------------------------------------------------------------
    def _start_repair(self, node: str) -> None:
        if not self.settings.repair_command or node in self.repairs:
            return
        self.repairs[node] = asyncio.create_task(self._repair(node))

    async def _repair(self, node: str) -> None:
        try:
            env = dict(os.environ, TIMESHARE_NODE=node, TIMESHARE_CLUSTER=self.cluster)
            proc = await asyncio.create_subprocess_shell(self.settings.repair_command, env=env,
                                                         stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            out, _ = await proc.communicate()
            if proc.returncode == 0:
                log.info("repaired %s: %s", node, out.decode(errors="replace").strip()[:200])
                await self.propose_repaired(node)
            else:
                log.error("repair of %s failed (exit %s): %s; needs a human", node, proc.returncode,
                          out.decode(errors="replace").strip()[:500])
        finally:
            self.repairs.pop(node, None)

    async def propose_repaired(self, node: str) -> str:
        doc = self.nodes[node]
        e = ev.NodeRepaired(event_id=f"repaired.{node}.{doc['incidents']}", at_ms=self.clock.now_ms(),
                            cluster=self.cluster, node=node)
        await self.bus.propose(e)
        return e.event_id

    async def _catch_up(self, done, timeout_s: float = 2.0) -> None:
        """Wait (bounded) until ``done()`` or this projection has applied everything the log
        holds: a human who saw a node drained (placement's view, or the log) and declares it
        repaired at once must not be refused because this projection is a moment behind."""
        deadline = time.monotonic() + timeout_s
        while not done() and time.monotonic() < deadline:
            try:
                info = await self.bus.js.consumer_info(subjects.LOG_STREAM, self.consumer)
                if not info.num_pending and not info.num_ack_pending:
                    return
            except Exception:  # NATS away: answer from what is applied
                return
            await asyncio.sleep(0.05)

    async def declare_repaired(self, node: str, uncordon: bool = False) -> dict:
        """A human declares ``node`` repaired (command ``health.repaired``), or with ``uncordon``
        takes back a cordon of a node that did not fail: the reply body. Both are
        ``node.repaired``: the node takes work again."""
        if node not in self.nodes:
            return {"error": f"unknown node {node!r}", "status": 404}
        if uncordon:
            if self.nodes[node]["state"] not in ("cordoned", "drained"):
                await self._catch_up(lambda: self.nodes[node]["state"] in ("cordoned", "drained"))
            state = self.nodes[node]["state"]
            if state not in ("cordoned", "drained"):
                why = ("it failed: declare it repaired once it is (nodes repair)" if state == "down"
                       else "it is in service")
                return {"error": f"node {node} is {state}; only a cordoned or drained node can be uncordoned "
                                 f"({why})", "status": 409}
            eid = await self.propose_repaired(node)
            return {"node": node, "event_id": eid}
        if self.nodes[node]["state"] not in ("drained", "down"):
            await self._catch_up(lambda: self.nodes[node]["state"] in ("drained", "down"))
        if self.nodes[node]["state"] not in ("drained", "down"):
            return {"error": f"node {node} is {self.nodes[node]['state']}; only drained "
                             "or down nodes can be declared repaired", "status": 409}
        eid = await self.propose_repaired(node)
        return {"node": node, "event_id": eid}


def default_broker(service: Health):
    from ..common.broker import make_broker
    from .handlers import router

    return make_broker(service.settings, "health", router(service, service.cluster))
