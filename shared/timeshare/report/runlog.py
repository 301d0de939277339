"""One run's event log, folded into flat numpy arrays the figures can slice without loops.

A *segment* is one run of one workload: from ``workload.started`` to whatever stopped it
(preempted, completed, failed, cancelled) or to the end of the run. Each segment knows the GPU
rows it held (one row per physical GPU, pools in scenario order, nodes by index), whether it
ran allocated, and from when it could be interrupted. Waits, demand and node events are read
the same way the metrics collector reads them, so the pictures agree with ``metrics.json``.
"""

from __future__ import annotations

import itertools
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


# What the fold does with each event type (slim views and full events alike).
_SUB, _START, _PRE, _DONE, _FAIL, _CANCEL, _NODE, _OTHER = range(8)
_CODE_OF_EVENT = {ev.WorkloadSubmitted: _SUB, ev.WorkloadStarted: _START, ev.WorkloadPreempted: _PRE,
                  ev.WorkloadCompleted: _DONE, ev.WorkloadFailed: _FAIL, ev.WorkloadCancelled: _CANCEL,
                  ev.NodeUnhealthy: _NODE, ev.NodeFailed: _NODE, ev.NodeDrained: _NODE, ev.NodeRepaired: _NODE}
_CODE = {**_CODE_OF_EVENT, **{slim: _CODE_OF_EVENT[t] for t, slim in _SLIM.items() if t in _CODE_OF_EVENT}}
#: how a segment closed by each code ended (index into END_KINDS)
_END_OF_CODE = np.zeros(8, np.int8)
_END_OF_CODE[[_PRE, _DONE, _FAIL, _CANCEL]] = [_END["preempted"], _END["completed"], _END["failed"],
                                               _END["cancelled"]]
_NODE_KIND = {ev.NodeUnhealthy: "unhealthy", ev.NodeFailed: "failed", ev.NodeDrained: "drained",
              ev.NodeRepaired: "repaired"}


