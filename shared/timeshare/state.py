"""The scheduler's state and its evolution by events.

Every change goes through :meth:`SchedulerState.apply` (the *evolve* function): decisions
build events, applying an event changes the state. The live placement service rebuilds its
state by applying the stream; the simulator applies the same events as it makes them; so
both hold the same state for the same history.
"""

from __future__ import annotations

import heapq
from typing import Callable, Final

from msgspec import UNSET

from . import events as ev
from .cluster import NODE_CORDONED, NODE_DOWN, NODE_DRAINED, NODE_HEALTHY, Cluster, Node
from .caches import PolicyCaches
from .config import PolicyConfig
from .fairshare import workload_sort_key
from .queue import LeafQueue
from .tree import AllocationTree
from .rules import runs_allocated
from .units import Seconds, ms_to_s, s_to_ms
from .window import UsageLedger
from .workload import PRIORITY_RANK, WorkloadSpec, check_contract

PENDING: Final = "pending"
RUNNING: Final = "running"
COMPLETED: Final = "completed"
PREEMPTED: Final = "preempted"   # ended by preemption (not resumable)
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
#: a preemptor whose victims are under notice: out of the queue, its GPUs held for it (not yet
#: its own); it starts when the last of them is preempted (SchedulerState.notice_events)
AWAITING: Final = "awaiting"
ENDED = (COMPLETED, PREEMPTED, FAILED, CANCELLED)
#: where a leaf's queue of each class sits in SchedulerState.leaf_queues: unallocated ("u")
#: work first, as a pass walks them
_CLASS_SLOT: Final = {"u": 0, "a": 1}


class Notice:
    """A running workload told to stop (``workload.preemption_notice``): it keeps its GPUs until
    it reports its checkpoint or the deadline passes (docs/design/preemption-rules.md, "Notice")."""

    __slots__ = ("by", "reason", "notified_s", "deadline_s", "checkpointed_s", "demand_gbps")

    def __init__(self, by: str | None, reason: ev.PreemptionReason, notified_s: Seconds, deadline_s: Seconds,
                 demand_gbps: float):
        #: the preemptor its GPUs go to (None: a drain)
        self.by = by
        self.reason = reason
        self.notified_s = notified_s
        self.deadline_s = deadline_s
        #: when it reported its checkpoint (None: not yet)
        self.checkpointed_s: Seconds | None = None
        #: the checkpoint bandwidth it needs to write its checkpoint within its notice (GB/s)
        self.demand_gbps = demand_gbps


class Plan:
    """Where a preemptor under notice will start: its nodes, the GPUs it needs on each, the
    victims still under notice, and the free GPUs held for it meanwhile (by node index)."""

    __slots__ = ("nodes", "per_node", "victims", "holds")

    def __init__(self, nodes: list[Node], per_node: int):
        self.nodes = nodes
        self.per_node = per_node
        self.victims: set[str] = set()
        self.holds: dict[int, int] = {}


def notice_terms(spec: WorkloadSpec) -> tuple[int, bool]:
    """The notice a workload asks for (0: none), and whether a notice keeps something by it
    (resumable work its progress, a session its suspended state)."""
    return spec.notice_s, spec.resumable or spec.suspends


