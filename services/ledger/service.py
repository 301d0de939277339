"""Ledger: rolling-window occupancy per tree node and GPU type, and the attainment report.

It projects the cluster's log into its store (every workload, node and budget event, with the
applied stream sequence in the same transaction) and keeps the core's ``UsageLedger``
(allocated / unallocated GPU-seconds per tree node over the lookback window) in memory,
rebuilt on start from its latest checkpoint and the journal after it (see ``Checkpoint``). Every couple of seconds it publishes a usage snapshot to
the ``timeshare_usage`` KV bucket (key = cluster; ``payload.decode_value`` reads it: a large tree's is
compressed) for dashboards and other readers; placement
computes the same numbers from its own replay with the same core code. It answers the
owed / delivered / attainment report over any time range (request/reply).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import math
import pickle

import msgspec

from timeshare import events as ev
from timeshare.sim.metrics import HOUR_S
from timeshare.window import UsageLedger

from ..common import healthz, payload, subjects
from ..common.bus import Bus
from ..common.cluster_config import ClusterConfig
from ..common.code_version import code_version
from ..common.forked_pickle import start_pickle
from ..common.projector import Projector
from ..common.settings import Settings
from ..common.store import Changes, make_store
from ..common.supervise import describe, spawn
from .hourly import HourlyUsage, report_from_rows, series_from_rows

log = logging.getLogger("timeshare.ledger")

#: the longest range one report bins (hour by hour, per team)
MAX_REPORT_RANGE_S = 400 * 86400
#: the most points one series answers (a chart wider than this has more points than pixels)
MAX_SERIES_POINTS = 500

# -- the checkpoint ------------------------------------------------------------------------
# Without one, a start folded the whole journal: a month's 216,668 events took tens of seconds
# and grew with history. Every CHECKPOINT_EVERY journal rows the in-memory state (window usage,
# running work, the open hourly rows, the tree) is pickled, by a forked child so the ledger
# goes on, and stored in the same transaction as the next batch, with the number of journal
# rows it covers; a start loads it and folds only the rows after. Its size follows the work in
# the system (ended workloads are forgotten, hourly.py), not the history. A checkpoint written
# by other code (CODE_VERSION) or unreadable is ignored: the whole journal is folded, as before.

#: journal rows between checkpoints: a start folds at most about this many
CHECKPOINT_EVERY = 20_000
#: checkpoints are loaded by the same code only (the core, this file and the hourly rows)
CODE_VERSION = code_version(__file__, __file__.replace("service.py", "hourly.py"))


class Ledger:
    def __init__(self, settings: Settings, config: ClusterConfig, clock, bus: Bus | None = None, store=None,
                 snapshot_every_s: float = 2.0):
        self.settings = settings
        self.config = config
        self.cluster = config.name
        self.clock = clock
        self.bus = bus
        self.own_bus = bus is None
        self.store = store or make_store(settings.database_url, "ledger")
        self.consumer = f"ledger-{self.cluster}"
        self.snapshot_every_s = snapshot_every_s
        self.cluster_model = config.cluster()
        self._reset()
        self.stop_event = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.broker = None
        self.dirty = False
        self.projector: Projector | None = None
        #: journal rows folded at the last start, and the rows the stored checkpoint covers
        self.stats: dict[str, int] = {"folded_at_start": 0, "checkpoint_rows": 0}

    def _reset(self) -> None:
        self.tree = self.config.tree()
        self.usage = UsageLedger(self.config.policy.lookback_window_s)
        self.running: dict[str, tuple[str, str, bool, int]] = {}
        self.last_ms = 0
        self.pool_gpus = {gt: p.total_gpus for gt, p in self.cluster_model.pools.items()}
        nodes = {n.name: (p.gpu_type, n.gpus) for p in self.cluster_model.pools.values() for n in p.nodes}
        #: hourly usage rows (services/ledger/hourly.py): what the report reads
        self.hourly = HourlyUsage(self.tree, self.pool_gpus, nodes, self.config.policy.max_min_runtime_s)
        #: journal rows folded into this state, and how many the stored checkpoint covers
        self.journal_rows = 0
        self.checkpoint_rows = 0

    #: what a checkpoint holds: the state folded from the journal
    _CHECKPOINTED = ("tree", "usage", "running", "last_ms", "hourly", "journal_rows")

    async def start(self, broker=None) -> "Ledger":
        """``broker``: the faststream broker with this service's handlers (``main.py`` builds it);
        without one, the handlers of ``handlers.py`` on a broker of its own."""
        if self.bus is None:
            self.bus = await Bus.connect(self.settings, self.cluster, name="ledger")
        await self.bus.ensure_infra()
        await self.store.open()
        await self.load(self.store)
        self.projector = await Projector(self, self.bus, self.store, self.stop_event,
                                         stuck_after_s=self.settings.stuck_after_s).start()
        self.tasks.append(spawn("ledger usage snapshots", self._snapshots, self.stop_event))
        self.broker = broker or default_broker(self)
        await self.broker.start()
        return self

    async def health_report(self) -> dict:
        return healthz.projector_report("ledger", [self.projector], self.bus, journal_rows=self.journal_rows,
                                        **self.stats)

    async def stop(self) -> None:
        self.stop_event.set()
        if self.projector is not None:
            await self.projector.close()
        if self.broker is not None:
            await self.broker.stop()
        for t in self.tasks:
            try:  # the snapshot loop ends by itself on stop_event (a row write in flight completes)
                await asyncio.wait_for(asyncio.shield(t), 5)
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):
                t.cancel()
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass
        await self.store.close()
        if self.own_bus:
            await self.bus.close()

    def _observe(self, e: ev.Event) -> None:
        now_s = e.at_ms / 1000
        self.last_ms = max(self.last_ms, e.at_ms)
        match e:
            case ev.WorkloadStarted():
                self.running[e.workload_id] = (e.project, e.gpu_type, e.allocated, e.gpus)
                self.usage.add_running(e.project, e.gpu_type, e.allocated, e.gpus, now_s)
            case ev.WorkloadPreempted() | ev.WorkloadCompleted() | ev.WorkloadFailed() | ev.WorkloadCancelled():
                r = self.running.pop(e.workload_id, None)
                if r is not None:
                    leaf, gpu_type, allocated, gpus = r
                    self.usage.add_running(leaf, gpu_type, allocated, -gpus, now_s)
            case ev.BudgetChanged():
                self.tree = ev.tree_after(e, self.tree)  # (the hourly rows follow it in observe)
        try:
            self.hourly.observe(e)
        except Exception:  # the rows must never stop the projection (this runs after the commit)
            log.exception("hourly usage: cannot take %s %s", ev.event_type(e), e.event_id)

    # -- the projection (run by services.common.projector) ---------------------------------
    async def load(self, store) -> None:
        self._reset()
        self._restore(await store.get("checkpoint", self.cluster))
        rows = await store.journal("events", self.cluster, skip=self.journal_rows)
        for doc in rows:
            self._observe(ev.decoder.decode(msgspec.json.encode(doc)))
        self.journal_rows += len(rows)
        self.checkpoint_rows = self.journal_rows - len(rows)
        self.stats["folded_at_start"] = len(rows)
        self.dirty = True

    def _restore(self, doc: dict | None) -> None:
        """Take the stored checkpoint's state, when this code wrote it; else start empty."""
        if doc is None:
            return
        if doc.get("code") != CODE_VERSION:
            log.info("ledger checkpoint of %s is from other code: folding the whole journal", self.cluster)
            return
        try:
            state = pickle.loads(base64.b64decode(doc["state"]))
            for name in self._CHECKPOINTED:
                setattr(self, name, state[name])
        except Exception as exc:  # noqa: BLE001 - the journal is the truth: fold all of it
            log.warning("ledger checkpoint of %s unreadable (%s): folding the whole journal", self.cluster, exc)
            self._reset()
            return
        self.stats["checkpoint_rows"] = self.journal_rows

    async def begin(self, store, events) -> dict:
        work = {"events": [], "checkpoint": None}
        if self.journal_rows - self.checkpoint_rows >= CHECKPOINT_EVERY:
            # the state now is the journal's first journal_rows rows: no batch is between its
            # commit and its fold (the runner awaits one batch at a time)
            job = start_pickle({name: getattr(self, name) for name in self._CHECKPOINTED})
            data = await job.result()
            work["checkpoint"] = {"code": CODE_VERSION, "journal_rows": self.journal_rows,
                                  "state": base64.b64encode(data).decode()}
        return work

    def fold(self, work: dict, seq: int, e: ev.Event, changes: Changes) -> dict:
        if work["checkpoint"] is not None:  # stored with this batch, covering what came before it
            changes.put("checkpoint", self.cluster, work["checkpoint"])
        if not isinstance(e, ev.MinRuntimeReached):  # changes no usage
            changes.append("events", self.cluster, msgspec.to_builtins(e))
            work["events"].append(e)
        return work

    def committed(self, work: dict, events) -> None:
        if work["checkpoint"] is not None:
            self.checkpoint_rows = work["checkpoint"]["journal_rows"]
            self.stats["checkpoint_rows"] = self.checkpoint_rows
        for e in work["events"]:
            self._observe(e)
        self.journal_rows += len(work["events"])
        self.dirty = self.dirty or bool(work["events"])

    @property
    def last_seq(self) -> int:
        return self.projector.applied_seq if self.projector is not None else 0

    def usage_snapshot(self) -> dict:
        now_s = max(self.clock.now_ms(), self.last_ms) / 1000
        out = {}
        for path in ["", *sorted(self.tree.nodes)]:
            per = {}
            for gt in self.cluster_model.pools:
                per[gt] = {"allocated_gpu_s": self.usage.usage_gpu_s(path, gt, True, now_s),
                           "unallocated_gpu_s": self.usage.usage_gpu_s(path, gt, False, now_s),
                           "running_gpus": self.usage.running_gpus(path, gt, True) + self.usage.running_gpus(path, gt, False)}
            out[path or "(cluster)"] = per
        return {"cluster": self.cluster, "now_s": now_s, "window_s": self.usage.window_s, "usage": out}

    async def _snapshots(self) -> None:
        kv = await self.bus.js.key_value(subjects.USAGE_BUCKET)
        while not self.stop_event.is_set():
            try:  # woken by stop: the loop ends by itself, never cancelled inside a store write
                await asyncio.wait_for(self.stop_event.wait(), self.snapshot_every_s)
            except asyncio.TimeoutError:
                pass
            try:
                # shielded: cancelling asyncpg inside executemany once left the task hanging
                await asyncio.shield(self.write_hourly_rows())
            except Exception as exc:  # kept in memory (the report reads them there): next time
                log.warning("hourly rows: %s", describe(exc))
            if self.dirty:
                self.dirty = False
                try:
                    await kv.put(self.cluster, payload.value(self.usage_snapshot()))
                except Exception as exc:
                    self.dirty = True  # put it again next time
                    log.warning("usage snapshot: %s", exc)

    def _hourly_key(self, hour: int) -> str:
        return f"{self.cluster}:{hour}"

    async def write_hourly_rows(self) -> int:
        """Store the complete hours' rows (kind ``hourly``); returns how many were written."""
        rows = dict(self.hourly.unwritten)
        if not rows:
            return 0
        changes = Changes()
        for hour, row in rows.items():
            changes.put("hourly", self._hourly_key(hour), row)
        # rows are a function of the journal up to the ledger's sequence: a sequence already
        # stored means rows as complete as these are stored (a restart re-derives them)
        await self.store.commit(f"{self.consumer}-hourly", self.last_seq, changes)
        for hour in rows:
            self.hourly.unwritten.pop(hour, None)
        return len(rows)

    async def _rows_of(self, from_s: float | None, to_s: float | None) -> tuple[list[dict], float] | dict:
        """The hourly rows of ``[from_s, to_s)`` in order, and the range's end: the store's rows
        of the complete hours, the open hour from memory; or an error (``status`` 4xx/503)."""
        # the report bins every hour of the range for every team: a far ``to_s`` once took
        # 23.7 GB and stalled every service, so ranges it cannot serve are refused up front
        now_s = max(self.clock.now_ms(), self.last_ms) / 1000
        if to_s is not None and to_s > now_s + 3600:
            return {"error": f"to_s {to_s:.0f} is in the future (now is {now_s:.0f}): a report covers what "
                             "happened", "status": 400}
        if from_s is not None and to_s is not None and to_s < from_s:
            return {"error": "to_s is before from_s", "status": 400}
        if from_s is not None and (to_s if to_s is not None else now_s) - from_s > MAX_REPORT_RANGE_S:
            return {"error": f"a report covers at most {MAX_REPORT_RANGE_S // 86400} days; ask for a shorter "
                             "range (from_s, to_s)", "status": 400}
        hourly = self.hourly
        to = to_s if to_s is not None else now_s
        if not hourly.started:
            return [], to
        first_h, open_h = hourly.first_h, hourly.open_h
        if from_s is None and to - first_h * HOUR_S > MAX_REPORT_RANGE_S:
            return {"error": f"the journal spans more than {MAX_REPORT_RANGE_S // 86400} days: give from_s",
                    "status": 400}
        if to < open_h * HOUR_S and to % HOUR_S:
            return {"error": f"to_s {to:.0f} is inside a complete hour: give a whole hour (a multiple of 3600) "
                             f"or a time from {open_h * HOUR_S} on (the report reads hourly rows)", "status": 400}
        from_h = first_h if from_s is None else max(first_h, int(from_s // HOUR_S))
        to_h = int(math.ceil(to / HOUR_S))  # hours [from_h, to_h)
        complete = range(from_h, min(to_h, open_h))
        rows = {h: hourly.unwritten[h] for h in complete if h in hourly.unwritten}
        wanted = [self._hourly_key(h) for h in complete if h not in rows]
        if wanted:
            stored = await self.store.get_many("hourly", wanted)
            for key, row in stored.items():
                rows[row["hour"]] = row
        missing = [h for h in complete if h not in rows and not hourly.in_gap(h)]
        if missing:
            return {"error": f"{len(missing)} hourly rows are not stored yet (first: hour {missing[0]}); try "
                             "again in a few seconds", "status": 503}
        rows.update(hourly.open_rows(to))
        return [rows[h] for h in sorted(rows) if from_h <= h < to_h], to

    async def report(self, from_s: float | None, to_s: float | None) -> dict:
        """Owed / delivered / attainment over ``[from_s, to_s)`` from the hourly rows (never the
        journal): the store's rows of the complete hours, the open hour from memory."""
        got = await self._rows_of(from_s, to_s)
        if isinstance(got, dict):
            return got
        rows, to = got
        return report_from_rows(rows, self.tree, self.pool_gpus, self.config.policy.max_min_runtime_s,
                                from_s, to, self.hourly.first_s)

    async def series(self, node: str, from_s: float | None, to_s: float | None, bucket_h: int | None) -> dict:
        """Owed and delivered GPU-hours of funded work of tree node ``node`` ("" = every team)
        over ``[from_s, to_s)``, one point per ``bucket_h`` hours (default: the fewest hours
        that keep it to MAX_SERIES_POINTS points): the report's numbers hour by hour."""
        if node and node not in self.tree.nodes:
            return {"error": f"unknown tree node {node!r} (known: {', '.join(sorted(self.tree.nodes))})",
                    "status": 404}
        if bucket_h is not None and not 1 <= bucket_h <= MAX_REPORT_RANGE_S // HOUR_S:
            return {"error": f"bucket_h must be a whole number of hours from 1 to {MAX_REPORT_RANGE_S // HOUR_S}",
                    "status": 400}
        got = await self._rows_of(from_s, to_s)
        if isinstance(got, dict):
            return got
        rows, to = got
        first_s = self.hourly.first_s
        start_s = first_s if from_s is None else (from_s if first_s is None else max(from_s, first_s))
        hours = max(1, int(math.ceil(to / HOUR_S)) - int((to if start_s is None else start_s) // HOUR_S))
        if bucket_h is None:
            bucket_h = max(1, math.ceil(hours / MAX_SERIES_POINTS))
        elif hours / bucket_h > MAX_SERIES_POINTS:
            return {"error": f"{hours} hours in {bucket_h}-hour buckets is more than {MAX_SERIES_POINTS} points: "
                             f"give bucket_h of at least {math.ceil(hours / MAX_SERIES_POINTS)}", "status": 400}
        return series_from_rows(rows, self.tree, self.pool_gpus, self.config.policy.max_min_runtime_s,
                                node, from_s, to, first_s, bucket_h)


def default_broker(service: Ledger):
    from ..common.broker import make_broker
    from .handlers import router

    return make_broker(service.settings, "ledger", router(service, service.cluster))
