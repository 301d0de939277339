"""Every state change, as one msgspec tagged union shared by the simulator and the services.

Events are frozen, keyword-only and tagged by ``type`` (``workload.started``...). Times are
integer milliseconds since the epoch of the run (``at_ms``). New fields get defaults so old
logs still decode; a breaking change bumps the subject version (``timeshare.v1``).
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

from .tree import AllocationTree, ancestors
from .workload import WorkloadSpec


# gc=False (here and on WorkloadSpec): frozen records of strings, numbers and lists of them
# can never be part of a reference cycle, and a simulation keeps hundreds of thousands of them
# alive, which every full garbage collection would otherwise walk
class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", gc=False):
    event_id: str
    at_ms: int
    cluster: str = "default"


class NodeGpus(msgspec.Struct, frozen=True, kw_only=True, array_like=False, gc=False):
    node: str
    gpu_ids: list[int]


# omit_defaults: a decision carries a few of these, each with only the numbers of its own reason
class RejectedCandidate(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """A running workload that a preemption's victim search considered and did not take, and
    why (rejected.py): ``reason`` names the rule or the step of the search that spared it, the
    numbers are the ones it compared (None: not part of that reason), ``message`` says it."""

    workload_id: str
    project: str
    gpus: int
    #: its node (a gang's first node)
    node: str
    #: ``protected``, ``non_preemptible``, ``same_leaf``, ``only_unallocated``, ``beyond_due_share``,
    #: ``not_above_due_share``, ``no_cascade``, ``subtree_cap``,
    #: ``not_richer``, ``reserved_node``, ``node_unavailable``, ``node_short``, ``subtree_cap_on_node``,
    #: ``gang_node_held``, ``cheaper_on_node``, ``ranked_lower``, ``not_eligible``, ``under_notice``, ``storage``
    reason: str
    #: its side where its path and the preemptor's part, and that side's fill and usage ratio
    subtree: str | None = None
    fill: float | None = None
    ratio: float | None = None
    due_gpus: float | None = None
    #: the preemptor's side: fill with the request, usage ratio
    preemptor_fill: float | None = None
    preemptor_ratio: float | None = None
    #: the most GPUs its subtree could lose to this request
    may_lose_gpus: int | None = None
    protected_until_ms: int | None = None
    #: progress preempting it would have lost, and what the chosen victims lost
    lost_gpu_s: int | None = None
    chosen_lost_gpu_s: int | None = None
    message: str = ""


class PreemptionReason(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Why a workload was preempted, as the numbers that justified it.

    kind: ``unallocated`` (the victim ran on unallocated time), ``fair_share`` (the preemptor's
    subtree was more deserving at ``level``), ``drain`` (its node is being drained),
    ``priority`` (the baseline policy: a higher priority took its GPUs).
    """

    kind: str
    by_workload_id: str | None = None
    by_project: str | None = None
    level: str | None = None
    preemptor_subtree: str | None = None
    victim_subtree: str | None = None
    preemptor_ratio: float | None = None
    victim_ratio: float | None = None
    #: running allocated GPUs / GPUs due now (the preemptor's counts the request)
    preemptor_fill: float | None = None
    victim_fill: float | None = None
    victim_running_gpus: int | None = None
    victim_due_gpus: float | None = None
    hysteresis: float | None = None
    node: str | None = None
    #: the rule that allowed it: ``due_share`` (the victim's subtree ran above its due share and
    #: ends no lower than the preemptor's), ``unallocated`` (the victim ran on unallocated time);
    #: ``window_credit`` appears only in logs written before that rule was folded into the due share
    rule: str | None = None
    #: the victim's protection ended here (ms; None: it had none)
    victim_protected_until_ms: int | None = None
    message: str = ""
    #: the running workloads the decision considered and did not take: how many, and the
    #: closest calls with why (at most rejected.SHOWN). Only a policy asked for them fills them
    #: (the live placement); UNSET leaves them out of the encoded event, so the simulator's
    #: events stay as they were
    considered: int | UnsetType = UNSET
    rejected: tuple[RejectedCandidate, ...] | UnsetType = UNSET


class WorkloadSubmitted(_Event, frozen=True, kw_only=True, tag="workload.submitted"):
    workload: WorkloadSpec
    resubmit_of: str | None = None