class Workload:
    """A workload's contract and where it stands now."""

    __slots__ = (
        "spec", "id", "leaf", "gpu_type", "gpus", "key", "state", "progress_s", "run_start_s",
        "allocated", "protected_until_s", "placement", "first_start_s", "queued_since_s",
        "attempt", "preemptions", "resubmit_of", "submit_s", "non_preemptible", "min_runtime_s",
        "queue_class", "work_s", "resumable", "checkpoint_interval_s", "ended_s", "notice", "plan",
        "notice_s", "keeps_by_notice",
    )

    def __init__(self, spec: WorkloadSpec, submit_s: Seconds, resubmit_of: str | None):
        self.spec = spec
        self.id = spec.id
        self.leaf = spec.project
        self.gpu_type = spec.gpu_type
        self.gpus = spec.gpus
        self.submit_s = submit_s
        self.key = workload_sort_key(PRIORITY_RANK[spec.priority], submit_s, spec.id)
        self.state = PENDING
        self.progress_s = 0
        self.run_start_s: Seconds = 0
        self.allocated = False
        self.protected_until_s: Seconds | None = None
        self.placement: list[tuple[Node, list[int]]] = []
        self.first_start_s: Seconds | None = None
        self.queued_since_s: Seconds = submit_s
        self.attempt = 0
        self.preemptions = 0
        self.resubmit_of = resubmit_of
        self.non_preemptible = False
        self.min_runtime_s = spec.min_runtime_s
        #: "a" when it asks for allocated time (min runtime > 0), else "u" (unallocated)
        self.queue_class = "a" if spec.min_runtime_s > 0 else "u"
        # the contract's numbers a pass reads often, as plain attributes
        self.work_s = spec.work_s
        self.resumable = spec.resumable
        self.checkpoint_interval_s = spec.checkpoint_interval_s
        #: the notice it asks for (0: none), and whether a notice keeps something (its progress,
        #: or a session's suspended state): every victim costed reads both, and on the spec
        #: (a msgspec struct, not compiled) each is a Python property call
        self.notice_s, self.keeps_by_notice = notice_terms(spec)
        #: when it ended for good (completed, failed, cancelled, preempted and not requeued);
        #: None while it may still run (see SchedulerState.forget_ended)
        self.ended_s: Seconds | None = None
        #: the notice it was given (a victim under notice), else None
        self.notice: Notice | None = None
        #: the GPUs it waits for (a preemptor in state AWAITING), else None
        self.plan: Plan | None = None

    def remaining_s(self) -> int:
        return self.work_s - self.progress_s

    def is_protected(self, now_s: Seconds) -> bool:
        return self.protected_until_s is not None and now_s < self.protected_until_s

    def saved_progress_s(self, now_s: Seconds) -> int:
        """Work that survives a stop now: resumable work keeps its last checkpoint."""
        if not self.resumable:
            return 0
        ran = int(now_s - self.run_start_s)
        interval = self.checkpoint_interval_s
        kept = (ran // interval) * interval if interval else 0
        return min(self.progress_s + kept, self.work_s)


class SchedulerState:
    """Tree, cluster, usage and workloads of one cluster; mutated only through :meth:`apply`."""

    def __init__(self, tree: AllocationTree, cluster: Cluster, config: PolicyConfig, name: str = "default",
                 id_prefix: str = "e"):
        self.tree = tree
        self.cluster = cluster
        self.config = config
        self.name = name
        self.ledger = UsageLedger(config.lookback_window_s)
        self.workloads: dict[str, Workload] = {}
        self.running: dict[str, Workload] = {}
        self.queues: dict[tuple[str, str, str], LeafQueue] = {}
        #: the same queues by pool and leaf, [unallocated, allocated] (None: none yet): a pass
        #: reads each leaf's queues from here, without building and hashing a key per leaf
        self.leaf_queues: dict[str, dict[str, list[LeafQueue | None]]] = {t: {} for t in cluster.pools}
        self.pending_count = 0
        # running GPUs by pool: unallocated, and allocated-but-unprotected per leaf
        self.unallocated_gpus: dict[str, int] = {t: 0 for t in cluster.pools}
        self.unprotected_gpus: dict[str, dict[str, int]] = {t: {} for t in cluster.pools}
        self.nonpreemptible_gpus: dict[str, dict[str, int]] = {t: {} for t in cluster.pools}
        self.pending_by_pool: dict[str, int] = {t: 0 for t in cluster.pools}
        #: (submit_s, id) of pending work per pool, a heap, kept only when a policy needs it
        #: (fifo.py): an entry goes when it reaches the top and its workload is no longer
        #: pending (taking it out of a sorted list at once moved the whole backlog each start)
        self.submit_order: dict[str, list[tuple[Seconds, str]]] | None = None
        #: the old scheduler's global order (baseline.py): each pool's pending work in one
        #: queue, kept only once that policy asks for it (its walk then merges one queue, not
        #: one per leaf and class)
        self.pool_queues: dict[str, LeafQueue] | None = None
        self._protection: list[tuple[Seconds, str, int]] = []  # (until, id, attempt)
        self._seq = 0
        self._id_prefix = id_prefix
        #: the budget policy's caches (caches.py: an optimisation, never a decision)
        self.caches = PolicyCaches()
        #: work that became pending since the last pass, and each pool's change stamp then
        #: (a pass with no node changed since need only look at fresh work)
        self.fresh_pending: dict[str, list[str]] = {t: [] for t in cluster.pools}
        self.pass_seq: dict[str, int] = {}
        #: per pool, when the last full pass ran: a quick pass is allowed only within
        #: FULL_PASS_EVERY_S of it (rule "quick pass", scheduler.py)
        self.full_pass_s: dict[str, Seconds] = {}
        self.tree_changed = False
        #: per leaf, when (ms) it last lost work to another leaf's request, the contract's case
        #: (an allocated request taking unallocated work) aside: rule "no cascade" keeps such a
        #: leaf from preempting at that instant (scheduler.py)
        self.lost_at_ms: dict[str, int] = {}
        #: a pass that held a preemption back under "no cascade" asks for another pass at this
        #: time (the simulator wakes then; the live placement's timer runs one anyway)
        self.retry_at_s: Seconds | None = None
        #: the time of the pass that is deciding (set by the policy as a pass begins): work it
        #: started at this very time has nothing to checkpoint (gives_notice)
        self.pass_now_s: Seconds | None = None
        self.last_event_ms = 0
        #: completions first, live: work whose minimum runtime covers all its remaining work is
        #: protected this much longer, so that the moment it ends by itself is not also the
        #: moment it may be taken (see ``started``). 0 in the simulator, which orders
        #: completions before wake-ups within one moment and so never needs it.
        self.completion_grace_s: Seconds = 0
        #: victims under notice and preemptors awaiting them, by id (a pass reads only these:
        #: notice bookkeeping costs O(notices))
        self.notices: dict[str, Workload] = {}
        self.awaiting: dict[str, Workload] = {}
        #: moves with every change to the checkpoints being written (a notice, a checkpoint, an
        #: end): a victim search remembered under limited bandwidth is valid for one value only
        self.storage_seq = 0
        self._writing_gbps = 0.0

    def __setstate__(self, d: dict) -> None:
        """Unpickle, also a snapshot taken before notices existed."""
        self.__dict__.update(d)
        if "pool_queues" not in d:
            self.pool_queues = None
        if "leaf_queues" not in d:
            self.leaf_queues = {t: {} for t in self.cluster.pools}
            for (t, leaf, cls), q in self.queues.items():
                self._index_queue(t, leaf, cls, q)
        if not hasattr(self.caches, "priority_gang_nodes") \
                or any(not hasattr(m, "free_limit") for m in self.caches.failed.values()):
            # taken before the old scheduler's memo, or before failed searches kept their free
            # limit apart (caches decide nothing: starting them afresh changes no decision)
            self.caches = PolicyCaches()
        if any(not hasattr(n, "unallocated_by") or (n.unallocated and not n.unallocated_by)
               for p in self.cluster.pools.values() for n in p.nodes):
            # a snapshot from before Pool.groups: the leaves of unallocated work, from the workloads
            leaf_of = {w.id: w.leaf for w in self.running.values() if not w.allocated}
            for p in self.cluster.pools.values():
                p.regroup(leaf_of)
        for w in self.workloads.values():
            if not hasattr(w, "notice_s"):  # a snapshot from before a workload kept its notice
                w.notice_s, w.keeps_by_notice = notice_terms(w.spec)
        if "pass_now_s" not in d:
            self.pass_now_s = None
        if "notices" not in d:
            self.notices, self.awaiting, self.storage_seq, self._writing_gbps = {}, {}, 0, 0.0
            for w in self.workloads.values():
                w.notice = w.plan = None

    # -- ids and time ---------------------------------------------------------------------
    def next_event_id(self) -> str:
        self._seq += 1
        return f"{self._id_prefix}{self._seq}"

    @staticmethod
    def ms(now_s: Seconds) -> int:
        return s_to_ms(now_s)

    # -- queries --------------------------------------------------------------------------
    def queue(self, gpu_type: str, leaf: str, cls: str) -> LeafQueue:
        q = self.queues.get((gpu_type, leaf, cls))
        if q is None:
            q = self.queues[(gpu_type, leaf, cls)] = LeafQueue()
            self._index_queue(gpu_type, leaf, cls, q)
        return q

    def _index_queue(self, gpu_type: str, leaf: str, cls: str, q: LeafQueue) -> None:
        """Put a new queue in ``leaf_queues`` too."""
        by_leaf = self.leaf_queues.get(gpu_type)
        if by_leaf is None:
            by_leaf = self.leaf_queues[gpu_type] = {}
        pair = by_leaf.get(leaf)
        if pair is None:
            pair = by_leaf[leaf] = [None, None]
        pair[_CLASS_SLOT[cls]] = q

    def pending(self) -> list[Workload]:
        return sorted((w for w in self.workloads.values() if w.state == PENDING), key=lambda w: w.key)

    def validate_submission(self, spec: WorkloadSpec) -> None:
        """Raise ContractError/TreeError/PlacementError; changes nothing."""
        check_contract(spec, self.config.max_min_runtime_s, self.config.max_notice_s)
        self.tree.require_leaf(spec.project)
        self.cluster.pool(spec.gpu_type).check_request(spec.gpus)
        if spec.id in self.workloads:
            raise ValueError(f"id: workload {spec.id!r} already exists")

    # -- forgetting ---------------------------------------------------------------------
    def forget_ended(self, before_s: Seconds) -> list[str]:
        """Drop the workloads that ended for good before ``before_s``; returns their ids, sorted.

        Ended for good: completed, failed, cancelled, or preempted and not requeued (not
        resumable). No decision reads such a workload: a pass looks at the queues (pending
        work), ``running`` and the nodes' holders; a min-runtime timer of one is skipped by
        ``expire_protection``; usage lives in the ledger's window, not here. So a state that
        forgets decides exactly as one that keeps them (tests/unit/test_forget.py runs the
        same scenarios both ways), and keeping them only made the state, and every snapshot of
        it, grow with history.

        What changes is which ids ``validate_submission`` calls taken: a forgotten id is free
        again here. Ids are unique for ever at the gateway (its durable store answers 409) and
        within JetStream's dedup window; see docs/design/services.md, "Bounded state".

        Left as they are, on purpose: the protection heap's entries of ended workloads (one
        per protected start, each gone once its minimum runtime has passed, so bounded by
        the starts of one ``max_min_runtime_s``; dropping them early would move
        ``next_protection_expiry_s``, i.e. when the services wake up for a pass)."""
        gone = sorted(wid for wid, w in self.workloads.items() if w.ended_s is not None and w.ended_s < before_s)
        if not gone:
            return gone
        for wid in gone:
            del self.workloads[wid]
        # a workload submitted and ended between two passes is still listed as fresh; a quick
        # pass skips what is not pending, but would look it up first. In place: a pass in
        # progress holds the list and clears it when it is done.
        for fresh in self.fresh_pending.values():
            if fresh:
                fresh[:] = [wid for wid in fresh if wid in self.workloads]
        return gone

    # -- decisions that come from outside the scheduler -----------------------------------
    def submitted(self, spec: WorkloadSpec, now_s: Seconds, resubmit_of: str | None = None) -> ev.WorkloadSubmitted:
        self.validate_submission(spec)
        return ev.WorkloadSubmitted(event_id=self.next_event_id(), at_ms=self.ms(now_s), cluster=self.name,
                                    workload=spec, resubmit_of=resubmit_of)

    def completed(self, workload_id: str, now_s: Seconds, exit_code: int = 0) -> ev.Event:
        w = self.workloads[workload_id]
        if w.state != RUNNING:
            raise ValueError(f"{workload_id} is {w.state}, not running")
        if exit_code:
            return ev.WorkloadFailed(event_id=self.next_event_id(), at_ms=self.ms(now_s), cluster=self.name,
                                     workload_id=workload_id, reason=f"exit code {exit_code}", exit_code=exit_code)
        return ev.WorkloadCompleted(event_id=self.next_event_id(), at_ms=self.ms(now_s), cluster=self.name,
                                    workload_id=workload_id)

    def cancelled(self, workload_id: str, now_s: Seconds, by: str = "") -> ev.WorkloadCancelled:
        w = self.workloads[workload_id]
        if w.state in ENDED:
            raise ValueError(f"{workload_id} already ended ({w.state})")
        return ev.WorkloadCancelled(event_id=self.next_event_id(), at_ms=self.ms(now_s), cluster=self.name,
                                    workload_id=workload_id, by=by)

    def started(self, w: Workload, nodes: list[Node], now_s: Seconds, non_preemptible: bool = False,
                contract: bool = True) -> ev.WorkloadStarted:
        """The event that starts ``w`` on ``nodes`` (GPU ids picked here, lowest free first)."""
        per_node = w.gpus if len(nodes) == 1 else w.spec.gpus // len(nodes)
        placement = []
        for node in nodes:
            ids = [g for g, holder in enumerate(node.slots) if holder is None][:per_node]
            placement.append(ev.NodeGpus(node=node.name, gpu_ids=ids))
        if not contract:  # baseline: "allocated" means opted out of preemption, no timer
            allocated, until = non_preemptible, None
        else:
            allocated = runs_allocated(w.spec.min_runtime_s, self.tree.nodes[w.leaf].fraction)
            until = now_s + w.spec.min_runtime_s if allocated else None
            if until is not None and self.completion_grace_s > 0 and \
                    w.spec.min_runtime_s >= w.spec.work_s - w.progress_s:
                # protected to its declared end: the live executor reports that end a NATS
                # round trip after placement's own wake-up for the protection's end, and a
                # pass in between would take work that is completing (all of it lost when it
                # is not resumable). The grace keeps it protected until the report arrives
                # (the simulator's order); a process that runs past its declared work is
                # protected for the grace only.
                until += self.completion_grace_s
        return ev.WorkloadStarted(
            event_id=self.next_event_id(), at_ms=self.ms(now_s), cluster=self.name, workload_id=w.id,
            project=w.leaf, gpu_type=w.gpu_type, gpus=w.gpus, placement=placement, allocated=allocated,
            protected_until_ms=self.ms(until) if until is not None else None, progress_s=w.progress_s,
            attempt=w.attempt + 1, non_preemptible=non_preemptible,
        )

    def preempted(self, w: Workload, now_s: Seconds, reason: ev.PreemptionReason) -> list[ev.Event]:
        """Events that stop ``w`` now: preempted, then requeued when it is resumable (or, after a
        notice, a session that saved its state). A workload under notice keeps all its progress
        up to the notice when it checkpointed, else its last periodic checkpoint before the
        notice; the time it held its GPUs under notice is reported apart (``checkpoint_gpu_s``)."""
        notice = w.notice
        if notice is None:
            saved = w.saved_progress_s(now_s)
            lost_s = int(now_s - w.run_start_s) - (saved - w.progress_s)
            out: list[ev.Event] = [ev.WorkloadPreempted(
                event_id=self.next_event_id(), at_ms=self.ms(now_s), cluster=self.name, workload_id=w.id,
                reason=reason, resumable=w.spec.resumable, progress_s=saved, lost_gpu_s=lost_s * w.gpus)]
            requeue = w.spec.resumable
        else:
            checkpointed = notice.checkpointed_s is not None
            worked_s = notice.notified_s - w.run_start_s  # SIGTERM stops the work; the checkpoint follows
            if checkpointed:
                saved = min(w.progress_s + int(worked_s), w.work_s)
                lost_s = 0
                checkpoint_s = notice.checkpointed_s - notice.notified_s  # type: ignore[operator]  # set above
            else:  # killed at the deadline: its last periodic checkpoint before the notice
                saved = w.saved_progress_s(notice.notified_s)
                lost_s = int(worked_s) - (saved - w.progress_s)
                checkpoint_s = now_s - notice.notified_s
            suspends = w.spec.suspends
            requeue = w.spec.resumable or (suspends and checkpointed)
            if not requeue:
                saved = 0  # a session whose state was lost starts afresh
            out = [ev.WorkloadPreempted(
                event_id=self.next_event_id(), at_ms=self.ms(now_s), cluster=self.name, workload_id=w.id,
                reason=notice.reason, resumable=requeue, progress_s=saved, lost_gpu_s=int(lost_s * w.gpus),
                checkpoint_gpu_s=int(round(checkpoint_s * w.gpus)), checkpointed=checkpointed,
                state_saved=checkpointed if suspends else UNSET)]
        if requeue:
            out.append(ev.WorkloadRequeued(event_id=self.next_event_id(), at_ms=self.ms(now_s), cluster=self.name,
                                           workload_id=w.id, progress_s=saved))
        return out

    # -- notices --------------------------------------------------------------------------
    def gives_notice(self, w: Workload) -> bool:
        """Whether preempting ``w`` starts with a notice: the policy gives notices, ``w`` declared
        a checkpoint time, it is not under notice already, and it keeps something by it
        (resumable work its progress, a session that suspends its state; anything else would
        only hold its GPUs longer to lose the same). Resumable work that the deciding pass itself
        started (it resumed from its checkpoint this instant) has no progress to save: it is
        preempted at once, losing nothing, and its GPUs go to the preemptor without a wait."""
        if not (self.config.preemption_notice and w.notice is None and w.notice_s > 0 and w.keeps_by_notice):
            return False
        return not (w.resumable and w.state == RUNNING and w.run_start_s == self.pass_now_s)

    def storage_key(self) -> int | None:
        """What a remembered victim search depends on besides the nodes: with limited checkpoint
        bandwidth, which victims may get a notice now (rule "storage"; None: unlimited)."""
        return self.storage_seq if self.cluster.checkpoint_bandwidth_gbps is not None else None

    @staticmethod
    def demand_gbps(w: Workload) -> float:
        """The checkpoint bandwidth ``w`` needs to write its checkpoint within its notice (GB/s)."""
        notice_s = w.notice_s
        return w.spec.checkpoint_size_gb / notice_s if notice_s > 0 else 0.0

    def writing_gbps(self) -> float:
        """Bandwidth that the checkpoints being written now need (GB/s)."""
        return self._writing_gbps

    def storage_admits(self, victims: list[Workload]) -> bool:
        """Rule "storage": whether the checkpoint storage absorbs the checkpoints that preempting
        ``victims`` starts (those given a notice) within their notice times, on top of those
        being written (``Cluster.checkpoint_bandwidth_gbps``; None: unlimited). A checkpoint
        that needs more than the whole bandwidth is admitted alone, when nothing else is
        written (it will be killed at its deadline); else a further notice waits for a pass
        after others finished."""
        bandwidth = self.cluster.checkpoint_bandwidth_gbps
        if bandwidth is None:
            return True
        demand = 0.0
        for v in victims:
            if self.gives_notice(v):
                demand += self.demand_gbps(v)
        if demand <= 0:
            return True
        writing = self.writing_gbps()
        return writing + demand <= bandwidth + 1e-9 or writing == 0

    def may_take(self, w: Workload) -> bool:
        """Whether a decision may take ``w`` now as far as notices go: not under notice already
        (its GPUs are promised), and the storage admits its checkpoint if it gets a notice."""
        if w.notice is not None:
            return False
        return self.cluster.checkpoint_bandwidth_gbps is None or not self.gives_notice(w) or self.storage_admits([w])

    def notice_event(self, w: Workload, now_s: Seconds, reason: ev.PreemptionReason,
                     nodes: list[Node] | None) -> ev.WorkloadPreemptionNotice:
        """The notice that starts preempting ``w``; ``nodes``: where its preemptor will start."""
        return ev.WorkloadPreemptionNotice(
            event_id=self.next_event_id(), at_ms=self.ms(now_s), cluster=self.name, workload_id=w.id, reason=reason,
            deadline_ms=self.ms(now_s + w.notice_s), attempt=w.attempt,
            preemptor_nodes=[n.name for n in nodes] if nodes else UNSET)

    def checkpointed(self, workload_id: str, now_s: Seconds) -> ev.WorkloadCheckpointed:
        w = self.workloads[workload_id]
        if w.notice is None or w.notice.checkpointed_s is not None:
            raise ValueError(f"{workload_id} is not writing a checkpoint under notice")
        return ev.WorkloadCheckpointed(event_id=self.next_event_id(), at_ms=self.ms(now_s), cluster=self.name,
                                       workload_id=workload_id, attempt=w.attempt)

    def take(self, w: Workload | None, nodes: list[Node] | None, victims: list[Workload],
             reasons: list[ev.PreemptionReason], now_s: Seconds) -> tuple[list[ev.Event], bool]:
        """Apply a decision to preempt ``victims`` (for ``w`` on ``nodes``; None: a drain): those
        without a notice are preempted at once (as before notices existed), then those with one
        get it. Returns the events and whether ``w`` waits for victims under notice (else the
        caller starts it now)."""
        out: list[ev.Event] = []
        noticed = [self.gives_notice(v) for v in victims]
        for v, reason, n in zip(victims, reasons, noticed):
            if not n:
                for e in self.preempted(v, now_s, reason):
                    self.apply(e)
                    out.append(e)
        for v, reason, n in zip(victims, reasons, noticed):
            if n:
                e = self.notice_event(v, now_s, reason, nodes)
                self.apply(e)
                out.append(e)
        return out, any(noticed) and w is not None and w.state == AWAITING

    def notice_events(self, now_s: Seconds,
                      start: Callable[[Workload, list[Node]], ev.WorkloadStarted] | None = None) -> list[ev.Event]:
        """The notice step of a pass: preempt every victim under notice that checkpointed or
        whose deadline passed, then start every preemptor whose victims are all gone, on the
        GPUs held for it (``start`` builds its start; default: the budget policy's)."""
        if not self.notices and not self.awaiting:
            return []
        out: list[ev.Event] = []
        due = sorted(wid for wid, w in self.notices.items()
                     if w.notice is not None and (w.notice.checkpointed_s is not None or w.notice.deadline_s <= now_s))
        for wid in due:
            w = self.workloads[wid]
            for e in self.preempted(w, now_s, w.notice.reason):  # type: ignore[union-attr]  # under notice
                self.apply(e)
                out.append(e)
        for wid in sorted(self.awaiting):
            p = self.awaiting[wid]
            if p.plan is not None and not p.plan.victims:
                e = start(p, p.plan.nodes) if start is not None else self.started(p, p.plan.nodes, now_s)
                self.apply(e)
                out.append(e)
        return out

    def next_notice_deadline_s(self) -> Seconds | None:
        """The earliest deadline of a victim under notice that has not checkpointed (a pass is
        due then: the simulator and the live placement wake up for it)."""
        out: Seconds | None = None
        for w in self.notices.values():
            n = w.notice
            if n is not None and n.checkpointed_s is None and (out is None or n.deadline_s < out):
                out = n.deadline_s
        return out

    def next_wake_s(self) -> Seconds | None:
        """When the next pass is due with no event: a protection ends or a notice's deadline."""
        a = self.next_protection_expiry_s()
        b = self.next_notice_deadline_s()
        if a is None:
            return b
        return a if b is None or a <= b else b

    def replay_problem(self, e: ev.Event) -> str | None:
        """Why a notice event (or the start of a preemptor awaiting one) cannot be applied now
        (None: it can): the core's rules for the live placement's log check."""
        match e:
            case ev.WorkloadPreemptionNotice():
                w = self.workloads.get(e.workload_id)
                if w is None:
                    return f"unknown workload {e.workload_id!r}"
                if w.state != RUNNING:
                    return f"{w.id} is {w.state}, not running"
                if w.notice is not None:
                    return f"{w.id} is under notice already"
                if e.preemptor_nodes is not UNSET:
                    for name in e.preemptor_nodes:
                        if name not in self.cluster.nodes_by_name:
                            return f"unknown node {name!r}"
                return None
            case ev.WorkloadCheckpointed():
                w = self.workloads.get(e.workload_id)
                if w is None:
                    return f"unknown workload {e.workload_id!r}"
                if w.notice is None or w.notice.checkpointed_s is not None:
                    return f"{w.id} is not writing a checkpoint under notice"
                if e.attempt is not None and e.attempt != w.attempt:
                    return f"stale report for {w.id}: attempt {e.attempt}, it runs attempt {w.attempt}"
                return None
        return None

    def _storage_changed(self) -> None:
        self.storage_seq += 1
        # summed afresh (in id order: the same float every time) on each change, read by every
        # victim search under limited bandwidth
        total = 0.0
        for wid in sorted(self.notices):
            n = self.notices[wid].notice
            if n is not None and n.checkpointed_s is None:
                total += n.demand_gbps
        self._writing_gbps = total

    def _rehold(self, p: Workload) -> None:
        """Hold for ``p`` the free GPUs of its nodes that its victims under notice will not
        bring (after a victim ended, its GPUs are held instead)."""
        plan = p.plan
        if plan is None:
            return
        pool = self.cluster.pools[p.gpu_type]
        for node in plan.nodes:
            coming = 0
            for vid in plan.victims:
                coming += node.holders.get(vid, 0)
            have = plan.holds.get(node.index, 0)
            want = max(0, plan.per_node - coming)
            if want > node.free + have:
                want = node.free + have
            if want != have:
                pool.hold(node, want - have)
                plan.holds[node.index] = want

    def _release_plan(self, p: Workload) -> None:
        """Give back the GPUs held for ``p``; it no longer awaits."""
        plan = p.plan
        if plan is None:
            return
        pool = self.cluster.pools[p.gpu_type]
        for node in plan.nodes:
            h = plan.holds.get(node.index, 0)
            if h:
                pool.hold(node, -h)
        p.plan = None
        self.awaiting.pop(p.id, None)

    def _abandon_plans_on(self, node: Node) -> None:
        """A node leaves service: a preemptor waiting for GPUs there goes back to its queue
        (its victims under notice still end at their checkpoint or deadline)."""
        for wid in sorted(self.awaiting):
            p = self.awaiting[wid]
            if p.plan is not None and node in p.plan.nodes:
                self._release_plan(p)
                self._enqueue(p)

    def expire_protection(self, now_s: Seconds) -> list[ev.Event]:
        """min_runtime_reached for every allocated workload whose protection ended by now."""
        out: list[ev.Event] = []
        heap = self._protection
        while heap and heap[0][0] <= now_s:
            until, wid, attempt = heapq.heappop(heap)
            w = self.workloads.get(wid)
            if w is not None and w.state == RUNNING and w.attempt == attempt and w.protected_until_s == until:
                e = ev.MinRuntimeReached(event_id=self.next_event_id(), at_ms=self.ms(until), cluster=self.name,
                                         workload_id=wid)
                self.apply(e)
                out.append(e)
        return out

    def next_protection_expiry_s(self) -> Seconds | None:
        return self._protection[0][0] if self._protection else None

    # -- nodes ----------------------------------------------------------------------------
    def node_unhealthy(self, name: str, now_s: Seconds, reason: str, needs_human: bool) -> ev.NodeUnhealthy:
        self.cluster.node(name)
        return ev.NodeUnhealthy(event_id=self.next_event_id(), at_ms=self.ms(now_s), cluster=self.name,
                                node=name, reason=reason, needs_human=needs_human)

    def node_failed(self, name: str, now_s: Seconds, reason: str) -> list[ev.Event]:
        """The node dies: its work ends at once (resumable work is requeued)."""
        node = self.cluster.node(name)
        out: list[ev.Event] = [ev.NodeFailed(event_id=self.next_event_id(), at_ms=self.ms(now_s),
                                             cluster=self.name, node=name, reason=reason)]
        for wid in node.workload_ids():
            w = self.workloads[wid]
            if w.spec.resumable:
                out.extend(self.preempted(w, now_s, ev.PreemptionReason(
                    kind="node_failed", node=name, message=f"node {name} failed: {reason}")))
            else:
                out.append(ev.WorkloadFailed(event_id=self.next_event_id(), at_ms=self.ms(now_s), cluster=self.name,
                                             workload_id=wid, reason=f"node {name} failed: {reason}"))
        return out

    def node_repaired(self, name: str, now_s: Seconds) -> ev.NodeRepaired:
        self.cluster.node(name)
        return ev.NodeRepaired(event_id=self.next_event_id(), at_ms=self.ms(now_s), cluster=self.name, node=name)

    # -- evolve ---------------------------------------------------------------------------
    def apply(self, e: ev.Event) -> None:
        """Change the state by one event. Events must arrive in order."""
        self.last_event_ms = e.at_ms
        now_s: Seconds = ms_to_s(e.at_ms)
        match e:
            case ev.WorkloadSubmitted():
                spec = e.workload
                w = Workload(spec, now_s, e.resubmit_of)
                # an id that exists here only as ended work (a writer that had forgotten it
                # accepted it again; see forget_ended) starts afresh: the ended one is in no
                # queue, node or pool, so replacing it is forgetting it
                self.workloads[w.id] = w
                self._enqueue(w)
            case ev.WorkloadStarted():
                self._start(self.workloads[e.workload_id], e, now_s)
            case ev.WorkloadPreemptionNotice():
                w = self.workloads[e.workload_id]
                if w.state != RUNNING or w.notice is not None:
                    raise ValueError(f"{w.id} is {w.state}{' under notice' if w.notice else ''}; cannot be notified")
                by = e.reason.by_workload_id
                w.notice = Notice(by, e.reason, now_s, ms_to_s(e.deadline_ms), self.demand_gbps(w))
                self.notices[w.id] = w
                self._block(w, +1)  # no other decision takes it: its GPUs are promised
                self._storage_changed()
                p = self.workloads.get(by) if by is not None else None
                if p is not None and e.preemptor_nodes is not UNSET:
                    if p.state == PENDING:
                        self._dequeue(p)
                        p.state = AWAITING
                        nodes = [self.cluster.node(n) for n in e.preemptor_nodes]
                        p.plan = Plan(nodes, p.gpus if len(nodes) == 1 else p.gpus // len(nodes))
                        self.awaiting[p.id] = p
                    if p.plan is not None:
                        p.plan.victims.add(w.id)
                        self._rehold(p)
            case ev.WorkloadCheckpointed():
                w = self.workloads[e.workload_id]
                if w.notice is None or w.notice.checkpointed_s is not None:
                    raise ValueError(f"{w.id} is not writing a checkpoint under notice")
                w.notice.checkpointed_s = now_s
                self._storage_changed()
            case ev.MinRuntimeReached():
                w = self.workloads[e.workload_id]
                if w.state == RUNNING and w.protected_until_s is not None:
                    w.protected_until_s = None
                    self._block(w, -1)
                    u = self.unprotected_gpus[w.gpu_type]
                    u[w.leaf] = u.get(w.leaf, 0) + w.gpus
            case ev.WorkloadPreempted():
                w = self.workloads[e.workload_id]
                self._note_loss(w, e)
                self._stop(w, now_s)
                w.progress_s = e.progress_s
                w.preemptions += 1
                w.state = PREEMPTED  # becomes pending again on workload.requeued
                if not e.resumable:
                    w.ended_s = now_s  # no workload.requeued follows: ended for good
            case ev.WorkloadRequeued():
                w = self.workloads[e.workload_id]
                w.progress_s = e.progress_s
                w.queued_since_s = now_s
                w.ended_s = None
                self._enqueue(w)
            case ev.WorkloadCompleted():
                w = self.workloads[e.workload_id]
                self._stop(w, now_s)
                w.progress_s = w.spec.work_s
                w.state = COMPLETED
                w.ended_s = now_s
            case ev.WorkloadFailed():
                w = self.workloads[e.workload_id]
                self._end(w, now_s, FAILED)
            case ev.WorkloadCancelled():
                w = self.workloads[e.workload_id]
                self._end(w, now_s, CANCELLED)
            case ev.NodeUnhealthy():
                node = self.cluster.node(e.node)
                if node.state == NODE_HEALTHY:
                    node.pool.set_state(node, NODE_CORDONED)
                    if self.awaiting:
                        self._abandon_plans_on(node)
            case ev.NodeFailed():
                node = self.cluster.node(e.node)
                node.pool.set_state(node, NODE_DOWN)
                if self.awaiting:
                    self._abandon_plans_on(node)
            case ev.NodeDrained():
                node = self.cluster.node(e.node)
                node.pool.set_state(node, NODE_DRAINED)
            case ev.NodeRepaired():
                node = self.cluster.node(e.node)
                node.pool.set_state(node, NODE_HEALTHY)
            case ev.BudgetChanged():
                self.tree = ev.tree_after(e, self.tree)
                self.tree_changed = True
            case _:
                raise TypeError(f"unknown event {e!r}")

    def _note_loss(self, w: Workload, e: ev.WorkloadPreempted) -> None:
        """Remember that ``w``'s leaf lost work to another leaf's request (rule "no cascade"),
        unless an allocated request took unallocated work (the contract allows it at any time)."""
        by = e.reason.by_workload_id
        if by is None or e.reason.by_project is None or e.reason.by_project == w.leaf \
                or e.reason.kind not in ("fair_share", "unallocated"):
            return
        preemptor = self.workloads.get(by)
        if not w.allocated and preemptor is not None and preemptor.min_runtime_s > 0 \
                and preemptor.leaf in self.tree.nodes and self.tree.nodes[preemptor.leaf].fraction > 0:
            return
        self.lost_at_ms[w.leaf] = e.at_ms

    def _enqueue(self, w: Workload) -> None:
        w.state = PENDING
        self.fresh_pending[w.gpu_type].append(w.id)
        self.queue(w.gpu_type, w.leaf, w.queue_class).add(w.gpus, w.key, w.min_runtime_s)
        self.pending_count += 1
        self.pending_by_pool[w.gpu_type] += 1
        if self.submit_order is not None:
            heapq.heappush(self.submit_order.setdefault(w.gpu_type, []), (w.submit_s, w.id))
        if self.pool_queues is not None:
            pool_queue = self.pool_queues.get(w.gpu_type)
            if pool_queue is None:
                pool_queue = self.pool_queues[w.gpu_type] = LeafQueue()
            pool_queue.add(w.gpus, w.key)

    def _dequeue(self, w: Workload) -> None:
        self.queue(w.gpu_type, w.leaf, w.queue_class).remove(w.gpus, w.key, w.min_runtime_s)
        self.pending_count -= 1
        self.pending_by_pool[w.gpu_type] -= 1
        if self.pool_queues is not None:
            self.pool_queues[w.gpu_type].remove(w.gpus, w.key)

    def _start(self, w: Workload, e: ev.WorkloadStarted, now_s: Seconds) -> None:
        if w.state == AWAITING:
            self._release_plan(w)  # the GPUs held for it become its own below
        elif w.state != PENDING:
            raise ValueError(f"{w.id} is {w.state}; only pending work starts")
        else:
            self._dequeue(w)
        pool = self.cluster.pool(w.gpu_type)
        placement = []
        for part in e.placement:
            node = self.cluster.node(part.node)
            for g in part.gpu_ids:
                if node.slots[g] is not None:
                    raise AssertionError(f"{node.name} GPU {g} is held by {node.slots[g]}; cannot give it to {w.id}")
                node.slots[g] = w.id
            node.holders[w.id] = node.holders.get(w.id, 0) + len(part.gpu_ids)
            old = node.free
            node.free -= len(part.gpu_ids)
            pool._rebucket(node, old)
            placement.append((node, list(part.gpu_ids)))
        w.placement = placement
        w.state = RUNNING
        w.attempt = e.attempt
        w.run_start_s = now_s
        w.progress_s = e.progress_s
        if w.first_start_s is None:
            w.first_start_s = now_s
        w.allocated = e.allocated
        if not w.allocated:
            for node, ids in placement:
                node.pool.add_unallocated(node, len(ids), w.leaf)
        w.non_preemptible = e.non_preemptible
        if w.non_preemptible:
            n = self.nonpreemptible_gpus[w.gpu_type]
            n[w.leaf] = n.get(w.leaf, 0) + w.gpus
            self._block(w, +1)
        w.protected_until_s = e.protected_until_ms / 1000 if e.protected_until_ms is not None else None
        if w.protected_until_s is not None and w.protected_until_s == int(w.protected_until_s):
            w.protected_until_s = int(w.protected_until_s)
        self.running[w.id] = w
        self.ledger.add_running(w.leaf, w.gpu_type, w.allocated, w.gpus, now_s)
        if not w.allocated:
            self.unallocated_gpus[w.gpu_type] += w.gpus
        elif w.protected_until_s is None or w.protected_until_s <= now_s:
            w.protected_until_s = None
            u = self.unprotected_gpus[w.gpu_type]
            u[w.leaf] = u.get(w.leaf, 0) + w.gpus
        else:
            heapq.heappush(self._protection, (w.protected_until_s, w.id, w.attempt))
            self._block(w, +1)

    def _block(self, w: Workload, sign: int) -> None:
        """Mark ``w``'s GPUs as (un)preemptable for every request (see Pool.open)."""
        pool = self.cluster.pools[w.gpu_type]
        for node, ids in w.placement:
            pool.block(node, sign * len(ids))

    def _stop(self, w: Workload, now_s: Seconds) -> None:
        if w.state != RUNNING:
            raise ValueError(f"{w.id} is {w.state}, not running")
        pool = self.cluster.pool(w.gpu_type)
        if w.non_preemptible or (w.allocated and w.protected_until_s is not None):
            self._block(w, -1)
        for node, ids in w.placement:
            if not w.allocated:
                pool.add_unallocated(node, -len(ids), w.leaf)
            pool.release(node, ids, w.id)
        placement = w.placement
        w.placement = []
        if w.non_preemptible:
            self.nonpreemptible_gpus[w.gpu_type][w.leaf] -= w.gpus
            w.non_preemptible = False
        del self.running[w.id]
        self.ledger.add_running(w.leaf, w.gpu_type, w.allocated, -w.gpus, now_s)
        if not w.allocated:
            self.unallocated_gpus[w.gpu_type] -= w.gpus
        elif w.protected_until_s is None:
            self.unprotected_gpus[w.gpu_type][w.leaf] -= w.gpus
        w.protected_until_s = None
        notice = w.notice
        if notice is not None:
            # its GPUs were blocked by the notice; once free, its preemptor's hold takes them
            for node, ids in placement:
                pool.block(node, -len(ids))
            w.notice = None
            del self.notices[w.id]
            self._storage_changed()
            p = self.workloads.get(notice.by) if notice.by is not None else None
            if p is not None and p.plan is not None and w.id in p.plan.victims:
                p.plan.victims.discard(w.id)
                self._rehold(p)

    def _end(self, w: Workload, now_s: Seconds, state: str) -> None:
        if w.state == RUNNING:
            self._stop(w, now_s)
        elif w.state == PENDING:
            self._dequeue(w)
        elif w.state == AWAITING:
            self._release_plan(w)  # its victims under notice still end at their checkpoint or deadline
        w.state = state
        w.ended_s = now_s

    # -- node drains ----------------------------------------------------------------------
    def cordoned_nodes(self) -> list[Node]:
        return [n for p in self.cluster.pools.values() if p.cordoned for n in p.nodes if n.state == NODE_CORDONED]

    def drain_events(self, now_s: Seconds, may_end_now: Callable[[Workload, Seconds], bool]) -> list[ev.Event]:
        """Drain cordoned nodes: stop what ``may_end_now(w, now_s)`` allows; report empty nodes."""
        out: list[ev.Event] = []
        for node in self.cordoned_nodes():
            for wid in node.workload_ids():
                w = self.workloads[wid]
                if w.notice is not None:
                    continue  # told already: it ends at its checkpoint or deadline
                if may_end_now(w, now_s):
                    reason = ev.PreemptionReason(
                        kind="drain", node=node.name,
                        message=f"node {node.name} is unhealthy and drains as work reaches its minimum runtime")
                    if self.gives_notice(w):
                        if self.storage_admits([w]):
                            notice = self.notice_event(w, now_s, reason, None)
                            self.apply(notice)
                            out.append(notice)
                        continue  # else the storage is busy: a later pass gives the notice
                    for e in self.preempted(w, now_s, reason):
                        self.apply(e)
                        out.append(e)
            if node.free == node.gpus:
                e = ev.NodeDrained(event_id=self.next_event_id(), at_ms=self.ms(now_s), cluster=self.name,
                                   node=node.name)
                self.apply(e)
                out.append(e)
        return out
