"""Fluent builders for workloads, clusters and scenarios, and a small harness that drives the
pure core (SchedulerState + a policy) by hand, so tests read like specifications:

    scenario = (ScenarioBuilder().pool(nodes=2, gpus_per_node=8)
                .team("a", 1).team("b", 1)
                .workload("w1", "a", gpus=8, work="2h", min_runtime="1h")
                .build())
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from timeshare import events as ev
from timeshare.baseline import BaselinePolicy
from timeshare.cluster import Cluster, PoolSpec
from timeshare.config import PolicyConfig
from timeshare.durations import parse_duration_s
from timeshare.fifo import FifoPolicy
from timeshare.scheduler import BudgetPolicy
from timeshare.sim.engine import run
from timeshare.sim.scenario import NodeEvent, Scenario
from timeshare.state import SchedulerState
from timeshare.tree import AllocationTree
from timeshare.workload import WorkloadSpec

POLICIES = {"budget": BudgetPolicy, "baseline": BaselinePolicy, "fifo": FifoPolicy}


def secs(value) -> int:
    return parse_duration_s(value)


def spec(id: str, project: str, *, gpus: int = 1, work="1h", submit=0, min_runtime=0, resumable: bool = False,
         priority: str = "normal", kind: str = "other", checkpoint=None, gpu_type: str = "H100",
         user: str = "", notice=None, checkpoint_gb: float | None = None, suspends: bool | None = None) -> WorkloadSpec:
    """One workload specification with readable defaults (durations as "1h", "15m" or seconds);
    ``notice``: its checkpoint_on_notice_s (None: none declared, as before notices)."""
    extra: dict = {}
    if notice is not None:
        extra["checkpoint_on_notice_s"] = secs(notice)
    if checkpoint_gb is not None:
        extra["checkpoint_gb"] = checkpoint_gb
    if suspends is not None:
        extra["suspends_on_notice"] = suspends
    return WorkloadSpec(
        id=id, submit_s=secs(submit), project=project, gpu_type=gpu_type, gpus=gpus, work_s=secs(work),
        min_runtime_s=secs(min_runtime), resumable=resumable, priority=priority, kind=kind,
        checkpoint_interval_s=secs(checkpoint) if checkpoint is not None else None, user=user, **extra)


class ScenarioBuilder:
    def __init__(self, name: str = "test", duration="14d", seed: int = 0):
        self._name = name
        self._duration = secs(duration)
        self._seed = seed
        self._pools: list[PoolSpec] = []
        self._shares: dict[str, float] = {}
        self._policy: dict = {}
        self._workloads: list[WorkloadSpec] = []
        self._node_events: list[NodeEvent] = []
        self._bandwidth_gbps: float | None = None

    def checkpoint_bandwidth(self, gbps: float | None) -> "ScenarioBuilder":
        """The cluster's checkpoint bandwidth (GB/s; None: unlimited)."""
        self._bandwidth_gbps = gbps
        return self

    def duration(self, value) -> "ScenarioBuilder":
        self._duration = secs(value)
        return self

    def pool(self, gpu_type: str = "H100", nodes: int = 2, gpus_per_node: int = 8,
             rack_size: int | None = None) -> "ScenarioBuilder":
        self._pools.append(PoolSpec(gpu_type, nodes, gpus_per_node, rack_size))
        return self

    def team(self, path: str, share: float) -> "ScenarioBuilder":
        """An allocation-tree node; parents must be declared too (``team("p", 1)``)."""
        self._shares[path] = share
        return self

    def teams(self, **shares: float) -> "ScenarioBuilder":
        for path, share in shares.items():
            self.team(path, share)
        return self

    def policy(self, **settings) -> "ScenarioBuilder":
        """PolicyConfig fields; durations may be written as "7d" (``lookback_window_s="7d"``)."""
        for key, value in settings.items():
            self._policy[key] = secs(value) if key.endswith("_s") and value is not None else value
        return self

    def workload(self, id: str, project: str, **kw) -> "ScenarioBuilder":
        self._workloads.append(spec(id, project, **kw))
        return self

    def add(self, *specs: WorkloadSpec) -> "ScenarioBuilder":
        self._workloads.extend(specs)
        return self

    def node_event(self, at, node: str, kind: str = "unhealthy", repair="6h") -> "ScenarioBuilder":
        self._node_events.append(NodeEvent(secs(at), node, kind, secs(repair)))
        return self

    def config(self) -> PolicyConfig:
        return PolicyConfig(**self._policy).validate()

    def tree(self) -> AllocationTree:
        return AllocationTree.from_shares(dict(self._shares))

    def cluster(self) -> Cluster:
        return Cluster(list(self._pools or [PoolSpec("H100", 2, 8)]), self._bandwidth_gbps)

    def build(self) -> Scenario:
        return Scenario(
            name=self._name, duration_s=self._duration, seed=self._seed, policy=self.config(),
            pools=list(self._pools or [PoolSpec("H100", 2, 8)]), allocations=dict(self._shares),
            node_events=sorted(self._node_events, key=lambda e: (e.at_s, e.node)),
            workloads=sorted(self._workloads, key=lambda w: (w.submit_s, w.id)),
            checkpoint_bandwidth_gbps=self._bandwidth_gbps)

    def harness(self, policy: str = "budget") -> "Harness":
        return Harness(SchedulerState(self.tree(), self.cluster(), self.config()), POLICIES[policy]())


