"""Placement: the scheduler. The single writer of the cluster's event log.

Loop: fetch proposed events from the inbox -> validate each against the state (the shell's
rules below) -> apply it -> run the core's scheduling pass (``BudgetPolicy.schedule``) ->
append the accepted inputs and the pass's decisions to the log, fenced and with
``Nats-Msg-Id`` = event id -> ack the inbox. Because the log holds exactly what was applied,
in order, replaying it on start rebuilds the same state. One active instance per cluster
holds a lease in a JetStream KV bucket; a standby waits for it to lapse.

Inputs the shell refuses (dead-lettered with the reason): undecodable messages; decisions only
placement makes (started, preempted, ...); a submission that breaks the contract or reuses a
workload id; an executor report for a workload that is not running that attempt (stale); a
cancel of a finished workload; health changes for unknown nodes or nodes not in that state.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import msgspec
import nats.errors
from opentelemetry import trace
from nats.js.errors import KeyWrongLastSequenceError

from timeshare import events as ev
from timeshare.cluster import NODE_HEALTHY, PlacementError
from timeshare.drains import drain_needs_human
from timeshare.scheduler import BudgetPolicy
from timeshare.state import AWAITING, ENDED, PENDING, RUNNING, SchedulerState
from timeshare.tree import AllocationTree, TreeError
from timeshare.units import ms_to_s
from timeshare.workload import ContractError

from ..common import subjects
from ..common.bus import Bus, FenceError, decode_event, reply_json
from ..common.cluster_config import ClusterConfig
from ..common.forked_pickle import PickleJob, start_pickle
from ..common.ids import attempt_of
from ..common.settings import Settings
from ..common.supervise import describe, is_transient
from ..common import telemetry
from ..common.telemetry import setup_metrics, setup_telemetry
from ..common.snapshots import CODE_VERSION, purge_mark_name, read_snapshot, snapshot_name
from .metrics import PlacementMetrics

log = logging.getLogger("timeshare.placement")

PROPOSABLE = (ev.WorkloadSubmitted, ev.WorkloadCompleted, ev.WorkloadFailed, ev.WorkloadCancelled,
              ev.WorkloadCheckpointed, ev.NodeUnhealthy, ev.NodeFailed, ev.NodeRepaired, ev.BudgetChanged)


def notice_problem(state: SchedulerState, e: ev.WorkloadCheckpointed) -> str | None:
    """Why an executor's ``workload.checkpointed`` cannot be applied (None when it can): only a
    workload under notice, in the attempt the notice was given to, reports its checkpoint, once
    (the core's rule, ``SchedulerState.replay_problem``; a report id also names its attempt)."""
    attempt = e.attempt if e.attempt is not None else attempt_of(e.event_id)
    w = state.workloads.get(e.workload_id)
    if w is not None and attempt is not None and attempt != w.attempt:
        return (f"stale report for {e.workload_id}: it is {w.state} in attempt {w.attempt}, the report is about "
                f"attempt {attempt}")
    return state.replay_problem(e)


#: why an id may be unknown to placement although it was submitted once (forget_ended)
FORGOTTEN_HINT = " (never submitted, or ended more than TIMESHARE_FORGET_ENDED_AFTER_S ago and forgotten)"


class Rejected(Exception):
    pass


class UntrustedLog(Exception):
    """A record of the log this placement cannot apply: it does not lead from a state it cannot
    trust; an operator looks at the record and skips it explicitly (services/placement/skip.py)."""

    def __init__(self, seq: int, event_id: str, event_type: str, reason: str):
        super().__init__(f"log record seq {seq} ({event_type} {event_id}) cannot be applied: {reason}; "
                         f"placement does not lead until an operator skips it "
                         f"(python -m services.placement.skip --seq {seq} --reason '...')")
        self.seq = seq
        self.event_id = event_id
        self.event_type = event_type
        self.reason = reason


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


def check_replayable(state: SchedulerState, e: ev.Event) -> str | None:
    """Why ``e`` cannot be applied to ``state`` (None when it can), checked before ``apply``
    touches anything: the log is written by placement alone, but a record that was forged (or
    written by a buggy version) must not leave a half-applied state or crash every rebuild."""
    wid = getattr(e, "workload_id", None)
    w = state.workloads.get(wid) if wid is not None else None
    match e:
        case ev.WorkloadSubmitted():
            # only what applying needs (the contract was checked when it was accepted, maybe
            # under another cap: a changed cluster file must not make the log untrusted)
            spec = e.workload
            held = state.workloads.get(spec.id)
            # an id of work that has ended may come again: the leader that appended it had
            # forgotten the first (forget_ended), this replay has not (a snapshot from before)
            if held is not None and held.ended_s is None:
                return f"workload {spec.id!r} already exists and has not ended"
            if spec.gpu_type not in state.cluster.pools:
                return f"no pool of GPU type {spec.gpu_type!r}"
            if spec.project not in state.tree.nodes or not state.tree.nodes[spec.project].is_leaf:
                return f"project {spec.project!r} is not a leaf of the tree"
            if spec.gpus < 1:
                return f"gpus: {spec.gpus}"
            return None
        case ev.NodeUnhealthy() | ev.NodeFailed() | ev.NodeDrained() | ev.NodeRepaired():
            try:
                state.cluster.node(e.node)
            except PlacementError as exc:
                return str(exc)
            return None
        case ev.BudgetChanged():
            try:
                AllocationTree.from_shares(e.new)
            except TreeError as exc:
                return f"budget change: {exc}"
            return None
    if w is None:
        return f"unknown workload {wid!r}"
    match e:
        case ev.WorkloadStarted():
            # a preemptor awaiting its victims under notice starts on the GPUs held for it
            if w.state not in (PENDING, AWAITING):
                return f"{wid} is {w.state}; only pending work starts"
            seen: set[tuple[str, int]] = set()
            for part in e.placement:
                try:
                    node = state.cluster.node(part.node)
                except PlacementError as exc:
                    return str(exc)
                if node.pool.gpu_type != w.gpu_type:
                    return f"{wid} asks for {w.gpu_type}; node {node.name} is {node.pool.gpu_type}"
                for g in part.gpu_ids:
                    if not 0 <= g < len(node.slots):
                        return f"node {node.name} has no GPU {g}"
                    if node.slots[g] is not None or (node.name, g) in seen:
                        return f"GPU {g} of {node.name} is held by {node.slots[g] or wid} (double booking)"
                    seen.add((node.name, g))
            if len(seen) != w.gpus:
                return f"{wid} needs {w.gpus} GPUs; the record places {len(seen)}"
        case ev.WorkloadPreempted() | ev.WorkloadCompleted():
            if w.state != RUNNING:
                return f"{wid} is {w.state}, not running"
        case ev.WorkloadRequeued():
            if w.state != "preempted":
                return f"{wid} is {w.state}; only preempted work is requeued"
        case ev.WorkloadCheckpointed():
            return notice_problem(state, e)
        case ev.WorkloadPreemptionNotice():
            return state.replay_problem(e)
    return None


class Tick(msgspec.Struct, frozen=True):
    at_ms: int


class Placement:
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

    async def _release_lease(self) -> None:
        try:
            kv = await self.bus.js.key_value(subjects.LEASE_BUCKET)
            await kv.delete(self._lease_key(), last=self.lease_rev)
        except Exception:  # lapses by its TTL anyway
            pass

    # -- the operator's decisions about records placement cannot apply ---------------------
    def _skip_key(self) -> str:
        return f"skip.{self.cluster}"

    async def _skipped_seqs(self) -> set[int]:
        """Log sequences an operator decided to skip (KV ``timeshare_operator``, key
        ``skip.<cluster>``: {"<seq>": {"reason", "at_ms"}}); only the operator's NATS user may write it."""
        try:
            kv = await self.bus.js.key_value(subjects.OPERATOR_BUCKET)
            entry = await kv.get(self._skip_key())
        except Exception:  # no bucket or no key: nothing skipped
            return set()
        try:
            return {int(k) for k in msgspec.json.decode(entry.value)}
        except (msgspec.DecodeError, ValueError, TypeError):
            log.error("the operator's skip list of %s is unreadable; skipping nothing", self.cluster)
            return set()

    async def _wait_for_skip(self, seq: int) -> None:
        while not self.stop_event.is_set():
            if seq in await self._skipped_seqs():
                log.warning("placement %s: the operator skips log record seq %d; rebuilding", self.instance, seq)
                self.untrusted = None
                self.blocked.clear()
                return
            try:
                await asyncio.wait_for(self.stop_event.wait(), 1.0)
            except asyncio.TimeoutError:
                pass

    def _lease_key(self) -> str:
        return f"placement.{self.cluster}"

    async def _run(self) -> None:
        """Campaign for the lease, lead until something goes wrong, step down, campaign again.

        Nothing but ``stop`` ends this loop: a lost lease, a fenced append, NATS going away
        mid-append or a bug in a pass each make this instance step down (logged) and campaign
        again; the next term starts from a replay of the log."""
        wait_s = 0.1
        while not self.stop_event.is_set():
            started = time.monotonic()
            try:
                kv = await self.bus.js.key_value(subjects.LEASE_BUCKET)
                await self._acquire_lease(kv)
                await self._term(kv)
            except asyncio.CancelledError:
                raise
            except FenceError as exc:
                self.last_error = describe(exc)
                log.error("placement %s lost the log (%s); stepping down", self.instance, exc)
            except UntrustedLog as exc:
                # not a crash loop: wait (without the lease) for the operator's decision
                self.last_error = str(exc)
                if self.untrusted is None or self.untrusted.seq != exc.seq:
                    log.error("placement %s: %s", self.instance, exc)
                self.untrusted = exc
                self.blocked.set()
                await self._release_lease()
                await self._wait_for_skip(exc.seq)
                continue
            except Exception as exc:  # noqa: BLE001 - step down, never die
                self.last_error = describe(exc)
                log.error("placement %s stepped down: %s; campaigning again", self.instance, describe(exc),
                          exc_info=not is_transient(exc))
            finally:
                self.leader.clear()
            if time.monotonic() - started > 30:
                wait_s = 0.1
            try:
                await asyncio.wait_for(self.stop_event.wait(), wait_s)
            except asyncio.TimeoutError:
                pass
            wait_s = min(2.0, wait_s * 2)

    async def _term(self, kv) -> None:
        """One term as leader: ends when the lease is lost (returns) or the work fails (raises)."""
        refresher = asyncio.create_task(self._refresh_lease(kv), name="placement lease")
        work = asyncio.create_task(self._lead(), name="placement leader")
        try:
            done, _ = await asyncio.wait({refresher, work}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (refresher, work):
                t.cancel()
            for t in (refresher, work):
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass
        if work in done and not work.cancelled() and work.exception() is not None:
            raise work.exception()
        if refresher in done:
            self.terms_lost += 1
            log.error("placement %s lost its lease; campaigning again", self.instance)

    async def _lead(self) -> None:
        await self._rebuild()
        # the inbox durable acks all up to a sequence at once: what the previous leader
        # fetched but never acked would be acked unseen by this leader's first ack, so
        # everything above the ack floor is delivered again now (applied ids are skipped)
        await self.bus.rewind_to_ack_floor(subjects.INBOX_STREAM, f"placement-{self.cluster}")
        if 0 < self.settings.snapshot_every <= self.replayed:
            self._maybe_snapshot(0, force=True)  # a long replay is not repeated by the next leader
        self.leader.set()
        self.terms += 1
        log.info("placement %s leads cluster %s from log seq %d", self.instance, self.cluster, self.last_log_seq)
        await self._loop()

    async def _acquire_lease(self, kv) -> None:
        key, me = self._lease_key(), self.instance.encode()
        while not self.stop_event.is_set():
            try:
                self.lease_rev = await kv.create(key, me)
                return
            except Exception:  # held (KeyWrongLastSequenceError), or NATS away: look again
                pass
            try:
                entry = await kv.get(key)
                if entry.value == me:  # still ours from the last term (stepped down, not deposed)
                    self.lease_rev = await kv.update(key, me, last=entry.revision)
                    return
            except Exception:
                pass
            await asyncio.sleep(max(0.05, self.settings.lease_ttl_s / 10))
        raise asyncio.CancelledError

    async def _refresh_lease(self, kv) -> None:
        """Keep the lease; return once it is lost (another instance holds it, or it lapsed)."""
        while True:
            await asyncio.sleep(self.settings.lease_ttl_s / 3)
            try:
                self.lease_rev = await kv.update(self._lease_key(), self.instance.encode(), last=self.lease_rev)
            except KeyWrongLastSequenceError:
                self.leader.clear()
                return
            except Exception as exc:  # NATS briefly away: try again
                log.warning("lease refresh failed: %s", exc)

    def _id_prefix(self) -> str:
        """Decision ids of this rebuild: unique per instance *and* rebuild. A new term in the
        same process counts its decisions from 1 again; with the old prefix its ids collided
        with the last term's inside the dedup window, JetStream dropped those decisions as
        duplicates and answered with the old sequences, and the leader fenced itself out for
        the length of the window (two minutes without scheduling after a NATS restart)."""
        self.rebuilds += 1
        return f"p{self.instance}-" if self.rebuilds == 1 else f"p{self.instance}r{self.rebuilds}-"

    async def _rebuild(self) -> None:
        """The state from the latest snapshot (if any) and the log after it, or the whole log."""
        t0 = time.perf_counter()
        prefix = self._id_prefix()
        snap = await self._load_snapshot()
        if snap is not None:
            self.state, self.applied_ids, self.ids_of = snap["state"], snap["applied_ids"], snap["ids_of"]
            # the snapshot counts decision ids under an old prefix: this term uses its own
            self.state._id_prefix = prefix
            start = snap["log_seq"] + 1
        else:
            self.state = SchedulerState(self.config.tree(), self.config.cluster(), self.config.policy,
                                        name=self.cluster, id_prefix=prefix)
            self.applied_ids, self.ids_of = set(), {}
            start = 1
        # completions first on the wall clock (SchedulerState.completion_grace_s); on a manual
        # clock the driver advances the executor, whose reports come in, before it ticks
        self.state.completion_grace_s = 0 if self.clock.manual else self.settings.completion_grace_s
        self.snapshot_seq = self.loaded_snapshot_seq = start - 1
        self.since_snapshot = 0
        n = 0

        skip = await self._skipped_seqs()
        self.skipped = []

        def on_msg(m) -> None:
            nonlocal n
            seq = m.metadata.sequence.stream
            try:
                e = decode_event(m.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                e, problem = None, f"undecodable: {exc}"
            else:
                problem = check_replayable(self.state, e)
            if problem is not None:
                if seq in skip:
                    log.warning("log record seq %d skipped, as an operator decided: %s", seq, problem)
                    self.skipped.append(seq)
                    return
                raise UntrustedLog(seq, getattr(e, "event_id", "?"), ev.event_type(e) if e is not None else "?",
                                   problem)
            if isinstance(e, ev.WorkloadSubmitted) and m.headers and "traceparent" in m.headers:
                self.trace_ctx[e.workload.id] = telemetry.extract_context(m.headers)
            self.state.apply(e)
            self._remember(e)
            n += 1

        self.last_log_seq = await self.bus.replay(subjects.LOG_STREAM, subjects.log_filter(self.cluster), on_msg,
                                                  start_seq=start)
        self.replayed = n
        self.rebuild_s = time.perf_counter() - t0
        log.info("rebuilt %s from %s%d events in %.3fs", self.cluster,
                 f"the snapshot at log seq {start - 1} + " if snap is not None else "", n, self.rebuild_s)

    # -- snapshots --------------------------------------------------------------------------
    # A pickle of the core's SchedulerState (with the applied ids and the log sequence it
    # covers) in the object store, written by the leader every ``snapshot_every`` appended
    # events at a point where the state is exactly the log up to that sequence. It is loaded
    # only by the same code (CODE_VERSION hashes the core, this file and common/snapshots.py), else ignored: the
    # whole log is replayed. Pickle trusts the bucket: only services may write to it.
    def _snapshot_name(self) -> str:
        return snapshot_name(self.cluster)

    async def _load_snapshot(self) -> dict | None:
        return await read_snapshot(self.bus, self.cluster, use=self.settings.snapshot_every > 0)

    def _maybe_snapshot(self, appended: int, force: bool = False) -> None:
        self.since_snapshot += appended
        every = self.settings.snapshot_every
        if every <= 0 or (self.since_snapshot < every and not force) or (
                self.snapshot_task and not self.snapshot_task.done()):
            return
        self._forget_ended()
        # taken here, between batches, where the state is the log up to last_log_seq: a forked
        # child pickles it as it is now while this process goes on (forked_pickle.py)
        job = start_pickle({"code": CODE_VERSION, "cluster": self.cluster, "log_seq": self.last_log_seq,
                            "state": self.state, "applied_ids": self.applied_ids, "ids_of": self.ids_of})
        self.stats["snapshot_pause_ms"] = round(job.paused_s * 1000, 1)
        self.since_snapshot = 0
        self.snapshot_task = asyncio.create_task(self._put_snapshot(job, self.last_log_seq))

    def _forget_ended(self) -> None:
        """Drop work that ended more than ``forget_ended_after_s`` of cluster time ago, so the
        snapshot (and a new leader's start-up) stays the size of the live work, not of history.

        Run before each snapshot, between batches. The retention is counted in event time (the
        state's last event, the log's time, as every duration of the core), not the wall clock. A
        forgotten id is no longer known here: an executor report or a cancel about it is
        refused as "unknown workload", and a submission reusing it would be accepted. That is
        guarded upstream: the gateway refuses an id its store holds (409, the durable record of
        every workload) and JetStream drops a repeated ``sub.<id>`` within its dedup window."""
        after_s = self.settings.forget_ended_after_s
        if after_s <= 0:
            return
        forgotten = self.state.forget_ended(ms_to_s(self.state.last_event_ms) - after_s)
        for wid in forgotten:  # normally gone at the end already (_remember); never kept after it
            self.trace_ctx.pop(wid, None)
            for i in self.ids_of.pop(wid, ()):
                self.applied_ids.discard(i)
        if forgotten:
            self.stats["forgotten"] = self.stats.get("forgotten", 0) + len(forgotten)
            log.info("placement %s forgot %d workloads that ended before %s s", self.instance, len(forgotten),
                     ms_to_s(self.state.last_event_ms) - after_s)

    async def _put_snapshot(self, job: PickleJob, log_seq: int) -> None:
        try:
            data = await job.result()
            store = await self.bus.object_store(subjects.SNAPSHOT_BUCKET)
            await store.put(self._snapshot_name(), data)
            previous, self.snapshot_seq = self.snapshot_seq, log_seq
            log.info("snapshot of %s at log seq %d (%d bytes; the loop paused %.1f ms%s)", self.cluster, log_seq,
                     len(data), job.paused_s * 1000, " to fork" if job.forked else "")
        except Exception as exc:  # noqa: BLE001 - the next one will try again
            log.warning("snapshot of %s failed: %s", self.cluster, describe(exc))
            return
        if self.settings.purges_log and previous:
            try:
                await self._purge_log(previous)
            except Exception as exc:  # noqa: BLE001 - the next snapshot tries again
                log.warning("purging the log of %s failed: %s", self.cluster, describe(exc))

    def _log_durables(self) -> list[str]:
        """The durable consumers that read this cluster's log (infra/nats.json)."""
        from ..common.bus import infra_definitions

        defs = infra_definitions(self.settings, self.cluster)
        return sorted(c["durable_name"] for c in defs["consumers"] if c["stream"] == subjects.LOG_STREAM)

    async def _purge_log(self, covered_seq: int) -> int:
        """Drop this cluster's log messages that no reader needs any more; returns the first kept.

        Kept: everything after ``covered_seq`` (the snapshot *before* the one just written: a
        reader that follows the log without a durable, the executor, may be that far behind
        and still miss nothing; a new leader starts from the newest), and everything a durable
        projection has not read and acknowledged. A durable that cannot be asked (missing, or
        being re-created) stops the purge: it may need anything."""
        keep_from = covered_seq + 1
        held_by: dict[str, int] = {}
        for durable in self._log_durables():
            try:
                info = await self.bus.js.consumer_info(subjects.LOG_STREAM, durable)
            except Exception as exc:  # noqa: BLE001
                log.info("log of %s not purged: durable %s: %s", self.cluster, durable, describe(exc))
                return 0
            # a durable filters the log (budget reads budget.changed only): what it still needs
            # starts after its ack floor when it holds unacked messages, after what it was last
            # sent when messages wait for it, and nowhere when it has read all there is (what
            # comes next lands above anything purged here)
            needs = None
            if info.num_ack_pending:
                needs = (info.ack_floor.stream_seq if info.ack_floor else 0) + 1
            elif info.num_pending:
                needs = (info.delivered.stream_seq if info.delivered else 0) + 1
            if needs is not None and needs <= covered_seq:
                held_by[durable] = needs
                keep_from = min(keep_from, needs)
        self._note_held_purge(held_by)
        if keep_from <= max(self.purged_below, 1):
            return keep_from  # nothing new to drop
        # the mark first: a leader running other code must not replay a log that is no longer whole
        store = await self.bus.object_store(subjects.SNAPSHOT_BUCKET)
        await store.put(purge_mark_name(self.cluster), str(keep_from).encode())
        await self.bus.js.purge_stream(subjects.LOG_STREAM, seq=keep_from, subject=subjects.log_filter(self.cluster))
        self.purged_below = keep_from
        self.stats["purged_below"] = keep_from
        log.info("log of %s purged below seq %d", self.cluster, keep_from)
        return keep_from

    def _note_held_purge(self, held_by: dict[str, int]) -> None:
        """A durable that needs the same sequence at two purges in a row has read nothing
        between two snapshots: its projection is away or stuck, and the log grows behind it
        (safe: nothing it needs is dropped). Said once per durable and position, not per purge."""
        for durable, needs in held_by.items():
            if self.purge_held_by.get(durable) == needs:
                if self._purge_warned.get(durable) != needs:
                    log.warning("log of %s: durable %s has read nothing since seq %d; the log is kept from "
                                "there (snapshot covers seq %d). Is its projection running?",
                                self.cluster, durable, needs, self.snapshot_seq)
                    self._purge_warned[durable] = needs
        self.purge_held_by = held_by

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

    # -- traces -----------------------------------------------------------------------------
    # One trace per workload: the gateway's HTTP span -> "placement workload.submitted" (here,
    # child of the traceparent the proposal carried) -> one span per decision about it, child
    # of that, timed like the pass that made it and linked to the pass's own span -> the
    # executor's report -> "placement workload.completed". Each log message carries the context
    # of its event's span, so services downstream continue the workload's trace.
    def _trace_input(self, e: ev.Event, msg) -> None:
        if not telemetry.enabled():
            return
        wid = e.workload.id if isinstance(e, ev.WorkloadSubmitted) else getattr(e, "workload_id", None)
        if wid is None:
            return
        headers = msg.headers or {}
        parent = telemetry.extract_context(headers) if "traceparent" in headers else self.trace_ctx.get(wid)
        attrs = {"timeshare.workload_id": wid, "timeshare.event_id": e.event_id, "timeshare.at_ms": e.at_ms,
                 "timeshare.cluster": self.cluster}
        if isinstance(e, ev.WorkloadSubmitted):
            w = e.workload
            attrs.update({"timeshare.project": w.project, "timeshare.user": w.user, "timeshare.gpu_type": w.gpu_type,
                          "timeshare.gpus": w.gpus, "timeshare.min_runtime_s": w.min_runtime_s,
                          "timeshare.resumable": w.resumable, "timeshare.kind": w.kind})
        span = self.tracer.start_span(f"placement {ev.event_type(e)}", context=parent, attributes=attrs)
        self.open_spans.append(span)  # ended once the log holds it (_append)
        ctx = trace.set_span_in_context(span)
        if isinstance(e, ev.WorkloadSubmitted):
            self.trace_ctx[wid] = ctx
        self.event_ctx[e.event_id] = ctx

    def _trace_decisions(self, decisions: list[ev.Event], pass_span, start_ns: int) -> None:
        """A span per decision in its workload's trace, with the numbers that justified it."""
        link = [trace.Link(pass_span.get_span_context())]
        for e in decisions:
            wid = getattr(e, "workload_id", None)
            if wid is None:
                continue
            attrs: dict = {"timeshare.workload_id": wid, "timeshare.event_id": e.event_id,
                           "timeshare.at_ms": e.at_ms, "timeshare.cluster": self.cluster}
            if isinstance(e, ev.WorkloadStarted):
                attrs.update({"timeshare.project": e.project, "timeshare.gpus": e.gpus,
                              "timeshare.nodes": ",".join(p.node for p in e.placement),
                              "timeshare.allocated": e.allocated, "timeshare.attempt": e.attempt})
                if e.protected_until_ms is not None:
                    attrs["timeshare.protected_until_ms"] = e.protected_until_ms
            elif isinstance(e, ev.WorkloadPreempted):
                attrs.update(telemetry.attributes_of("timeshare.preemption", e.reason, skip=("rejected",)))
                attrs.update({"timeshare.resumable": e.resumable, "timeshare.progress_s": e.progress_s,
                              "timeshare.lost_gpu_s": e.lost_gpu_s})
                if e.checkpointed is not msgspec.UNSET:  # after a notice
                    attrs.update({"timeshare.checkpointed": e.checkpointed,
                                  "timeshare.checkpoint_gpu_s": e.checkpoint_gpu_s})
            elif isinstance(e, ev.WorkloadPreemptionNotice):
                attrs.update(telemetry.attributes_of("timeshare.preemption", e.reason, skip=("rejected",)))
                attrs.update({"timeshare.deadline_ms": e.deadline_ms, "timeshare.attempt": e.attempt or 0})
            # a workload whose trace is unknown (submitted before a snapshot) hangs under the pass
            parent = self.trace_ctx.get(wid)
            span = self.tracer.start_span(f"placement.pass {ev.event_type(e)}", context=parent, links=link,
                                          start_time=start_ns, attributes=attrs)
            if isinstance(e, ev.WorkloadPreempted):
                span.add_event("preempted", {"timeshare.message": e.reason.message})
                # the closest candidates it did not take, and why: the data explain's sentence is made of
                for c in e.reason.rejected or ():
                    span.add_event("rejected", telemetry.attributes_of("timeshare.rejected", c))
            self.open_spans.append(span)  # ended once the log holds the decision (_append)
            self.event_ctx[e.event_id] = trace.set_span_in_context(span)

    def _end_spans(self, appended: bool) -> None:
        """End the spans of this batch's events: a decision is made when the log holds it. A
        batch the log refused (a deposed leader, a term that ended) is marked: the next leader
        decides again, with other event ids, in spans of its own. The metrics count only what
        the log holds, for the same reason."""
        for span in self.open_spans:
            span.set_attribute("timeshare.appended", appended)
            if not appended:
                span.set_status(trace.Status(trace.StatusCode.ERROR, "not appended to the log: the term ended"))
            span.end()
        self.open_spans.clear()
        if appended:
            self.metrics.decided(self.decided)
        self.decided.clear()

    async def _append(self, out: list[ev.Event]) -> None:
        try:
            acks = await self.bus.publish_events(
                out, lambda e: subjects.log_subject(self.cluster, ev.event_type(e)),
                fence_after_seq=self.last_log_seq, fence_filter=subjects.log_filter(self.cluster),
                context_of=lambda e: self.event_ctx.get(e.event_id))
        except BaseException:
            self._end_spans(appended=False)
            raise
        self.last_log_seq = max(self.last_log_seq, *(a.seq for a in acks))
        dup = [(e.event_id, a.seq) for e, a in zip(out, acks) if a.duplicate]
        self._end_spans(appended=not dup)
        if dup:
            # an id already in the log was not appended, yet the state applied it: the state is
            # no longer the log's; end the term, the next one rebuilds from the log
            raise RuntimeError(f"{len(dup)} events not appended, their ids are in the log already: {dup[:5]}")

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
                try:
                    tree = AllocationTree.from_shares(e.new)
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


def default_broker(service: Placement):
    from ..common.broker import make_broker
    from .handlers import router

    return make_broker(service.settings, f"placement-{service.instance}", router(service, service.cluster))
