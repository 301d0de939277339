"""Placement: the scheduler. The single writer of the cluster's event log.

Loop: fetch proposed events from the inbox -> validate each against the state (the shell's
rules) -> apply it -> run the core's scheduling pass (``BudgetPolicy.schedule``) ->
append the accepted inputs and the pass's decisions to the log, fenced and with
``Nats-Msg-Id`` = event id -> ack the inbox. Because the log holds exactly what was applied,
in order, replaying it on start rebuilds the same state. One active instance per cluster
holds a lease in a JetStream KV bucket; a standby waits for it to lapse.

This file composes the service from one module per job, each a mixin over the state declared
in ``Placement.__init__``: ``leader.py`` (the lease, campaigns and terms), ``log.py`` (append,
rebuild, snapshots, purge, records an operator skips), ``inbox.py`` (the inbox loop, the pass,
the rules for proposed events), ``tracing.py`` (the workloads' spans).
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from timeshare import events as ev
from timeshare.scheduler import BudgetPolicy
from timeshare.state import SchedulerState

from ..common import subjects
from ..common.bus import Bus
from ..common.cluster_config import ClusterConfig
from ..common.settings import Settings
from ..common.telemetry import setup_metrics, setup_telemetry
from .inbox import InboxLoop
from .leader import Leadership
from .log import LogKeeping, UntrustedLog
from .metrics import PlacementMetrics
from .tracing import DecisionTracing

log = logging.getLogger("timeshare.placement")


class Placement(Leadership, LogKeeping, InboxLoop, DecisionTracing):
    def __init__(self, settings: Settings, config: ClusterConfig, clock, bus: Bus | None = None):
        self.settings = settings
        self.config = config
        self.cluster = config.name
        self.clock = clock
        self.bus = bus
        self.own_bus = bus is None
        self.instance = uuid.uuid4().hex[:8]
        # each preemption's reason names the candidates it spared and why (on its span, in explain)
        self.policy = BudgetPolicy(explain_rejected=True)
        self.tracer = setup_telemetry("placement", settings.otel)
        #: workload id -> the trace context its decisions' spans are children of (its
        #: ``workload.submitted`` span; rebuilt from the log's traceparent headers on replay)
        self.trace_ctx: dict[str, object] = {}
        #: event id -> the trace context its log message carries (this batch only)
        self.event_ctx: dict[str, object] = {}
        #: spans of this batch's events, ended when the log holds them (or refused them)
        self.open_spans: list = []
        #: this batch's decisions, counted in the metrics when the log holds them
        self.decided: list[ev.Event] = []
        self.metrics = PlacementMetrics(setup_metrics("placement", settings.otel), self)
        self.state: SchedulerState | None = None
        #: ids of applied *proposed* events whose workload has not ended (see _remember)
        self.applied_ids: set[str] = set()
        self.ids_of: dict[str, list[str]] = {}
        self.last_log_seq = 0
        self.leader = asyncio.Event()
        self.stop_event = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.broker = None
        self.lease_rev: int | None = None
        self.last_pass_wall = 0.0
        self.terms = 0
        self.terms_lost = 0
        self.replayed = 0
        #: how long the last rebuild took (load the snapshot, replay the log after it), seconds
        self.rebuild_s = 0.0
        #: log sequence of the snapshot the last rebuild started from (0: none, the whole log)
        self.loaded_snapshot_seq = 0
        self.snapshot_seq = 0
        #: the log of this cluster holds nothing below this sequence (purged by this instance)
        self.purged_below = 0
        #: durable -> the first log sequence it still needs, for each durable that held the last
        #: purge below what the snapshots cover (in /healthz: an operator sees who keeps the log)
        self.purge_held_by: dict[str, int] = {}
        self._purge_warned: dict[str, int] = {}
        self.since_snapshot = 0
        self.snapshot_task: asyncio.Task | None = None
        self.rebuilds = 0
        self.last_error: str | None = None
        self.stats = {"passes": 0, "inputs": 0, "decisions": 0, "rejected": 0, "duplicates": 0}
        #: the log record this instance cannot apply (UntrustedLog), until an operator skips it
        self.untrusted: UntrustedLog | None = None
        self.blocked = asyncio.Event()
        #: log sequences skipped at the last rebuild, as the operator decided
        self.skipped: list[int] = []

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self, wait_leader: bool = True, broker=None) -> "Placement":
        """``broker``: the faststream broker with the query handlers (``main.py`` builds it);
        without one, the handlers of ``handlers.py`` on a broker of its own."""
        if self.bus is None:
            self.bus = await Bus.connect(self.settings, self.cluster, name=f"placement-{self.instance}")
        await self.bus.ensure_infra()
        self.broker = broker or default_broker(self)
        await self.broker.start()  # only the leader answers (handlers.py); every instance answers trace
        self.tasks.append(asyncio.create_task(self._run(), name="placement"))
        if wait_leader:
            # a log it cannot apply ends the wait too: say so instead of hanging without a word
            waits = [asyncio.ensure_future(self.leader.wait()), asyncio.ensure_future(self.blocked.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            if not self.leader.is_set() and self.untrusted is not None:
                log.error("placement %s does not lead: %s", self.instance, self.untrusted)
        return self

    async def health_report(self) -> dict | None:
        if self.untrusted is not None and not self.leader.is_set():
            u = self.untrusted
            return {"ok": False, "leader": None, "error": str(u),
                    "untrusted_record": {"seq": u.seq, "event_id": u.event_id, "type": u.event_type,
                                         "reason": u.reason}}
        if not self.leader.is_set():
            return None  # the leader answers for placement; a standby stays silent
        info = await self.bus.js.consumer_info(subjects.INBOX_STREAM, f"placement-{self.cluster}")
        inbox = {"lag": info.num_pending, "unacked": info.num_ack_pending, "last_error": self.last_error,
                 "stuck": False}
        return {"ok": self.bus.nc.is_connected, "leader": self.instance, "log_seq": self.last_log_seq,
                "terms": self.terms, "terms_lost": self.terms_lost, "consumers": {"inbox": inbox},
                "replayed_at_start": self.replayed, "snapshot_seq": self.snapshot_seq,
                "purge": {"purged_below": self.purged_below, "held_by": self.purge_held_by},
                "stats": self.stats}

    async def stop(self, release_lease: bool = True) -> None:
        self.stop_event.set()
        if self.snapshot_task is not None:
            self.snapshot_task.cancel()
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        if self.broker is not None:
            try:
                await self.broker.stop()
            except Exception:
                pass
        if release_lease and self.lease_rev is not None:
            try:
                kv = await self.bus.js.key_value(subjects.LEASE_BUCKET)
                await kv.delete(self._lease_key(), last=self.lease_rev)
            except Exception:
                pass
        if self.own_bus:
            await self.bus.close()


def default_broker(service: Placement):
    from ..common.broker import make_broker
    from .handlers import router

    return make_broker(service.settings, f"placement-{service.instance}", router(service, service.cluster))