@dataclass
class Harness:
    """The core driven by hand: submit, run a pass, complete; every event is kept in order."""

    state: SchedulerState
    policy: object
    events: list = field(default_factory=list)

    def _apply(self, e) -> None:
        self.state.apply(e)
        self.events.append(e)

    def submit(self, *specs: WorkloadSpec, at=None) -> "Harness":
        for s in specs:
            self._apply(self.state.submitted(s, secs(at) if at is not None else s.submit_s))
        return self

    def schedule(self, at) -> list:
        out = self.policy.schedule(self.state, secs(at))
        self.events.extend(out)
        return out

    def complete(self, workload_id: str, at) -> "Harness":
        self._apply(self.state.completed(workload_id, secs(at)))
        return self

    def checkpointed(self, workload_id: str, at) -> "Harness":
        self._apply(self.state.checkpointed(workload_id, secs(at)))
        return self

    def cancel(self, workload_id: str, at) -> "Harness":
        self._apply(self.state.cancelled(workload_id, secs(at)))
        return self

    def unhealthy(self, node: str, at) -> "Harness":
        self._apply(self.state.node_unhealthy(node, secs(at), "test", False))
        return self

    def fail_node(self, node: str, at) -> list:
        out = self.state.node_failed(node, secs(at), "test")
        for e in out:
            self._apply(e)
        return out

    def running(self) -> set[str]:
        return set(self.state.running)

    def of_type(self, cls) -> list:
        return [e for e in self.events if isinstance(e, cls)]

    def started(self, workload_id: str) -> ev.WorkloadStarted:
        found = [e for e in self.events if isinstance(e, ev.WorkloadStarted) and e.workload_id == workload_id]
        assert found, f"{workload_id} never started"
        return found[-1]


@dataclass
class Run:
    result: object
    events: list

    @property
    def metrics(self) -> dict:
        return self.result.metrics

    @property
    def state(self):
        return self.result.state

    def of_type(self, cls, workload_id: str | None = None) -> list:
        return [e for e in self.events if isinstance(e, cls)
                and (workload_id is None or getattr(e, "workload_id", None) == workload_id)]

    def encoded(self) -> bytes:
        return b"\n".join(ev.encoder.encode(e) for e in self.events)


def simulate(scenario: Scenario, policy: str = "budget") -> Run:
    events: list = []
    result = run(scenario, policy, on_event=events.append, wall_clock=lambda: 0.0)
    return Run(result, events)


def replace(spec_: WorkloadSpec, **changes) -> WorkloadSpec:
    return msgspec.structs.replace(spec_, **changes)
