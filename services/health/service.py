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

from ..common import commands, healthz, subjects
from ..common.bus import Bus, reply_json
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
        self.subs = []
        self.live = asyncio.Event()

    async def start(self) -> "Health":
        if self.bus is None:
            self.bus = await Bus.connect(self.settings, self.cluster, name="health")
        await self.bus.ensure_infra()
        await self.store.open()
        await self.load(self.store)
        self.projector = await Projector(self, self.bus, self.store, self.stop_event,
                                         stuck_after_s=self.settings.stuck_after_s).start()
        self.tasks.append(spawn("health heartbeat watch", self._watch, self.stop_event))
        nc = self.bus.nc
        self.subs += [
            await healthz.serve(self.bus, self.cluster, "health", self.health_report),
            await nc.subscribe(subjects.heartbeat_subject(self.cluster), cb=self._on_heartbeat),
            await nc.subscribe(subjects.cmd_subject(self.cluster, "health.report"), cb=self._on_report),
            await nc.subscribe(subjects.cmd_subject(self.cluster, "health.repaired"), cb=self._on_repaired),
            await nc.subscribe(subjects.query_subject(self.cluster, "health.nodes"), cb=self._on_nodes),
        ]
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
        for s in self.subs:
            await s.unsubscribe()
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
    async def _on_heartbeat(self, msg) -> None:
        body, _ = commands.decode(commands.Heartbeat, msg.data)
        if body is None:
            return  # a heartbeat has no reply: a malformed one is dropped
        node = body.node
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

    async def _on_report(self, msg) -> None:
        cmd, refused = commands.decode(commands.HealthReport, msg.data)
        if cmd is None:
            return await msg.respond(reply_json(refused))
        body = msgspec.to_builtins(cmd)
        node = body.get("node")
        if node not in self.nodes:
            return await msg.respond(reply_json({"error": f"unknown node {node!r}", "status": 404}))
        if body.get("ok", True):
            self.last_heartbeat[node] = time.monotonic()
            return await msg.respond(reply_json({"node": node, "state": self.nodes[node]["state"]}))
        if self.nodes[node]["state"] != "healthy":
            return await msg.respond(reply_json({"node": node, "state": self.nodes[node]["state"],
                                                 "note": "already out of service"}))
        eid = await self.report_unhealthy(node, body.get("reason") or "health check failed",
                                          bool(body.get("needs_human")))
        await msg.respond(reply_json({"node": node, "state": "cordoning", "event_id": eid}))

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

    async def _on_repaired(self, msg) -> None:
        cmd, refused = commands.decode(commands.Repaired, msg.data)
        if cmd is None:
            return await msg.respond(reply_json(refused))
        body = msgspec.to_builtins(cmd)
        node = body.get("node")
        if node not in self.nodes:
            return await msg.respond(reply_json({"error": f"unknown node {node!r}", "status": 404}))
        if self.nodes[node]["state"] not in ("drained", "down"):
            return await msg.respond(reply_json({"error": f"node {node} is {self.nodes[node]['state']}; only drained "
                                                          "or down nodes can be declared repaired", "status": 409}))
        eid = await self.propose_repaired(node)
        await msg.respond(reply_json({"node": node, "event_id": eid}))

    async def _on_nodes(self, msg) -> None:
        await msg.respond(reply_json({"nodes": self.nodes}))