def fold_events(events, policy: str, end_s: float, teams: list[str], rows: GpuRows) -> RunLog:
    """Fold an ordered event stream into a RunLog (``end_s`` closes what is still open).

    Column by column rather than event by event: the events are split by type (keeping their
    positions), each type's fields become arrays in one comprehension, and a run's end is found
    by sorting starts and ends by (workload, position): an end closes the start just before it
    of the same workload, if that start is still open (a workload runs once at a time). Workload
    ids are unique per submission (a resubmission has an id of its own)."""
    events = events if isinstance(events, list) else list(events)
    f64, i32 = np.float64, np.int32
    pools = list(rows.pool_gpus)
    pool_idx = {p: i for i, p in enumerate(pools)}
    team_idx = {t: i for i, t in enumerate(teams)}
    code_of = _CODE
    codes = np.fromiter((code_of.get(type(e), _OTHER) for e in events), np.int8, len(events))

    def where(*kinds):
        return np.flatnonzero(np.isin(codes, kinds)) if len(kinds) > 1 else np.flatnonzero(codes == kinds[0])

    def pick(positions: np.ndarray) -> list:
        return [events[i] for i in positions.tolist()]

    # submissions: what each workload asks for (index = position among submissions)
    subs = pick(where(_SUB))
    specs = [e.workload for e in subs]
    wid_of = {s.id: i for i, s in enumerate(specs)}
    sub_t = np.array([e.at_ms for e in subs], f64) / 1000
    spec_team = np.array([team_idx[s.project] for s in specs], i32)
    spec_pool = np.array([pool_idx[s.gpu_type] for s in specs], i32)
    spec_gpus = np.array([s.gpus for s in specs], f64)
    spec_min_rt = np.array([s.min_runtime_s > 0 for s in specs], bool)
    kind_names = list(dict.fromkeys(s.kind for s in specs))
    kind_idx = {k: i for i, k in enumerate(kind_names)}
    spec_kind = np.array([kind_idx[s.kind] for s in specs], i32)
    resubmit = np.array([bool(e.resubmit_of) for e in subs], bool)

    # starts: one segment each
    start_pos = where(_START)
    starts = pick(start_pos)
    st_w = np.array([wid_of[e.workload_id] for e in starts], np.int64)
    st_t = np.array([e.at_ms for e in starts], f64) / 1000
    inf = float("inf")
    # from when it could be interrupted: never (baseline opt-out), after its protection, or at once
    int_from = np.maximum(st_t, np.array([inf if e.non_preemptible else -inf if e.protected_until_ms is None
                                          else e.protected_until_ms / 1000 for e in starts], f64))
    base = rows.node_base
    # the GPU rows each start holds: its placement's (node, GPU ids) chunks, flattened
    chunks = [pg for e in starts for pg in e.placement]
    chunk_seg = np.repeat(np.arange(len(starts), dtype=i32), [len(e.placement) for e in starts])
    chunk_len = [len(pg.gpu_ids) for pg in chunks]
    gpu_row = (np.repeat(np.array([base[pg.node] for pg in chunks], i32), chunk_len)
               + np.fromiter(itertools.chain.from_iterable(pg.gpu_ids for pg in chunks), i32))
    row_seg = np.repeat(chunk_seg, chunk_len)

    # ends: preempted, completed, failed, cancelled
    end_pos = where(_PRE, _DONE, _FAIL, _CANCEL)
    ends = pick(end_pos)
    end_w = np.array([wid_of[e.workload_id] for e in ends], np.int64)
    end_t = np.array([e.at_ms for e in ends], f64) / 1000
    end_code = codes[end_pos]
    n_start = len(starts)
    order = np.lexsort((np.concatenate((start_pos, end_pos)), np.concatenate((st_w, end_w))))
    is_start = order < n_start
    closes = np.flatnonzero(~is_start[1:] & is_start[:-1]) + 1  # an end right after a start ...
    closes = closes[np.concatenate((st_w, end_w))[order[closes]] == np.concatenate((st_w, end_w))[order[closes - 1]]]
    seg_i, end_i = order[closes - 1], order[closes] - n_start  # ... of the same workload
    seg_t1 = np.full(n_start, float(end_s))
    seg_t1[seg_i] = end_t[end_i]
    seg_end = np.full(n_start, _END["running"], np.int8)
    seg_end[seg_i] = _END_OF_CODE[end_code[end_i]]
    int_from = np.minimum(int_from, seg_t1)

    # demand: asked for from submission until it completes, fails, is cancelled, or is
    # preempted without being resumable
    preempted = [e for e, c in zip(ends, end_code.tolist()) if c == _PRE]
    resumable = np.ones(len(ends), bool)
    resumable[end_code == _PRE] = [e.resumable for e in preempted]
    gone = (end_code != _PRE) | ~resumable
    gone_w = end_w[gone]
    demand_t = np.concatenate((sub_t, end_t[gone]))
    demand_delta = np.concatenate((spec_gpus, -spec_gpus[gone_w]))
    demand_team = np.concatenate((spec_team, spec_team[gone_w]))
    demand_pool = np.concatenate((spec_pool, spec_pool[gone_w]))
    demand_min_rt = np.concatenate((spec_min_rt, spec_min_rt[gone_w]))

    # first waits, censored at the end for work never started (as metrics.py counts them)
    first_start = np.full(len(specs), np.nan)
    started_w, first = np.unique(st_w, return_index=True)
    first_start[started_w] = st_t[first]
    wait = np.where(np.isnan(first_start), end_s, first_start) - sub_t
    original = ~resubmit

    node_events = []
    for e in pick(where(_NODE)):
        kind = _NODE_KIND[_SLIM_OF.get(type(e), type(e))]
        node_events.append((e.at_ms / 1000, e.node, kind, bool(getattr(e, "needs_human", False))))

    return RunLog(
        policy=policy, end_s=end_s, teams=teams, kinds=kind_names,
        seg_workload=[e.workload_id for e in starts], seg_team=np.array([team_idx[e.project] for e in starts], i32),
        seg_pool=np.array([pool_idx[e.gpu_type] for e in starts], i32),
        seg_gpus=np.array([e.gpus for e in starts], i32), seg_t0_s=st_t, seg_t1_s=seg_t1,
        seg_allocated=np.array([e.allocated for e in starts], bool), seg_min_runtime=spec_min_rt[st_w],
        seg_interruptible_from_s=int_from, seg_end=seg_end, row_seg=row_seg, gpu_row=gpu_row,
        wait_s=wait[original], wait_kind=spec_kind[original],
        demand_t_s=demand_t, demand_delta=demand_delta, demand_team=demand_team, demand_pool=demand_pool,
        demand_min_runtime=demand_min_rt,
        preempt_t_s=np.array([e.at_ms for e in preempted], f64) / 1000,
        preempt_reason=[e.reason.kind for e in preempted], node_events=node_events, pools=pools,
    )


def load_run(events_path: Path, policy: str, end_s: float, scenario, rows: GpuRows | None = None) -> RunLog:
    rows = rows or GpuRows.from_scenario(scenario)
    return fold_events(read_events(events_path), policy, end_s, scenario.tree().leaves, rows)
