"""The cluster a service runs: pools, initial allocation tree and policy, from a TOML file.

Any simulator scenario file works (its workloads are ignored by the services, but the devstack
uses them as its synthetic submissions); a file with only [[pools]], [allocations] and [policy]
works too.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from timeshare.cluster import Cluster, PoolSpec
from timeshare.config import PolicyConfig
from timeshare.sim.scenario import Scenario, _Reader, scenario_from_dict
from timeshare.tree import AllocationTree


@dataclass
class ClusterConfig:
    name: str
    policy: PolicyConfig
    pools: list[PoolSpec]
    allocations: dict[str, float]
    scenario: Scenario

    def tree(self) -> AllocationTree:
        return AllocationTree.from_shares(self.allocations)

    def cluster(self) -> Cluster:
        # the scenario's cluster: pools and the checkpoint bandwidth that notices share (the live
        # placement applies the rule "storage" as the simulator does)
        return self.scenario.cluster()


def load_cluster(path: str | Path, name: str = "") -> ClusterConfig:
    path = Path(path)
    text = path.read_text()
    data = tomllib.loads(text)
    if "trace" not in data and "generator" not in data:
        data["trace"] = {"path": os.devnull}
    data.setdefault("duration", "1d")
    scenario = scenario_from_dict(data, _Reader(str(path), text), path.parent)
    cluster_name = name or scenario.name
    if not cluster_name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"{path}: cluster name {cluster_name!r} must be letters, digits, - or _ (it is a subject token)")
    return ClusterConfig(cluster_name, scenario.policy, scenario.pools, dict(scenario.allocations), scenario)