class WorkloadStarted(_Event, frozen=True, kw_only=True, tag="workload.started"):
    workload_id: str
    project: str
    gpu_type: str
    gpus: int
    placement: list[NodeGpus]
    allocated: bool
    protected_until_ms: int | None
    progress_s: int = 0
    attempt: int = 1
    #: baseline policy only: the workload opted out of preemption (within its team's cap)
    non_preemptible: bool = False


class MinRuntimeReached(_Event, frozen=True, kw_only=True, tag="workload.min_runtime_reached"):
    workload_id: str


class WorkloadPreemptionNotice(_Event, frozen=True, kw_only=True, tag="workload.preemption_notice"):
    """A preemption decided against a workload that declared ``checkpoint_on_notice_s``: it keeps
    its GPUs until it reports its checkpoint (``workload.checkpointed``) or ``deadline_ms``
    passes; then ``workload.preempted`` follows and only then do its GPUs go to the preemptor
    (``reason.by_workload_id``), which no other request may take them from meanwhile."""

    workload_id: str
    reason: PreemptionReason
    deadline_ms: int
    attempt: int | None = None
    #: where the preemptor (``reason.by_workload_id``) will start once its victims are gone
    #: (their free GPUs are held for it meanwhile); UNSET for a drain's notice
    preemptor_nodes: list[str] | UnsetType = UNSET


class WorkloadCheckpointed(_Event, frozen=True, kw_only=True, tag="workload.checkpointed"):
    """A workload under notice wrote its checkpoint (the executor: its process exited 0 after
    SIGTERM before the deadline; the simulator: its checkpoint time, shared bandwidth counted)."""

    workload_id: str
    attempt: int | None = None


class WorkloadPreempted(_Event, frozen=True, kw_only=True, tag="workload.preempted"):
    workload_id: str
    reason: PreemptionReason
    resumable: bool
    progress_s: int
    lost_gpu_s: int
    #: after a notice: the GPU time spent writing the checkpoint (overhead, reported apart from
    #: lost progress), whether it checkpointed before the deadline, and, for a session that
    #: suspends on notice, whether its state was saved. UNSET without a notice (events stay as
    #: they were)
    checkpoint_gpu_s: int | UnsetType = UNSET
    checkpointed: bool | UnsetType = UNSET
    state_saved: bool | UnsetType = UNSET


class WorkloadRequeued(_Event, frozen=True, kw_only=True, tag="workload.requeued"):
    workload_id: str
    progress_s: int


class WorkloadCompleted(_Event, frozen=True, kw_only=True, tag="workload.completed"):
    workload_id: str
    exit_code: int = 0
    #: the run it reports on (an executor's late report of an older run is refused)
    attempt: int | None = None


class WorkloadFailed(_Event, frozen=True, kw_only=True, tag="workload.failed"):
    workload_id: str
    reason: str
    exit_code: int | None = None
    attempt: int | None = None


class WorkloadCancelled(_Event, frozen=True, kw_only=True, tag="workload.cancelled"):
    workload_id: str
    by: str = ""


class NodeUnhealthy(_Event, frozen=True, kw_only=True, tag="node.unhealthy"):
    node: str
    reason: str = ""
    needs_human: bool = False


class NodeFailed(_Event, frozen=True, kw_only=True, tag="node.failed"):
    node: str
    reason: str = ""


class NodeDrained(_Event, frozen=True, kw_only=True, tag="node.drained"):
    node: str


class NodeRepaired(_Event, frozen=True, kw_only=True, tag="node.repaired"):
    node: str


