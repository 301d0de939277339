"""Executor: runs what placement decided and reports how it ended.

It follows the cluster's log from the beginning (its state is rebuilt by replay: which
workloads run, where, in which attempt). ``started`` launches a workload, ``preempted`` /
``cancelled`` / ``failed`` stop it; when a workload ends by itself the executor proposes
``completed`` or ``failed`` (exit code) with the id ``<kind>.<workload>.<attempt>``, so a
stale report is recognised by placement and a retry dedups.

* simulated: a workload "runs" for its remaining work x ``time_scale`` seconds (wall clock),
  or, on a manual clock, until a driver advances the clock past its end (``advance`` command);
* process: each part of the placement runs ``spec.command`` as a local process with
  ``CUDA_VISIBLE_DEVICES`` = its GPU ids and ``TIMESHARE_RANK`` / ``TIMESHARE_WORLD_SIZE``;
  a stop sends SIGTERM to the process group, then SIGKILL after the grace period. Processes get
  SIGTERM when the executor dies, and a restarted executor stops the groups a killed one left
  before it starts anything (``processes.py``).

Preemption with notice (a workload that declared ``checkpoint_on_notice_s``): every process
gets ``TIMESHARE_CHECKPOINT_DIR`` (one directory per workload under ``executor_data_dir``, kept
across attempts) and ``TIMESHARE_NOTICE_S``. ``workload.preemption_notice`` sends SIGTERM to its
processes at once and SIGKILL at the notice's deadline if they still run; processes that all exit
0 before the deadline have written their checkpoint: the executor proposes
``workload.checkpointed`` (id ``ckpt.<workload>.<attempt>``) and placement hands the GPUs over
then, instead of at the deadline. A simulated workload writes its checkpoint as the simulator
models it (``timeshare.sim.storage``: its declared ``checkpoint_on_notice_s`` x ``time_scale``,
longer when checkpoints written at once share too little of the cluster's bandwidth). Work under
notice with no processes here (an executor restarted during the notice) is started again only to
write its checkpoint: ``TIMESHARE_UNDER_NOTICE=1``, SIGTERM halfway to the deadline, SIGKILL at it.

A workload's checkpoint directory is removed once the workload has ended for good (completed,
failed, cancelled, preempted and not requeued: ``events.ends_for_good``), after its processes
stopped; one that is requeued keeps it. An executor that was down when work ended removes those
directories at its start, once it has caught up with the log (``checkpoints.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import msgspec
from opentelemetry import trace
from tenacity import AsyncRetrying, retry_if_exception, wait_exponential_jitter

from timeshare import events as ev

from ..common import subjects
from ..common.bus import Bus, decode_event, follow
from ..common.cluster_config import ClusterConfig
from ..common.ids import ended_id
from ..common.settings import Settings
from ..common.supervise import describe, is_transient, retry_transient
from ..common.telemetry import extract_context, setup_telemetry
from . import processes
from .checkpoints import checkpoint_dir, remove_checkpoint_dir, stale_checkpoint_dirs

log = logging.getLogger("timeshare.executor")


#: the id of the checkpoint report of one attempt (a retry dedups, a stale one is recognised)
CHECKPOINTED = "ckpt"


class Running:
    __slots__ = ("workload_id", "attempt", "end_ms", "spec", "placement", "handle", "procs", "stopping",
                 "started_seq", "trace_ctx", "notice_deadline_ms", "checkpoint_reported", "signals")

    def __init__(self, workload_id, attempt, end_ms, spec, placement, started_seq: int = 0):
        self.workload_id = workload_id
        self.started_seq = started_seq
        self.attempt = attempt
        self.end_ms = end_ms
        self.spec = spec
        self.placement = placement
        self.handle = None
        self.procs: list[asyncio.subprocess.Process] = []
        self.stopping = False
        #: the trace context of its ``workload.started`` (from the log message's headers): the
        #: run's span and the report it proposes belong to the workload's trace
        self.trace_ctx = None
        #: under notice: the deadline (SIGKILL then); None while it runs without one
        self.notice_deadline_ms: int | None = None
        #: its checkpoint was reported (simulated: its work stopped at the notice, no completion)
        self.checkpoint_reported = False
        #: the timers that send SIGKILL at the deadline (and SIGTERM, to processes started under
        #: notice, halfway there)
        self.signals: list[asyncio.TimerHandle] = []

    @property
    def under_notice(self) -> bool:
        return self.notice_deadline_ms is not None


class Executor:
    def __init__(self, settings: Settings, config: ClusterConfig, clock, bus: Bus | None = None):
        self.settings = settings
        self.cluster = config.name
        self.clock = clock
        self.bus = bus
        self.own_bus = bus is None
        self.kind = settings.executor
        self.tracer = setup_telemetry("executor", settings.otel)
        if self.kind not in ("simulated", "process"):
            raise ValueError(f"TIMESHARE_EXECUTOR must be 'simulated' or 'process', got {self.kind!r}")
        from ..common.settings import ROOT

        self.data_dir = settings.executor_data_dir or str(ROOT / ".run" / "executor")
        self.policy = config.policy
        from timeshare.sim.storage import CheckpointStorage

        #: simulated work under notice writes its checkpoint here, as in the simulator
        self.storage = CheckpointStorage(config.cluster().checkpoint_bandwidth_gbps)
        self.storage_timer: asyncio.TimerHandle | None = None
        self.specs: dict[str, object] = {}
        self.running: dict[str, Running] = {}
        self.stop_event = asyncio.Event()
        self.caught_up = asyncio.Event()
        self.tasks: list[asyncio.Task] = []
        self.broker = None
        self.reported = 0
        #: (node, GPU id) -> the stop of the process still holding it: a workload given those
        #: GPUs starts only once that process has exited (SIGTERM, grace, SIGKILL), so two
        #: processes never share a GPU even though placement hands GPUs over at once
        self.releasing: dict[tuple[str, int], asyncio.Future] = {}
        #: stream sequence of the last log message applied (``advance`` waits for a given one)
        self.last_seq = 0
        #: log sequences on the operator's skip list (read at start)
        self.skipped_seqs: set[int] = set()
        #: the log follower's position, lag and last error (for the health report)
        self.follow_status: dict = {}
        self.seq_changed = asyncio.Condition()
        #: the log is followed live (past the history replayed at start): a workload that ends
        #: for good now has its checkpoint directory removed at once; the ends replayed at start
        #: are covered by one sweep once caught up (_sweep_checkpoints)
        self.live = False
        #: checkpoint directories being removed (awaited by ``stop``)
        self.cleanups: set[asyncio.Future] = set()

    async def start(self, broker=None) -> "Executor":
        """``broker``: the faststream broker with this service's handlers (``main.py`` builds it);
        without one, the handlers of ``handlers.py`` on a broker of its own."""
        if self.bus is None:
            self.bus = await Bus.connect(self.settings, self.cluster, name="executor")
        await self.bus.ensure_infra()
        self.broker = broker or default_broker(self)
        await self.broker.start()  # its router also answers trace queries (the gateway gathers spans)
        if self.kind == "process":  # before anything is started: nothing runs twice (processes.py)
            await processes.stop_leftovers(self.data_dir, self.cluster, self.settings.kill_grace_s)
        start_seq = await self._from_snapshot()
        self.skipped_seqs = await self._operator_skips()
        self.tasks.append(asyncio.create_task(follow(
            self.bus, subjects.LOG_STREAM, subjects.log_filter(self.cluster), self._on_batch, self.stop_event,
            start_seq=start_seq, caught_up=self.caught_up, name=f"executor {self.cluster} log follower",
            status=self.follow_status)))
        await self.caught_up.wait()
        await self._sweep_checkpoints()
        # what runs by the log and placement's snapshot: the follower launches it with the next
        # live batch, which does not come while the log is quiet
        self._launch_all()
        return self

    async def _operator_skips(self) -> set[int]:
        """The log records an operator told placement to skip (KV ``timeshare_operator``, key
        ``skip.<cluster>``): never applied by placement, so not followed here either."""
        try:
            kv = await self.bus.js.key_value(subjects.OPERATOR_BUCKET)
            entry = await kv.get(f"skip.{self.cluster}")
            return {int(k) for k in msgspec.json.decode(entry.value)}
        except Exception:  # no bucket, no key, unreadable: nothing skipped
            return set()

    async def _from_snapshot(self) -> int:
        """Adopt what runs and what may still run from placement's latest snapshot; returns the
        log sequence to follow from (1 without a snapshot: the whole log, as before purging).

        Once placement purges the log, a replay from the start would miss the submissions and
        starts of work that runs now; the snapshot holds them (the core's state: spec,
        attempt, placement, when the run started and the progress it started from)."""
        from timeshare.state import ENDED, PREEMPTED, RUNNING

        from ..common.snapshots import read_snapshot

        snap = await retry_transient(f"reading placement's snapshot of {self.cluster}",
                                     lambda: read_snapshot(self.bus, self.cluster))
        if snap is None:
            return 1
        state = snap["state"]
        scale = 1.0 if self.clock.manual else self.settings.time_scale
        for wid, w in sorted(state.workloads.items()):
            if w.state in ENDED and not (w.state == PREEMPTED and w.resumable):
                continue  # a resumable preempted workload is requeued next: keep its spec
            self.specs[wid] = w.spec
            if w.state == RUNNING:
                start_ms = state.ms(w.run_start_s)
                end_ms = start_ms + int(round((w.spec.work_s - w.progress_s) * 1000 * scale))
                placement = [ev.NodeGpus(node=node.name, gpu_ids=list(gpus)) for node, gpus in w.placement]
                self.running[wid] = r = Running(wid, w.attempt, end_ms, w.spec, placement)
                if w.notice is not None:  # under notice at the snapshot (_launch: what it does then)
                    r.checkpoint_reported = w.notice.checkpointed_s is not None
                    if r.checkpoint_reported:
                        r.notice_deadline_ms = state.ms(w.notice.deadline_s)
                    else:
                        self._notice(r, state.ms(w.notice.deadline_s), state.ms(w.notice.notified_s))
        self.last_seq = snap["log_seq"]
        log.info("executor %s starts from the snapshot at log seq %d (%d running)", self.cluster,
                 snap["log_seq"], len(self.running))
        return snap["log_seq"] + 1

    async def health_report(self) -> dict:
        st = dict(self.follow_status)
        since = time.monotonic() - st.pop("last_progress", time.monotonic())
        st.update(applied_seq=self.last_seq, since_progress_s=round(since, 3),
                  stuck=since > self.settings.stuck_after_s)
        return {"ok": self.bus.nc.is_connected and not st["stuck"], "consumers": {"log follower": st},
                "running": len(self.running), "reported": self.reported}

    async def stop(self) -> None:
        self.stop_event.set()
        if self.storage_timer is not None:
            self.storage_timer.cancel()
        for r in list(self.running.values()):
            if r.handle is not None:
                r.handle.cancel()
            if r.procs:
                await self._terminate(r)
        if self.cleanups:
            await asyncio.gather(*self.cleanups, return_exceptions=True)
        for t in self.tasks:
            t.cancel()
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        if self.broker is not None:
            await self.broker.stop()
        if self.own_bus:
            await self.bus.close()

    # -- following the log ------------------------------------------------------------------
    async def _on_batch(self, msgs, live: bool) -> None:
        self.live = live
        for m in msgs:
            seq = m.metadata.sequence.stream
            try:
                e = decode_event(m.data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue  # placement never appends what it cannot decode
            finally:
                self.last_seq = max(self.last_seq, seq)
            if seq in self.skipped_seqs:
                # placement skips it too (the operator's decision): one line, no traceback
                # (issue 22, finding 8: a traceback at every start for a skipped record)
                log.info("executor %s: log record seq %d (%s) is on the operator's skip list: skipped",
                         self.cluster, seq, ev.event_type(e))
                continue
            try:
                self._apply(e, seq)
                if isinstance(e, ev.WorkloadStarted) and m.headers and e.workload_id in self.running:
                    self.running[e.workload_id].trace_ctx = extract_context(m.headers)
            except Exception as exc:  # one event this executor cannot follow must not stop it
                log.warning("executor %s: cannot apply %s (log seq %d): %s", self.cluster, ev.event_type(e), seq,
                            describe(exc))
                log.debug("executor: the failure in full", exc_info=True)
        if live:
            self._launch_all()
        if msgs:
            async with self.seq_changed:
                self.seq_changed.notify_all()

    def _apply(self, e, seq: int = 0) -> None:
        match e:
            case ev.WorkloadSubmitted():
                self.specs[e.workload.id] = e.workload
            case ev.WorkloadStarted():
                spec = self.specs[e.workload_id]
                remaining_s = spec.work_s - e.progress_s
                end_ms = e.at_ms + int(round(remaining_s * 1000 * (1.0 if self.clock.manual else self.settings.time_scale)))
                self.running[e.workload_id] = Running(e.workload_id, e.attempt, end_ms, spec, e.placement, seq)
            case ev.WorkloadPreemptionNotice():
                r = self.running.get(e.workload_id)
                if r is not None and (e.attempt is None or e.attempt == r.attempt) and not r.under_notice:
                    self._notice(r, e.deadline_ms, e.at_ms)
            case ev.WorkloadPreempted() | ev.WorkloadCancelled() | ev.WorkloadFailed() | ev.WorkloadCompleted():
                for_good = ev.ends_for_good(e)
                if for_good:
                    self.specs.pop(e.workload_id, None)  # never started again
                r = self.running.pop(e.workload_id, None)
                stopping = None
                if e.workload_id in self.storage.writers:  # it stopped writing (as the simulator's storage)
                    self.storage.remove(e.workload_id, e.at_ms)
                    self._storage_changed()
                if r is not None:
                    r.stopping = True
                    if r.handle is not None:
                        r.handle.cancel()
                    for t in r.signals:
                        t.cancel()
                    if r.procs:
                        stopping = asyncio.ensure_future(self._terminate(r))
                        self._release_later(r, stopping)
                if for_good and self.live:
                    self._forget_checkpoint(e.workload_id, stopping)

    # -- checkpoint directories -------------------------------------------------------------
    def _forget_checkpoint(self, workload_id: str, stopping: asyncio.Future | None) -> None:
        """Remove the directory of a workload that ended for good, once its processes (if any
        still run) have stopped: none of them writes into a directory being removed."""
        task = asyncio.ensure_future(self._remove_checkpoint(workload_id, stopping))
        self.cleanups.add(task)
        task.add_done_callback(self.cleanups.discard)

    async def _remove_checkpoint(self, workload_id: str, stopping: asyncio.Future | None = None) -> None:
        if stopping is not None:
            await asyncio.wait([stopping])  # not gather: a cancelled wait must not cancel the stop
        try:  # a thread: a checkpoint may be many files
            if await asyncio.to_thread(remove_checkpoint_dir, self.data_dir, self.cluster, workload_id):
                log.info("executor %s: removed the checkpoint directory of %s (ended for good)", self.cluster,
                         workload_id)
        except (OSError, ValueError) as exc:  # one directory it cannot remove must not stop the executor
            log.warning("executor %s: cannot remove the checkpoint directory of %s: %s", self.cluster, workload_id,
                        describe(exc))

    async def _sweep_checkpoints(self) -> None:
        """Once caught up: remove the directory of every workload that is no longer live (not
        submitted-and-not-ended in the log or placement's snapshot), i.e. that ended for good
        while this executor was down, or before its start's replay. Listed and compared in one
        step of the event loop: a directory is created only for a workload it knows as live, and
        an id that ended never becomes live again (the gateway refuses a used id), so nothing
        created after the listing is removed."""
        stale = stale_checkpoint_dirs(self.data_dir, self.cluster, self.specs)
        for wid in stale:
            await self._remove_checkpoint(wid)
        if stale:
            log.info("executor %s: swept %d checkpoint directories of workloads that ended", self.cluster, len(stale))

    def _release_later(self, r: Running, stopping: asyncio.Future) -> None:
        keys = [(part.node, g) for part in r.placement for g in part.gpu_ids]
        for key in keys:
            self.releasing[key] = stopping

        def released(_):
            for key in keys:
                if self.releasing.get(key) is stopping:
                    del self.releasing[key]

        stopping.add_done_callback(released)

    def _launch_all(self) -> None:
        for r in list(self.running.values()):
            if r.handle is None and not r.procs and not r.stopping:
                self._launch(r)

    def _launch(self, r: Running) -> None:
        if r.under_notice and not self._relaunch_under_notice(r):
            # simulated work writes its checkpoint in the storage model (its timer is the
            # executor's, _storage_changed); a checkpoint reported already, or a deadline past,
            # leaves nothing to do: placement preempts it
            return
        if self.kind == "process" and r.spec.command:
            r.handle = asyncio.ensure_future(self._run_processes(r))
        elif not self.clock.manual:
            delay_s = max(0.0, (r.end_ms - self.clock.now_ms()) / 1000)
            r.handle = asyncio.get_running_loop().call_later(delay_s, self._finish_soon, r, 0)
        # manual clock: the driver's ``advance`` ends it

    def _relaunch_under_notice(self, r: Running) -> bool:
        """Whether to start the processes of work under notice that has none here: noticed
        before it was launched (in the same batch, or while this executor was down: its stop
        ended the processes). Started under notice (``TIMESHARE_UNDER_NOTICE=1``,
        _notice_at_start), a workload that honours its notice resumes from its checkpoint
        directory, writes it again and exits 0: the executor reports the checkpoint and placement
        hands the GPUs over in seconds, where waiting for the deadline held them idle for up to
        the whole notice. It keeps what its directory holds: the notice's checkpoint when the
        stopped process wrote it before it died, else its last periodic one
        (docs/design/known-gaps.md)."""
        return (self.kind == "process" and bool(r.spec.command) and not r.checkpoint_reported
                and r.notice_deadline_ms is not None and self.clock.now_ms() < r.notice_deadline_ms)

    def _finish_soon(self, r: Running, exit_code: int) -> None:
        asyncio.ensure_future(self._report(r, exit_code, self.clock.now_ms()))

    async def _report(self, r: Running, exit_code: int | None, at_ms: int, reason: str = "") -> None:
        if r.stopping or self.stop_event.is_set() or self.running.get(r.workload_id) is not r \
                or (r.checkpoint_reported and not r.procs):
            return
        r.stopping = True
        if exit_code == 0:
            e = ev.WorkloadCompleted(event_id=ended_id("done", r.workload_id, r.attempt), at_ms=at_ms,
                                     cluster=self.cluster, workload_id=r.workload_id, attempt=r.attempt)
        else:
            e = ev.WorkloadFailed(event_id=ended_id("fail", r.workload_id, r.attempt), at_ms=at_ms,
                                  cluster=self.cluster, workload_id=r.workload_id,
                                  reason=reason or f"exit code {exit_code}", exit_code=exit_code,
                                  attempt=r.attempt)
        span = self.tracer.start_span(f"executor {ev.event_type(e)}", context=r.trace_ctx, attributes={
            "timeshare.workload_id": r.workload_id, "timeshare.cluster": self.cluster, "timeshare.attempt": r.attempt,
            "timeshare.exit_code": -1 if exit_code is None else exit_code})
        if not await self._propose_report(r, e, span):
            r.stopping = False

    async def _propose_report(self, r: Running, e: ev.Event, span) -> bool:
        """Propose a report of ``r`` (an end, a checkpoint) until it is in placement's inbox;
        ends ``span``. A lost connection is retried until it comes back (the id dedups a
        repeat); the report is dropped only when the workload was stopped meanwhile or the
        executor stops. True when it was proposed."""
        try:
            async for attempt in AsyncRetrying(
                    retry=retry_if_exception(is_transient), reraise=True,
                    wait=wait_exponential_jitter(multiplier=0.1, max=2.0, jitter=0.1),
                    stop=lambda _s: self.stop_event.is_set() or self.running.get(r.workload_id) is not r,
                    before_sleep=lambda rs: log.warning("report %s: %s; retrying", e.event_id,
                                                        rs.outcome.exception())):
                with attempt, trace.use_span(span):  # the proposal carries the workload's trace
                    await self.bus.propose(e)
            self.reported += 1
            return True
        except Exception as exc:
            log.error("could not report %s: %s", e.event_id, exc)
            return False
        finally:
            span.end()

    # -- preemption with notice -------------------------------------------------------------
    def _notice_s(self, spec) -> int:
        """The notice this workload will be given (0: none, SIGTERM then means stop): what it
        declared, when the policy gives notices and it keeps something by one (resumable work,
        a session that suspends), as ``SchedulerState.gives_notice`` decides."""
        if not self.policy.preemption_notice or not (spec.resumable or spec.suspends):
            return 0
        return spec.notice_s

    def _notice(self, r: Running, deadline_ms: int, at_ms: int) -> None:
        """SIGTERM now, SIGKILL at the deadline (processes); simulated work starts writing its
        checkpoint in the storage model. Applied while catching up too: nothing runs yet then,
        and ``_launch`` starts the processes under notice (``_relaunch_under_notice``)."""
        r.notice_deadline_ms = deadline_ms
        if self.kind == "process" and r.spec.command:
            if r.procs:  # else they are being started: _run_processes calls this again
                self._signal(r, signal.SIGTERM)
                delay_s = max(0.0, (deadline_ms - self.clock.now_ms()) / 1000)
                r.signals.append(asyncio.get_running_loop().call_later(delay_s, self._signal, r, signal.SIGKILL))
            return
        # simulated, as the simulator models it (timeshare.sim.storage): the checkpoint takes its
        # declared time, longer when checkpoints written at once share too little bandwidth; its
        # work goes on meanwhile (it may complete first) and stops when the checkpoint is written
        scale = 1.0 if self.clock.manual else self.settings.time_scale
        self.storage.add(r.workload_id, r.attempt, r.spec.checkpoint_size_gb, r.spec.notice_s * scale, at_ms)
        self._storage_changed()

    def _notice_at_start(self, r: Running) -> None:
        """Processes started under notice (_relaunch_under_notice) were told so by
        ``TIMESHARE_UNDER_NOTICE=1``: write the checkpoint and exit 0 at once. A SIGTERM now
        would meet a process that has not set up its handler yet (and kill it, checkpoint
        unwritten), so the one that missed the variable gets SIGTERM halfway to the deadline;
        SIGKILL at the deadline as for any notice."""
        left_s = max(0.0, (r.notice_deadline_ms - self.clock.now_ms()) / 1000)
        loop = asyncio.get_running_loop()
        r.signals += [loop.call_later(left_s / 2, self._signal, r, signal.SIGTERM),
                      loop.call_later(left_s, self._signal, r, signal.SIGKILL)]

    def _storage_changed(self) -> None:
        """Wall clock: one timer at the next checkpoint the storage finishes (the manual clock's
        ``advance`` reports them instead)."""
        if self.clock.manual:
            return
        if self.storage_timer is not None:
            self.storage_timer.cancel()
            self.storage_timer = None
        nxt = self.storage.next_finish()
        if nxt is not None:
            self.storage_timer = asyncio.get_running_loop().call_later(
                max(0.0, (nxt[0] - self.clock.now_ms()) / 1000), self._checkpoints_due)

    def _checkpoints_due(self) -> None:
        self.storage_timer = None
        for r, at_ms in self._written_by(self.clock.now_ms()):
            asyncio.ensure_future(self._report_checkpointed(r, at_ms))
        self._storage_changed()

    def _written_by(self, now_ms: int) -> list[tuple[Running, int]]:
        """Checkpoints the storage finished by ``now_ms``, in the order they finished (each at
        its own time; the rates change as each one ends), taken out of the storage."""
        out = []
        while True:
            nxt = self.storage.next_finish()
            if nxt is None or nxt[0] > now_ms:
                return out
            at_ms, wid = nxt
            finished = self.storage.finished(wid, at_ms)
            self.storage.remove(wid, at_ms)
            r = self.running.get(wid)
            if finished and r is not None and r.under_notice and not r.stopping:
                out.append((r, at_ms))

    def _signal(self, r: Running, sig: int) -> None:
        for p in r.procs:
            if p.returncode is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    async def _report_checkpointed(self, r: Running, at_ms: int) -> None:
        """Propose ``workload.checkpointed`` for this attempt (placement accepts it only while
        the workload is under notice in that attempt; a repeat dedups by its id)."""
        if self.stop_event.is_set() or self.running.get(r.workload_id) is not r or r.stopping \
                or r.checkpoint_reported:
            return
        r.checkpoint_reported = True  # its work stops here: no completion is reported after it
        e = ev.WorkloadCheckpointed(event_id=ended_id(CHECKPOINTED, r.workload_id, r.attempt), at_ms=at_ms,
                                    cluster=self.cluster, workload_id=r.workload_id, attempt=r.attempt)
        span = self.tracer.start_span("executor workload.checkpointed", context=r.trace_ctx, attributes={
            "timeshare.workload_id": r.workload_id, "timeshare.cluster": self.cluster, "timeshare.attempt": r.attempt})
        await self._propose_report(r, e, span)

    # -- manual clock -----------------------------------------------------------------------
    async def wait_for_seq(self, seq: int, timeout_s: float = 10.0) -> None:
        """Return once the log has been applied up to stream sequence ``seq``."""
        async with self.seq_changed:
            await asyncio.wait_for(self.seq_changed.wait_for(lambda: self.last_seq >= seq), timeout_s)

    async def advance(self, now_ms: int, log_seq: int = 0) -> list[str]:
        """End every simulated workload due by ``now_ms`` (stamped at its own end time).

        ``log_seq``: first apply the log up to this stream sequence (the driver's last
        tick), so work started by it is known. Work ending at the same moment is reported in
        the order it started (the simulator's order)."""
        if log_seq:
            await self.wait_for_seq(log_seq)
        # checkpoints written by now (the storage model), before completions of the same moment
        for r, at_ms in self._written_by(now_ms):
            await self._report_checkpointed(r, at_ms)
        due = sorted((r for r in self.running.values() if r.end_ms <= now_ms and not r.stopping
                       and not r.checkpoint_reported),
                     key=lambda r: (r.end_ms, r.started_seq, r.workload_id))
        for r in due:
            await self._report(r, 0, r.end_ms)
        return [r.workload_id for r in due]

    # -- processes --------------------------------------------------------------------------
    async def _run_processes(self, r: Running) -> None:
        holders = {self.releasing[(part.node, g)] for part in r.placement for g in part.gpu_ids
                   if (part.node, g) in self.releasing}
        if holders:  # the previous holders of these GPUs are still stopping
            await asyncio.gather(*holders, return_exceptions=True)
            if r.stopping or (r.under_notice and not self._relaunch_under_notice(r)):
                return  # noticed meanwhile: started only to write its checkpoint (_relaunch_under_notice)
        world = len(r.placement)
        started_under_notice = r.under_notice
        try:
            ckpt_dir = checkpoint_dir(self.data_dir, self.cluster, r.workload_id)
            os.makedirs(ckpt_dir, exist_ok=True)
        except (OSError, ValueError) as exc:
            await self._report(r, 127, self.clock.now_ms(), reason=f"no checkpoint directory: {exc}")
            return
        for rank, part in enumerate(r.placement):
            env = dict(os.environ)
            env.update({"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in part.gpu_ids),
                        "TIMESHARE_RANK": str(rank), "TIMESHARE_WORLD_SIZE": str(world),
                        "TIMESHARE_NODE": part.node, "TIMESHARE_WORKLOAD_ID": r.workload_id,
                        "TIMESHARE_ATTEMPT": str(r.attempt), "TIMESHARE_CLUSTER": self.cluster,
                        "TIMESHARE_CHECKPOINT_DIR": ckpt_dir, "TIMESHARE_NOTICE_S": str(self._notice_s(r.spec)),
                        "TIMESHARE_UNDER_NOTICE": "1" if started_under_notice else "0"})
            try:
                proc = await asyncio.create_subprocess_exec(*r.spec.command, env=env, start_new_session=True,
                                                            preexec_fn=processes.die_with_parent(os.getpid()))
            except OSError as exc:
                await self._report(r, 127, self.clock.now_ms(), reason=f"cannot start {r.spec.command[0]!r}: {exc}")
                await self._terminate(r)
                return
            r.procs.append(proc)
            self._record(proc, r, rank)
        if started_under_notice:
            self._notice_at_start(r)
        elif r.under_notice:  # the notice came while they were starting
            self._notice(r, r.notice_deadline_ms, self.clock.now_ms())
        codes = await asyncio.gather(*(p.wait() for p in r.procs))
        if r.stopping:
            return
        bad = [c for c in codes if c != 0]
        if r.under_notice:
            for t in r.signals:
                t.cancel()
            # exited after SIGTERM: with 0 everywhere before the deadline it wrote its checkpoint;
            # otherwise (killed, or an error) placement ends it at the deadline with what its
            # periodic checkpoint kept (no completed/failed: this attempt ends by preemption)
            now_ms = self.clock.now_ms()
            if not bad and now_ms <= r.notice_deadline_ms:
                await self._report_checkpointed(r, now_ms)
            else:
                log.info("%s exited under notice with %s at %d ms (deadline %d): not checkpointed",
                         r.workload_id, codes, now_ms, r.notice_deadline_ms)
            return
        await self._report(r, bad[0] if bad else 0, self.clock.now_ms())

    def _record(self, proc: asyncio.subprocess.Process, r: Running, rank: int) -> None:
        """Record the process group until its leader has exited (processes.py: a restarted
        executor stops what a killed one left)."""
        try:
            processes.write(self.data_dir, self.cluster, proc.pid, r.workload_id, r.attempt, rank)
        except OSError as exc:  # the work runs on; only a crash of this executor would leave it unstopped
            log.warning("executor %s: cannot record process %d of %s: %s", self.cluster, proc.pid, r.workload_id,
                        describe(exc))
            return
        done = asyncio.ensure_future(proc.wait())
        done.add_done_callback(lambda _f: processes.forget_if_gone(self.data_dir, self.cluster, proc.pid))

    async def _terminate(self, r: Running) -> None:
        alive = [p for p in r.procs if p.returncode is None]
        for p in alive:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if not alive:
            return
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in alive)), self.settings.kill_grace_s)
        except asyncio.TimeoutError:
            for p in alive:
                if p.returncode is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            await asyncio.gather(*(p.wait() for p in alive))


def default_broker(service: Executor):
    from ..common.broker import make_broker
    from .handlers import router

    return make_broker(service.settings, "executor", router(service, service.cluster))
