"""One run's event log, folded into flat numpy arrays the figures can slice without loops.

A *segment* is one run of one workload: from ``workload.started`` to whatever stopped it
(preempted, completed, failed, cancelled) or to the end of the run. Each segment knows the GPU
rows it held (one row per physical GPU, pools in scenario order, nodes by index), whether it
ran allocated, and from when it could be interrupted. Waits, demand and node events are read
the same way the metrics collector reads them, so the pictures agree with ``metrics.json``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import msgspec

from .. import events as ev

# How a segment ended (index into END_KINDS).
END_KINDS = ("running", "completed", "preempted", "failed", "cancelled")
_END = {name: i for i, name in enumerate(END_KINDS)}


@dataclass
class GpuRows:
    """Maps (node, gpu id) to a row of the cluster picture."""

    node_base: dict[str, int]  # node name -> row of its GPU 0
    node_gpus: dict[str, int]
    pool_of_node: dict[str, str]
    pool_gpus: dict[str, int]  # GPU type -> GPUs in the pool
    total: int

    @classmethod
    def from_scenario(cls, scenario) -> "GpuRows":
        base, gpus, pool_of, pool_gpus = {}, {}, {}, {}
        row = 0
        for pool in scenario.cluster().pools.values():
            pool_gpus[pool.gpu_type] = pool.total_gpus
            for node in pool.nodes:
                base[node.name] = row
                gpus[node.name] = node.gpus
                pool_of[node.name] = pool.gpu_type
                row += node.gpus
        return cls(base, gpus, pool_of, pool_gpus, row)


@dataclass
class RunLog:
    policy: str
    end_s: float
    teams: list[str]  # leaves of the allocation tree (index = team id in the arrays)
    kinds: list[str]
    # segments (one per start)
    seg_workload: list[str] = field(default_factory=list)
    seg_team: np.ndarray = None
    seg_pool: np.ndarray = None  # index into pools
    seg_gpus: np.ndarray = None
    seg_t0_s: np.ndarray = None
    seg_t1_s: np.ndarray = None
    seg_allocated: np.ndarray = None
    #: the workload asks for a minimum runtime (funded when its team also has a budget)
    seg_min_runtime: np.ndarray = None
    #: from here to t1 the segment could be interrupted (= t1 when it never could)
    seg_interruptible_from_s: np.ndarray = None
    seg_end: np.ndarray = None  # index into END_KINDS
    # GPU rows held, flattened: row_seg[i] is the segment holding row gpu_row[i]
    row_seg: np.ndarray = None
    gpu_row: np.ndarray = None
    # first queue wait per original submission (resubmissions excluded), censored at the end
    wait_s: np.ndarray = None
    wait_kind: np.ndarray = None  # index into kinds
    # demand (pending or running GPUs) as rate changes per (team, pool)
    demand_t_s: np.ndarray = None
    demand_delta: np.ndarray = None
    demand_team: np.ndarray = None
    demand_pool: np.ndarray = None
    demand_min_runtime: np.ndarray = None  # the workload asks for a minimum runtime
    # preemptions
    preempt_t_s: np.ndarray = None
    preempt_reason: list[str] = field(default_factory=list)
    # node events: (t_s, node, kind, needs_human); kind in unhealthy|failed|drained|repaired
    node_events: list[tuple[float, str, str, bool]] = field(default_factory=list)
    pools: list[str] = field(default_factory=list)


# Slim views of the events: only the fields the report reads. Decoding into these skips
# building full WorkloadSpec / PreemptionReason structs, about half the cost on 30-day logs.
class _Spec(msgspec.Struct, gc=False):
    id: str
    project: str
    gpu_type: str
    gpus: int
    kind: str = "other"
    min_runtime_s: int = 0


class _Reason(msgspec.Struct, gc=False):
    kind: str


class _Slim(msgspec.Struct, tag_field="type", gc=False):
    at_ms: int


class _Submitted(_Slim, tag="workload.submitted"):
    workload: _Spec
    resubmit_of: str | None = None


class _Started(_Slim, tag="workload.started"):
    workload_id: str
    project: str
    gpu_type: str
    gpus: int
    placement: list[ev.NodeGpus]
    allocated: bool
    protected_until_ms: int | None
    non_preemptible: bool = False


class _Preempted(_Slim, tag="workload.preempted"):
    workload_id: str
    reason: _Reason
    resumable: bool


class _Ended(_Slim, tag="workload.completed"):
    workload_id: str


class _Failed(_Slim, tag="workload.failed"):
    workload_id: str


class _Cancelled(_Slim, tag="workload.cancelled"):
    workload_id: str


class _Unhealthy(_Slim, tag="node.unhealthy"):
    node: str
    needs_human: bool = False


class _NodeFailed(_Slim, tag="node.failed"):
    node: str


class _Drained(_Slim, tag="node.drained"):
    node: str


class _Repaired(_Slim, tag="node.repaired"):
    node: str


class _MinRuntime(_Slim, tag="workload.min_runtime_reached"):
    pass


class _Requeued(_Slim, tag="workload.requeued"):
    pass


class _BudgetChanged(_Slim, tag="budget.changed"):
    pass


_SLIM = {ev.WorkloadSubmitted: _Submitted, ev.WorkloadStarted: _Started, ev.WorkloadPreempted: _Preempted,
         ev.WorkloadCompleted: _Ended, ev.WorkloadFailed: _Failed, ev.WorkloadCancelled: _Cancelled,
         ev.NodeUnhealthy: _Unhealthy, ev.NodeFailed: _NodeFailed, ev.NodeDrained: _Drained,
         ev.NodeRepaired: _Repaired, ev.MinRuntimeReached: _MinRuntime, ev.WorkloadRequeued: _Requeued,
         ev.BudgetChanged: _BudgetChanged}
# Every other event type (notices, checkpoints, ... and any added to events.py later) as a bare
# slim view, so one log decodes with the slim union alone: a tag it does not know would send the
# whole file to the full decoder, the slower path.
for _t in typing.get_args(ev.Event):
    if _t not in _SLIM:
        _SLIM[_t] = msgspec.defstruct(f"_{_t.__name__}", [], bases=(_Slim,), tag=_t.__struct_config__.tag)
_SLIM_OF = {v: k for k, v in _SLIM.items()}  # slim type -> the event type it stands for
_slim_decoder = msgspec.json.Decoder(typing.Union[tuple(_SLIM.values())])
_full_decoder = msgspec.json.Decoder(ev.Event)


def read_events(path: Path) -> list:
    """Decode an ``events.jsonl`` file (one JSON event per line) in one call.

    Uses the slim views; an event type they do not know (added to events.py later) falls back
    to the full union, which is slower but always current."""
    data = Path(path).read_bytes()
    try:
        return _slim_decoder.decode_lines(data)
    except msgspec.ValidationError:
        return _full_decoder.decode_lines(data)


def fold_events(events, policy: str, end_s: float, teams: list[str], rows: GpuRows) -> RunLog:
    """Fold an ordered event stream into a RunLog (``end_s`` closes what is still open)."""
    pools = list(rows.pool_gpus)
    pool_idx = {p: i for i, p in enumerate(pools)}
    team_idx = {t: i for i, t in enumerate(teams)}
    kinds: dict[str, int] = {}

    seg_wid, seg_team, seg_pool, seg_gpus, seg_t0, seg_t1 = [], [], [], [], [], []
    seg_alloc, seg_min_rt, seg_int_from, seg_end = [], [], [], []
    row_seg, gpu_row = [], []
    open_seg: dict[str, int] = {}
    spec_of: dict[str, object] = {}
    submit_s: dict[str, float] = {}
    resubmit: dict[str, bool] = {}
    first_wait: dict[str, float] = {}
    d_t, d_delta, d_team, d_pool, d_min_rt = [], [], [], [], []
    p_t, p_reason = [], []
    node_events = []

    def close(wid: str, t: float, how: str) -> None:
        i = open_seg.pop(wid, None)
        if i is not None:
            seg_t1[i] = t
            seg_end[i] = _END[how]
            seg_int_from[i] = min(seg_int_from[i], t)

    def end_demand(wid: str, t: float) -> None:
        spec = spec_of[wid]
        d_t.append(t)
        d_delta.append(-spec.gpus)
        d_team.append(team_idx[spec.project])
        d_pool.append(pool_idx[spec.gpu_type])
        d_min_rt.append(spec.min_runtime_s > 0)

    for e in events:
        t = e.at_ms / 1000
        typ = type(e)
        typ = _SLIM_OF.get(typ, typ)  # a slim view stands for its event type
        if typ is ev.WorkloadStarted:
            wid = e.workload_id
            i = len(seg_t0)
            open_seg[wid] = i
            seg_wid.append(wid)
            seg_team.append(team_idx[e.project])
            seg_pool.append(pool_idx[e.gpu_type])
            seg_gpus.append(e.gpus)
            seg_t0.append(t)
            seg_t1.append(end_s)
            seg_alloc.append(e.allocated)
            seg_min_rt.append(spec_of[wid].min_runtime_s > 0)
            if e.non_preemptible:
                seg_int_from.append(float("inf"))  # baseline opt-out: never interruptible
            elif e.protected_until_ms is not None:
                seg_int_from.append(max(t, e.protected_until_ms / 1000))
            else:
                seg_int_from.append(t)
            seg_end.append(_END["running"])
            for pg in e.placement:
                base = rows.node_base[pg.node]
                for g in pg.gpu_ids:
                    row_seg.append(i)
                    gpu_row.append(base + g)
            if wid not in first_wait:
                first_wait[wid] = t - submit_s[wid]
        elif typ is ev.WorkloadSubmitted:
            spec = e.workload
            spec_of[spec.id] = spec
            submit_s[spec.id] = t
            resubmit[spec.id] = bool(e.resubmit_of)
            kinds.setdefault(spec.kind, len(kinds))
            d_t.append(t)
            d_delta.append(spec.gpus)
            d_team.append(team_idx[spec.project])
            d_pool.append(pool_idx[spec.gpu_type])
            d_min_rt.append(spec.min_runtime_s > 0)
        elif typ is ev.WorkloadPreempted:
            close(e.workload_id, t, "preempted")
            p_t.append(t)
            p_reason.append(e.reason.kind)
            if not e.resumable:
                end_demand(e.workload_id, t)
        elif typ is ev.WorkloadCompleted:
            close(e.workload_id, t, "completed")
            end_demand(e.workload_id, t)
        elif typ is ev.WorkloadFailed or typ is ev.WorkloadCancelled:
            close(e.workload_id, t, "failed" if typ is ev.WorkloadFailed else "cancelled")
            end_demand(e.workload_id, t)
        elif typ is ev.NodeUnhealthy:
            node_events.append((t, e.node, "unhealthy", e.needs_human))
        elif typ is ev.NodeFailed:
            node_events.append((t, e.node, "failed", False))
        elif typ is ev.NodeDrained:
            node_events.append((t, e.node, "drained", False))
        elif typ is ev.NodeRepaired:
            node_events.append((t, e.node, "repaired", False))

    for i in open_seg.values():
        seg_int_from[i] = min(seg_int_from[i], end_s)

    # first waits, censored at the end for work never started (as metrics.py counts them)
    kind_names = list(kinds)
    waits, wait_kind = [], []
    for wid, spec in spec_of.items():
        if resubmit[wid]:
            continue
        waits.append(first_wait.get(wid, end_s - submit_s[wid]))
        wait_kind.append(kinds[spec.kind])

    f64, i32 = np.float64, np.int32
    return RunLog(
        policy=policy, end_s=end_s, teams=teams, kinds=kind_names,
        seg_workload=seg_wid, seg_team=np.array(seg_team, i32), seg_pool=np.array(seg_pool, i32),
        seg_gpus=np.array(seg_gpus, i32), seg_t0_s=np.array(seg_t0, f64), seg_t1_s=np.array(seg_t1, f64),
        seg_allocated=np.array(seg_alloc, bool), seg_min_runtime=np.array(seg_min_rt, bool),
        seg_interruptible_from_s=np.array(seg_int_from, f64), seg_end=np.array(seg_end, np.int8),
        row_seg=np.array(row_seg, i32), gpu_row=np.array(gpu_row, i32),
        wait_s=np.array(waits, f64), wait_kind=np.array(wait_kind, i32),
        demand_t_s=np.array(d_t, f64), demand_delta=np.array(d_delta, f64),
        demand_team=np.array(d_team, i32), demand_pool=np.array(d_pool, i32),
        demand_min_runtime=np.array(d_min_rt, bool),
        preempt_t_s=np.array(p_t, f64), preempt_reason=p_reason, node_events=node_events, pools=pools,
    )


def load_run(events_path: Path, policy: str, end_s: float, scenario, rows: GpuRows | None = None) -> RunLog:
    rows = rows or GpuRows.from_scenario(scenario)
    return fold_events(read_events(events_path), policy, end_s, scenario.tree().leaves, rows)
