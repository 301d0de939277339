"""Placement's event log: appending to it (fenced), rebuilding the state from it (the latest
snapshot and the log after it; ``check_replayable`` refuses a record that cannot be applied,
unless an operator skipped it), writing snapshots, and purging what no reader needs any more.

Because the log holds exactly what was applied, in order, replaying it on start rebuilds the
same state. A mixin of ``Placement`` (service.py), whose ``__init__`` declares the state it
reads and sets.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from timeshare import events as ev
from timeshare.cluster import PlacementError
from timeshare.state import AWAITING, PENDING, RUNNING, SchedulerState
from timeshare.tree import TreeError
from timeshare.units import ms_to_s

from ..common import subjects, telemetry
from ..common.bus import decode_event
from ..common.forked_pickle import PickleJob, start_pickle
from ..common.ids import attempt_of
from ..common.supervise import describe
from ..common.snapshots import CODE_VERSION, purge_mark_name, read_snapshot, snapshot_name

log = logging.getLogger("timeshare.placement")


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
            # (not budget_conflict: what the log holds was checked when it came; a replay onto a
            # tree that differs must still end with the shares the change set)
            try:
                ev.tree_after(e, state.tree)
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


class LogKeeping:
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