class ShareChange(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One path's share before and after a budget change (None: the path was added, or removed
    with everything below it)."""

    old: float | None
    new: float | None


# omit_defaults: a change written now carries ``changed`` alone, not the null whole maps
class BudgetChanged(_Event, frozen=True, kw_only=True, tag="budget.changed", omit_defaults=True):
    """Who changed the allocation tree and why, and the shares the change changed: its size
    follows the change, not the tree (a 10,000-leaf tree's whole map is hundreds of KB, and
    NATS refuses a message over 1 MB). Every reader holds the tree the log made so far and
    applies ``changed`` to it (:func:`shares_after`)."""

    by: str
    reason: str
    changed: dict[str, ShareChange] = {}
    #: the whole share maps before and after, as changes written before ``changed`` carried them
    #: (read, never written now): such a change replaces the tree with ``new``
    old: dict[str, float] | None = None
    new: dict[str, float] | None = None


Event = (
    WorkloadSubmitted
    | WorkloadStarted
    | MinRuntimeReached
    | WorkloadPreemptionNotice
    | WorkloadCheckpointed
    | WorkloadPreempted
    | WorkloadRequeued
    | WorkloadCompleted
    | WorkloadFailed
    | WorkloadCancelled
    | NodeUnhealthy
    | NodeFailed
    | NodeDrained
    | NodeRepaired
    | BudgetChanged
)

EVENT_TYPES: tuple[type, ...] = Event.__args__  # type: ignore[attr-defined]

#: Long-lived codec objects (creating them per message is the slow path in msgspec).
encoder = msgspec.json.Encoder()
decoder = msgspec.json.Decoder(Event)


def event_type(event: _Event) -> str:
    """The tag of an event, e.g. ``workload.started`` (also the subject suffix)."""
    return type(event).__struct_config__.tag  # type: ignore[return-value]  # a str for every event


def ends_for_good(event: _Event) -> bool:
    """Whether ``event`` ends its workload for good, so nothing of it runs again: completed,
    failed, cancelled, or preempted and not requeued (not resumable). A resumable preemption is
    followed by ``workload.requeued``: the workload runs again and resumes from what it kept."""
    if isinstance(event, WorkloadPreempted):
        return not event.resumable
    return isinstance(event, (WorkloadCompleted, WorkloadFailed, WorkloadCancelled))


def share_changes(old: dict[str, float], new: dict[str, float]) -> dict[str, ShareChange]:
    """The paths whose share differs between two whole maps, sorted, each with both shares
    (None where the path is missing: added, or removed). A removed path whose parent is removed
    too is left out: removing a path removes everything below it (retiring a program of 30,000
    projects is one entry, not 30,000)."""
    out: dict[str, ShareChange] = {}
    for p in sorted(old.keys() | new.keys()):
        was, now = old.get(p), new.get(p)
        if was == now:
            continue
        if now is None and "/" in p and p.rsplit("/", 1)[0] not in new:
            continue  # below a removed path
        out[p] = ShareChange(old=was, new=now)
    return out


def shares_after(e: BudgetChanged, before: dict[str, float]) -> dict[str, float]:
    """The whole share map after ``e``, given the map before it (what the log made so far): the
    changed paths set, the removed ones gone with everything below them, the rest as they were
    (a change in the old form: its ``new``)."""
    if e.new is not None:
        return e.new
    removed = {path for path, c in e.changed.items() if c.new is None}
    if removed:
        after = {p: s for p, s in before.items() if not any(a in removed for a in ancestors(p))}
    else:
        after = dict(before)
    for path, c in e.changed.items():
        if c.new is not None:
            after[path] = c.new
    return after


def tree_after(e: BudgetChanged, tree: AllocationTree) -> AllocationTree:
    """The tree after ``e``, given the tree the log made before it (validated: TreeError)."""
    return AllocationTree.from_shares(shares_after(e, tree.shares()), like=tree)


def budget_conflict(e: BudgetChanged, tree: AllocationTree) -> str | None:
    """Why ``e`` does not follow from ``tree`` (a path's share is not the one the change was
    made from: another change came first), or None. A proposal is checked against the tree of
    the log, so that two changes made from the same tree cannot undo each other's shares; the
    log's own changes are not (they were checked when they came)."""
    if e.new is not None:
        return None  # a whole map replaces whatever was there
    for path in sorted(e.changed):
        was = e.changed[path].old
        node = tree.nodes.get(path)
        now = node.share if node is not None else None
        if now != was:
            return (f"{path}: its share is {_share_text(now)}, not {_share_text(was)} as the change was made from "
                    "(another change came first; read the tree again and send the change again)")
    return None


def _share_text(share: float | None) -> str:
    return "absent" if share is None else f"{share:g}"


def json_schema() -> dict:
    """JSON Schema of the whole event union (written to ``schemas/`` by ``make schemas``)."""
    _, components = msgspec.json.schema_components([Event], ref_template="#/$defs/{name}")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "timeshare events (v1)",
        "anyOf": [{"$ref": f"#/$defs/{t.__name__}"} for t in EVENT_TYPES],
        "$defs": components,
    }
